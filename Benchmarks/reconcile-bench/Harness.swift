import CMallocCounter

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
    /// Rounds over the implementations of one scenario (side-by-side runs).
    var rounds: Int

    static let full = Budget(time: .milliseconds(400), minRuns: 7, maxRuns: 3000, rounds: 7)
    static let quick = Budget(time: .milliseconds(40), minRuns: 5, maxRuns: 400, rounds: 3)
}

/// What the timed runs of one case measured.
struct Measurement {
    /// Nanoseconds per run, sorted.
    var nanos: [Double]
    /// Heap allocations during the timed runs.
    var allocations: Int64

    var runs: Int { nanos.count }
    var median: Double { percentile(0.5) }
    var p99: Double { percentile(0.99) }
    var allocationsPerRun: Double { Double(allocations) / Double(max(1, runs)) }

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

/// Runs `benchmark`: setUp, a warm-up (at least two runs, about a tenth of the
/// budget), timed runs until the budget is spent, tearDown.
func measure(_ benchmark: some Benchmark, _ budget: Budget, unitsPerRun: Int = 1, after: () -> Void = {}) -> Measurement {
    benchmark.setUp()
    defer { benchmark.tearDown() }
    let clock = ContinuousClock()
    var sink = 0
    var iteration = 0
    let warmStart = clock.now
    while iteration < 2 || (iteration < 200 && clock.now - warmStart < budget.time / 10) {
        sink &+= benchmark.run(iteration)
        iteration += 1
    }
    var nanos = [Double]()
    nanos.reserveCapacity(budget.maxRuns)
    let allocationsBefore = CMallocCounter_allocations()
    let start = clock.now
    while nanos.count < budget.minRuns || (nanos.count < budget.maxRuns && clock.now - start < budget.time) {
        let t0 = clock.now
        sink &+= benchmark.run(iteration)
        let t1 = clock.now
        nanos.append(Double((t1 - t0).nanoseconds) / Double(unitsPerRun))
        iteration += 1
    }
    let allocations = CMallocCounter_allocations() - allocationsBefore
    blackHole(sink)
    after()
    nanos.sort()
    return Measurement(nanos: nanos, allocations: allocations / Int64(unitsPerRun))
}

/// Runs several benchmarks of one scenario side by side: all are set up,
/// each warms up, then `budget.rounds` rounds give each benchmark in turn a
/// block of timed runs (a share of the budget, at least a share of
/// `minRuns`). A disturbance from outside the process then falls on every
/// implementation alike instead of on whichever ran at the time, and caches
/// stay warm within a block. `after(i)` runs before the tear-downs.
func measureSideBySide(_ benchmarks: [any Benchmark], _ budget: Budget, after: (Int) -> Void = { _ in }) -> [Measurement] {
    for b in benchmarks { b.setUp() }
    defer { for b in benchmarks { b.tearDown() } }
    let clock = ContinuousClock()
    var sink = 0
    var iterations = [Int](repeating: 0, count: benchmarks.count)
    for (i, b) in benchmarks.enumerated() {
        let warmStart = clock.now
        while iterations[i] < 2 || (iterations[i] < 200 && clock.now - warmStart < budget.time / 10) {
            sink &+= b.run(iterations[i])
            iterations[i] += 1
        }
    }
    let rounds = max(1, budget.rounds)
    let blockTime = budget.time / rounds
    let minPerBlock = (budget.minRuns + rounds - 1) / rounds
    let maxPerBlock = max(1, budget.maxRuns / rounds)
    var nanos = [[Double]](repeating: [], count: benchmarks.count)
    for i in nanos.indices { nanos[i].reserveCapacity(maxPerBlock * rounds) }
    var allocations = [Int64](repeating: 0, count: benchmarks.count)
    for _ in 0..<rounds {
        for (i, b) in benchmarks.enumerated() {
            let allocationsBefore = CMallocCounter_allocations()
            let start = clock.now
            var runs = 0
            while runs < minPerBlock || (runs < maxPerBlock && clock.now - start < blockTime) {
                let t0 = clock.now
                sink &+= b.run(iterations[i])
                let t1 = clock.now
                nanos[i].append(Double((t1 - t0).nanoseconds))
                iterations[i] += 1
                runs += 1
            }
            allocations[i] += CMallocCounter_allocations() - allocationsBefore
        }
    }
    blackHole(sink)
    for i in benchmarks.indices { after(i) }
    return benchmarks.indices.map { Measurement(nanos: nanos[$0].sorted(), allocations: allocations[$0]) }
}

/// Times `body` once.
func time(_ body: () -> Void) -> Double {
    let clock = ContinuousClock()
    let t0 = clock.now
    body()
    return Double((clock.now - t0).nanoseconds)
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
