# The README's commands: `make demo`, `make test`, `make bench`.
SWIFT ?= swift
SWIFTFLAGS ?= -Xswiftc -warnings-as-errors

.PHONY: deps build test demo demo-netns bench clean fuzz fuzz-replay docs sanitize stress check-invariants

deps:
	@./scripts/ensure-deps.sh

build: deps
	$(SWIFT) build $(SWIFTFLAGS)

# Builds everything (warnings are errors) and runs every test.
test: deps
	$(SWIFT) build --build-tests $(SWIFTFLAGS)
	timeout 1500 $(SWIFT) test --skip-build --disable-xctest
	@$(MAKE) --no-print-directory fuzz-replay

# The reconciler's invariant checks (Sources/Reconcile/Reconciler/Invariants.swift)
# compiled in, after every reconcile, over the suites that drive the engine
# hardest (differential, property, groups, group reuse, planner, layout), in
# a build directory of its own. CI runs it after `make test`.
INVARIANT_SUITES = InvariantChecksTests|DifferentialTests|PropertyTests|GroupTests|GroupReuseTests|PlannerTests|LayoutTests|TicketReuseTests|DebounceTests|RuntimeTests
check-invariants: deps
	RECONCILE_CHECK_INVARIANTS=1 $(SWIFT) build --build-tests --scratch-path .build/invariants $(SWIFTFLAGS)
	RECONCILE_CHECK_INVARIANTS=1 timeout 900 $(SWIFT) test --skip-build --disable-xctest --scratch-path .build/invariants \
		--filter '$(INVARIANT_SUITES)'

# Every test under ThreadSanitizer, then under AddressSanitizer, each in its
# own build directory (the debug build is left alone). Any report fails the
# run (children the tests start inherit the options). scripts/tsan.supp
# holds the one suppression, a false positive, explained there.
sanitize: deps
	$(SWIFT) build --build-tests --sanitize=thread --scratch-path .build/tsan $(SWIFTFLAGS)
	# (A timer's ticks under a 100-connection flood measure speed, which
	# instrumentation changes, and the runtime's shadow memory makes RSS no
	# measure of a leak: those tests run in `make test` only.
	# RECONCILE_SANITIZER tells the tests that push a million items through
	# the loop to push fewer: under TSan a million took 46-60 s of a 60 s bound.)
	RECONCILE_SANITIZER=thread TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/scripts/tsan.supp" \
		timeout 2400 $(SWIFT) test --skip-build --disable-xctest --sanitize=thread --scratch-path .build/tsan \
		--skip 'DescriptorsAndMemoryFlat|aTimerIsNotStarvedWhile100ConnectionsFlood'
	$(SWIFT) build --build-tests --sanitize=address --scratch-path .build/asan $(SWIFTFLAGS)
	# (Resident memory is no measure under ASan, whose quarantine keeps freed
	# memory on purpose: the RSS-flatness tests run in `make test` only.)
	RECONCILE_SANITIZER=address ASAN_OPTIONS="halt_on_error=1 detect_leaks=0" \
		timeout 2400 $(SWIFT) test --skip-build --disable-xctest --sanitize=address --scratch-path .build/asan \
		--skip 'DescriptorsAndMemoryFlat|aTimerIsNotStarvedWhile100ConnectionsFlood'

# Builds and runs the connectivity indicator on this machine (Ctrl-C stops it).
# Same flags as `make test`, so switching between the two rebuilds nothing.
demo: deps
	$(SWIFT) build --product connectivity-indicator $(SWIFTFLAGS)
	@if [ -t 1 ]; then echo "connectivity-indicator: watching this machine's connectivity; Ctrl-C stops it"; fi
	.build/debug/connectivity-indicator

# The indicator in a private network namespace, reacting to a scripted veth.
demo-netns: deps
	$(SWIFT) build --product connectivity-indicator $(SWIFTFLAGS)
	./scripts/demo-netns.sh .build/debug/connectivity-indicator

clean:
	rm -rf .build

# The fuzz targets (libFuzzer): the netlink parser and the transcript
# parser. `make fuzz` runs each for FUZZ_SECONDS; `make test` replays both
# corpora and runs a short bounded round of each.
FUZZ_SECONDS ?= 60
FUZZ_BIN = .build/fuzz-netlink
FUZZ_TRANSCRIPT_BIN = .build/fuzz-transcript

