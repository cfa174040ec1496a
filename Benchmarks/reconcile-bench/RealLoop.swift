import CMallocCounter
import CSystemd
import Glibc
import Reconcile
import ReconcileSystemd

// The real loop: our runtime and sd-event driver against the same sd-event
// calls made directly.

/// An owned loop, a `SystemdDriver` and a runtime whose model selects one of
/// `sets`; everything on this thread. The loop has run once, so
/// `sd_event_now` is valid.
final class LoopRig {
    let loop: EventLoop
    let driver: SystemdDriver
    let runtime: Runtime<SelectProgram>

    init(_ sets: [Subscriptions<BenchMessage>], initial: Int = 0) throws {
        loop = try EventLoop()
        try loop.runOnce(timeout: .zero)
        driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
        runtime = Runtime(SelectProgram(sets: SetList(sets), initial: initial), driver: driver)
        try runtime.start()
    }

    func select(_ index: Int) { try! runtime.send(index) }

    deinit { runtime.shutdown() }
}

/// A bare `sd_event` for the raw baselines.
final class RawLoop {
    let handle: OpaquePointer

    init() {
        var e: OpaquePointer?
        precondition(sd_event_new(&e) >= 0, "sd_event_new")
        handle = e!
        _ = sd_event_run(handle, 0)
    }

