import Reconcile

extension SystemdDriver: TaskDriver {
    /// Tasks run on the loop's task executor (`.offload`: the global executor).
    public var taskRunner: any TaskRunner { LoopTaskRunner(loop: loop) }
    /// Real monotonic time; sleeps are sd-event timers.
    public var clock: LoopClock { loop.clock }
}

/// Runs tasks on a loop's task executor (the loop made it with itself);
/// the runner is created on the first task.
final class LoopTaskRunner: TaskRunner {
    private let loop: EventLoop
    private var runner: ExecutorTaskRunner?

    init(loop: EventLoop) { self.loop = loop }

    func start(_ job: TaskJob) -> () -> Void {
        if let runner { return runner.start(job) }
        let r = ExecutorTaskRunner(executor: loop.taskExecutor)
        runner = r
        return r.start(job)
    }
}

/// A task-backed source (`StreamSource`) as a running source.
final class TaskSourceRunner: DriverRunner {
    private var stopTask: (() -> Void)?
    init(stop: @escaping () -> Void) { stopTask = stop }
    override func stop() {
        stopTask?()
        stopTask = nil
    }
    deinit { stop() }
}
