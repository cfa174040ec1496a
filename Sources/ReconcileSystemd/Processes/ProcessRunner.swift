import CSystemd
import Glibc
import Reconcile

extension ProcessSource: SystemdSource {
    /// Spawns the child (`posix_spawn`) and watches it with `sd_event_add_child` (a pidfd).
    ///
    /// - Throws: `SourceFailure` when it cannot be spawned or watched.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        try ProcessRunner(ticket: ticket, configuration: configuration, driver: context.driver)
    }
}

/// Spawns `arguments` (searched in `PATH`) in a process group of its own,
/// with stdout and stderr on fresh pipes (close-on-exec on this side) and
/// no other descriptor; returns the
/// pid and the pipes' read ends (non-blocking).
func spawnChild(_ arguments: [String], environment: [String]?, directory: String?) throws(SourceFailure) -> (pid: Int32, out: Int32, err: Int32) {
    guard let program = arguments.first, !program.isEmpty else {
        throw SourceFailure(operation: "posix_spawn", code: EINVAL, reason: "no program to run (the argument list is empty)")
    }
    var out: [Int32] = [-1, -1], err: [Int32] = [-1, -1]
    let ro = CSystemd_pipe_cloexec(&out)
    guard ro == 0 else { throw SourceFailure(operation: "pipe2", code: -ro, reason: errorText(-ro)) }
    let re = CSystemd_pipe_cloexec(&err)
    guard re == 0 else {
        let e = -re
        close(out[0]); close(out[1])
        throw SourceFailure(operation: "pipe2", code: e, reason: errorText(e))
    }
    let argv = arguments.map { strdup($0) }
    let envp = environment.map { $0.map { strdup($0) } }
    defer {
        argv.forEach { free($0) }
        envp?.forEach { free($0) }
    }
    let pid: Int32 = (argv + [nil]).withUnsafeBufferPointer { a in
        func run(_ e: UnsafePointer<UnsafeMutablePointer<CChar>?>?) -> Int32 {
            if let directory {
                return CSystemd_spawn(program, a.baseAddress, e, directory, out[1], err[1])
            }
            return CSystemd_spawn(program, a.baseAddress, e, nil, out[1], err[1])
        }
        if let envp { return (envp + [nil]).withUnsafeBufferPointer { run($0.baseAddress) } }
        return run(nil)
    }
    close(out[1])
    close(err[1])
    if pid < 0 {
        close(out[0]); close(err[0])
        throw SourceFailure(operation: "posix_spawn \(program)", code: -pid, reason: errorText(-pid))
    }
    _ = CSystemd_set_nonblocking(out[0])
    _ = CSystemd_set_nonblocking(err[0])
    return (pid, out[0], err[0])
}

/// Makes sure SIGCHLD is blocked in the calling (loop) thread, which is
/// what `sd_event_add_child` checks (`Signals.block()` blocks it too).
func blockChildSignal() {
    if CSystemd_signal_is_blocked(SIGCHLD) != 1 {
        var signals: [Int32] = [SIGCHLD]
        _ = CSystemd_block_signals(&signals, 1)
    }
}

/// A child on the loop: its two output pipes read as lines, its exit seen
/// through a pidfd (`sd_event_add_child`), reaped by sd-event.
final class ProcessRunner: RunningSource {
    /// Weak: the ticket's driver state holds this runner (through the
    /// driver's `ForeignRunner`), and a runner whose ticket goes away
    /// without a stop (a runtime dropped without `shutdown()`) stops in
    /// that runner's deinit; held strongly it was a cycle, and the source
    /// ran on while the driver lived. Cleared at stop.
    private weak var ticket: SourceTicket?
    private let configuration: ProcessSource.Configuration
    private let state: IOState
    private let loop: EventLoop
    let pid: Int32
    /// The child source; owned by sd-event's "process own" rule (released
    /// while the child runs, it is killed and reaped).
    private var child: OpaquePointer?
    private var announce: OpaquePointer?
    private var grace: OpaquePointer?
    private var pipes: [Pipe]
    private var announced = false
    private var exit: ProcessSource.Event?
    private var stopping = false

