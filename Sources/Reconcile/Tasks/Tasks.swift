import Synchronization

/// The identity of an owned task: any hashable, sendable key (a request ID,
/// a phase, a string). One task per identity is *in flight* at a time.
public struct TaskID: Hashable, @unchecked Sendable, CustomStringConvertible {
    let box: HashableBox
    let cachedHash: Int

    /// The identity keyed by `key`.
    public init<Key: Hashable & Sendable>(_ key: Key) {
        if let id = key as? TaskID {
            self = id
            return
        }
        box = TypedHashableBox(key)
        var h = Hasher()
        h.combine(ObjectIdentifier(Key.self))   // keys of two empty types hash apart
        h.combine(key)
        cachedHash = h.finalize()
    }

    /// The key as given.
    public var key: AnyHashable { box.hashable }

    /// Whether `a` and `b` have equal keys of the same type.
    public static func == (a: TaskID, b: TaskID) -> Bool {
        a.cachedHash == b.cachedHash && (a.box === b.box || a.box.isEqual(b.box))
    }
    /// Hashes the key's type and the key (computed once, at init).
    public func hash(into hasher: inout Hasher) { hasher.combine(cachedHash) }
    /// The key as text (`search-3`).
    public var description: String { "\(key.base)" }
}

/// What `run` does when a task with the same identity is still in flight.
public enum InFlightPolicy: Sendable {
    /// Cancel the running task and start the new one (the default). The
    /// cancelled task's result is still delivered; `update` rejects it.
    case cancelPrevious
    /// Keep the running task; the new one is not started.
    case keepPrevious
}

/// Where a task's operation runs.
public enum TaskPlacement: Sendable {
    /// On the loop's executor (the driver's): every job and continuation on
    /// the loop thread. Never block in such a task.
    case loop
    /// On Swift's global concurrent executor, for CPU-heavy or blocking work;
    /// the result still comes back through the mailbox on the loop thread.
    case offload
}

/// One started task as a driver's `TaskRunner` sees it: its identity and a
/// way to run it. The runner decides where it runs (or, in a test kit,
/// whether it runs at all).
public final class TaskJob: Sendable {
    /// The identity the command interpreter gave.
    public let id: TaskID
    /// Increasing per runtime: tells two runs of one identity apart.
    public let serial: UInt64
    /// Where the operation asked to run.
    public let placement: TaskPlacement
    /// Runs the operation and posts its typed result (after `claim()`).
    private let body: @Sendable (TaskJob) async -> Void
    /// Posts an erased result of the program's type (test kits); false on a type mismatch.
    private let postErased: @Sendable (TaskJob, any Sendable, Bool) -> Bool
    private let done = Atomic<Bool>(false)

    init(id: TaskID, serial: UInt64, placement: TaskPlacement,
         body: @escaping @Sendable (TaskJob) async -> Void,
         postErased: @escaping @Sendable (TaskJob, any Sendable, Bool) -> Bool) {
        self.id = id
        self.serial = serial
        self.placement = placement
        self.body = body
        self.postErased = postErased
    }

    /// Runs the operation and hands its message to the runtime (once).
    public func run() async { await body(self) }

    /// Takes the one right to hand over a result.
    func claim() -> Bool {
        done.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }

    /// Hands `message` to the runtime as this task's result without running
    /// the operation (test kits). Returns false when the task already has a
    /// result or `message` is not of the program's message type.
    @discardableResult
    public func complete(with message: any Sendable, cancelled: Bool = false) -> Bool {
        postErased(self, message, cancelled)
    }

    /// Whether the task has handed over its result.
    public var hasCompleted: Bool { done.load(ordering: .acquiring) }
}

/// Starts tasks for a runtime: supplied by the driver (`TaskDriver`). The
/// sd-event driver runs them on the loop's executor; the test kit records.
public protocol TaskRunner: AnyObject {
    /// Starts `job` (loop thread) and returns what cancels it (loop thread).
    func start(_ job: TaskJob) -> () -> Void
}

