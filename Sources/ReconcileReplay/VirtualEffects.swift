import Reconcile
import Synchronization

/// A serial executor that runs its jobs only when a test lets it
/// (`VirtualDriver.runUntilIdle()`, `advance(by:)`), on the test's thread:
/// tasks run deterministically, without real concurrency.
public final class VirtualExecutor: SerialExecutor, TaskExecutor {
    private let jobs = Mutex<[UnownedJobBox]>([])
    private let ran = Atomic<Int>(0)

    /// An executor with no jobs queued.
    public init() {}

    /// Queues `job` until the test lets jobs run (any thread).
    /// - Parameter job: The job to queue.
    public func enqueue(_ job: consuming ExecutorJob) {
        let box = UnownedJobBox(UnownedJob(job))
        jobs.withLock { $0.append(box) }
    }

    /// This executor as an actor's `unownedExecutor`.
    public func asUnownedSerialExecutor() -> UnownedSerialExecutor { UnownedSerialExecutor(ordinary: self) }
    /// This executor as a task's executor preference.
    public func asUnownedTaskExecutor() -> UnownedTaskExecutor { UnownedTaskExecutor(ordinary: self) }

    /// Jobs run so far.
    public var jobsRun: Int { ran.load(ordering: .relaxed) }

    /// Runs queued jobs, and the jobs they queue, until none is left.
    /// Returns whether any ran.
    @discardableResult
    public func runJobs() -> Bool {
        var any = false
        while true {
            let batch = jobs.withLock { j in
                let b = j
                j = []
                return b
            }
            if batch.isEmpty { return any }
            any = true
            for b in batch {
                ran.add(1, ordering: .relaxed)
                b.job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: asUnownedTaskExecutor())
            }
        }
    }
}

struct UnownedJobBox: @unchecked Sendable {
    let job: UnownedJob
    init(_ job: UnownedJob) { self.job = job }
}

/// Virtual time for `LoopClock`: `VirtualDriver.advance(by:)` moves it and
/// resumes the sleeps that are due, in deadline order.
public final class VirtualClockSource: LoopClockSource {
    final class Sleep: @unchecked Sendable {
        let deadline: Duration
        let serial: UInt64
        var continuation: CheckedContinuation<Void, any Error>?
        var cancelled = false
        init(deadline: Duration, serial: UInt64) {
            self.deadline = deadline
            self.serial = serial
        }
    }

    private struct State: @unchecked Sendable {
        var now: Duration = .zero
        var sleeps: [Sleep] = []
        var serial: UInt64 = 0
    }

    private let state = Mutex(State())

    /// A clock at zero with no sleeps.
    public init() {}

    /// The virtual time now (moved by `advance(by:)`).
    public var now: Duration { state.withLock { $0.now } }

    /// How many sleeps wait.
    public var sleepers: Int { state.withLock { $0.sleeps.count } }

    /// Suspends until the virtual time reaches `deadline`.
    /// - Parameter deadline: The offset from the clock's zero to wake at.
    /// - Throws: `CancellationError` when the task is cancelled first.
    public func sleep(until deadline: Duration) async throws {
        let sleep: Sleep? = state.withLock { s in
            if deadline <= s.now { return nil }
            s.serial += 1
            let sleep = Sleep(deadline: deadline, serial: s.serial)
            s.sleeps.append(sleep)
            return sleep
        }
        guard let sleep else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let cancelled = state.withLock { _ in
                    if sleep.cancelled { return true }
                    sleep.continuation = c
                    return false
                }
                if cancelled { c.resume(throwing: CancellationError()) }
            }
        } onCancel: {
            let c: CheckedContinuation<Void, any Error>? = state.withLock { s in
                sleep.cancelled = true
                s.sleeps.removeAll { $0 === sleep }
                let c = sleep.continuation
                sleep.continuation = nil
                return c
            }
            c?.resume(throwing: CancellationError())
        }
    }

    /// The earliest deadline not after `limit`.
    package func nextDeadline(notAfter limit: Duration) -> Duration? {
        state.withLock { s in s.sleeps.map(\.deadline).filter { $0 <= limit }.min() }
    }

    /// Sets the time and resumes every sleep due by then (deadline order).
    package func set(now: Duration) {
        let due: [CheckedContinuation<Void, any Error>] = state.withLock { s in
            s.now = max(s.now, now)
            let t = s.now
            let ready = s.sleeps.filter { $0.deadline <= t && $0.continuation != nil }
                .sorted { ($0.deadline, $0.serial) < ($1.deadline, $1.serial) }
            s.sleeps.removeAll { r in ready.contains { $0 === r } }
            return ready.compactMap { r in
                let c = r.continuation
                r.continuation = nil
                return c
            }
        }
        for c in due { c.resume() }
    }
}

