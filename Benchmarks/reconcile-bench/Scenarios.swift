import Glibc
import Reconcile
import ReconcileSystemd
import ReconcileTesting

// The benchmarks over the virtual driver: reconcile (identities replaced),
// retune (parameters changed under the same identity), memory and messages.

/// Reconciles alternately to `cycle[0]` and `cycle[1]`, starting from
/// `initial` (which is `cycle[1]`'s content), so every timed reconcile makes
/// the same change.
final class ReconcileCase: Benchmark {
    let implementation: Implementation
    let sets: SetList
    let initial: DesiredSet
    let cycle: [DesiredSet]
    private(set) var driver: VirtualDriver?
    private var subject: (any Reconciling)?
    private var callsAfterSetUp = 0
    private(set) var iterations = 0
    private(set) var driverCalls = 0
    private(set) var problems: [String] = []

    init(_ implementation: Implementation, sets: SetList, initial: DesiredSet, cycle: [DesiredSet]) {
        self.implementation = implementation
        self.sets = sets
        self.initial = initial
        self.cycle = cycle
    }

    func setUp() {
        if implementation.usesTickets {
            _ = initial.tickets
            for s in cycle { _ = s.tickets }
        }
        let driver = VirtualDriver()
        self.driver = driver
        subject = implementation.make(sets, initial: initial, driver: driver)
        callsAfterSetUp = driver.log.count
    }

    func run(_ iteration: Int) -> Int {
        subject!.reconcile(to: cycle[iteration & 1])
        iterations = iteration + 1
        return iteration
    }

    /// Reads the driver's counters and checks the end state (untimed).
    func finish() {
        guard let driver else { return }
        driverCalls = driver.log.count - callsAfterSetUp
        guard implementation.callsDriver else { return }
        if !driver.contractViolations.isEmpty {
            problems.append("\(driver.contractViolations.count) driver contract violations, first: \(driver.contractViolations[0])")
        }
        let last = cycle[(iterations - 1) & 1]
        if driver.running.count != last.count {
            problems.append("\(driver.running.count) running after reconciling to \(last.count)")
        }
    }

    func tearDown() {
        subject = nil
        driver = nil
    }
}

/// Runs the `reconcile` or `retune` benchmark for one size.
///
/// Every reconcile starts from sources the base set `A` started. Variant
/// `fresh` (every churn level): the reconciles alternate between the changed
/// set (for a no-op `A''`, another copy of `A` built anew) and `A'`, so no
/// comparison is helped by a shared box; variant `same` (`reconcile`, churn
/// 0): every reconcile is given `A` itself (every box pointer-equal).
/// `iced-rust` (Benchmarks/iced-tracker) runs right after the others, on
/// the same inputs, as a child process.
func reconcileBenchmark(_ name: String, table: SetTable, churns: [Int], implementations: [Implementation],
                        budget: Budget, icedRust: String?, into records: inout [Record]) {
    for churn in churns {
        let changed = name == "retune" ? table.retuned(churn) : (churn == 0 ? table.baseCopy2 : table.replaced(churn))
        var variants = [("fresh", [changed, table.baseCopy])]
        if name == "reconcile" && churn == 0 { variants.append(("same", [table.base, table.base])) }
        for (variant, cycle) in variants {
            let chosen = implementations.filter { $0 != .icedRust && (!$0.noopOnly || (churn == 0 && name == "reconcile")) }
            let cases = chosen.map { ReconcileCase($0, sets: table.list, initial: table.base, cycle: cycle) }
            let measurements = measureSideBySide(cases, budget) { cases[$0].finish() }
            for (c, m) in zip(cases, measurements) {
                let implementation = c.implementation
                for p in c.problems { warn("\(name) \(implementation.rawValue) size \(table.size) churn \(churn)% \(variant): \(p)") }
                records.append(Record(
                    benchmark: name, implementation: implementation.rawValue, size: table.size, churn: churn,
                    unit: "reconcile", runs: m.runs, medianNanos: m.median, p99Nanos: m.p99,
                    driverCalls: implementation.callsDriver ? Double(c.driverCalls) / Double(max(1, c.iterations)) : nil,
                    allocations: m.allocationsPerRun, variant: variant, rangeMin: m.rangeMin, rangeMax: m.rangeMax))
                progress("\(name) \(implementation.rawValue) \(table.size) \(churn)% \(variant): \(duration(m.median))")
            }
            if name == "reconcile", implementations.contains(.icedRust), let path = icedRust {
                if let r = runIcedRust(path, size: table.size, churn: churn, variant: variant, budget: budget) {
                    records.append(r)
                    progress("\(name) iced-rust \(table.size) \(churn)% \(variant): \(duration(r.medianNanos))")
                }
            }
        }
    }
}

