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
