import CSystemd
import Glibc
import Reconcile

/// The entry point for a daemon: owns an sd-event loop, runs a program on it,
/// talks to the service manager and logs what the reconciler does.
///
/// - SIGTERM and SIGINT (by default) shut down in order: `STOPPING=1`, every
///   source stopped once, the loop exits with code 0.
/// - `READY=1` is sent after the first reconcile, never after `STOPPING=1`
///   (a start command may stop the daemon); `STATUS=` whenever the
///   program's `status(_:)` changes; the watchdog is pinged from the loop
///   every half `WATCHDOG_USEC` when it is set (at least every 10 ms, see
///   `ServiceManager.minimumWatchdogInterval`). `READY=1` waits for the
///   start's tasks marked with `readyWaits(for:)`, with `EXTEND_TIMEOUT_USEC`
///   sent meanwhile.
/// - With `Options.reloadMessage`, SIGHUP reloads: `RELOADING=1` with
///   `MONOTONIC_USEC`, the message delivered, `READY=1` once the reload's
///   commands ran and its marked tasks ended (Docs/Embedding.md). A reload
///   signal during a held start runs after the start's `READY=1`.
/// - `Options.startTimeout` fails a start still waiting for `READY=1`
///   (`ERRNO=ETIMEDOUT`, exit code 1).
/// - `fail(_:errno:busError:exitCode:)` sends `STATUS=` and `ERRNO=` before
///   the stop; exit waits (bounded) for the manager to have read the last
///   message (`sd_notify_barrier`).
/// - Each reconcile that changed something is logged at debug (counts by
///   outcome, then its steps); every source failure at warning with its
///   reason.
public final class Daemon<P: Program> {
    /// Options for the daemon glue.
    public struct Options {
        /// Signals that shut the daemon down (the program cannot subscribe to these).
        public var shutdownSignals: [SignalSource.Signal] = [.terminate, .interrupt]
        /// Whether to send READY/STATUS/STOPPING.
        public var notify = true
        /// Whether to let the loop ping the watchdog when the manager asks.
        public var watchdog = true
        /// Where logs go.
        public var logger = DaemonLogger()
        /// How many cross-thread messages may wait.
        public var inboxCapacity = 4096
        /// Record the run's transcript to this file (JSON Lines, mode 0600;
        /// Docs/Replay.md). Written off the loop thread.
        public var recordPath: String?
        /// Bytes after which recording stops (with one notice).
        public var recordSizeLimit = 256 << 20
        /// The command line to note in the transcript's header (replay tools
        /// rebuild the program from it); nil: none.
        public var recordArguments: [String]?
        /// How long shutdown waits for cancelled tasks on the running loop
        /// before abandoning them (Docs/Effects.md).
        public var shutdownGrace: Duration = .seconds(5)
        /// Delivered to `update` when shutdown begins (before tasks are cancelled).
        public var shutdownMessage: P.Message?
        /// Whether the loop drains the main actor's queue when it runs on the
        /// main thread (`@MainActor` code and `Task {}` in `main.swift` run).
        public var drainsMainQueue = true
        /// Delivered to `update` on a reload signal, after `RELOADING=1`; nil:
        /// no reload (the program may subscribe to SIGHUP itself).
        public var reloadMessage: P.Message?
        /// What else `READY=1` after a reload waits for, besides the tasks
        /// marked with `readyWaits(for:)`: checked after each dispatch until
        /// it is true for the model. nil: nothing else.
        public var reloadDone: ((P.Model) -> Bool)?
        /// Signals that reload when `reloadMessage` is set (the program cannot
        /// subscribe to these then).
        public var reloadSignals: [SignalSource.Signal] = [.hangup]
        /// How often `EXTEND_TIMEOUT_USEC` is sent while a start or a reload
        /// waits for its tasks, or shutdown waits in its grace; each message
        /// asks for three intervals more.
        public var timeoutExtensionInterval: Duration = .seconds(1)
        /// How long a start or a reload is extended at most: after this the
        /// extensions stop (logged at warning), `READY=1` still waits, and
        /// the manager's own `TimeoutStartSec=` applies again (it times the
        /// unit out once its last extension lapsed, if the start or reload
        /// has by then run longer than `TimeoutStartSec=`).
        public var maximumStartExtension: Duration = .seconds(600)
        /// How long a start may wait for `READY=1` (the tasks marked with
        /// `readyWaits(for:)`), counted from `run()`: then the daemon fails
        /// as by `fail(_:errno:busError:exitCode:)`, with
        /// `STATUS=start timed out...`, `ERRNO=ETIMEDOUT` and exit code 1.
        /// nil: no bound of its own (the manager's applies).
        public var startTimeout: Duration?
        /// How long exit waits for the manager to have read the last
        /// notification (`sd_notify_barrier`); nil: exit at once.
        public var notifyBarrierTimeout: Duration? = .seconds(1)

