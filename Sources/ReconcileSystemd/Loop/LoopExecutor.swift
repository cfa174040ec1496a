import CSystemd
import Glibc
import Reconcile
import Synchronization

/// The sd-event loop as a Swift executor, in two roles sharing one queue:
///
/// - `EventLoop.executor` (`.serial`): a `SerialExecutor` an actor adopts
///   through `unownedExecutor`; its jobs run isolated to it.
/// - `EventLoop.taskExecutor` (`.task`): a `TaskExecutor` a task prefers
///   (`Task(executorPreference:)`); its jobs run on the loop as the task's
///   executor, so nonisolated async calls inside the task stay on the loop
///   without re-enqueueing. (The serial one also works as a preference, with
///   one extra hop per nonisolated call.)
///
/// Jobs enqueued from any thread wait in one queue and run on the loop's
/// thread, in the order they were enqueued, from an sd-event IO source on an
/// eventfd (written once per empty -> non-empty transition, as the runtime's
/// inbox). Each dispatch runs the jobs queued when it began: a job that
/// enqueues more yields to the loop's other sources first. Works for owned
/// and borrowed loops and for a host poll loop (the eventfd is in the loop's
/// epoll set, `EventLoop.fd`). `checkIsolated` / `isIsolatingCurrentContext`
/// say whether the caller is on the loop's thread.
public final class LoopExecutor: SerialExecutor, TaskExecutor {
    /// How this executor's jobs run.
    public enum Role: Sendable {
        /// Isolated to the serial executor (actors).
        case serial
        /// On the task executor (tasks' preference).
        case task
    }

    /// This executor's role.
    public let role: Role
    let queue: LoopQueue
    private let sibling: LoopExecutor?

    /// The serial executor of a loop, with its task-executor sibling.
    init(queue: LoopQueue) {
        role = .serial
        self.queue = queue
        sibling = LoopExecutor(taskRoleOn: queue)
    }

    private init(taskRoleOn queue: LoopQueue) {
        role = .task
        self.queue = queue
        sibling = nil
    }

    /// The task-role executor on the same loop (itself when it is one).
    public var taskExecutor: LoopExecutor { sibling ?? self }

    /// The loop's thread (`pthread_self`).
    public var thread: UInt { queue.thread }

    /// Whether the caller runs on the loop's thread.
    public var isOnLoopThread: Bool { CSystemd_thread_id() == queue.thread }

    /// Jobs refused because the loop's executor was closed (its `EventLoop`
    /// went away); the tasks they belonged to never resume.
    public var droppedJobs: Int { queue.dropped.load(ordering: .relaxed) }

    /// Queues `job` to run on the loop's thread, after the work queued before it
    /// (any thread). Wakes the loop.
    /// - Parameter job: The job to run.
    public func enqueue(_ job: consuming ExecutorJob) {
        queue.push(role == .serial ? .serialJob(UnownedJob(job)) : .taskJob(UnownedJob(job)))
    }

    /// Runs `body` on the loop's thread, after the work queued before it.
    public func execute(_ body: @escaping @Sendable () -> Void) {
        queue.push(.call(body))
    }

    /// This executor as an actor's `unownedExecutor`.
    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// This executor as a task's executor preference.
    public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
        UnownedTaskExecutor(ordinary: self)
    }

    /// Traps unless called on the loop's thread (`assumeIsolated`,
    /// `preconditionIsolated` of an actor on this executor).
    public func checkIsolated() {
        precondition(isOnLoopThread, "not on the sd-event loop's thread")
    }

    /// Whether the caller runs on the loop's thread.
    public func isIsolatingCurrentContext() -> Bool? { isOnLoopThread }

    /// Runs what was queued when the dispatch began (loop thread; serial role).
    func dispatch() {
        let task = taskExecutor.asUnownedTaskExecutor()
        for w in queue.takeAll() {
            switch w {
            case .serialJob(let job): job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: task)
            case .taskJob(let job): job.runSynchronously(on: task)
            case .call(let body): body()
            case .arm(let sleeper, let due): sleeper.arm(queue, due)
            }
        }
    }

    func armed(_ s: Sleeper) { queue.sleepers.withLock { $0[ObjectIdentifier(s)] = s } }
    func disarmed(_ s: Sleeper) { _ = queue.sleepers.withLock { $0.removeValue(forKey: ObjectIdentifier(s)) } }

    /// Refuses further work and releases armed sleep timers (loop thread),
    /// so the loop is not kept alive by them; returns how many queued jobs
    /// never ran. Tasks whose jobs are dropped never resume (abandoned).
    func close() -> Int {
        let left = queue.close()
        let armed = queue.sleepers.withLock { s in
            let all = Array(s.values)
            s = [:]
            return all
        }
        for sleeper in armed {
            sleeper.disarm()
            sleeper.resume(throwing: CancellationError())
        }
        return left
    }
}