    deinit { sd_event_unref(handle) }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
func monotonicNanos() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

/// The interval of timer `i` in the start/stop benchmarks: an hour and a bit,
/// so none fires and due times are not in start order.
func timerInterval(_ i: Int) -> Duration { .seconds(3600 + i % 60) }

// MARK: Start and stop

/// Results of the start/stop rounds of one side.
struct StartStop {
    var start: [Double] = []
    var stop: [Double] = []
    var startAllocations: [Double] = []
    var stopAllocations: [Double] = []
    var total: [Double] { zip(start, stop).map { $0 + $1 } }
    var allocations: [Double] { zip(startAllocations, stopAllocations).map { $0 + $1 } }
}

/// Starts and stops `count` sources `rounds` times through our runtime and
/// driver and through direct sd-event calls, alternating, after one warm-up
/// round each.
func startStopBenchmark(_ name: String, count: Int, rounds: Int,
                        ours: (_ round: Int) -> (start: () -> Void, stop: () -> Void),
                        raw: (_ round: Int) -> (start: () -> Void, stop: () -> Void),
                        note: String, into records: inout [Record]) {
    var a = StartStop(), b = StartStop()
    for round in -1..<rounds {
        for side in 0..<2 {
            let (start, stop) = side == 0 ? ours(round) : raw(round)
            let allocs = allocationCount
            let s = time(start)
            let middle = allocationCount
            let t = time(stop)
            let n = (Double(middle - allocs), Double(allocationCount - middle))
            guard round >= 0 else { continue }
            if side == 0 {
                a.start.append(s); a.stop.append(t); a.startAllocations.append(n.0); a.stopAllocations.append(n.1)
            } else {
                b.start.append(s); b.stop.append(t); b.startAllocations.append(n.0); b.stopAllocations.append(n.1)
            }
        }
    }
    let ratio = median(a.total) / median(b.total)
    for (label, r) in [("ours", a), ("raw", b)] {
        var extra = [("start_median_ns", median(r.start)), ("stop_median_ns", median(r.stop)),
                     ("start_allocations", median(r.startAllocations)), ("stop_allocations", median(r.stopAllocations))]
        extra.append(("start_allocations_per_source", median(r.startAllocations) / Double(count)))
        if label == "ours" {
            extra.append(("ratio_ours_over_raw", ratio))
            // The ratio per round (ours and raw alternate), its range.
            let perRound = zip(a.total, b.total).map { $0 / $1 }
            extra.append(("ratio_range_min", perRound.min() ?? .nan))
            extra.append(("ratio_range_max", perRound.max() ?? .nan))
            extra.append(("start_ratio", median(a.start) / median(b.start)))
            extra.append(("stop_ratio", median(a.stop) / median(b.stop)))
        }
        records.append(Record(
            benchmark: name, implementation: label, size: count, churn: nil, unit: "start+stop",
            runs: rounds, medianNanos: median(r.total), p99Nanos: p99(r.total),
            driverCalls: Double(2 * count), allocations: median(r.allocations), extra: extra,
            rangeMin: r.total.min(), rangeMax: r.total.max()))
    }
    progress("\(name): ours \(duration(median(a.total))), raw \(duration(median(b.total))), ratio \(significant(ratio)) (\(note))")
}

/// 10,000 timers: our runtime's reconcile (empty → all → empty) against
/// `sd_event_now` + `sd_event_add_time` and `sd_event_source_disable_unref`
/// (one sd-event source per timer, as a program without our driver has
/// them; ours share one per clock and accuracy, `TimerQueue`).
func loopTimersBenchmark(count: Int, rounds: Int, into records: inout [Record]) throws {
    let timers = Subscriptions<BenchMessage>((0..<count).map { i in
        Subscription.every(timerInterval(i), key: i, leeway: .milliseconds(1)) { _ in -1 }
    })
    // Before the rig: its runtime's wake-up source goes at its shutdown too.
    let liveBefore = EventSourceAccounting.live
    let rig = try LoopRig([.none, timers])
    let raw = RawLoop()
    // Plain buffers: a captured array would cost the raw side a dynamic
    // exclusivity check per access, which a C program does not pay.
    let sources = UnsafeMutablePointer<OpaquePointer?>.allocate(capacity: count)
    sources.initialize(repeating: nil, count: count)
    let intervals = UnsafeMutablePointer<UInt64>.allocate(capacity: count)
    for i in 0..<count { (intervals + i).initialize(to: usec(timerInterval(i))) }
    defer {
        sources.deallocate()
        intervals.deallocate()
    }
    let handle = raw.handle
    startStopBenchmark("loop-timers", count: count, rounds: rounds,
        ours: { _ in ({ rig.select(1) }, { rig.select(0) }) },
        raw: { _ in ({
            for i in 0..<count {
                var now: UInt64 = 0
                sd_event_now(handle, CLOCK_MONOTONIC, &now)
                sd_event_add_time(handle, sources + i, CLOCK_MONOTONIC, now &+ intervals[i], 1_000,
                                  { _, _, _ in 0 }, nil)
            }
        }, {
            for i in 0..<count { sources[i] = sd_event_source_disable_unref(sources[i]) }
        }) },
        note: "timers", into: &records)
    // Counted after the runtime has shut down: while attached, the timers'
    // queue keeps its one sd-event source (parked) for the next start.
    _ = rig.runtime.shutdown()
    if EventSourceAccounting.live != liveBefore { warn("loop-timers: \(EventSourceAccounting.live - liveBefore) sources left") }
}

/// A directory tree of `count` files in 100 directories, removed by `remove()`.
final class FileTree {
    let root: String
    let paths: [String]
    let parents: [String]

    init(count: Int) {
        let tmp = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
        var template = Array("\(tmp)/reconcile-bench-XXXXXX".utf8CString)
        root = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        let directories = max(1, min(100, count))
        for d in 0..<directories { mkdir("\(root)/d\(d)", 0o755) }
        var paths: [String] = [], parents: [String] = []
        for i in 0..<count {
            let parent = "\(root)/d\(i % directories)"
            let path = "\(parent)/unit-\(i).conf"
            let fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o644)
            if fd >= 0 { close(fd) }
            paths.append(path)
            parents.append(parent)
        }
        self.paths = paths
        self.parents = parents
    }

    func remove() {
        for p in paths { unlink(p) }
        for p in Set(parents) { rmdir(p) }
        rmdir(root)
    }
}

/// What `FileWatchRunner` asks of each directory it watches.
let directoryWatchMask = UInt32(IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CLOSE_WRITE | IN_ATTRIB
    | IN_DELETE_SELF | IN_MOVE_SELF)

/// `O_PATH` (not exported by Glibc's module without `_GNU_SOURCE`).
let benchOPath: Int32 = 0o10_000_000

