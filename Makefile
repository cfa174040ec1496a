# The README's commands: `make demo`, `make test`, `make bench`.
SWIFT ?= swift
SWIFTFLAGS ?= -Xswiftc -warnings-as-errors

.PHONY: deps build test demo bench clean

deps:
	@./scripts/ensure-deps.sh

build: deps
	$(SWIFT) build $(SWIFTFLAGS)

# Builds everything (warnings are errors) and runs every test.
test: deps
	$(SWIFT) build --build-tests $(SWIFTFLAGS)
	timeout 1500 $(SWIFT) test --skip-build

clean:
	rm -rf .build

# Builds reconcile-bench (release) and runs the full table; see
# Docs/Performance.md. `.build/release/reconcile-bench --quick` is a short run.
bench: deps
	$(SWIFT) build -c release --product reconcile-bench $(SWIFTFLAGS)
	.build/release/reconcile-bench