    final class Pipe {
        let stream: ProcessSource.Stream
        var fd: Int32
        var source: OpaquePointer?
        var lines: LineBuffer
        init(_ stream: ProcessSource.Stream, fd: Int32, limit: Int) {
            self.stream = stream
            self.fd = fd
            lines = LineBuffer(limit: limit)
        }
        func close() {
            if let source { sd_event_source_disable_unref(source) }
            source = nil
            if fd >= 0 { Glibc.close(fd) }
            fd = -1
        }
    }

    init(ticket: SourceTicket, configuration: ProcessSource.Configuration, driver: SystemdDriver) throws {
        self.ticket = ticket
        self.configuration = configuration
        state = driver.io
        loop = driver.loop
        blockChildSignal()
        let spawned = try spawnChild(configuration.arguments, environment: configuration.environment, directory: configuration.directory)
        pid = spawned.pid
        pipes = [Pipe(.stdout, fd: spawned.out, limit: configuration.maxLineLength),
                 Pipe(.stderr, fd: spawned.err, limit: configuration.maxLineLength)]
        let me = Unmanaged.passUnretained(self).toOpaque()
        var s: OpaquePointer?
        let r = sd_event_add_child(loop.handle, &s, pid, WEXITED, { _, info, ud in
            Unmanaged<ProcessRunner>.fromOpaque(ud!).takeUnretainedValue().exited(info!)
            return 0
        }, me)
        guard r >= 0 else {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            pipes.forEach { $0.close() }
            throw SourceFailure(operation: "sd_event_add_child(\(pid))", code: -r, reason: errorText(-r))
        }
        EventSource.account(s!)
        sd_event_source_set_child_process_own(s, 1)
        child = s
        for (index, pipe) in pipes.enumerated() {
            var io: OpaquePointer?
            let r: Int32
            if index == 0 {
                r = sd_event_add_io(loop.handle, &io, pipe.fd, UInt32(EPOLLIN.rawValue), { _, _, _, ud in
                    Unmanaged<ProcessRunner>.fromOpaque(ud!).takeUnretainedValue().readable(0)
                    return 0
                }, me)
            } else {
                r = sd_event_add_io(loop.handle, &io, pipe.fd, UInt32(EPOLLIN.rawValue), { _, _, _, ud in
                    Unmanaged<ProcessRunner>.fromOpaque(ud!).takeUnretainedValue().readable(1)
                    return 0
                }, me)
            }
            if r >= 0 {
                EventSource.account(io!)
                pipe.source = io
            }
        }
        var d: OpaquePointer?
        if sd_event_add_defer(loop.handle, &d, { _, ud in
            Unmanaged<ProcessRunner>.fromOpaque(ud!).takeUnretainedValue().announceStart()
            return 0
        }, me) >= 0 { announce = d }
    }

    func retune(to configuration: AnyHashable) throws {}

    /// `.started` goes first, before any output (dispatch order among
    /// sources of one iteration is not guaranteed).
    private func announceStart() {
        guard !announced else { return }
        announced = true
        if let announce { state.releaseLater(announce) }
        announce = nil
        ticket?.emit(ProcessSource.Event.started(pid: pid))
    }

    private func readable(_ index: Int) {
        announceStart()
        emit(read(pipes[index], drain: false))
    }