/// 10,000 file watches: our runtime's reconcile against the calls the watch
/// makes, made directly. A watch resolves its path one component at a time
/// from `/` and watches every directory a name is looked up in, sharing one
/// inotify source per directory inode among all watches: per path, the
/// deferred flush source (priority, off; made by the first start and kept
/// off by a stop for the next, as a stopped runner keeps it), `open("/", O_PATH)` and its
/// `fstat`, and for each component the directory's inotify source when it
/// is not watched yet (its inode, the sharing key, from the `fstat` that
/// found it), `openat(O_PATH | O_NOFOLLOW)`, `fstat`, `close`. Stop: the flush
/// source turned off, and a directory's source when its last
/// watch goes. The raw side keeps its directory table in a dictionary, as
/// ours does. Both sides keep one inotify watch on `/` open, so sd-event
/// never closes and reopens its inotify fd.
func loopWatchesBenchmark(count: Int, rounds: Int, into records: inout [Record]) throws {
    let tree = FileTree(count: count)
    defer { tree.remove() }
    let watches = Subscriptions<BenchMessage>(tree.paths.map { path in Subscription.watch(path) { _ in -1 } })
    let liveBefore = EventSourceAccounting.live
    var rig: LoopRig? = try LoopRig([.none, watches])
    let raw = RawLoop()
    var keeper: OpaquePointer?
    precondition(sd_event_add_inotify(raw.handle, &keeper, "/", UInt32(IN_DELETE_SELF), { _, _, _ in 0 }, nil) >= 0)
    defer { sd_event_source_disable_unref(keeper) }
    struct Inode: Hashable { let device: UInt64; let inode: UInt64 }
    var directories: [Inode: (source: OpaquePointer?, users: Int)] = [:]
    // The directories each path watches (a raw program would keep them too).
    var used = [[Inode]](repeating: [], count: count)
    var defers = [OpaquePointer?](repeating: nil, count: count)
    let components = tree.paths.map { $0.split(separator: "/").map { strdup(String($0))! } }
    defer { for c in components { for p in c { free(p) } } }
    startStopBenchmark("loop-watches", count: count, rounds: rounds,
        ours: { _ in ({ rig!.select(1) }, { rig!.select(0) }) },
        raw: { _ in ({
            var st = stat()
            for i in 0..<count {
                if defers[i] == nil {
                    sd_event_add_defer(raw.handle, &defers[i], { _, _ in 0 }, nil)
                    sd_event_source_set_priority(defers[i], Int64(SD_EVENT_PRIORITY_NORMAL) + 10)
                    sd_event_source_set_enabled(defers[i], Int32(SD_EVENT_OFF))
                }
                var dir = open("/", benchOPath | O_DIRECTORY | O_CLOEXEC)
                _ = fstat(dir, &st)
                for name in components[i] {
                    // `st` is the directory's: `/`, then the name just entered.
                    let key = Inode(device: UInt64(st.st_dev), inode: UInt64(st.st_ino))
                    if directories[key] != nil {
                        directories[key]!.users += 1
                    } else {
                        var s: OpaquePointer?
                        if sd_event_add_inotify_fd(raw.handle, &s, dir, directoryWatchMask, { _, _, _ in 0 }, nil) < 0 {
                            warn("raw sd_event_add_inotify_fd failed")
                        }
                        directories[key] = (s, 1)
                    }
                    used[i].append(key)
                    let fd = openat(dir, name, benchOPath | O_NOFOLLOW | O_CLOEXEC)
                    _ = fstat(fd, &st)
                    close(dir)
                    dir = fd
                }
                close(dir)
            }
        }, {
            for i in 0..<count {
                sd_event_source_set_enabled(defers[i], Int32(SD_EVENT_OFF))
                for key in used[i] {
                    directories[key]!.users -= 1
                    if directories[key]!.users == 0 {
                        sd_event_source_disable_unref(directories[key]!.source)
                        directories[key] = nil
                    }
                }
                used[i].removeAll(keepingCapacity: true)
            }
        }) },
        note: "file watches", into: &records)
    for i in defers.indices { defers[i] = sd_event_source_disable_unref(defers[i]) }
    // Counted after the runtime has shut down: while attached, the driver
    // keeps one watch on `/` (its inotify keeper) and each spare (stopped)
    // watch runner keeps its flush source off for reuse, released at detach
    // (a check made before that read those 10,000 as "left").
    rig = nil
    if EventSourceAccounting.live != liveBefore { warn("loop-watches: \(EventSourceAccounting.live - liveBefore) sources left") }
}

