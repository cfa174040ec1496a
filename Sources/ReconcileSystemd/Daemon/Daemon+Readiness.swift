import CSystemd
import Glibc
import Reconcile

/// Where the daemon is in the service manager's terms, and what `READY=1`
/// waits for (loop thread only).
final class Lifecycle {
    /// What the manager was last told.
    enum Phase {
        /// Before the first `READY=1`.
        case starting
        /// `READY=1` sent, no reload in progress.
        case ready
        /// `RELOADING=1` sent, `READY=1` not yet.
        case reloading
    }

    var phase = Phase.starting
    /// The start commands ran (`runtime.start()` returned).
    var startCommandsDone = false
    /// Tasks `READY=1` waits for (`readyWaits(for:)`).
    var holds: [TaskID] = []
    /// When the current start or reload began (loop time, usec).
    var holdingSince: UInt64 = 0
    /// Sends `READY=1` once the holds ended (an sd-event post source).
    var check: EventSource?
    var checkHook: SignalHook?
    /// `EXTEND_TIMEOUT_USEC` on a timer.
    var extender: TimeoutExtender?
    var reloadSources: [EventSource] = []
    var reloadHook: SignalHook?
    /// Reloads asked for (signals received) and finished (`READY=1` after them).
    var reloads = 0, reloadsFinished = 0
    /// A reload signal received during the start: the reload runs once the
    /// start's `READY=1` is sent (the signal's number; several are one).
    var queuedReload: Int32?
    /// When `run()` began (loop time, usec): what `Options.startTimeout` counts from.
    var startedAt: UInt64 = 0
    /// Fails the start after `Options.startTimeout` (a timer).
    var startDeadline: EventSource?
    var startDeadlineHook: SignalHook?

    /// Drops the holds that ended; whether some still run (`isInFlight` is
    /// asked of the holds only, no set of every task made per dispatch).
    func holding(_ isInFlight: (TaskID) -> Bool) -> Bool {
        holds.removeAll { !isInFlight($0) }
        return !holds.isEmpty
    }

    func stopHolding() {
        check?.close()
        check = nil
        checkHook = nil
        extender?.close()
        extender = nil
        startDeadline?.close()
        startDeadline = nil
        startDeadlineHook = nil
        holds = []
    }

    func close() {
        stopHolding()
        for s in reloadSources { s.close() }
        reloadSources = []
        reloadHook = nil
        queuedReload = nil
    }
}

extension Daemon {
    /// Whether a reload is in progress (`RELOADING=1` sent, `READY=1` not yet).
    public var isReloading: Bool { lifecycle.phase == .reloading }

    /// Makes `READY=1` wait for the task `id` (started with `tasks.run(id:)`)
    /// while the start or a reload is in progress: `READY=1` is sent once
    /// every such task has ended and its result was handled by `update`
    /// (whose commands may mark more). Meanwhile `EXTEND_TIMEOUT_USEC` goes
    /// out every `Options.timeoutExtensionInterval`. Call it from the command
    /// interpreter right after `tasks.run(id:)`.
    ///
    /// - Parameter id: the task's identity.
    /// - Returns: whether `READY=1` now waits for it: false when no start or
    ///   reload is in progress, shutdown began, or no task `id` is in flight.
    @discardableResult
    public func readyWaits(for id: some Hashable & Sendable) -> Bool {
        let task = TaskID(id)
        guard state == .running, !stopRequested, lifecycle.phase != .ready, tasks.inFlight.contains(task) else { return false }
        if !lifecycle.holds.contains(task) { lifecycle.holds.append(task) }
        // During the start `run()` arms the check after the start commands.
        if lifecycle.startCommandsDone || lifecycle.phase == .reloading { beginHolding() }
        return true
    }

    /// Stops the daemon because it failed: `STATUS=` with `reason` and
    /// `ERRNO=` (and/or `BUSERROR=`) go to the manager first, then the
    /// shutdown runs as for `stop(exitCode:)`, and exit waits for the manager
    /// to have read them. A start that fails this way never sends `READY=1`.
    ///
    /// - Parameters:
    ///   - reason: one line for `STATUS=` (and the log).
    ///   - errno: the errno-style code, for `ERRNO=`.
    ///   - busError: a D-Bus error name, for `BUSERROR=`.
    ///   - exitCode: what `run()` returns (default 1).
    public func fail(_ reason: String, errno: Int32? = nil, busError: String? = nil, exitCode: Int32 = 1) {
        guard state == .running, !stopRequested else { return }
        logger.error("failed: \(reason)", ["ERRNO": errno.map(String.init) ?? "", "BUSERROR": busError ?? ""])
        if options.notify { ServiceManager.notify(ServiceManager.failureMessage(reason, errno: errno, busError: busError)) }
        stop(exitCode: exitCode)
    }