        /// The defaults: SIGTERM and SIGINT shut down, notify and watchdog on, logging from `.info`.
        public init() {}
    }

    enum State { case idle, running, stopped }

    /// The owned loop.
    public let loop: EventLoop
    /// The driver running the program's sources.
    public let driver: SystemdDriver
    /// The runtime (model, stats, sender).
    public private(set) var runtime: Runtime<P>!
    /// The options given.
    public let options: Options
    /// Called after each committed model (render here); `Daemon` itself
    /// uses the runtime's `didCommit` for `STATUS=`.
    public var didCommit: ((P.Model) -> Void)?
    /// The transcript recorder when `Options.recordPath` is set.
    public private(set) var recorder: TranscriptRecorder<P>?

    var state = State.idle
    private var shutdownSources: [EventSource] = []
    private var signalHook: SignalHook?
    private var watchdog: WatchdogPinger?
    private var lastStatus: String?
    private var ready = false
    var exitCode: Int32 = 0
    private var flushHook: SignalHook?
    // Effects (Daemon+Effects.swift).
    var mainQueue: MainQueueDrain?
    var stopRequested = false
    var stopHook: SignalHook?
    var stoppingNotified = false
    var graceSources: [EventSource] = []
    var graceHook: SignalHook?
    /// How the tasks in flight at shutdown ended (after `run()` returned).
    public internal(set) var taskReport = TaskShutdownCounts()
    /// Readiness, reload and timeout extensions (Daemon+Readiness.swift).
    let lifecycle = Lifecycle()
    /// The shutdown's reason, once it happened.
    public internal(set) var shutdownReason: String?

    /// A daemon running `program`; `perform` interprets its commands.
    /// - Throws: `SystemdError` if the loop cannot be created.
    public convenience init(_ program: P, options: Options = Options(),
                            perform: @escaping (P.Command, Daemon<P>) -> Void = { _, _ in }) throws {
        try self.init(program, options: options, perform: perform) { path, limit, arguments, logger in
            TranscriptRecorder<P>(path: path, sizeLimit: limit, arguments: arguments, logger: logger)
        }
    }

    /// `makeRecorder`: the transcript recorder for `Options.recordPath`
    /// (one whose writer thread encodes when the types are `Sendable`).
    init(_ program: P, options: Options, perform: @escaping (P.Command, Daemon<P>) -> Void,
         makeRecorder: (String, Int, [String]?, DaemonLogger) -> TranscriptRecorder<P>) throws {
        self.options = options
        loop = try EventLoop()
        driver = SystemdDriver(loop: loop, logger: options.logger)
        runtime = Runtime(program, driver: driver, inboxCapacity: options.inboxCapacity) { [unowned self] command, _ in
            perform(command, self)
        }
        if let path = options.recordPath {
            let recorder = makeRecorder(path, options.recordSizeLimit, options.recordArguments, options.logger)
            recorder.attach(to: runtime)
            self.recorder = recorder
        }
        wire()
    }

    /// The logger.
    public var logger: DaemonLogger { options.logger }