// MARK: Timer lateness

/// Collects how late each tick arrived, in nanoseconds past its due time.
final class LatenessProbe {
    var ours: [Double] = []
    var raw: [Double] = []
    var origin: UInt64 = 0      // µs, the driver timer's start (sd_event_now)
    var interval: UInt64 = 0    // µs
}

/// One repeating timer through the runtime; `update` notes its lateness.
struct TickProgram: Program {
    let probe: LatenessProbe
    let interval: Duration

    func start() -> (Int, [Never]) { (0, []) }
    func update(_ model: inout Int, _ message: TimerSource.Event) -> [Never] {
        let now = monotonicNanos()
        if case .tick(let t) = message {
            let due = Int64(probe.origin &+ t.sequence &* probe.interval) * 1_000
            probe.ours.append(Double(now - due))
        }
        return []
    }
    func subscriptions(_ model: Int) -> Subscriptions<TimerSource.Event> {
        Subscriptions { Subscription.every(interval, key: "lateness", leeway: .microseconds(1)) { $0 } }
    }
}

/// A repeating timer through the runtime and one made directly on the same
/// loop, half an interval apart, both with 1 µs accuracy: how late each tick
/// reaches `update` (ours) or the sd-event callback (raw).
func latenessBenchmark(ticks: Int, interval: Duration, into records: inout [Record]) throws {
    let probe = LatenessProbe()
    let loop = try EventLoop()
    try loop.runOnce(timeout: .zero)
    let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
    probe.interval = usec(interval)
    probe.origin = loop.now()   // what the timer runner reads when it starts, in this same iteration
    let runtime = Runtime(TickProgram(probe: probe, interval: interval), driver: driver)
    try runtime.start()
    var raw: OpaquePointer?
    let r = sd_event_add_time(loop.handle, &raw, CLOCK_MONOTONIC, probe.origin + probe.interval * 3 / 2, 1, { s, usec, ud in
        let now = monotonicNanos()
        let probe = Unmanaged<LatenessProbe>.fromOpaque(ud!).takeUnretainedValue()
        probe.raw.append(Double(now - Int64(usec) * 1_000))
        sd_event_source_set_time(s, usec + probe.interval)
        sd_event_source_set_enabled(s, Int32(SD_EVENT_ONESHOT))
        return 0
    }, Unmanaged.passUnretained(probe).toOpaque())
    precondition(r >= 0, "sd_event_add_time")
    let done = try loop.run(until: { probe.ours.count >= ticks && probe.raw.count >= ticks },
                            timeout: interval * (ticks + 50))
    if !done { warn("lateness: only \(probe.ours.count) + \(probe.raw.count) ticks") }
    sd_event_source_disable_unref(raw)
    runtime.shutdown()
    for (label, values) in [("ours", probe.ours), ("raw", probe.raw)] {
        records.append(Record(
            benchmark: "lateness", implementation: label, size: 1, churn: nil, unit: "tick",
            runs: values.count, medianNanos: median(values), p99Nanos: p99(values), perSubscription: false,
            extra: [("interval_ns", Double(interval.nanoseconds))]))
    }
    progress("lateness: ours \(duration(median(probe.ours))) / p99 \(duration(p99(probe.ours))), raw \(duration(median(probe.raw))) / p99 \(duration(p99(probe.raw)))")
}

// MARK: No-op reconciles on the real loop

/// 10,000 live sources on a real loop (timers, file watches, signals) under
/// a runtime whose model changes on every message while its set does not.
final class NoopRig {
    static let signals: [SignalSource.Signal] = [.hangup, .user1, .user2]
    let tree: FileTree
    let rig: LoopRig
    let count: Int

