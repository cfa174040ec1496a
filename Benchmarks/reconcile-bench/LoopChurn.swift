import CSystemd
import Glibc
import Reconcile
import ReconcileSystemd

// loop-churn: 10,000 timers on the real loop with a share of them replaced
// per reconcile (0, 1, 10, 25, 50, 100 %): our runtime and sd-event driver
// against an oracle (raw sd-event calls making exactly the changed stops and
// starts, knowing them without any diff) and raw restart-all (every timer
// stopped and started again). Sets are fresh: the reconciles alternate
// between the changed set and a copy of the base built anew.

/// The timer at position `i` of a churned set (`identity` keeps `i`'s interval).
func churnTimer(_ identity: Int, _ i: Int) -> Subscription<BenchMessage> {
    .every(timerInterval(i), key: identity, leeway: .milliseconds(1)) { _ in -1 }
}

/// Our side: a runtime on a real loop alternating between two sets.
final class LoopChurnOurs: Benchmark {
    let sets: [Subscriptions<BenchMessage>]
    private var rig: LoopRig?
    private(set) var problems: [String] = []

    /// `sets`: the base set (started first), then the two the runs alternate between.
    init(sets: [Subscriptions<BenchMessage>]) { self.sets = sets }

    func setUp() { rig = try! LoopRig(sets, initial: 0) }

    func run(_ iteration: Int) -> Int {
        rig!.select(1 + iteration & 1)
        return iteration
    }

    func finish() {
        if let rig, rig.driver.runningCount != sets[0].items.count {
            problems.append("\(rig.driver.runningCount) running, expected \(sets[0].items.count)")
        }
    }

    func tearDown() { rig = nil }
}

/// A raw sd-event side: `count` timers; a run replaces those at `positions`
/// (the oracle) or all of them (restart-all).
final class LoopChurnRaw: Benchmark {
    let count: Int
    let positions: [Int]
    // Plain buffers (a class's array property would cost a dynamic
    // exclusivity check per access, which a C program does not pay).
    private var loop: RawLoop?
    private var handle: OpaquePointer?
    private let sources: UnsafeMutablePointer<OpaquePointer?>
    private let intervals: UnsafeMutablePointer<UInt64>

    init(count: Int, positions: [Int]) {
        self.count = count
        self.positions = positions
        sources = .allocate(capacity: count)
        sources.initialize(repeating: nil, count: count)
        intervals = .allocate(capacity: count)
        for i in 0..<count { (intervals + i).initialize(to: usec(timerInterval(i))) }
    }

    deinit {
        sources.deallocate()
        intervals.deallocate()
    }

    @inline(__always)
    private func add(_ i: Int, _ handle: OpaquePointer) {
        var now: UInt64 = 0
        sd_event_now(handle, CLOCK_MONOTONIC, &now)
        sd_event_add_time(handle, sources + i, CLOCK_MONOTONIC, now &+ intervals[i], 1_000, { _, _, _ in 0 }, nil)
    }

    func setUp() {
        let loop = RawLoop()
        self.loop = loop
        handle = loop.handle
        for i in 0..<count { add(i, loop.handle) }
    }

    func run(_ iteration: Int) -> Int {
        let handle = handle!
        positions.withUnsafeBufferPointer { positions in
            for i in positions { sources[i] = sd_event_source_disable_unref(sources[i]) }
            for i in positions { add(i, handle) }
        }
        return iteration
    }

    func tearDown() {
        for i in 0..<count { sources[i] = sd_event_source_disable_unref(sources[i]) }
        handle = nil
        loop = nil
    }
}

func loopChurnBenchmark(count: Int, churns: [Int], budget: Budget, into records: inout [Record]) {
    let base = Subscriptions<BenchMessage>((0..<count).map { churnTimer($0, $0) })
    let copy = Subscriptions<BenchMessage>((0..<count).map { churnTimer($0, $0) })
    var crossover: Int?
    // LOOP_CHURN_ONLY=<percent> runs one churn level (for a profiler).
    let only = getenv("LOOP_CHURN_ONLY").flatMap { Int(String(cString: $0)) }
    for churn in churns where only == nil || only == churn {
        let changed = Subscriptions<BenchMessage>((0..<count).map {
            churnTimer(isChanged($0, churn: churn) ? $0 + replacementOffset : $0, $0)
        })
        let positions = (0..<count).filter { isChanged($0, churn: churn) }
        let ours = LoopChurnOurs(sets: [base, changed, copy])
        let cases: [any Benchmark] = [ours, LoopChurnRaw(count: count, positions: positions),
                                      LoopChurnRaw(count: count, positions: Array(0..<count))]
        let m = measureSideBySide(cases, budget) { if $0 == 0 { ours.finish() } }
        for p in ours.problems { warn("loop-churn \(churn)%: \(p)") }
        for (i, label) in ["ours", "oracle", "restart-all"].enumerated() {
            var r = Record(benchmark: "loop-churn", implementation: label, size: count, churn: churn, unit: "reconcile",
                           runs: m[i].runs, medianNanos: m[i].median, p99Nanos: m[i].p99, perSubscription: false,
                           driverCalls: Double(2 * (i == 2 ? count : positions.count)), allocations: m[i].allocationsPerRun,
                           variant: "fresh", rangeMin: m[i].rangeMin, rangeMax: m[i].rangeMax)
            if i == 0 {
                r.extra = [("ratio_ours_over_oracle", m[0].median / m[1].median),
                           ("ratio_ours_over_restart_all", m[0].median / m[2].median),
                           ("changed", Double(positions.count))]
                if positions.count > 0 { r.extra.append(("ns_per_changed_over_oracle", (m[0].median - m[1].median) / Double(positions.count))) }
            }
            records.append(r)
        }
        if crossover == nil && m[2].median < m[0].median { crossover = churn }
        progress("loop-churn \(churn)%: ours \(duration(m[0].median)), oracle \(duration(m[1].median)), restart-all \(duration(m[2].median))")
    }
    // The lowest churn at which restart-all was faster (-1: at none measured).
    if let i = records.lastIndex(where: { $0.benchmark == "loop-churn" && $0.implementation == "ours" }) {
        records[i].extra.append(("crossover_churn_percent", Double(crossover ?? -1)))
    }
}