/// The loop executors' shared queue and wake.
final class LoopQueue: Sendable {
    enum Work: @unchecked Sendable {
        case serialJob(UnownedJob)
        case taskJob(UnownedJob)
        case call(@Sendable () -> Void)
        /// A clock sleep to arm on the loop's thread (failed, not dropped,
        /// if the loop goes away first).
        case arm(Sleeper, UInt64)
    }

    private struct State: @unchecked Sendable {
        var work: [Work] = []
        var closed = false
    }

    /// The `sd_event *` sleeps arm their timers through, until the queue
    /// closes (loop thread only; the loop closes the queue before it frees
    /// the `sd_event`, on that thread). A clock keeps the queue, never a
    /// bare handle: after the loop is gone it finds nil here, not a freed
    /// loop (nor a new one at the same address).
    nonisolated(unsafe) private var loopHandle: OpaquePointer?

    let thread: UInt
    private let channel: WakeChannel
    private let state = Mutex(State())
    let dropped = Atomic<Int>(0)
    /// Clock sleeps with an armed timer on this loop (closed with it).
    let sleepers = Mutex<[ObjectIdentifier: Sleeper]>([:])

    init(thread: UInt, channel: WakeChannel, loop: OpaquePointer) {
        self.thread = thread
        self.channel = channel
        loopHandle = loop
    }

    /// The loop to arm a timer on, or nil once the queue closed (loop thread).
    var armingHandle: OpaquePointer? { state.withLock { $0.closed } ? nil : loopHandle }

    /// Queues `work`; false (and counted as dropped) once the queue closed.
    @discardableResult
    func push(_ work: Work) -> Bool {
        let wake: Bool? = state.withLock { q in
            if q.closed { return nil }
            q.work.append(work)
            return q.work.count == 1
        }
        switch wake {
        case nil: dropped.add(1, ordering: .relaxed)
        case true?: channel.wake()
        case false?: break
        }
        return wake != nil
    }

    func takeAll() -> [Work] {
        state.withLock { q in
            let work = q.work
            q.work = []
            return work
        }
    }

    func close() -> Int {
        let left = state.withLock { q in
            q.closed = true
            let work = q.work
            q.work = []
            return work
        }
        loopHandle = nil
        dropped.add(left.count, ordering: .relaxed)
        channel.close()
        // A sleep waiting to be armed fails: its task resumes with the error.
        for case .arm(let sleeper, _) in left { sleeper.resume(throwing: LoopError.gone) }
        return left.count
    }
}

/// The executor's eventfd and IO source on one loop (kept by `EventLoop`,
/// created with it). The source is the loop's own, not counted in
/// `EventSourceAccounting` (which counts the sources runtimes start).
final class LoopExecutorSource {
    let executor: LoopExecutor
    private var source: OpaquePointer?

    init(loop: OpaquePointer, thread: UInt) throws(SystemdError) {
        let efd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        if efd < 0 { throw SystemdError("eventfd", errno: Glibc.errno) }
        let executor = LoopExecutor(queue: LoopQueue(thread: thread, channel: WakeChannel(fd: efd), loop: loop))
        var s: OpaquePointer?
        let r = sd_event_add_io(loop, &s, efd, UInt32(EPOLLIN.rawValue), { _, fd, _, ud in
            var value: UInt64 = 0
            _ = read(fd, &value, 8)
            Unmanaged<LoopExecutor>.fromOpaque(ud!).takeUnretainedValue().dispatch()
            return 0
        }, Unmanaged.passUnretained(executor).toOpaque())
        if r < 0 {
            Glibc.close(efd)
            throw SystemdError("sd_event_add_io", errno: -r)
        }
        self.executor = executor
        source = s
    }