    /// What `pipe` has now (a bounded amount unless `drain`), as events.
    private func read(_ pipe: Pipe, drain: Bool) -> [ProcessSource.Event] {
        guard pipe.fd >= 0 else { return [] }
        var items: [LineBuffer.Item<String>] = []
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        var budget = drain ? 4 << 20 : DescriptorRunner.readBudget
        var ended = false
        while budget > 0 {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(pipe.fd, $0.baseAddress, $0.count) }
            if n > 0 {
                budget -= n
                buffer.withUnsafeBytes { pipe.lines.feed(UnsafeRawBufferPointer(rebasing: $0[..<n]), into: &items) }
            } else if n < 0, errno == EINTR {
                continue
            } else {
                ended = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)
                break
            }
        }
        if ended || drain {
            pipe.lines.finish(into: &items)
            pipe.close()
        }
        return items.map {
            switch $0 {
            case .line(let s): .output(pipe.stream, s)
            case .tooLong: .lineTooLong(pipe.stream)
            }
        }
    }

    /// One batch: `update` runs for each event in order and one reconcile
    /// follows, as a descriptor's dispatch (one each was a reconcile per
    /// line: a chatty child made a reconcile of every subscription per line).
    private func emit(_ events: [ProcessSource.Event]) {
        guard !events.isEmpty, let ticket else { return }
        if ticket.emit(batch: events, of: ProcessSource.self) { return }
        for event in events {
            guard let ticket = self.ticket else { return }
            ticket.emit(event)
        }
    }

    private func exited(_ info: UnsafePointer<siginfo_t>) {
        var exitedNormally: Int32 = 0, value: Int32 = 0
        CSystemd_child_status(info, &exitedNormally, &value)
        let event: ProcessSource.Event = exitedNormally == 1 ? .exited(status: value) : .killed(signal: value)
        exit = event
        if let grace { sd_event_source_disable_unref(grace) }
        grace = nil
        // sd-event reaps after this callback: the child source is released later.
        if let child { state.releaseLater(child) }
        child = nil
        if stopping {
            pipes.forEach { $0.close() }
            state.lingering[ObjectIdentifier(self)] = nil
            return
        }
        announceStart()
        // Everything it wrote is in the pipes now: its lines, then its exit.
        var events = read(pipes[0], drain: true)
        events += read(pipes[1], drain: true)
        emit(events + [event])
    }

    /// Stopped: SIGTERM, then SIGKILL after the grace; kept alive by the
    /// driver's state until the child is reaped.
    func stop() {
        guard !stopping else { return }
        ticket = nil
        stopping = true
        if let announce { sd_event_source_disable_unref(announce) }
        announce = nil
        pipes.forEach { $0.close() }
        guard child != nil else { return }
        signalGroup(SIGTERM)
        state.lingering[ObjectIdentifier(self)] = self
        var t: OpaquePointer?
        if sd_event_add_time_relative(loop.handle, &t, CLOCK_MONOTONIC, usec(configuration.grace), 1000, { _, _, ud in
            Unmanaged<ProcessRunner>.fromOpaque(ud!).takeUnretainedValue().killNow()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque()) >= 0 { grace = t } else { killNow() }
    }

    private func killNow() { signalGroup(SIGKILL) }

    /// Signals the child's process group (its own children too: a shell's
    /// `sleep` is not left behind), or the child alone when that fails.
    /// Only while it is not reaped, so the ids cannot have been reused.
    private func signalGroup(_ signal: Int32) {
        guard let child else { return }
        if kill(-pid, signal) != 0 { sd_event_source_send_child_signal(child, signal, nil, 0) }
    }

    /// The driver detaches with `runners` still stopping: each gets up to a
    /// second (within its grace) after its SIGTERM, then SIGKILL; all reaped.
    static func finish(_ runners: [ProcessRunner]) {
        guard !runners.isEmpty else { return }
        let wait = min(runners.map(\.configuration.grace).max() ?? .zero, .seconds(1))
        let deadline = ContinuousClock.now + wait
        var fds = runners.compactMap { r -> pollfd? in
            guard let c = r.child else { return nil }
            let fd = sd_event_source_get_child_pidfd(c)
            return fd >= 0 ? pollfd(fd: fd, events: Int16(POLLIN), revents: 0) : nil
        }
        while !fds.isEmpty, ContinuousClock.now < deadline {
            let left = deadline - ContinuousClock.now
            let ms = Int32(clamping: left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000 + 1)
            if poll(&fds, nfds_t(fds.count), ms) <= 0 { break }
            fds.removeAll { $0.revents != 0 }
            for i in fds.indices { fds[i].revents = 0 }
        }
        for r in runners {
            if let g = r.grace { sd_event_source_disable_unref(g) }
            r.grace = nil
            // "Process own": a child still running is killed; reaped either way.
            if let c = r.child {
                r.signalGroup(SIGKILL)
                sd_event_source_disable_unref(c)
            }
            r.child = nil
        }
    }

    deinit {
        pipes.forEach { $0.close() }
        if let announce { sd_event_source_disable_unref(announce) }
        if let grace { sd_event_source_disable_unref(grace) }
        if let child { state.releaseLater(child) }
    }
}
