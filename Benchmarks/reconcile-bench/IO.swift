import CSystemd
import Glibc
import Reconcile
import ReconcileSystemd

// MARK: Descriptors and listeners on the real loop

/// Counts the lines of one descriptor, and the connections of one listener.
struct CountingProgram: Program {
    /// (`open` by identity: a connection's end removes it without a pass
    /// over the others, whose cost would be this program's, not the
    /// runtime's; the hand-written accept loop keeps no list at all.)
    struct Model: Equatable { var lines = 0; var ended = false; var accepted = 0; var open: [UInt64: Connection] = [:] }
    enum Message { case descriptor(DescriptorSource.Event), listener(ListenerSource.Event), connection(UInt64, DescriptorSource.Event) }
    let fd: Int32
    let listening: Bool
    /// `Subscription.lines(fd, batched: true)`: a dispatch's lines as one message.
    var batched = false

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .descriptor(.line): model.lines += 1
        case .descriptor(.lines(let lines)):
            // Each line made a String and looked at, as the hand-written
            // reader does (a batch makes a line's string when it is read).
            for line in lines { model.lines += line.isEmpty ? 0 : 1 }
        case .descriptor(.endOfFile): model.ended = true
        case .listener(.accepted(let c)):
            model.accepted += 1
            model.open[c.id] = c
        case .connection(let id, .endOfFile), .connection(let id, .failed):
            model.open[id] = nil
        default: break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        if listening {
            return Subscriptions {
                Subscription.listen(fd, name: "bench", connectionLimit: 1 << 20) { .listener($0) }
                model.open.values.map { c in Subscription.connection(c) { .connection(c.id, $0) } }
            }
        }
        return Subscriptions { Subscription.lines(fd, batched: batched) { .descriptor($0) } }
    }
}

/// A thread that writes `count` 64-byte lines to `fd`, then closes it.
func startWriter(_ fd: Int32, lines count: Int) {
    final class Job { let fd: Int32; let count: Int; init(_ fd: Int32, _ count: Int) { self.fd = fd; self.count = count } }
    var thread = pthread_t()
    pthread_create(&thread, nil, { arg in
        let job = Unmanaged<Job>.fromOpaque(arg!).takeRetainedValue()
        var block = [UInt8]()
        for _ in 0..<1024 { block += Array(String(repeating: "x", count: 63).utf8) + [10] }
        var left = job.count
        while left > 0 {
            let n = min(left, 1024)
            var off = 0
            let bytes = n * 64
            while off < bytes {
                let w = block.withUnsafeBytes { write(job.fd, $0.baseAddress! + off, bytes - off) }
                if w <= 0 { break }
                off += w
            }
            left -= n
        }
        close(job.fd)
        return nil
    }, Unmanaged.passRetained(Job(fd, count)).toOpaque())
    pthread_detach(thread)
}

/// A thread that connects to the unix socket at `path` `count` times, closing each.
func startConnector(_ path: String, connections count: Int) {
    final class Job { let path: String; let count: Int; init(_ p: String, _ c: Int) { path = p; count = c } }
    var thread = pthread_t()
    pthread_create(&thread, nil, { arg in
        let job = Unmanaged<Job>.fromOpaque(arg!).takeRetainedValue()
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: Array(job.path.utf8)) }
        for _ in 0..<job.count {
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            while withUnsafePointer(to: &addr, { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }) != 0 {
                usleep(100)   // the backlog is full: the loop is behind
            }
            close(fd)
        }
        return nil
    }, Unmanaged.passRetained(Job(path, count)).toOpaque())
    pthread_detach(thread)
}

/// What the hand-written sd-event reader counts.
///
/// Its fields' exclusivity is unchecked, as the runtime's hot fields are:
/// checked, each line's `counter.model` and `counter.lines` access cost the
/// baseline ~165 instructions of `swift_beginAccess` (callgrind), a cost
/// the runtime does not pay, so the baseline flattered us.
final class RawCounter {
    @exclusivity(unchecked) var lines = 0
    @exclusivity(unchecked) var ended = false
    @exclusivity(unchecked) var accepted = 0
    /// The fair variant's `update` (the program's own, called through a
    /// closure once per line, as the runtime calls it) and its model.
    @exclusivity(unchecked) var update: ((inout CountingProgram.Model, CountingProgram.Message) -> [Never])?
    @exclusivity(unchecked) var model = CountingProgram.Model()
    /// The reader's buffer, made once (as a hand-written reader would).
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 << 10, alignment: 16)
    deinit { buffer.deallocate() }
}

