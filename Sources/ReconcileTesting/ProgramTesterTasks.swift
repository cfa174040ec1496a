import Reconcile
import Testing

/// What `ProgramTester` hands its command interpreter: a real
/// `TaskRegistry` (the runtime's, with its in-flight and cancel semantics)
/// whose tasks are recorded by identity and run only when the test says so,
/// and a clock on virtual time.
///
/// It is a `CommandContext`, as `Runtime` and `Daemon` are: an interpreter
/// written against `some CommandContext<Message>` runs under all three.
public final class TesterEffects<Message>: CommandContext {
    /// The owned tasks: `run(id:)`, `cancel(id:)`, `inFlight`, `stats`, as
    /// `Runtime.tasks`.
    public let tasks = TaskRegistry<Message>()
    /// The recording runner, as `VirtualDriver.tasks`: every `run` and
    /// `cancel` by identity (`log`), `pending`, `isCancelled(_:)`, and
    /// `runsTasks` to run every task's operation as it starts.
    public let recorder: VirtualTasks
    /// Where performed tasks run: only inside the tester's `runUntilIdle()`,
    /// `advance(by:)`, `complete(task:with:)` and `perform(task:)`.
    public let executor = VirtualExecutor()
    let clockSource = VirtualClockSource()

    init() {
        recorder = VirtualTasks(executor: executor)
        tasks.attach(waker: Waker {}, runner: recorder)
    }

    /// The virtual clock tasks sleep on: a sleep ends when `advance(by:)`
    /// passes its deadline.
    public var clock: LoopClock { LoopClock(clockSource) }

    /// How many sleeps on `clock` wait for `advance(by:)`.
    public var sleepers: Int { clockSource.sleepers }
}

extension ProgramTester {
    /// The recorded task calls and pending tasks (`effects.recorder`), as
    /// `VirtualDriver.tasks`.
    public var tasks: VirtualTasks { effects.recorder }

    /// The task identities in flight (started, no result yet, not
    /// cancelled), as `Runtime.tasks.inFlight`.
    public var inFlight: Set<TaskID> { effects.tasks.inFlight }

    /// The virtual time: moved only by `advance(by:)`.
    public var now: Duration { effects.clockSource.now }

    /// Runs queued task jobs and delivers the tasks' results to `update`
    /// (each through `send(_:)`, so `model`, `commands` and `lastPlan` show
    /// the last one), until nothing is left. Each result is a step of its
    /// own, reconciled after it; the runtime may batch results that end
    /// together into one reconcile.
    public mutating func runUntilIdle() {
        while true {
            let ran = effects.executor.runJobs()
            var results: [P.Message] = []
            effects.tasks.takeResults { message, _ in results.append(message) }
            for message in results { send(message) }
            if !ran && results.isEmpty { return }
        }
    }

    /// Moves the virtual clock forward by `duration`, resuming the tasks'
    /// sleeps in deadline order and running until idle after each.
    public mutating func advance(by duration: Duration) {
        let target = now + duration
        runUntilIdle()
        var previous: (Duration, Int)?
        while let due = effects.clockSource.nextDeadline(notAfter: target) {
            let waiting = effects.clockSource.sleepers
            // A sleep that is registered but not yet suspended cannot be resumed: stop.
            if let (d, w) = previous, d == due, w == waiting { break }
            previous = (due, waiting)
            effects.clockSource.set(now: due)
            runUntilIdle()
        }
        effects.clockSource.set(now: target)
        runUntilIdle()
    }

    /// Runs the real operation of the pending task `id` (the newest run of
    /// it) on the virtual executor, until idle: its result goes to `update`,
    /// its `clock` sleeps wait for `advance(by:)`. Records an issue and
    /// returns false when no task `id` is pending or it already runs.
    @discardableResult
    public mutating func perform(task id: some Hashable & Sendable, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        let taskID = TaskID(id)
        let ok = effects.recorder.perform(taskID)
        if !ok {
            let why = tasks.pending.contains(taskID) ? "already runs its operation" : notPending(taskID)
            Issue.record("cannot perform task \(taskID): \(why)", sourceLocation: sourceLocation)
        }
        runUntilIdle()
        return ok
    }

    func notPending(_ id: TaskID) -> String {
        let started = tasks.log.contains(.run(id))
        let pending = tasks.pending.map(\.description).joined(separator: ", ")
        return (started ? "it already has a result" : "it was never started") + "; pending: [\(pending)]"
    }
}

extension ProgramTester where P.Message: Sendable {
    /// Delivers `message` to `update` as the result of the pending task `id`
    /// (the newest run of it), as if its operation had returned it, then
    /// runs until idle. A cancelled task is still pending: its late result
    /// is delivered, as the runtime delivers it, for the program to reject.
    /// Records an issue and returns false when no task `id` is pending
    /// (never started, or it already has a result).
    /// - Parameters:
    ///   - id: The task's identity, as given to `run(id:)`.
    ///   - message: The result.
    ///   - cancelled: Whether it counts as ended by cancellation.
    ///   - sourceLocation: Where a failure is reported.
    @discardableResult
    public mutating func complete(
        task id: some Hashable & Sendable, with message: P.Message, cancelled: Bool = false,
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> Bool {
        let taskID = TaskID(id)
        let ok = effects.recorder.complete(taskID, with: message, cancelled: cancelled)
        if !ok { Issue.record("cannot complete task \(taskID): \(notPending(taskID))", sourceLocation: sourceLocation) }
        runUntilIdle()
        return ok
    }
}
