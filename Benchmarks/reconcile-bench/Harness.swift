import CMallocCounter
import Glibc

/// One timed case, in the shape of swift-nio's performance tester: set up,
/// run (one unit of work per call, warm-up first), tear down.
protocol Benchmark: AnyObject {
    /// Builds the state the runs need (untimed).
    func setUp()
    /// Does one unit of work; `iteration` counts from 0 across warm-up and
    /// timed runs. Returns a value so the work cannot be optimised away.
    func run(_ iteration: Int) -> Int
    /// Releases the state (untimed).
    func tearDown()
}

/// How long and how often to run a case.
struct Budget {
    /// Timed runs stop after this much time, once `minRuns` are done.
    var time: Duration
    var minRuns: Int
    var maxRuns: Int
    /// Repetitions: rounds over the implementations of one scenario
    /// (side-by-side runs); the range reported is over their medians.
    var rounds: Int

    static let full = Budget(time: .milliseconds(400), minRuns: 7, maxRuns: 3000, rounds: 7)
    static let quick = Budget(time: .milliseconds(40), minRuns: 5, maxRuns: 400, rounds: 3)
}

/// Whether timed runs read the wall clock (`--wall`) instead of this
/// thread's CPU time (the default: on a shared machine another process's
/// work does not count against ours).
nonisolated(unsafe) var timesWallClock = false