/// Lines per second through `Subscription.lines` to `update`, against a
/// hand-written `sd_event_add_io` reader (64 KiB reads, memchr) in the same
/// run, timed by the loop thread's CPU time (the writer runs on a thread of
/// its own; `--wall`: the wall clock); then
/// connections accepted per second through `Subscription.listen` against a
/// hand-written accept loop, and a timer's lateness under a flood.
func ioBenchmark(lines count: Int, connections: Int, rounds: Int, into records: inout [Record]) throws {
    try ioLinesBenchmark(lines: count, rounds: rounds, into: &records)
    try ioAcceptsBenchmark(connections: connections, rounds: rounds, into: &records)
    try ioFloodBenchmark(connections: 100, seconds: rounds > 3 ? 3 : 1, into: &records)
}

/// The lines part of `io` (alone: `io-lines`, for a profiler).
func ioLinesBenchmark(lines count: Int, rounds: Int, into records: inout [Record]) throws {
    var ours: [Double] = [], oursBatched: [Double] = [], raw: [Double] = [], rawUpdate: [Double] = []
    // Lines `update` saw per reconcile (about: per dispatch's batch), which
    // says how much per-dispatch work (epoll, the batch, the reconcile of a
    // changed model) each line carries.
    var linesPerReconcile: [Double] = []
    for _ in 0..<rounds {
        // Ours: one `.line` per line (the default), then `batched: true`
        // (one `.lines` per dispatch).
        for batched in [false, true] {
            var pair: [Int32] = [0, 0]
            precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            let runtime = Runtime(CountingProgram(fd: pair[0], listening: false, batched: batched), driver: driver)
            try runtime.start()
            let began = timerNanos()
            startWriter(pair[1], lines: count)
            _ = try loop.run(until: { runtime.model.ended }, timeout: .seconds(120))
            let elapsed = Double(timerNanos() - began)
            if runtime.model.lines != count { warn("io: ours read \(runtime.model.lines) of \(count) lines") }
            if batched {
                oursBatched.append(Double(count) / (elapsed / 1e9))
            } else {
                ours.append(Double(count) / (elapsed / 1e9))
                linesPerReconcile.append(Double(runtime.stats.messages) / Double(max(1, runtime.stats.reconciles + runtime.stats.skippedReconciles)))
            }
            runtime.shutdown()
            close(pair[0])
        }
        // Hand-written; then the same with the program's `update` per line.
        for withUpdate in [false, true] {
            var pair: [Int32] = [0, 0]
            precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &pair) == 0)
            let flags = fcntl(pair[1], F_GETFL)
            _ = fcntl(pair[1], F_SETFL, flags & ~O_NONBLOCK)
            let loop = try EventLoop()
            let counter = RawCounter()
            if withUpdate {
                let program = CountingProgram(fd: pair[0], listening: false)
                counter.update = { program.update(&$0, $1) }
            }
            var source: OpaquePointer?
            precondition(sd_event_add_io(loop.handle, &source, pair[0], UInt32(EPOLLIN.rawValue), { s, fd, _, ud in
                let counter = Unmanaged<RawCounter>.fromOpaque(ud!).takeUnretainedValue()
                let n = read(fd, counter.buffer.baseAddress, counter.buffer.count)
                if n == 0 {
                    counter.ended = true
                    sd_event_source_set_enabled(s, Int32(SD_EVENT_OFF))
                    return 0
                }
                guard n > 0 else { return 0 }
                // Each line made a String and handled, as a daemon would (a
                // line split across two reads is counted once, at its newline;
                // its first part is not carried over: a lower bound on the work).
                do {
                    var p = UnsafeRawPointer(counter.buffer.baseAddress!), left = n
                    while left > 0, let hit = memchr(p, 10, left) {
                        let used = p.distance(to: UnsafeRawPointer(hit)) + 1
                        let line = String(decoding: UnsafeRawBufferPointer(start: p, count: used - 1), as: UTF8.self)
                        counter.lines += line.isEmpty ? 0 : 1
                        if let update = counter.update { _ = update(&counter.model, .descriptor(.line(line))) }
                        p += used
                        left -= used
                    }
                }
                return 0
            }, Unmanaged.passUnretained(counter).toOpaque()) >= 0)
            let began = timerNanos()
            startWriter(pair[1], lines: count)
            _ = try loop.run(until: { counter.ended }, timeout: .seconds(120))
            let elapsed = Double(timerNanos() - began)
            if withUpdate {
                rawUpdate.append(Double(counter.lines) / (elapsed / 1e9))
            } else {
                raw.append(Double(counter.lines) / (elapsed / 1e9))
            }
            sd_event_source_disable_unref(source)
            close(pair[0])
        }
    }
    records.append(Record(benchmark: "io", implementation: "ours", size: count, churn: nil, unit: "line", runs: rounds,
                          medianNanos: 1e9 / median(ours), p99Nanos: 1e9 / (ours.min() ?? 1), perSubscription: false,
                          extra: [("lines_per_second", median(ours)), ("ratio_to_raw", median(ours) / median(raw)),
                                  ("ratio_to_raw_update", median(ours) / median(rawUpdate)),
                                  ("paired_ratio_to_raw", paired(ours, raw)),
                                  ("lines_per_reconcile", median(linesPerReconcile))]))
    records.append(Record(benchmark: "io", implementation: "ours-batched", size: count, churn: nil, unit: "line", runs: rounds,
                          medianNanos: 1e9 / median(oursBatched), p99Nanos: 1e9 / (oursBatched.min() ?? 1), perSubscription: false,
                          extra: [("lines_per_second", median(oursBatched)), ("ratio_to_raw", median(oursBatched) / median(raw)),
                                  ("ratio_to_raw_update", median(oursBatched) / median(rawUpdate)),
                                  ("paired_ratio_to_raw", paired(oursBatched, raw))]))
    records.append(Record(benchmark: "io", implementation: "raw", size: count, churn: nil, unit: "line", runs: rounds,
                          medianNanos: 1e9 / median(raw), p99Nanos: 1e9 / (raw.min() ?? 1), perSubscription: false,
                          extra: [("lines_per_second", median(raw))]))
    records.append(Record(benchmark: "io", implementation: "raw-update", size: count, churn: nil, unit: "line", runs: rounds,
                          medianNanos: 1e9 / median(rawUpdate), p99Nanos: 1e9 / (rawUpdate.min() ?? 1), perSubscription: false,
                          extra: [("lines_per_second", median(rawUpdate))]))
    progress("io lines: ours \(Int(median(ours)))/s, hand-written sd_event_add_io \(Int(median(raw)))/s, ratio \(format2(median(ours) / median(raw))); hand-written + update per line \(Int(median(rawUpdate)))/s, ratio \(format2(median(ours) / median(rawUpdate))); \(Int(median(linesPerReconcile))) lines per reconcile; batched (one .lines per dispatch) \(Int(median(oursBatched)))/s, ratio \(format2(median(oursBatched) / median(raw))); per round (median of each round's ratio to the reader): per line \(format2(paired(ours, raw))), batched \(format2(paired(oursBatched, raw)))")
}