    /// Tells the manager why `run()` throws (its setup or start failed).
    func notifyStartFailure(_ error: any Error) {
        guard options.notify else { return }
        let code: Int32? = (error as? SystemdError)?.errno ?? (error is DaemonError ? EBUSY : nil)
        ServiceManager.notify(ServiceManager.failureMessage("start failed: \(error)", errno: code))
    }

    /// The last step before `run()` returns: wait (bounded) until the
    /// manager read everything sent (`sd_notify_barrier`).
    func finishNotifications() {
        guard options.notify, let timeout = options.notifyBarrierTimeout, ServiceManager.isListening else { return }
        if case .failed(let e) = ServiceManager.barrier(timeout: timeout) {
            logger.warning("the service manager did not confirm the last notifications within \(timeout.short): \(SystemdError("sd_notify_barrier", errno: e).reason)")
        }
    }

    /// Arms what sends `READY=1` once the holds ended, and the extensions.
    func beginHolding() {
        if lifecycle.check == nil {
            let hook = SignalHook { [unowned self] _ in checkReadiness() }
            var s: OpaquePointer?
            let r = sd_event_add_post(loop.handle, &s, { _, ud in
                Unmanaged<SignalHook>.fromOpaque(ud!).takeUnretainedValue().action(0)
                return 0
            }, Unmanaged.passUnretained(hook).toOpaque())
            guard r >= 0 else {
                logger.error("cannot wait for the tasks before READY=1: \(SystemdError("sd_event_add_post", errno: -r)); ready now")
                lifecycle.holds = []
                checkReadiness()
                return
            }
            lifecycle.check = EventSource(s!)
            lifecycle.checkHook = hook
            lifecycle.holdingSince = loop.now()
        }
        if options.notify, lifecycle.extender == nil {
            let until = usecAdd(lifecycle.holdingSince, usec(options.maximumStartExtension))
            let what = lifecycle.phase == .starting ? "the start" : "the reload"
            lifecycle.extender = TimeoutExtender(
                loop: loop, interval: options.timeoutExtensionInterval, until: until, logger: logger,
                cutoff: "\(what) has been extended for \(options.maximumStartExtension.short) (Options.maximumStartExtension): no more EXTEND_TIMEOUT_USEC; READY=1 still waits, and the manager's TimeoutStartSec= applies again")
        }
        if lifecycle.phase == .starting, lifecycle.startDeadline == nil, let timeout = options.startTimeout {
            armStartDeadline(timeout)
        }
    }

    /// The timer of `Options.startTimeout`: a start still held then fails
    /// (`STATUS=`, `ERRNO=ETIMEDOUT`, exit code 1) through `fail`.
    private func armStartDeadline(_ timeout: Duration) {
        let hook = SignalHook { [unowned self] _ in
            guard state == .running, !stopRequested, lifecycle.phase == .starting else { return }
            lifecycle.stopHolding()
            fail("start timed out: READY=1 not sent within \(timeout.short) (Options.startTimeout)", errno: ETIMEDOUT, exitCode: 1)
        }
        var s: OpaquePointer?
        let due = usecAdd(lifecycle.startedAt, usec(timeout))
        let r = sd_event_add_time(loop.handle, &s, CLOCK_MONOTONIC, due, 1000, { _, _, ud in
            Unmanaged<SignalHook>.fromOpaque(ud!).takeUnretainedValue().action(0)
            return 0
        }, Unmanaged.passUnretained(hook).toOpaque())
        guard r >= 0 else {
            return logger.error("cannot arm the start timeout: \(SystemdError("sd_event_add_time", errno: -r)); the start is not bounded")
        }
        lifecycle.startDeadline = EventSource(s!)
        lifecycle.startDeadlineHook = hook
    }

    /// After each dispatch while holding: `READY=1` once the holds ended.
    func checkReadiness() {
        guard state == .running, !stopRequested else { return lifecycle.stopHolding() }
        guard lifecycle.phase != .ready, lifecycle.startCommandsDone, !lifecycle.holding({ tasks.isInFlight($0) }), reloadSettled else { return }
        lifecycle.stopHolding()
        let reloaded = lifecycle.phase == .reloading
        sendReady()
        if reloaded {
            lifecycle.reloadsFinished = lifecycle.reloads
            logger.notice("reloaded")
        } else if let signo = lifecycle.queuedReload {
            // The start is done: now the reload asked for during it.
            lifecycle.queuedReload = nil
            reload(signal: signo)
        }
    }

