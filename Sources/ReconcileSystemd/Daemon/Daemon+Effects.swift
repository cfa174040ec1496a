import CSystemd
import Glibc
import Reconcile

extension Daemon {
    /// The program's owned tasks (`run(id:)`, `cancel(id:)`); see Docs/Effects.md.
    public var tasks: TaskRegistry<P.Message> { runtime.tasks }

    /// Real monotonic time; a task's `clock.sleep` is an sd-event timer.
    public var clock: LoopClock { runtime.clock }

    /// The loop as a Swift executor.
    public var executor: LoopExecutor { loop.executor }

    /// Starts a graceful stop (after `stop` delivered the shutdown message):
    /// every task cancelled; `EXTEND_TIMEOUT_USEC` during the grace.
    /// Returns true when tasks still run: the loop keeps running (sources,
    /// messages, the cancelled tasks' results) until they end or
    /// `Options.shutdownGrace` passes; then shutdown finishes.
    func beginGracefulStop() -> Bool {
        let running = runtime.beginShutdown()
        guard running > 0 else { return false }
        if options.notify {
            ServiceManager.notify("STOPPING=1")
            stoppingNotified = true
        }
        logger.notice("shutting down: \(running) task(s) cancelled, waiting up to \(options.shutdownGrace.short)",
                      ["TASKS": "\(running)"])
        let hook = SignalHook { [unowned self] ended in
            finishGracefulStop(reason: ended == 0 ? "stop requested; tasks ended" : "stop requested; grace period ended")
        }
        graceHook = hook
        let userdata = Unmanaged.passUnretained(hook).toOpaque()
        var timer: OpaquePointer?
        // An absolute deadline, saturating like every duration (Loop/Usec.swift):
        // a grace too long to add is "never" (USEC_INFINITY), not EOVERFLOW.
        let due = usecAdd(loop.now(CLOCK_MONOTONIC), usec(options.shutdownGrace))
        let r = sd_event_add_time(loop.handle, &timer, CLOCK_MONOTONIC, due, 1000, { _, _, ud in
            Unmanaged<SignalHook>.fromOpaque(ud!).takeUnretainedValue().action(1)
            return 0
        }, userdata)
        guard r >= 0 else {
            logger.error("shutdown grace timer: \(SystemdError("sd_event_add_time", errno: -r)); not waiting")
            graceHook = nil
            return false
        }
        graceSources.append(EventSource(timer!))
        // The manager's TimeoutStopSec= does not strike during the grace.
        lifecycle.stopHolding()
        if options.notify {
            lifecycle.extender = TimeoutExtender(loop: loop, interval: options.timeoutExtensionInterval, until: due, logger: logger)
        }
        runtime.whenTasksEnded { [unowned self] in
            // Finish from a fresh dispatch, not from inside the runtime's pump.
            var deferred: OpaquePointer?
            let r = sd_event_add_defer(loop.handle, &deferred, { _, ud in
                Unmanaged<SignalHook>.fromOpaque(ud!).takeUnretainedValue().action(0)
                return 0
            }, userdata)
            if r >= 0 { graceSources.append(EventSource(deferred!)) } else { hook.action(0) }
        }
        return true
    }

    func finishGracefulStop(reason: String) {
        guard graceHook != nil else { return }
        shutdown(reason: reason)
        try? loop.exit(exitCode)
    }

    func closeGrace() {
        for s in graceSources { s.close() }
        graceSources = []
        graceHook = nil
        mainQueue?.close()
        mainQueue = nil
    }
}

/// An interpreter written against `CommandContext` runs under `Daemon`,
/// `Runtime` and `ProgramTester` alike.
extension Daemon: CommandContext {}