    /// Runs until a shutdown signal or `stop(exitCode:)`; returns the exit code.
    /// - Throws: `LoopError.alreadyRunning` / `.shutDown` on misuse;
    ///   `DaemonError` when shutdown signals cannot be set up.
    public func run() throws -> Int32 {
        try runOnThisThread()
    }

    /// `run()`, whichever overload the caller's context picks.
    func runOnThisThread() throws -> Int32 {
        switch state {
        case .running: throw LoopError.alreadyRunning
        case .stopped: throw LoopError.shutDown
        case .idle: break
        }
        do {
            try installShutdownSignals()
            try installReloadSignals()
            try installRecorderFlush()
            if options.drainsMainQueue { mainQueue = try MainQueueDrain(loop: loop) }
        } catch {
            // The manager hears why before the process exits.
            notifyStartFailure(error)
            throw error
        }
        state = .running
        lifecycle.startedAt = loop.now()
        do {
            try runtime.start()
        } catch {
            notifyStartFailure(error)
            shutdown(reason: "start failed")
            finishNotifications()
            throw error
        }
        // A start command may have stopped the daemon (at once, or by a
        // graceful stop still waiting for tasks): STOPPING=1 is sent, READY=1
        // must not follow it.
        guard state == .running else {
            finishNotifications()
            return exitCode
        }
        if stopRequested { return try runUntilStopped() }
        try startWatchdog()
        // READY after the first reconcile, with the status at that moment,
        // unless the start's marked tasks still run (then from the loop once
        // they ended, with EXTEND_TIMEOUT_USEC meanwhile).
        lifecycle.startCommandsDone = true
        if !lifecycle.holding({ tasks.isInFlight($0) }) {
            sendReady()
        } else {
            beginHolding()
        }
        return try runUntilStopped()
    }

    /// `READY=1` with the status at this moment; STATUS updates follow.
    func sendReady() {
        lastStatus = runtime.program.status(runtime.model)
        if options.notify {
            ServiceManager.notify(statusLine(lastStatus).map { "READY=1\nSTATUS=\($0)" } ?? "READY=1")
        }
        ready = true
        lifecycle.phase = .ready
    }

    private func startWatchdog() throws {
        if options.watchdog, let interval = ServiceManager.watchdogInterval {
            let period = ServiceManager.watchdogPingPeriod(for: interval)
            watchdog = try WatchdogPinger(loop: loop, period: period)
            if interval < ServiceManager.minimumWatchdogInterval {
                logger.warning("watchdog interval \(interval.short) is below the minimum \(ServiceManager.minimumWatchdogInterval.short): pinging every \(period.short)")
            } else {
                logger.info("watchdog enabled: \(interval.short), pinging every \(period.short)")
            }
        }
    }

    private func runUntilStopped() throws -> Int32 {
        let code = try loop.run()
        if state == .running { shutdown(reason: "loop ended") }
        finishNotifications()
        return code == 0 ? exitCode : code
    }

    /// Shuts down in order and makes `run()` return `exitCode`. Safe to call
    /// from a command interpreter or any loop callback; a second call does
    /// nothing.
    ///
    /// The stop itself runs from a fresh loop dispatch: the message being
    /// processed now, what it queued, and `Options.shutdownMessage` reach
    /// `update` first.
    public func stop(exitCode: Int32 = 0) {
        guard state == .running, !stopRequested else { return }
        self.exitCode = exitCode
        stopRequested = true
        if let message = options.shutdownMessage {
            do { try runtime.send(message) } catch { logger.warning("shutdown message not delivered: \(error)") }
        }
        let hook = SignalHook { [unowned self] _ in
            guard state == .running else { return }
            if beginGracefulStop() { return }   // tasks in flight: finishes on the loop
            shutdown(reason: "stop requested")
            try? loop.exit(self.exitCode)
        }
        stopHook = hook
        var deferred: OpaquePointer?
        let r = sd_event_add_defer(loop.handle, &deferred, { _, ud in
            Unmanaged<SignalHook>.fromOpaque(ud!).takeUnretainedValue().action(0)
            return 0
        }, Unmanaged.passUnretained(hook).toOpaque())
        if r >= 0 { graceSources.append(EventSource(deferred!)) } else { hook.action(0) }
    }