    /// Detaches from the loop; later jobs are dropped (counted).
    func close() {
        if let s = source {
            source = nil
            sd_event_source_disable_unref(s)
        }
        _ = executor.close()
    }

    deinit { close() }
}

/// Real monotonic time on the sd-event loop: `now` is `CLOCK_MONOTONIC`,
/// a sleep is a one-shot sd-event timer armed on the loop's thread.
///
/// It keeps (retains) the executor and through it the queue that holds the
/// loop's handle while the loop lives: a sleep after the loop is gone, from
/// any thread, fails with `LoopError.gone`.
final class SystemdClockSource: LoopClockSource {
    private let executor: LoopExecutor

    init(executor: LoopExecutor) {
        self.executor = executor
    }

    var now: Duration {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return .seconds(Int64(ts.tv_sec)) + .nanoseconds(Int64(ts.tv_nsec))
    }

    func sleep(until deadline: Duration) async throws {
        let sleeper = Sleeper()
        sleeper.executor = executor
        let executor = self.executor
        let queue = executor.queue
        // Rounded up to whole microseconds: never wakes before the deadline.
        let due = usec(deadline + .nanoseconds(999))
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                guard sleeper.set(c) else { return }
                if executor.isOnLoopThread { sleeper.arm(queue, due) } else if !queue.push(.arm(sleeper, due)) {
                    sleeper.resume(throwing: LoopError.gone)
                }
            }
        } onCancel: {
            sleeper.resume(throwing: CancellationError())
            executor.execute { sleeper.disarm() }
        }
    }
}

/// One pending sleep: resumed exactly once (timer or cancellation).
final class Sleeper: @unchecked Sendable {
    private struct State {
        var continuation: CheckedContinuation<Void, any Error>?
        var cancelled = false
        var done = false
    }
    private let state = Mutex(State())
    /// Loop thread only.
    private var source: EventSource?

    /// Stores the continuation; false (and resumed) if already cancelled.
    func set(_ c: CheckedContinuation<Void, any Error>) -> Bool {
        let cancelled = state.withLock { s in
            if s.cancelled { s.done = true; return true }
            s.continuation = c
            return false
        }
        if cancelled { c.resume(throwing: CancellationError()) }
        return !cancelled
    }

    func resume(throwing error: (any Error)? = nil) {
        let c: CheckedContinuation<Void, any Error>? = state.withLock { s in
            if error != nil { s.cancelled = true }
            guard !s.done, let c = s.continuation else { return nil }
            s.done = true
            s.continuation = nil
            return c
        }
        if let error { c?.resume(throwing: error) } else { c?.resume() }
    }

    /// Loop thread: arms the timer on `queue`'s loop, or fails the sleep
    /// with `LoopError.gone` when that loop is gone.
    func arm(_ queue: LoopQueue, _ usec: UInt64) {
        if state.withLock({ $0.done }) { return }
        guard let loop = queue.armingHandle else {
            resume(throwing: LoopError.gone)
            return
        }
        var s: OpaquePointer?
        let r = sd_event_add_time(loop, &s, CLOCK_MONOTONIC, usec, 1, { _, _, ud in
            let sleeper = Unmanaged<Sleeper>.fromOpaque(ud!).takeUnretainedValue()
            sleeper.disarm()
            sleeper.resume()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        if r < 0 {
            resume(throwing: SystemdError("sd_event_add_time", errno: -r))
            return
        }
        source = EventSource(s!)
        // The source's userdata is unretained: keep self until disarmed.
        retainedSelf = Unmanaged.passRetained(self)
        executor?.armed(self)
    }

    /// The executor whose loop holds the timer (set before arming).
    weak var executor: LoopExecutor?

    private var retainedSelf: Unmanaged<Sleeper>?

    /// Loop thread.
    func disarm() {
        executor?.disarmed(self)
        source?.close()
        source = nil
        retainedSelf?.release()
        retainedSelf = nil
    }
}