/// A driver that supplies where tasks run and the clock they read.
public protocol TaskDriver: Driver {
    /// Starts the runtime's tasks.
    var taskRunner: any TaskRunner { get }
    /// The clock programs' tasks sleep on.
    var clock: LoopClock { get }
}

/// Runs each task as a Swift `Task` preferring `executor` (nil: the global
/// concurrent executor). `.offload` tasks always use the global executor.
public final class ExecutorTaskRunner: TaskRunner {
    let executor: (any TaskExecutor)?

    /// A runner on `executor`.
    public init(executor: (any TaskExecutor)?) { self.executor = executor }

    /// Starts `job` as a `Task` on the runner's executor (`.offload`: the global one).
    /// - Parameter job: The task to run.
    /// - Returns: A closure that cancels the `Task`.
    public func start(_ job: TaskJob) -> () -> Void {
        let preferred: (any TaskExecutor)? = job.placement == .offload ? globalConcurrentExecutor : executor
        let task = Task(executorPreference: preferred) { await job.run() }
        return { task.cancel() }
    }
}

/// How the tasks in flight at shutdown ended.
public struct TaskShutdownCounts: Equatable, Sendable, CustomStringConvertible {
    /// Ended by cancellation (threw `CancellationError`) within the grace period.
    public var cancelled = 0
    /// Ran to a result (or another error) within the grace period.
    public var finished = 0
    /// Still running at the deadline; their results are never delivered.
    public var abandoned = 0

    /// All counts zero.
    public init() {}

    /// `2 cancelled, 1 finished, 0 abandoned`, as the shutdown log line shows it.
    public var description: String { "\(cancelled) cancelled, \(finished) finished, \(abandoned) abandoned" }
}

/// Counters of a runtime's task registry.
public struct TaskStats: Equatable, Sendable {
    /// Tasks started.
    public var started = 0
    /// Tasks cancelled (by `cancel(id:)`, by a new run, by shutdown).
    public var cancelled = 0
    /// Results delivered to `update` (cancelled tasks' results included).
    public var delivered = 0
    /// Runs not started: `.keepPrevious` with one in flight, or after shutdown began.
    public var refused = 0

    /// All counters zero.
    public init() {}
}

/// A runtime's owned tasks, by identity: what a command interpreter uses
/// (`runtime.tasks`, `daemon.tasks`). Loop thread only.
///
/// - `run(id:)` starts an operation whose result becomes a message. The
///   result goes through the mailbox and is never refused for capacity.
/// - `cancel(id:)` cancels the task in flight with that identity; its result
///   (if it produces one) is still delivered, so `update` must reject it by
///   request identity or phase, as with a late tick.
/// - Shutdown cancels every task, waits up to a grace period (drivers that run
///   a loop), and delivers nothing afterwards.
public final class TaskRegistry<Message> {
    struct Running {
        let job: TaskJob
        var cancel: () -> Void
        var cancelled = false
        var atShutdown = false
    }

    enum Phase { case open, stopping, closed }

    /// Counters.
    public private(set) var stats = TaskStats()

    private var running: [UInt64: Running] = [:]
    private var current: [TaskID: UInt64] = [:]
    private var nextSerial: UInt64 = 0
    private var phase = Phase.open
    private var counts = TaskShutdownCounts()
    /// Where tasks start: nil until the runtime attaches its driver's
    /// runner (tasks run before that wait in `queued`, so that a `.loop`
    /// task starts on the loop, not on the global executor).
    private var runner: (any TaskRunner)?
    /// Serials of tasks run before a runner was attached, in order.
    private var queued: [UInt64] = []
    let results = TaskResults<Message>()
    /// Called on the loop thread once every task has ended after shutdown began.
    var onSettled: (() -> Void)?

    /// A registry with nothing in flight (a runtime makes its own; the test
    /// kit's `ProgramTester` makes one for its interpreter).
    package init() {}

    /// The identities in flight (started, not yet ended, not cancelled).
    public var inFlight: Set<TaskID> { Set(current.keys) }

    /// Whether a task with identity `id` is in flight.
    public func isInFlight(_ id: some Hashable & Sendable) -> Bool { current[TaskID(id)] != nil }