    func shutdown(reason: String) {
        state = .stopped
        shutdownReason = reason
        if options.notify, !stoppingNotified { ServiceManager.notify("STOPPING=1") }
        stoppingNotified = true
        lifecycle.close()
        let report = runtime.shutdown()
        recorder?.finish(reason: "shutdown")
        watchdog?.close()
        watchdog = nil
        for s in shutdownSources { s.close() }
        shutdownSources = []
        closeGrace()
        taskReport = report.tasks
        logger.notice("shutdown (\(reason)): stopped \(report.stopped.count) source(s), dropped \(report.dropped.count) queued message(s), tasks: \(report.tasks)",
                      ["STOPPED": "\(report.stopped.count)", "DROPPED": "\(report.dropped.count)",
                       "TASKS_CANCELLED": "\(report.tasks.cancelled)", "TASKS_FINISHED": "\(report.tasks.finished)",
                       "TASKS_ABANDONED": "\(report.tasks.abandoned)"])
    }

    /// Hands recorded records to the writer thread whenever the loop has
    /// dispatched something (an sd-event post source), so the file trails
    /// the run by one loop iteration.
    private func installRecorderFlush() throws {
        guard let recorder else { return }
        let hook = SignalHook { _ in recorder.flush() }
        flushHook = hook
        var s: OpaquePointer?
        try check("sd_event_add_post", sd_event_add_post(loop.handle, &s, { _, ud in
            Unmanaged<SignalHook>.fromOpaque(ud!).takeUnretainedValue().action(0)
            return 0
        }, Unmanaged.passUnretained(hook).toOpaque()))
        shutdownSources.append(EventSource(s!))
    }

    private func installShutdownSignals() throws {
        guard !options.shutdownSignals.isEmpty else { return }
        try ensureBlocked(options.shutdownSignals)
        let hook = SignalHook { [unowned self] signo in
            logger.notice("received \(SignalSource.Signal(rawValue: signo).map(\.description) ?? "signal \(signo)"): shutting down")
            stop(exitCode: 0)
        }
        signalHook = hook
        for signal in options.shutdownSignals {
            shutdownSources.append(try hook.source(for: signal, on: loop))
        }
    }

    /// Blocks `signals` here when this is the only thread; throws when
    /// another thread could take one of them instead of the loop.
    func ensureBlocked(_ signals: [SignalSource.Signal]) throws {
        let unblocked = Signals.notBlockedEverywhere(signals)
        if !unblocked.isEmpty {
            // Blocking now covers only this thread (and threads it starts later).
            let threads = threadCount()
            guard threads <= 1 else { throw DaemonError.signalsNotBlocked(unblocked, threads: threads) }
            try Signals.block(unblocked)
        }
    }

    private func wire() {
        let logger = options.logger
        runtime.didReconcile = { plan in logger.logReconcile(plan) }
        runtime.diagnostics = { d in
            switch d {
            case .sourceFailed(let id, let a, let f):
                logger.warning(d.description, ["SUBSCRIPTION": "\(id)", "ACTIVATION": "\(a.generation)", "OUTCOME": "failed",
                                               "ERRNO": f.code.map(String.init) ?? ""])
            case .duplicateIdentity(let id):
                logger.warning(d.description, ["SUBSCRIPTION": "\(id)", "OUTCOME": "duplicate"])
            case .lateDelivery(let id, let a):
                logger.debug(d.description, ["SUBSCRIPTION": "\(id)", "ACTIVATION": "\(a.generation)", "OUTCOME": "late"])
            case .eventAfterStop(let id, _), .eventTypeMismatch(let id, _):
                logger.error(d.description, ["SUBSCRIPTION": "\(id)"])
            case .groupDependsOnMoreThanInput:
                logger.error(d.description, ["OUTCOME": "group-not-pure"])
            }
        }
        runtime.didCommit = { [unowned self] model in
            didCommit?(model)
            // After a failure or a stop began, the STATUS= sent last stays.
            guard options.notify, ready, state == .running, !stopRequested else { return }
            let status = runtime.program.status(model)
            if status != lastStatus {
                lastStatus = status
                if let line = statusLine(status) { ServiceManager.notify("STATUS=\(line)") }
            }
        }
    }