/// The accepts part of `io` (alone: `io-accepts`, for a profiler).
func ioAcceptsBenchmark(connections: Int, rounds: Int, into records: inout [Record]) throws {
    // Connections accepted per second (of the loop thread's CPU time, as
    // the lines; `--wall`: the wall clock).
    // The hand-written accept loop closes each connection at once; the
    // fair variant (`raw-read`) watches each with sd_event_add_io and
    // reads it to its end before closing it, as ours does.
    var oursAccepts: [Double] = [], rawAccepts: [Double] = [], rawReadAccepts: [Double] = []
    // Ours: the most connections open at once (accepted, not yet read to
    // their end and stopped) and the accepts per reconcile, which say how
    // much reconciling (a set of every open connection) each accept carries.
    var mostOpenSeen: [Double] = [], acceptsPerReconcile: [Double] = []
    // IO_ACCEPTS_ONLY=ours|raw|raw-read runs one implementation (for a
    // profiler; its ratios are then not computed).
    let only = getenv("IO_ACCEPTS_ONLY").map { String(cString: $0) }
    if let only { warn("io accepts: IO_ACCEPTS_ONLY=\(only): only that implementation runs, no ratios") }
    for round in 0..<rounds {
        for (hand, reads) in [(false, false), (true, false), (true, true)] {
            if let only, only != (hand ? (reads ? "raw-read" : "raw") : "ours") { continue }
            let tmp = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
            var template = Array((tmp + "/reconcile-bench-XXXXXX").utf8CString)
            guard let dir = mkdtemp(&template) else { fail("mkdtemp") }
            let path = String(cString: dir) + "/b\(round).sock"
            let listener = try SocketActivation.bind(path)
            let loop = try EventLoop()
            let began = timerNanos()
            if hand {
                let counter = RawCounter()
                _ = CSystemd_set_nonblocking(listener)
                var source: OpaquePointer?
                let acceptReading: sd_event_io_handler_t = { s, fd, _, ud in
                    let counter = Unmanaged<RawCounter>.fromOpaque(ud!).takeUnretainedValue()
                    for _ in 0..<64 {
                        let c = CSystemd_accept(fd, nil, nil)
                        if c < 0 { break }
                        counter.accepted += 1
                        var connection: OpaquePointer?
                        let r = sd_event_add_io(sd_event_source_get_event(s), &connection, c, UInt32(EPOLLIN.rawValue), { s, fd, _, _ in
                            var buffer = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
                            let n = withUnsafeMutableBytes(of: &buffer) { read(fd, $0.baseAddress, $0.count) }
                            if n <= 0, n == 0 || errno != EAGAIN {
                                sd_event_source_disable_unref(s)
                                close(fd)
                            }
                            return 0
                        }, nil)
                        if r < 0 { close(c) }
                    }
                    return 0
                }
                let acceptClosing: sd_event_io_handler_t = { _, fd, _, ud in
                    let counter = Unmanaged<RawCounter>.fromOpaque(ud!).takeUnretainedValue()
                    for _ in 0..<64 {
                        let c = CSystemd_accept(fd, nil, nil)
                        if c < 0 { break }
                        counter.accepted += 1
                        close(c)
                    }
                    return 0
                }
                precondition(sd_event_add_io(loop.handle, &source, listener, UInt32(EPOLLIN.rawValue), reads ? acceptReading : acceptClosing,
                                             Unmanaged.passUnretained(counter).toOpaque()) >= 0)
                startConnector(path, connections: connections)
                _ = try loop.run(until: { counter.accepted >= connections }, timeout: .seconds(120))
                let rate = Double(counter.accepted) / (Double(timerNanos() - began) / 1e9)
                if reads { rawReadAccepts.append(rate) } else { rawAccepts.append(rate) }
                sd_event_source_disable_unref(source)
            } else {
                let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
                let runtime = Runtime(CountingProgram(fd: listener, listening: true), driver: driver)
                try runtime.start()
                startConnector(path, connections: connections)
                var mostOpen = 0
                _ = try loop.run(until: { mostOpen = max(mostOpen, runtime.model.open.count); return runtime.model.accepted >= connections }, timeout: .seconds(120))
                oursAccepts.append(Double(runtime.model.accepted) / (Double(timerNanos() - began) / 1e9))
                mostOpenSeen.append(Double(mostOpen))
                acceptsPerReconcile.append(Double(runtime.model.accepted) / Double(max(1, runtime.stats.reconciles)))
                runtime.shutdown()
            }
            close(listener)
            unlink(path)
            rmdir(dir)
        }
    }
    if oursAccepts.isEmpty || rawAccepts.isEmpty || rawReadAccepts.isEmpty {
        for (name, rates) in [("ours", oursAccepts), ("raw", rawAccepts), ("raw-read", rawReadAccepts)] where !rates.isEmpty {
            progress("io accepts: \(name) \(Int(median(rates)))/s")
        }
        return
    }
    records.append(Record(benchmark: "io", implementation: "ours", size: connections, churn: nil, unit: "accept", runs: rounds,
                          medianNanos: 1e9 / median(oursAccepts), p99Nanos: 1e9 / (oursAccepts.min() ?? 1), perSubscription: false,
                          extra: [("accepts_per_second", median(oursAccepts)), ("ratio_to_raw", median(oursAccepts) / median(rawAccepts)),
                                  ("ratio_to_raw_read", median(oursAccepts) / median(rawReadAccepts)),
                                  ("paired_ratio_to_raw_read", paired(oursAccepts, rawReadAccepts)),
                                  ("most_open", median(mostOpenSeen)), ("accepts_per_reconcile", median(acceptsPerReconcile))]))
    records.append(Record(benchmark: "io", implementation: "raw", size: connections, churn: nil, unit: "accept", runs: rounds,
                          medianNanos: 1e9 / median(rawAccepts), p99Nanos: 1e9 / (rawAccepts.min() ?? 1), perSubscription: false,
                          extra: [("accepts_per_second", median(rawAccepts))]))
    records.append(Record(benchmark: "io", implementation: "raw-read", size: connections, churn: nil, unit: "accept", runs: rounds,
                          medianNanos: 1e9 / median(rawReadAccepts), p99Nanos: 1e9 / (rawReadAccepts.min() ?? 1), perSubscription: false,
                          extra: [("accepts_per_second", median(rawReadAccepts))]))
    progress("io accepts: ours \(Int(median(oursAccepts)))/s, hand-written \(Int(median(rawAccepts)))/s, ratio \(format2(median(oursAccepts) / median(rawAccepts))); hand-written reading each to its end \(Int(median(rawReadAccepts)))/s, ratio \(format2(median(oursAccepts) / median(rawReadAccepts))), per round \(format2(paired(oursAccepts, rawReadAccepts))); ours: \(Int(median(mostOpenSeen))) open at most, \(Int(median(acceptsPerReconcile))) accepts per reconcile")

}

