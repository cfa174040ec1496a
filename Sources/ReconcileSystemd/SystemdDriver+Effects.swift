import Reconcile

extension SystemdDriver: TaskDriver {
    /// Tasks run on the loop's executor (`.offload`: the global executor).
    public var taskRunner: any TaskRunner { ExecutorTaskRunner(executor: loop.taskExecutor) }
    /// Real monotonic time; sleeps are sd-event timers.
    public var clock: LoopClock { loop.clock }
}

/// A task-backed source (`StreamSource`) as a running source.
final class TaskSourceRunner: RunningSource {
    private var stopTask: (() -> Void)?
    init(stop: @escaping () -> Void) { stopTask = stop }
    func retune(to configuration: AnyHashable) throws {}
    func stop() {
        stopTask?()
        stopTask = nil
    }
}