/// Runs the Rust iced tracker (`path`) on the inputs of `size`, `churn` and
/// `variant` with the same repetitions and block time; nil (with a warning)
/// when it cannot.
func runIcedRust(_ path: String, size: Int, churn: Int, variant: String, budget: Budget) -> Record? {
    let rounds = max(3, budget.rounds)
    let blockMillis = max(1, Int((budget.time / rounds).nanoseconds / 1_000_000))
    let command = "'\(path)' \(size) \(churn) \(variant) \(rounds) \(blockMillis) \(budget.minRuns)"
    guard let pipe = popen(command, "r") else {
        warn("iced-rust: cannot run \(path)")
        return nil
    }
    var values: [String: Double] = [:]
    var line = [CChar](repeating: 0, count: 256)
    while fgets(&line, Int32(line.count), pipe) != nil {
        let text = String(decoding: line.prefix { $0 != 0 && $0 != 10 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let fields = text.split(separator: " ")
        if fields.count == 2, let v = Double(fields[1]) { values[String(fields[0])] = v }
    }
    let status = pclose(pipe)
    guard status == 0, let median = values["median_ns"], let running = values["running"] else {
        warn("iced-rust: \(path) failed (status \(status)); build it with `make bench` or pass --iced-rust PATH")
        return nil
    }
    if Int(running) != size { warn("iced-rust: \(Int(running)) running after the updates, expected \(size)") }
    return Record(
        benchmark: "reconcile", implementation: Implementation.icedRust.rawValue, size: size, churn: churn,
        unit: "reconcile", runs: Int(values["runs"] ?? 0), medianNanos: median, p99Nanos: .nan,
        allocations: values["allocations_per_update"], variant: variant,
        rangeMin: values["range_min_ns"], rangeMax: values["range_max_ns"])
}

// MARK: Memory

/// Heap bytes one prebuilt ticket holds (baselines hold one per running
/// subscription but never allocate it; ours allocates its own).
func ticketBytes(_ set: DesiredSet) -> Double { withHeapBytesTracked { ticketBytesTracked(set) } }

private func ticketBytesTracked(_ set: DesiredSet) -> Double {
    let before = liveHeapBytes
    let tickets = mintTickets(set.subscriptions)
    let after = liveHeapBytes
    let perTicket = Double(after - before - Int64(tickets.capacity * MemoryLayout<SourceTicket>.stride)) / Double(tickets.count)
    withExtendedLifetime(tickets) {}
    return perTicket
}

/// For each implementation: the heap its state holds per running
/// subscription (tickets included) after starting `table.base` from nothing
/// on a driver that does nothing, and how long that first reconcile takes.
func memoryBenchmark(table: SetTable, implementations: [Implementation], repeats: Int, into records: inout [Record]) {
    let set = table.base
    let perTicket = ticketBytes(set)
    for implementation in implementations where implementation != .icedRust && implementation != .floor {
        if implementation.usesTickets { _ = set.tickets }
        var nanos: [Double] = []
        var bytes: [Double] = []
        var allocations: [Double] = []
        for _ in 0..<repeats { withHeapBytesTracked {
            let driver = NullDriver()
            let heap = liveHeapBytes
            let allocs = allocationCount
            var subject: (any Reconciling)?
            nanos.append(time { subject = implementation.make(table.list, initial: set, driver: driver) })
            allocations.append(Double(allocationCount - allocs))
            let held = Double(liveHeapBytes - heap) / Double(table.size)
            bytes.append(held + (implementation.usesTickets ? perTicket : 0))
            withExtendedLifetime(subject) {}
            subject = nil
        } }
        records.append(Record(
            benchmark: "memory", implementation: implementation.rawValue, size: table.size, churn: nil,
            unit: "start from empty", runs: repeats, medianNanos: median(nanos), p99Nanos: p99(nanos),
            allocations: median(allocations), bytesPerSubscription: median(bytes),
            extra: implementation.usesTickets ? [("ticket_bytes_included", perTicket)] : []))
        progress("memory \(implementation.rawValue) \(table.size): \(fixed(median(bytes), 0)) B/sub")
    }
}

// MARK: Messages through the runtime

/// A program with an `Equatable` model. Message 0 leaves the model as it is
/// (the runtime skips the reconcile: no `subscriptions` call); message 1
/// changes it (the runtime calls `subscriptions` and reconciles an unchanged
/// set).
struct CounterProgram: Program {
    struct Model: Equatable { var count = 0 }
    let set: Subscriptions<BenchMessage>
    /// Build the set in `subscriptions` every time instead of returning `set`.
    let rebuild: Bool

    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ model: inout Model, _ message: BenchMessage) -> [Never] {
        if message == 1 { model.count &+= 1 }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<BenchMessage> {
        rebuild ? Subscriptions((0..<set.items.count).map { makeSubscription($0, variant: 0) }) : set
    }
}

/// Sends `batch` messages per run to a runtime with `set` running.
final class MessagesCase: Benchmark {
    let set: Subscriptions<BenchMessage>
    let message: BenchMessage
    let rebuild: Bool
    let batch: Int
    /// Record the transcript to a temporary file (the recording-on column).
    let record: Bool
    private var recorder: TranscriptRecorder<CounterProgram>?
    private var recordDirectory: String?
    private var runtime: Runtime<CounterProgram>?
    private var driver: VirtualDriver?
    private(set) var problems: [String] = []
    private var before = RuntimeStats()

    init(set: Subscriptions<BenchMessage>, message: BenchMessage, rebuild: Bool, batch: Int, record: Bool = false) {
        self.set = set
        self.message = message
        self.rebuild = rebuild
        self.batch = batch
        self.record = record
    }

    func setUp() {
        let driver = VirtualDriver()
        let runtime = Runtime(CounterProgram(set: set, rebuild: rebuild), driver: driver)
        if record {
            let tmp = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
            var template = Array("\(tmp)/reconcile-bench-XXXXXX".utf8CString)
            let dir = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!).map { String(cString: $0) } }
            recordDirectory = dir
            let recorder = TranscriptRecorder<CounterProgram>(
                path: (dir ?? tmp) + "/messages.jsonl", sizeLimit: .max, backlogLimit: 1 << 30)
            recorder.attach(to: runtime)
            self.recorder = recorder
        }
        try! runtime.start()
        self.driver = driver
        self.runtime = runtime
        before = runtime.stats
    }

    func run(_ iteration: Int) -> Int {
        let runtime = runtime!
        for _ in 0..<batch { try! runtime.send(message) }
        return iteration
    }

    func finish() {
        guard let runtime, let driver else { return }
        let s = runtime.stats
        if s.starts != before.starts || s.stops != before.stops { problems.append("driver calls made") }
        if driver.running.count != set.items.count { problems.append("\(driver.running.count) running") }
        let sent = s.messages - before.messages
        if message == 0 && s.skippedReconciles - before.skippedReconciles != sent { problems.append("reconciles not skipped") }
        if message == 1 && s.reconciles - before.reconciles != sent { problems.append("reconciles skipped") }
        if let recorder, !recorder.isRecording { problems.append("recording stopped") }
    }

    func tearDown() {
        recorder?.finish(timeout: .seconds(30))
        recorder = nil
        if let dir = recordDirectory {
            unlink(dir + "/messages.jsonl")
            rmdir(dir)
        }
        runtime = nil
        driver = nil
    }
}