    /// The reload signals: `RELOADING=1`, then `Options.reloadMessage`.
    func installReloadSignals() throws {
        guard options.reloadMessage != nil, !options.reloadSignals.isEmpty else { return }
        try ensureBlocked(options.reloadSignals)
        let hook = SignalHook { [unowned self] signo in reload(signal: signo) }
        lifecycle.reloadHook = hook
        for signal in options.reloadSignals where !options.shutdownSignals.contains(signal) {
            lifecycle.reloadSources.append(try hook.source(for: signal, on: loop))
        }
    }

    /// Starts a reload: `RELOADING=1` + `MONOTONIC_USEC`, the reload message
    /// delivered (its commands run now), `READY=1` once the tasks it marked
    /// ended. A reload during another reload joins it. A reload signal during
    /// a held start (before its `READY=1`) is queued: the reload runs right
    /// after the start's `READY=1` (systemd does not reload a unit that is
    /// still activating, and `RELOADING=1` before `READY=1` is not a state
    /// the protocol has); several such signals make one reload.
    func reload(signal signo: Int32) {
        guard state == .running, !stopRequested, let message = options.reloadMessage else { return }
        let name = SignalSource.Signal(rawValue: signo).map(\.description) ?? "signal \(signo)"
        if lifecycle.phase == .starting {
            if lifecycle.queuedReload == nil { logger.notice("received \(name) during the start: reloading after READY=1") }
            lifecycle.queuedReload = signo
            return
        }
        lifecycle.reloads += 1
        logger.notice("received \(name): reloading")
        if options.notify { ServiceManager.notify(ServiceManager.reloadingMessage()) }
        if lifecycle.phase == .ready {
            lifecycle.phase = .reloading
            lifecycle.holdingSince = loop.now()
        }
        do { try runtime.send(message) } catch { logger.warning("reload message not delivered: \(error)") }
        // Nothing marked: ready again at once (the reload's commands ran).
        guard lifecycle.phase == .reloading else { return }
        if lifecycle.holds.isEmpty, reloadSettled { checkReadiness() } else { beginHolding() }
    }

    /// Whether `Options.reloadDone` holds (true outside a reload).
    var reloadSettled: Bool {
        guard lifecycle.phase == .reloading, let done = options.reloadDone else { return true }
        return done(runtime.model)
    }
}

/// Sends `EXTEND_TIMEOUT_USEC` (three intervals) now and every `interval`
/// from a timer on the loop, until `until` (loop time, usec): the manager's
/// start, reload or stop timeout does not strike while the loop is alive.
/// At `until` it logs `cutoff` (when given) and stops.
final class TimeoutExtender {
    private let loop: EventLoop
    private let interval: UInt64
    private let until: UInt64
    private let message: String
    private let logger: DaemonLogger
    private let cutoff: String?
    private var source: EventSource?

    init?(loop: EventLoop, interval: Duration, until: UInt64, logger: DaemonLogger, cutoff: String? = nil) {
        self.loop = loop
        self.interval = max(1000, usec(interval))
        self.until = until
        self.logger = logger
        self.cutoff = cutoff
        message = ServiceManager.extendTimeoutMessage(interval * 3)
        ServiceManager.notify(message)
        var s: OpaquePointer?
        let r = sd_event_add_time(loop.handle, &s, CLOCK_MONOTONIC, usecAdd(loop.now(), self.interval), usecAccuracy(interval / 10), { s, _, ud in
            Unmanaged<TimeoutExtender>.fromOpaque(ud!).takeUnretainedValue().fire(s)
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        guard r >= 0 else {
            logger.warning("cannot extend the service manager's timeout: \(SystemdError("sd_event_add_time", errno: -r))")
            return nil
        }
        source = EventSource(s!)
        sd_event_source_set_enabled(s, Int32(SD_EVENT_ON))
    }

    private func fire(_ s: OpaquePointer?) {
        let now = loop.now()
        guard now < until else {
            if let cutoff { logger.warning(cutoff) }
            return close()
        }
        ServiceManager.notify(message)
        sd_event_source_set_time(s, usecAdd(now, interval))
    }

    func close() {
        source?.close()
        source = nil
    }
}
