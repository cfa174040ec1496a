import CSystemd
import Glibc
import Reconcile

/// An sd-event loop, owned or borrowed.
///
/// - An **owned** loop is created here (`sd_event_new`), run with `run()`,
///   ended with `exit(_:)`, and released when this object goes away.
/// - A **borrowed** loop belongs to the daemon: Reconcile attaches sources to
///   it and detaches them on shutdown, and never runs, exits or releases it.
///
/// Not thread-safe: use a loop from the thread that created it (other threads
/// use a runtime's `Sender`, or `executor`, which any thread may use).
public final class EventLoop {
    /// Who owns the `sd_event`.
    public enum Ownership: Sendable {
        /// Created here; run, exited and released here.
        case owned
        /// The host's; never run, exited or released here.
        case borrowed
    }

    /// The `sd_event *`.
    public let handle: OpaquePointer
    /// Owned or borrowed.
    public let ownership: Ownership
    /// The thread the loop belongs to (`pthread_self` of its creator).
    public let thread: UInt

    /// Creates a new loop owned by this object, with its executor.
    /// The corresponding C function is `sd_event_new`.
    /// - Throws: `SystemdError` if the loop, or its executor's eventfd and
    ///   IO source, cannot be created (out of descriptors: `EMFILE`).
    public init() throws(SystemdError) {
        var e: OpaquePointer?
        try check("sd_event_new", sd_event_new(&e))
        let thread = CSystemd_thread_id()
        do {
            executorSource = try LoopExecutorSource(loop: e!, thread: thread)
        } catch {
            sd_event_unref(e)
            throw error
        }
        handle = e!
        ownership = .owned
        self.thread = thread
    }

    /// Borrows a daemon's loop: sources are attached and detached, the loop
    /// is never run, exited or released here. The loop's executor (an
    /// eventfd and its IO source) is added to it now.
    /// - Throws: `SystemdError` if the executor's eventfd or IO source
    ///   cannot be created.
    public init(borrowing handle: OpaquePointer) throws(SystemdError) {
        let thread = CSystemd_thread_id()
        executorSource = try LoopExecutorSource(loop: handle, thread: thread)
        self.handle = handle
        ownership = .borrowed
        self.thread = thread
    }

    deinit {
        executorSource.close()
        if ownership == .owned { sd_event_unref(handle) }
    }

    private let executorSource: LoopExecutorSource

    /// The loop as a Swift executor, created with the loop (so it never
    /// fails later and any thread may read it): tasks preferring it and
    /// actors adopting it run on this loop.
    public var executor: LoopExecutor { executorSource.executor }

    /// The loop as a task executor, for `Task(executorPreference:)`: the
    /// task's jobs and continuations run on this loop.
    public var taskExecutor: LoopExecutor { executor.taskExecutor }

    /// Real monotonic time; sleeps are sd-event timers on this loop.
    public var clock: LoopClock { LoopClock(SystemdClockSource(executor: executor)) }

    /// Whether the caller is on the loop's thread.
    public var isOnLoopThread: Bool { CSystemd_thread_id() == thread }

    /// Keeps `object` until the loop's next iteration, then lets it go: for
    /// something that must not be freed inside one of its own callbacks (an
    /// sd-bus connection still dispatching). False when the loop cannot take
    /// the deferred source (it is finishing): `object` is then kept for ever
    /// rather than freed under its caller; the caller says so.
    /// The corresponding C function is `sd_event_add_defer`.
    func releaseOnNextIteration(_ object: AnyObject) -> Bool {
        let box = Unmanaged<AnyObject>.passRetained(object).toOpaque()
        var s: OpaquePointer?
        let r = sd_event_add_defer(handle, &s, { s, _ in
            sd_event_source_disable_unref(s)   // its destroy callback releases the box
            return 0
        }, box)
        guard r >= 0 else { return false }
        sd_event_source_set_destroy_callback(s) { ud in Unmanaged<AnyObject>.fromOpaque(ud!).release() }
        return true
    }

    /// The loop's current time on `clock` (the time of the current iteration).
    /// The corresponding C function is `sd_event_now`.
    public func now(_ clock: clockid_t = CLOCK_MONOTONIC) -> UInt64 {
        var usec: UInt64 = 0
        if sd_event_now(handle, clock, &usec) < 0 { return clockMicroseconds(clock) }
        return usec
    }

    /// Runs one iteration, waiting at most `timeout`. Returns whether
    /// something was dispatched.
    /// The corresponding C function is `sd_event_run`.
    @discardableResult
    public func runOnce(timeout: Duration? = nil) throws(SystemdError) -> Bool {
        let usec: UInt64 = timeout.map(usec) ?? usecInfinity
        return try check("sd_event_run", sd_event_run(handle, usec)) > 0
    }

    /// Runs iterations until `done()` is true or `timeout` passes; returns
    /// `done()`. For tests and hosts that wait on the loop with a deadline.
    @discardableResult
    public func run(until done: () -> Bool, timeout: Duration) throws(SystemdError) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while !done() {
            let left = deadline - ContinuousClock.now
            if left <= .zero { return done() }
            try runOnce(timeout: min(left, .milliseconds(50)))
        }
        return true
    }

    /// Runs an owned loop until `exit(_:)`; returns the exit code.
    /// - Throws: `LoopError.borrowed` for a borrowed loop.
    /// The corresponding C function is `sd_event_loop`.
    public func run() throws -> Int32 {
        guard ownership == .owned else { throw LoopError.borrowed }
        return try check("sd_event_loop", sd_event_loop(handle))
    }

    /// Asks an owned loop to finish with `code`.
    /// The corresponding C function is `sd_event_exit`.
    public func exit(_ code: Int32 = 0) throws {
        guard ownership == .owned else { throw LoopError.borrowed }
        try check("sd_event_exit", sd_event_exit(handle, code))
    }

    /// The loop's epoll fd, for embedding in a host's poll loop (see
    /// Docs/Embedding.md).
    /// The corresponding C function is `sd_event_get_fd`.
    public var fd: Int32 { sd_event_get_fd(handle) }
}

/// Misuse of a loop or runtime host, as a catchable error.
public enum LoopError: Error, Equatable, CustomStringConvertible {
    /// A borrowed loop cannot be run, exited or released by Reconcile.
    case borrowed
    /// `run()` was called while already running.
    case alreadyRunning
    /// `run()` was called after the runtime shut down.
    case shutDown
    /// The loop is gone: a sleep on its clock cannot be armed.
    case gone

    /// One sentence for a log line.
    public var description: String {
        switch self {
        case .borrowed: "the loop is borrowed: its owner runs and exits it"
        case .alreadyRunning: "the daemon is already running"
        case .shutDown: "the daemon has shut down and cannot run again"
        case .gone: "the loop is gone: its clock cannot sleep"
        }
    }
}