/// Messages per second through the runtime with `table.size` subscriptions
/// running, for an unchanged model, a changed model with the same set, and
/// (at 1,000) a program that builds its set on every call.
func messagesBenchmark(table: SetTable, budget: Budget, into records: inout [Record]) {
    let set = table.base.subscriptions
    var variants: [(String, BenchMessage, Bool)] = [("unchanged model", 0, false), ("changed model", 1, false)]
    if table.size == 1_000 { variants.append(("changed model, set rebuilt", 1, true)) }
    for (variant, message, rebuild) in variants {
        let batch = message == 0 ? 1_000 : max(1, 100_000 / table.size / (rebuild ? 100 : 1))
        // The recording-on column: the same case with the transcript
        // recorded to a file, measured right after (same run).
        var withoutRecording = 0.0
        for record in rebuild ? [false] : [false, true] {
            let c = MessagesCase(set: set, message: message, rebuild: rebuild, batch: batch, record: record)
            let m = measure(c, budget, unitsPerRun: batch, after: c.finish)
            let name = variant + (record ? ", recording" : "")
            for p in c.problems { warn("messages \(name) size \(table.size): \(p)") }
            var extra = [("messages_per_second", 1e9 / m.median), ("batch", Double(batch))]
            if record { extra.append(("throughput_vs_not_recording", withoutRecording / m.median)) } else { withoutRecording = m.median }
            records.append(Record(
                benchmark: "messages: " + name, implementation: Implementation.ours.rawValue, size: table.size, churn: nil,
                unit: "message", runs: m.runs, medianNanos: m.median, p99Nanos: m.p99,
                perSubscription: message != 0, driverCalls: 0, allocations: m.allocationsPerRun,
                extra: extra))
            progress("messages \(name) \(table.size): \(duration(m.median))")
        }
    }
}