/// Each round's own ratio (ours and the yardstick timed back to back),
/// their median: the machine changes speed between rounds more than within
/// one, so this moves less than the ratio of the medians.
func paired(_ a: [Double], _ b: [Double]) -> Double { median(zip(a, b).map { $0 / $1 }) }

/// `x` with two decimals.
func format2(_ x: Double) -> String {
    let hundredths = Int((x * 100).rounded())
    return "\(hundredths / 100).\(String(repeating: "0", count: hundredths % 100 < 10 ? 1 : 0))\(hundredths % 100)"
}

// MARK: A timer's lateness while connections flood

/// What the flood case measures: how late each due time of the timer was
/// served (ns; a missed one by the tick that covers it) while the flood
/// runs.
final class FloodProbe {
    var origin: UInt64 = 0      // µs, the timer's start (sd_event_now)
    var interval: UInt64 = 0    // µs
    var flooding = false
    var lateness: [Double] = []
    var ticks = 0
}

/// A listener, its connections read as lines, and a 10 ms timer whose
/// ticks' lateness `update` notes (the `SystemdTests.Sockets` flood test's
/// program, timed as `lateness` times its timer).
struct FloodBenchProgram: Program {
    struct Model: Equatable { var open: [Connection] = []; var lines = 0 }
    enum Message { case listener(ListenerSource.Event), connection(UInt64, DescriptorSource.Event), tick(TimerSource.Event) }
    let listener: Int32
    let probe: FloodProbe
    let interval: Duration

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .listener(.accepted(let c)): model.open.append(c)
        case .connection(_, .line): model.lines += 1
        case .connection(let id, .endOfFile), .connection(let id, .failed), .connection(let id, .closed):
            model.open.removeAll { $0.id == id }
        case .tick(.tick(let t)):
            // Every due time this tick serves, the missed ones included
            // (each is as late as this tick).
            if probe.flooding {
                probe.ticks += 1
                let now = monotonicNanos()
                for k in (t.sequence - min(t.missed, t.sequence - 1))...t.sequence {
                    probe.lateness.append(Double(now - Int64(probe.origin &+ k &* probe.interval) * 1_000))
                }
            }
        default: break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.every(interval, key: "flood-timer", leeway: .microseconds(1)) { .tick($0) }
            Subscription.listen(listener, name: "flood", connectionLimit: 1 << 20) { .listener($0) }
            model.open.map { c in Subscription.connection(c) { .connection(c.id, $0) } }
        }
    }
}