    init(count: Int) throws {
        // Signal sources need their signals blocked in every thread; this
        // process has one thread. SIGINT and SIGTERM are left alone.
        try Signals.block(Self.signals)
        let watches = count * 4 / 10
        let timers = count - watches - Self.signals.count
        tree = FileTree(count: watches)
        // Three equal sets, each built anew (as `subscriptions(model)` builds
        // one): the first starts the sources, the reconciles alternate
        // between the other two, so no box is pointer-equal to a running one.
        let paths = tree.paths
        func build() -> Subscriptions<BenchMessage> {
            var subs: [Subscription<BenchMessage>] = []
            for i in 0..<timers { subs.append(.every(timerInterval(i), key: i) { _ in -1 }) }
            for p in paths { subs.append(.watch(String(decoding: Array(p.utf8), as: UTF8.self)) { _ in -1 }) }
            for s in Self.signals { subs.append(.signal(s) { _ in -1 }) }
            return Subscriptions(subs)
        }
        let first = build()
        self.count = first.items.count
        rig = try LoopRig([.none, first, build(), build()])
        rig.select(1)
        precondition(rig.driver.runningCount == count, "\(rig.driver.runningCount) of \(count) running")
    }

    private var flip = 0

    /// One no-op reconcile: the model changes, the set is built anew with
    /// the same content.
    func reconcile() {
        flip ^= 1
        rig.select(2 + flip)
    }

    var stats: RuntimeStats { rig.runtime.stats }

    deinit {
        rig.select(0)
        tree.remove()
    }
}

/// A no-op reconcile of 10,000 live sources on the real loop, timed.
final class LoopNoopCase: Benchmark {
    let count: Int
    private var rig: NoopRig?
    private(set) var problems: [String] = []
    private var before = RuntimeStats()

    init(count: Int) { self.count = count }

    func setUp() {
        rig = try! NoopRig(count: count)
        before = rig!.stats
    }

    func run(_ iteration: Int) -> Int {
        rig!.reconcile()
        return iteration
    }

    func finish() {
        let s = rig!.stats
        if s.starts != before.starts || s.stops != before.stops || s.retunes != before.retunes {
            problems.append("driver calls during no-op reconciles")
        }
    }

    func tearDown() { rig = nil }
}

func loopNoopBenchmark(count: Int, budget: Budget, into records: inout [Record]) {
    let c = LoopNoopCase(count: count)
    let m = measure(c, budget, after: c.finish)
    for p in c.problems { warn("loop-noop: \(p)") }
    records.append(Record(
        benchmark: "loop-noop", implementation: Implementation.ours.rawValue, size: count, churn: 0,
        unit: "reconcile", runs: m.runs, medianNanos: m.median, p99Nanos: m.p99,
        driverCalls: 0, allocations: m.allocationsPerRun, variant: "fresh", rangeMin: m.rangeMin, rangeMax: m.rangeMax))
    progress("loop-noop \(count): \(duration(m.median))")
}

/// `--noop-reconciles N`: sets up 10,000 live sources, writes `noop-begin` to
/// standard error, performs N no-op reconciles, writes `noop-end`, reports.
/// Between the two markers `strace -f` should show nothing.
func noopReconcilesMode(_ n: Int, count: Int) throws {
    let rig = try NoopRig(count: count)
    let before = rig.stats
    let allocations = allocationCount
    marker("noop-begin\n")
    let clock = ContinuousClock()
    let t0 = clock.now
    for _ in 0..<n { rig.reconcile() }
    let elapsed = clock.now - t0
    marker("noop-end\n")
    let after = rig.stats
    let allocated = allocationCount - allocations
    print("live sources: \(rig.count) (sd-event sources: \(EventSourceAccounting.live))")
    print("no-op reconciles: \(after.reconciles - before.reconciles) in \(duration(Double(elapsed.nanoseconds)))"
        + (n > 0 ? ", \(duration(Double(elapsed.nanoseconds) / Double(n))) each" : ""))
    print("driver calls during them: \(after.starts - before.starts + after.stops - before.stops + after.retunes - before.retunes)")
    print("heap allocations during them: \(allocated)")
}

/// Writes `text` to standard error with one `write` (a marker in a trace).
func marker(_ text: StaticString) {
    _ = write(2, text.utf8Start, text.utf8CodeUnitCount)
}