/// The clock timed runs read, in nanoseconds: this thread's CPU time (user
/// and system), or `CLOCK_MONOTONIC` with `--wall`.
@inline(__always)
func timerNanos() -> Int64 {
    var ts = timespec()
    clock_gettime(timesWallClock ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

/// What the timed runs of one case measured.
struct Measurement {
    /// Nanoseconds per run, sorted.
    var nanos: [Double]
    /// Heap allocations during the timed runs.
    var allocations: Int64
    /// The median of each repetition (block of runs), in order.
    var repetitionMedians: [Double] = []
    /// Runs the allocations were counted over (samples × runs per sample;
    /// 0: one run per sample).
    var countedRuns = 0

    var runs: Int { nanos.count }
    var median: Double { percentile(0.5) }
    var p99: Double { percentile(0.99) }
    var allocationsPerRun: Double { Double(allocations) / Double(max(1, countedRuns > 0 ? countedRuns : runs)) }
    /// The least and greatest repetition median.
    var rangeMin: Double { repetitionMedians.min() ?? .nan }
    var rangeMax: Double { repetitionMedians.max() ?? .nan }

    /// Nearest-rank percentile; the median of an even count is the mean of
    /// the two middle runs.
    func percentile(_ p: Double) -> Double {
        guard !nanos.isEmpty else { return .nan }
        if p == 0.5 {
            let n = nanos.count
            return n % 2 == 1 ? nanos[n / 2] : (nanos[n / 2 - 1] + nanos[n / 2]) / 2
        }
        let rank = Int((p * Double(nanos.count)).rounded(.up))
        return nanos[min(nanos.count, max(1, rank)) - 1]
    }
}

/// Runs `benchmark` alone, as `measureSideBySide` does (at least three
/// repetitions); `unitsPerRun` divides each run's time and allocations.
func measure(_ benchmark: some Benchmark, _ budget: Budget, unitsPerRun: Int = 1, after: () -> Void = {}) -> Measurement {
    var b = budget
    b.rounds = max(3, budget.rounds)
    var m = measureSideBySide([benchmark], b, after: { _ in after() })[0]
    if unitsPerRun > 1 {
        m.nanos = m.nanos.map { $0 / Double(unitsPerRun) }
        m.repetitionMedians = m.repetitionMedians.map { $0 / Double(unitsPerRun) }
        m.countedRuns *= unitsPerRun
    }
    return m
}

/// Runs several benchmarks of one scenario side by side: all are set up,
/// each warms up, then `budget.rounds` rounds (repetitions, at least three)
/// give each benchmark in turn a block of timed runs (a share of the
/// budget, at least a share of `minRuns`). A disturbance from outside the
/// process then falls on every implementation alike instead of on whichever
/// ran at the time, and caches stay warm within a block. Runs are timed in
/// this thread's CPU time (`timerNanos`); a run shorter than about 20 µs is
/// timed in batches (the clock is a system call), an even number of runs
/// per batch so the alternating cases stay balanced. `after(i)` runs before
/// the tear-downs.
func measureSideBySide(_ benchmarks: [any Benchmark], _ budget: Budget, after: (Int) -> Void = { _ in }) -> [Measurement] {
    for b in benchmarks { b.setUp() }
    defer { for b in benchmarks { b.tearDown() } }
    let clock = ContinuousClock()
    var sink = 0
    var iterations = [Int](repeating: 0, count: benchmarks.count)
    var batches = [Int](repeating: 1, count: benchmarks.count)
    for (i, b) in benchmarks.enumerated() {
        let warmStart = clock.now
        let cpu0 = timerNanos()
        while iterations[i] < 2 || (iterations[i] < 200 && clock.now - warmStart < budget.time / 10) {
            sink &+= b.run(iterations[i])
            iterations[i] += 1
        }
        let perRun = max(1, Double(timerNanos() - cpu0) / Double(iterations[i]))
        var batch = max(1, Int((20_000 / perRun).rounded(.up)))
        if batch > 1 && batch % 2 == 1 { batch += 1 }
        batches[i] = batch
    }
    let rounds = max(3, budget.rounds)
    let blockTime = budget.time / rounds
    let minPerBlock = (budget.minRuns + rounds - 1) / rounds
    let maxPerBlock = max(1, budget.maxRuns / rounds)
    var nanos = [[Double]](repeating: [], count: benchmarks.count)
    for i in nanos.indices { nanos[i].reserveCapacity(maxPerBlock * rounds) }
    var blockMedians = [[Double]](repeating: [], count: benchmarks.count)
    var allocations = [Int64](repeating: 0, count: benchmarks.count)
    var counted = [Int](repeating: 0, count: benchmarks.count)
    var block: [Double] = []
    block.reserveCapacity(maxPerBlock)
    for _ in 0..<rounds {
        for (i, b) in benchmarks.enumerated() {
            block.removeAll(keepingCapacity: true)
            let allocationsBefore = CMallocCounter_allocations()
            let start = clock.now
            let batch = batches[i]
            while block.count < minPerBlock || (block.count < maxPerBlock && clock.now - start < blockTime) {
                let t0 = timerNanos()
                for _ in 0..<batch {
                    sink &+= b.run(iterations[i])
                    iterations[i] += 1
                }
                let t1 = timerNanos()
                block.append(Double(t1 - t0) / Double(batch))
                counted[i] += batch
            }
            allocations[i] += CMallocCounter_allocations() - allocationsBefore
            nanos[i].append(contentsOf: block)
            blockMedians[i].append(median(block))
        }
    }
    blackHole(sink)
    for i in benchmarks.indices { after(i) }
    return benchmarks.indices.map { i in
        Measurement(nanos: nanos[i].sorted(), allocations: allocations[i],
                    repetitionMedians: blockMedians[i], countedRuns: counted[i])
    }
}

/// Times `body` once, on the benchmark clock (`timerNanos`).
func time(_ body: () -> Void) -> Double {
    let t0 = timerNanos()
    body()
    return Double(timerNanos() - t0)
}

/// The load averages (1, 5, 15 minutes) and the runnable and total task
/// counts, as `/proc/loadavg` has them.
func machineLoad() -> String {
    guard let f = fopen("/proc/loadavg", "r") else { return "unknown" }
    defer { fclose(f) }
    var buffer = [CChar](repeating: 0, count: 128)
    guard fgets(&buffer, Int32(buffer.count), f) != nil else { return "unknown" }
    let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return String(text.filter { $0 != "\n" })
}

/// Keeps `value` alive in the optimiser's eyes.
@inline(never)
func blackHole(_ value: Int) {
    if value == 0x5eed_5eed_5eed { print("") }
}

extension Duration {
    /// Whole nanoseconds.
    var nanoseconds: Int64 {
        let (s, atto) = components
        return s * 1_000_000_000 + atto / 1_000_000_000
    }
}

/// The median of `values` (unsorted is fine).
func median(_ values: [Double]) -> Double {
    Measurement(nanos: values.sorted(), allocations: 0).median
}

/// The nearest-rank 99th percentile of `values`.
func p99(_ values: [Double]) -> Double {
    Measurement(nanos: values.sorted(), allocations: 0).p99
}

/// Heap bytes allocated minus freed (usable sizes) while tracking was on,
/// from the malloc shim: compare two readings inside `withHeapBytesTracked`.
var liveHeapBytes: Int64 { CMallocCounter_liveBytes() }

/// Runs `body` with the shim tracking bytes in use (off otherwise: it costs
/// a `malloc_usable_size` per allocation and free).
func withHeapBytesTracked<T>(_ body: () throws -> T) rethrows -> T {
    CMallocCounter_trackBytes(1)
    defer { CMallocCounter_trackBytes(0) }
    return try body()
}

/// Heap allocations so far, from the malloc shim.
var allocationCount: Int64 { CMallocCounter_allocations() }