/// A thread that writes 4 KiB of 64-byte lines to each of `fds` in turn
/// (non-blocking: a full socket is skipped) until `stop` is set.
func startFlooder(_ fds: [Int32], stop: UnsafeMutablePointer<Int>) {
    final class Job: @unchecked Sendable {
        let fds: [Int32]; let stop: UnsafeMutablePointer<Int>
        init(_ f: [Int32], _ s: UnsafeMutablePointer<Int>) { fds = f; stop = s }
    }
    var thread = pthread_t()
    pthread_create(&thread, nil, { arg in
        let job = Unmanaged<Job>.fromOpaque(arg!).takeRetainedValue()
        var block = [UInt8]()
        for _ in 0..<64 { block += Array(String(repeating: "z", count: 63).utf8) + [10] }
        // (A torn line at a full socket only makes the next line longer.)
        while __atomic_load_stop(job.stop) == 0 {
            for c in job.fds { _ = block.withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) } }
        }
        return nil
    }, Unmanaged.passRetained(Job(fds, stop)).toOpaque())
    pthread_detach(thread)
}

/// The stop flag, read with a compiler barrier on every pass (a plain
/// load the optimiser could hoist out of the loop otherwise).
@inline(never) func __atomic_load_stop(_ p: UnsafeMutablePointer<Int>) -> Int { p.pointee }