$(FUZZ_BIN): Fuzz/netlink/main.swift Sources/ReconcileSystemd/Connectivity/Netlink/NetlinkParser.swift
	@mkdir -p .build
	swiftc -O -sanitize=fuzzer,address -use-ld=lld -parse-as-library -swift-version 6 -o $@ $^

# (-package-name: the parser is `package`-internal in ReconcileTranscript.)
$(FUZZ_TRANSCRIPT_BIN): Fuzz/transcript/main.swift Sources/ReconcileTranscript/JSONParser.swift Sources/ReconcileTranscript/JSONValue.swift
	@mkdir -p .build
	swiftc -O -sanitize=fuzzer,address -use-ld=lld -parse-as-library -swift-version 6 -package-name reconcile -o $@ $^

# Quiet on success (one summary line each); on failure the whole libFuzzer log.
# $(1): name, $(2): binary, $(3): corpus, $(4): -max_len.
define fuzz_replay
	@mkdir -p .build/fuzz-corpus-$(1)
	@if $(2) -seed=1 -runs=200000 -max_len=$(4) -timeout=10 -malloc_limit_mb=512 .build/fuzz-corpus-$(1) $(3) >.build/fuzz-replay-$(1).log 2>&1; then \
		echo "fuzz-replay $(1): corpus replayed, $$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' .build/fuzz-replay-$(1).log | tail -1 | cut -c6-), $$(grep -o 'corp: [0-9]*' .build/fuzz-replay-$(1).log | tail -1 | cut -c7-) inputs, no crash"; \
	else cat .build/fuzz-replay-$(1).log; echo "fuzz-replay $(1): FAILED (log in .build/fuzz-replay-$(1).log)"; exit 1; fi
endef

fuzz-replay: $(FUZZ_BIN) $(FUZZ_TRANSCRIPT_BIN)
	$(call fuzz_replay,netlink,$(FUZZ_BIN),Fuzz/netlink/corpus,4096)
	$(call fuzz_replay,transcript,$(FUZZ_TRANSCRIPT_BIN),Fuzz/transcript/corpus,65536)

fuzz: $(FUZZ_BIN) $(FUZZ_TRANSCRIPT_BIN)
	@mkdir -p .build/fuzz-corpus-netlink .build/fuzz-corpus-transcript
	$(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) -max_len=4096 .build/fuzz-corpus-netlink Fuzz/netlink/corpus
	$(FUZZ_TRANSCRIPT_BIN) -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 -malloc_limit_mb=512 \
		.build/fuzz-corpus-transcript Fuzz/transcript/corpus

# The stress figures of Docs/Reliability.md (cross-thread sends, start/stop
# churn, link flaps in a namespace, fuzzing): about 5 minutes, root for the
# namespace; `scripts/stress.sh send|churn|links|fuzz` runs one part.
stress: deps
	$(SWIFT) build -c release --product reconcile-probe $(SWIFTFLAGS)
	FUZZ_SECONDS=$(FUZZ_SECONDS) ./scripts/stress.sh all

# The API reference (DocC) of Reconcile, ReconcileTesting, ReconcileReplay,
# ReconcileSystemd and ReconcileTranscript as a static site in .build/docs/site.
docs: deps
	SWIFT=$(SWIFT) ./scripts/docs.sh

# Builds reconcile-bench (release) and runs the full table; see
# Docs/Performance.md. `.build/release/reconcile-bench --quick` is a short run.
# The Rust iced tracker (Benchmarks/iced-tracker, no crates) is built beside it.
RUSTC ?= rustc
bench: deps
	$(SWIFT) build -c release --product reconcile-bench $(SWIFTFLAGS)
	@if command -v $(RUSTC) >/dev/null; then \
		$(RUSTC) --edition 2021 -C opt-level=3 Benchmarks/iced-tracker/main.rs -o .build/release/iced-tracker; \
	else echo "no $(RUSTC): the iced-rust rows are left out (apt-get install rustc)"; fi
	.build/release/reconcile-bench --svg .build/reconcile-bench.svg