    private func statusLine(_ status: String?) -> String? {
        status.map(ServiceManager.oneLine)
    }
}

/// Why a daemon could not start.
public enum DaemonError: Error, CustomStringConvertible {
    /// Shutdown signals are not blocked and other threads already run, so
    /// blocking them now would not cover those threads.
    case signalsNotBlocked([SignalSource.Signal], threads: Int)
    /// `run() async` was called off the thread that created the daemon (its
    /// loop's): the daemon cannot move (its closures may be isolated there).
    case notOnLoopThread
    /// A signal the loop must read already has a handler of someone else's,
    /// so it cannot be forwarded to the loop's thread.
    case signalHandled(SignalSource.Signal)
    /// `DaemonService.run()` was called a second time.
    case serviceAlreadyRan

    /// One sentence saying what to do.
    public var description: String {
        switch self {
        case .signalsNotBlocked(let s, let n):
            "\(s.map(\.description).joined(separator: ", ")) not blocked and \(n) threads already run: call Signals.block() first thing in main, before any thread starts"
        case .notOnLoopThread:
            "run() async was called off the daemon's thread: await it first thing in an async main (before any other await), or build the daemon inside DaemonService"
        case .signalHandled(let s):
            "\(s) has a handler installed by someone else and is not blocked in every thread: it cannot reach the loop"
        case .serviceAlreadyRan:
            "a DaemonService runs once: make a new one"
        }
    }
}

/// The number of threads in this process (from /proc/self/task).
func threadCount() -> Int {
    guard let dir = opendir("/proc/self/task") else { return 1 }
    defer { closedir(dir) }
    var n = 0
    while let e = readdir(dir) {
        if e.pointee.d_name.0 != 46 { n += 1 }   // skip "." and ".."
    }
    return n
}

/// The userdata of the daemon's signal sources (C callbacks cannot be generic).
final class SignalHook {
    let action: (Int32) -> Void
    init(_ action: @escaping (Int32) -> Void) { self.action = action }

    /// An sd-event signal source on `loop` that runs `action` with the
    /// signal's number (the hook is held unretained: its owner keeps it as
    /// long as the source).
    func source(for signal: SignalSource.Signal, on loop: EventLoop) throws(SystemdError) -> EventSource {
        var s: OpaquePointer?
        try check("sd_event_add_signal \(signal)", sd_event_add_signal(loop.handle, &s, signal.rawValue, { _, info, ud in
            let hook = Unmanaged<SignalHook>.fromOpaque(ud!).takeUnretainedValue()
            hook.action(info.map { Int32(bitPattern: $0.pointee.ssi_signo) } ?? 0)
            return 0
        }, Unmanaged.passUnretained(self).toOpaque()))
        return EventSource(s!)
    }
}

extension Daemon where P.Message: Sendable, P.Command: Sendable {
    /// A daemon running `program` whose transcript recorder (when
    /// `Options.recordPath` is set) encodes on its writer thread: the
    /// program's messages and commands are `Sendable` (Docs/Replay.md).
    /// - Throws: `SystemdError` if the loop cannot be created.
    public convenience init(_ program: P, options: Options = Options(),
                            perform: @escaping (P.Command, Daemon<P>) -> Void = { _, _ in }) throws {
        try self.init(program, options: options, perform: perform) { path, limit, arguments, logger in
            TranscriptRecorder<P>(path: path, sizeLimit: limit, arguments: arguments, logger: logger)
        }
    }
}