/// The test kit's task runner: records each `run` and `cancel` by identity
/// and, unless `runsTasks` is set, runs nothing. A test completes a task with
/// a chosen result (`VirtualDriver.complete(task:with:)`), or runs the real
/// operation on the virtual executor (`VirtualDriver.perform(task:)`).
public final class VirtualTasks: TaskRunner {
    /// One call the registry made.
    public enum Call: Hashable, CustomStringConvertible {
        /// `run(id:)` started a task with this identity.
        case run(TaskID)
        /// The task with this identity was cancelled.
        case cancel(TaskID)

        /// `run search-3` or `cancel search-3`.
        public var description: String {
            switch self {
            case .run(let id): "run \(id)"
            case .cancel(let id): "cancel \(id)"
            }
        }
    }

    struct Entry {
        let job: TaskJob
        var task: Task<Void, Never>?
        var cancelled = false
    }

    /// Every call, in order.
    public private(set) var log: [Call] = []
    /// When true, every started task runs its operation on the virtual
    /// executor (still only inside `runUntilIdle`/`advance`).
    public var runsTasks = false

    let executor: VirtualExecutor
    private var entries: [UInt64: Entry] = [:]

    package init(executor: VirtualExecutor) { self.executor = executor }

    /// Records `job` (and runs it when `runsTasks` is set).
    /// - Parameter job: The task the registry started.
    /// - Returns: A closure that records the cancel and cancels a running operation.
    public func start(_ job: TaskJob) -> () -> Void {
        log.append(.run(job.id))
        entries[job.serial] = Entry(job: job)
        if runsTasks { perform(serial: job.serial) }
        return { [weak self] in
            guard let self, var e = entries[job.serial] else { return }
            log.append(.cancel(job.id))
            e.cancelled = true
            entries[job.serial] = e
            e.task?.cancel()
        }
    }

    /// Identities of started tasks without a result yet (cancelled ones
    /// included), in start order.
    public var pending: [TaskID] {
        entries.values.filter { !$0.job.hasCompleted }.sorted { $0.job.serial < $1.job.serial }.map(\.job.id)
    }

    /// Whether the newest task with identity `id` was cancelled.
    public func isCancelled(_ id: some Hashable & Sendable) -> Bool {
        newest(TaskID(id)).map { entries[$0]?.cancelled ?? false } ?? false
    }

    func newest(_ id: TaskID, pendingOnly: Bool = false) -> UInt64? {
        entries.filter { $0.value.job.id == id && (!pendingOnly || !$0.value.job.hasCompleted) }.keys.max()
    }

    package func complete(_ id: TaskID, with message: any Sendable, cancelled: Bool) -> Bool {
        guard let serial = newest(id, pendingOnly: true), let e = entries[serial] else { return false }
        return e.job.complete(with: message, cancelled: cancelled)
    }

    package func perform(_ id: TaskID) -> Bool {
        guard let serial = newest(id, pendingOnly: true), entries[serial]?.task == nil else { return false }
        perform(serial: serial)
        return true
    }

    private func perform(serial: UInt64) {
        guard var e = entries[serial] else { return }
        let job = e.job
        e.task = Task(executorPreference: executor) { await job.run() }
        if e.cancelled { e.task?.cancel() }
        entries[serial] = e
    }
}

extension VirtualDriver: TaskDriver {
    /// The recording runner (`tasks`).
    public var taskRunner: any TaskRunner { tasks }

    /// The virtual clock: sleeps end when `advance(by:)` passes them.
    public var clock: LoopClock { LoopClock(clockSource) }

    /// Delivers `message` as the result of the pending task `id` (the newest
    /// run of it), as if its operation had returned it, then runs until idle.
    /// Returns false when no such task is pending or the type is wrong.
    @discardableResult
    public func complete(task id: some Hashable & Sendable, with message: any Sendable, cancelled: Bool = false) -> Bool {
        let ok = tasks.complete(TaskID(id), with: message, cancelled: cancelled)
        runUntilIdle()
        return ok
    }

    /// Runs the real operation of the pending task `id` on the virtual
    /// executor (its sleeps on `clock` wait for `advance`), until idle.
    @discardableResult
    public func perform(task id: some Hashable & Sendable) -> Bool {
        let ok = tasks.perform(TaskID(id))
        runUntilIdle()
        return ok
    }

    /// Starts a task-backed source (`StreamSource`) on the virtual executor.
    func startTaskBacked(_ ticket: SourceTicket) -> Bool {
        guard let kind = ticket.source as? any TaskBackedSource.Type else { return false }
        taskSourceStops[ticket.activation] = kind.startTask(ticket, executor: executor, producer: executor)
        return true
    }

    func stopTaskBacked(_ ticket: SourceTicket) {
        taskSourceStops.removeValue(forKey: ticket.activation)?()
    }
}