    /// Tasks not yet ended, cancelled ones included.
    public var runningCount: Int { running.count }

    /// Whether shutdown began: new runs are refused.
    public var isShuttingDown: Bool { phase != .open }

    /// Cancels the task in flight with identity `id`; returns whether there was one.
    @discardableResult
    public func cancel(id: some Hashable & Sendable) -> Bool {
        guard let serial = current.removeValue(forKey: TaskID(id)) else { return false }
        cancelRunning(serial)
        return true
    }

    /// Cancels every task in flight.
    public func cancelAll() {
        current = [:]
        for serial in running.keys { cancelRunning(serial) }
    }

    private func cancelRunning(_ serial: UInt64) {
        guard var r = running[serial], !r.cancelled else { return }
        r.cancelled = true
        running[serial] = r
        stats.cancelled += 1
        r.cancel()
    }

    // MARK: Runtime side

    package func attach(waker: Waker, runner: (any TaskRunner)?) {
        results.setWaker(waker)
        let runner = runner ?? ExecutorTaskRunner(executor: nil)
        self.runner = runner
        // Tasks run before the start start now, on the driver's runner; one
        // cancelled meanwhile starts cancelled (its result is still delivered).
        let waiting = queued
        queued = []
        for serial in waiting {
            guard let entry = running[serial] else { continue }
            let cancel = runner.start(entry.job)
            running[serial]?.cancel = cancel
            if entry.cancelled { cancel() }
        }
    }

    func start(id: TaskID, policy: InFlightPolicy, placement: TaskPlacement,
               body: @escaping @Sendable (TaskJob, TaskResults<Message>) async -> Void) -> Bool {
        guard phase == .open else {
            stats.refused += 1
            return false
        }
        if let previous = current[id] {
            if policy == .keepPrevious {
                stats.refused += 1
                return false
            }
            cancelRunning(previous)
        }
        nextSerial += 1
        let serial = nextSerial
        let results = self.results
        let job = TaskJob(id: id, serial: serial, placement: placement, body: { await body($0, results) }) { [weak results] job, message, cancelled in
            guard let results, let message = message as? Message, job.claim() else { return false }
            results.post(serial: serial, message: message, cancelled: cancelled)
            return true
        }
        current[id] = serial
        stats.started += 1
        // Registered before it can end: its result is matched on the loop.
        running[serial] = Running(job: job, cancel: {})
        guard let runner else {
            queued.append(serial)
            return true
        }
        let cancel = runner.start(job)
        if running[serial] != nil { running[serial] = Running(job: job, cancel: cancel) }
        return true
    }

    /// Moves ended tasks' results out (loop thread), in the order they ended,
    /// each with its task's ID.
    package func takeResults(_ deliver: (Message, AnyHashable) -> Void) {
        for r in results.takeAll() {
            guard let entry = running.removeValue(forKey: r.serial) else { continue }
            if current[entry.job.id] == r.serial { current[entry.job.id] = nil }
            if entry.atShutdown {
                if r.cancelled { counts.cancelled += 1 } else { counts.finished += 1 }
            }
            stats.delivered += 1
            deliver(r.message, entry.job.id)
        }
    }

    /// Called after each pump: tells the host when shutdown may finish.
    func checkSettled() {
        if phase == .stopping, running.isEmpty, let hook = onSettled {
            onSettled = nil
            hook()
        }
    }

    /// Cancels every task and refuses new runs; returns how many still run.
    func beginShutdown() -> Int {
        guard phase == .open else { return running.count }
        phase = .stopping
        for (serial, var r) in running {
            r.atShutdown = true
            running[serial] = r
        }
        cancelAll()
        return running.count
    }

    /// Closes the registry: what still runs is abandoned; results queued but
    /// not delivered are counted and returned (never delivered).
    func close() -> (TaskShutdownCounts, [Message]) {
        if phase == .open { _ = beginShutdown() }
        phase = .closed
        onSettled = nil
        var undelivered: [Message] = []
        for r in results.close() {
            guard let entry = running.removeValue(forKey: r.serial) else { continue }
            if entry.atShutdown {
                if r.cancelled { counts.cancelled += 1 } else { counts.finished += 1 }
            }
            undelivered.append(r.message)
        }
        counts.abandoned += running.count
        running = [:]
        current = [:]
        return (counts, undelivered)
    }
}