/// A 10 ms timer through the runtime while `connections` accepted unix
/// connections flood their subscriptions with lines for `seconds`: each
/// tick's lateness past its due time (worst, p99, median), and the lines
/// read meanwhile. The issue's bound: under 10 ms.
func ioFloodBenchmark(connections: Int, seconds: Int, into records: inout [Record]) throws {
    let tmp = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
    var template = Array((tmp + "/reconcile-bench-XXXXXX").utf8CString)
    guard let dir = mkdtemp(&template) else { fail("mkdtemp") }
    let path = String(cString: dir) + "/flood.sock"
    let listener = try SocketActivation.bind(path)
    defer { close(listener); unlink(path); rmdir(dir) }
    let interval = Duration.milliseconds(10)
    let probe = FloodProbe()
    let loop = try EventLoop()
    try loop.runOnce(timeout: .zero)
    let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
    probe.interval = usec(interval)
    probe.origin = loop.now()   // what the timer runner reads when it starts, in this same iteration
    let runtime = Runtime(FloodBenchProgram(listener: listener, probe: probe, interval: interval), driver: driver)
    try runtime.start()
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
    var clients: [Int32] = []
    for _ in 0..<connections {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let r = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        precondition(r == 0, "connect")
        clients.append(fd)
        if clients.count % 32 == 0 { _ = try loop.runOnce(timeout: .zero) }   // keep the backlog short
    }
    _ = try loop.run(until: { runtime.model.open.count == connections }, timeout: .seconds(30))
    let stop = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    stop.pointee = 0
    let linesBefore = runtime.model.lines
    probe.flooding = true
    startFlooder(clients, stop: stop)
    _ = try loop.run(until: { false }, timeout: .seconds(seconds))
    probe.flooding = false
    stop.pointee = 1
    let lines = runtime.model.lines - linesBefore
    usleep(20_000)   // the flooder's last pass
    runtime.shutdown()
    for c in clients { close(c) }
    let values = probe.lateness
    let worst = values.max() ?? 0
    records.append(Record(benchmark: "io-flood", implementation: "ours", size: connections, churn: nil, unit: "tick",
                          runs: values.count, medianNanos: median(values), p99Nanos: p99(values), perSubscription: false,
                          extra: [("worst_lateness_ns", worst), ("due_times", Double(values.count)), ("ticks", Double(probe.ticks)), ("seconds", Double(seconds)),
                                  ("lines_per_second", Double(lines) / Double(seconds))]))
    progress("io flood (\(connections) connections, \(seconds) s): timer lateness worst \(duration(worst)), p99 \(duration(p99(values))), median \(duration(median(values))); \(probe.ticks) ticks for \(values.count) due times; \(Int(Double(lines) / Double(seconds))) lines/s")
}