extension TaskRegistry where Message: Sendable {
    /// Starts `operation` as the task `id`; its result becomes a message.
    ///
    /// - Parameters:
    ///   - id: the task's identity: any hashable, sendable key.
    ///   - policy: what to do when `id` is in flight (default: cancel it).
    ///   - placement: the loop's executor (default) or the global one.
    ///   - operation: the work; what it returns is delivered to `update`.
    /// - Returns: whether the task was started (not with `.keepPrevious` and
    ///   one in flight, not after shutdown began).
    @discardableResult
    public func run(
        id: some Hashable & Sendable, policy: InFlightPolicy = .cancelPrevious, placement: TaskPlacement = .loop,
        _ operation: @escaping @Sendable () async -> Message
    ) -> Bool {
        start(id: TaskID(id), policy: policy, placement: placement) { job, results in
            let message = await operation()
            if job.claim() { results.post(serial: job.serial, message: message, cancelled: false) }
        }
    }

    /// Starts a throwing `operation` as the task `id`: its result, or the
    /// message `failure` makes of what it threw (a `CancellationError`
    /// included), becomes a message. Nothing thrown escapes.
    ///
    /// - Parameters:
    ///   - id: the task's identity: any hashable, sendable key.
    ///   - policy: what to do when `id` is in flight (default: cancel it).
    ///   - placement: the loop's executor (default) or the global one.
    ///   - operation: the work; what it returns is delivered to `update`.
    ///   - failure: makes the message for what `operation` threw.
    /// - Returns: whether the task was started.
    @discardableResult
    public func run(
        id: some Hashable & Sendable, policy: InFlightPolicy = .cancelPrevious, placement: TaskPlacement = .loop,
        _ operation: @escaping @Sendable () async throws -> Message,
        failure: @escaping @Sendable (any Error) -> Message
    ) -> Bool {
        start(id: TaskID(id), policy: policy, placement: placement) { job, results in
            let message: Message, cancelled: Bool
            do {
                message = try await operation()
                cancelled = false
            } catch {
                message = failure(error)
                cancelled = error is CancellationError
            }
            if job.claim() { results.post(serial: job.serial, message: message, cancelled: cancelled) }
        }
    }
}

/// What a command interpreter is handed: the program's owned tasks and the
/// clock they sleep on. `Runtime`, `Daemon` and `ProgramTester`'s
/// `TesterEffects` conform, so one interpreter function serves all three:
///
/// ```swift
/// func interpret(_ command: Command, _ context: some CommandContext<Message>) {
///     if case .search(let id, let query) = command {
///         let clock = context.clock
///         context.tasks.run(id: id) { try await lookup(query, clock) } failure: { .failed(id, "\($0)") }
///     }
/// }
/// ```
public protocol CommandContext<Message>: AnyObject {
    /// The program's message type.
    associatedtype Message
    /// The owned tasks, by identity.
    var tasks: TaskRegistry<Message> { get }
    /// The clock tasks sleep on.
    var clock: LoopClock { get }
}

extension Runtime: CommandContext {}

/// Ended tasks' results waiting for the loop: unbounded (each is one task the
/// program started), closed at shutdown (a `WakingQueue`).
final class TaskResults<Message>: Sendable {
    struct Item: @unchecked Sendable {
        let serial: UInt64
        let message: Message
        let cancelled: Bool
    }

    private let queue = WakingQueue<Item, Void>(())

    func setWaker(_ waker: Waker) { queue.setWaker(waker) }

    func post(serial: UInt64, message: Message, cancelled: Bool) {
        _ = queue.post(Item(serial: serial, message: message, cancelled: cancelled)) { _, _ in .accepted }
    }

    func takeAll() -> [Item] { queue.takeAll() }

    func close() -> [Item] { queue.close() }
}
