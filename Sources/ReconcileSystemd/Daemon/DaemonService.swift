import CSystemd
import Glibc
import Reconcile
import Synchronization

extension Daemon {
    /// Runs the daemon from an `async` main: `exit(try await daemon.run())`.
    ///
    /// The loop runs on the thread that created the daemon, which must be
    /// the caller's: in an `async` main, create the daemon and await this
    /// before any other `await` (the main thread then holds the loop, and the
    /// loop drains the main actor's queue, as with `run()`). Cancelling the
    /// awaiting task stops the daemon gracefully, as SIGTERM does
    /// (`STOPPING=1`, the shutdown message, tasks cancelled within the
    /// grace), and the exit code is returned. Anywhere else (a task of a
    /// service group), build the daemon inside a `DaemonService`.
    ///
    /// - Parameter isolation: the caller's actor (the main actor in an
    ///   `async` main); the call does not hop off it.
    /// - Returns: the exit code.
    /// - Throws: `DaemonError.notOnLoopThread` when called off the daemon's
    ///   thread; otherwise what `run()` throws.
    public func run(isolation: isolated (any Actor)? = #isolation) async throws -> Int32 {
        guard loop.isOnLoopThread else { throw DaemonError.notOnLoopThread }
        let stopper = LoopStopper(self)
        return try await withTaskCancellationHandler {
            // Capturing the isolated parameter keeps the closure on the
            // caller's actor (SE-0420): otherwise it is nonisolated and hops
            // to the global executor, off the loop's thread, and the main
            // thread parks in `dispatch_main` with no signal blocked.
            _ = isolation
            return try runOnThisThread()
        } onCancel: {
            stopper.stop(reason: "task cancelled")
        }
    }

    /// Stops from outside (`DaemonService`, a cancelled `run()`): logged, then `stop(exitCode: 0)`.
    func stopFromOutside(reason: String) {
        guard !stopRequested else { return }
        logger.notice("\(reason): shutting down")
        stop(exitCode: 0)
    }
}

/// Asks a daemon to stop from any thread: the stop runs on its loop.
final class LoopStopper: @unchecked Sendable {
    private let executor: LoopExecutor
    /// Read and used on the loop's thread only.
    private weak var daemon: (any StoppableDaemon)?

    init(_ daemon: some StoppableDaemon & AnyObject) {
        executor = daemon.loop.executor
        self.daemon = daemon
    }

    func stop(reason: String) {
        executor.execute { [self] in daemon?.stopFromOutside(reason: reason) }
    }
}

/// What `LoopStopper` needs of a `Daemon<P>`, whatever its program.
protocol StoppableDaemon: AnyObject {
    var loop: EventLoop { get }
    func stopFromOutside(reason: String)
}

extension Daemon: StoppableDaemon {}

/// How a `DaemonService` ended.
public struct DaemonShutdown: Equatable, Sendable, CustomStringConvertible {
    /// What `run()` returned.
    public var exitCode: Int32
    /// Why it stopped (`stop requested; tasks ended`, `loop ended`...).
    public var reason: String
    /// How the tasks in flight at shutdown ended.
    public var tasks: TaskShutdownCounts

    /// `exit 0 (stop requested): 1 cancelled, 0 finished, 0 abandoned`.
    public var description: String { "exit \(exitCode) (\(reason)): \(tasks)" }
}

/// A daemon as one service among others in an `async` program, in the shape
/// swift-service-lifecycle's `Service` has (`run() async throws`, graceful
/// shutdown from outside), without depending on it.
///
/// `run()` starts a thread of its own, builds the daemon there with `make`
/// (so the loop, the program's closures and its interpreter all live on
/// that thread) and runs it until a shutdown signal, `stop(exitCode:)`,
/// `triggerGracefulShutdown()` or the cancellation of the task awaiting
/// `run()`; then returns the exit code and keeps the shutdown's report in
/// `shutdown`.
///
/// Signals: the thread blocks the daemon's signals itself. In an `async`
/// main the main thread waits in `sigsuspend` with no signal blocked
/// (libdispatch's `dispatch_main`), so the signals the loop reads are
/// forwarded from whichever thread takes them to the loop's thread, with
/// the sender's pid (Daemon/SignalForwarding.swift); a signal that already
/// has someone else's handler fails the run with `DaemonError.signalHandled`.
///
/// ```swift
/// let service = DaemonService { try Daemon(MyProgram()) { command, daemon in ... } }
/// let code = try await service.run()      // cancel the task, or triggerGracefulShutdown()
/// ```
public final class DaemonService<P: Program>: Sendable {
    private let make: @Sendable () throws -> Daemon<P>
    private let control = ServiceControl()

    /// A service that builds its daemon with `make` when it runs (on the loop's thread).
    ///
    /// Makes the daemon's signals its own at once: from here on a signal
    /// (SIGTERM, SIGINT, SIGHUP...) that arrives before the loop runs is held
    /// and read by the loop once it does (a SIGTERM then is a graceful
    /// shutdown, not a kill). So make the service first thing in `main`,
    /// before any `await`, and run it: a service never run holds them until
    /// it is released (then what it held acts at once).
    /// - Parameter make: builds the daemon; called once, on the thread that runs it.
    public init(_ make: @escaping @Sendable () throws -> Daemon<P>) {
        self.make = make
        // A signal that has someone else's handler fails run() (runHere installs again).
        try? SignalForwarding.prepare(SignalSource.Signal.allCases)
    }

    /// How the run ended (nil until `run()` returned).
    public var shutdown: DaemonShutdown? { control.state.withLock { $0.shutdown } }

    /// A service that never ran gives the signals back: what it held acts
    /// now (a SIGTERM sent meanwhile ends the process), later ones as
    /// before it. (Not while another service's loop has taken them.)
    deinit {
        guard !control.state.withLock({ $0.ran }), SignalForwarding.target.load(ordering: .sequentiallyConsistent) == 0 else { return }
        SignalForwarding.remove(resending: true)
    }

    /// Asks the running daemon to shut down gracefully (as SIGTERM does);
    /// before it runs, makes it stop as soon as it has started. Any thread.
    public func triggerGracefulShutdown() { control.trigger(reason: "graceful shutdown triggered") }

    /// Builds and runs the daemon on a thread of its own until it stops.
    /// Cancelling the calling task triggers a graceful shutdown.
    /// - Returns: the exit code.
    /// - Throws: `DaemonError.serviceAlreadyRan` on a second call; what
    ///   `make` or the daemon's run throws (`SystemdError` when the thread
    ///   cannot start).
    public func run() async throws -> Int32 {
        let first = control.state.withLock { s in
            defer { s.ran = true }
            return !s.ran
        }
        guard first else { throw DaemonError.serviceAlreadyRan }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Int32, any Error>) in
                let body = ThreadBody { [self] in
                    continuation.resume(with: Result { try runHere() })
                }
                var thread = pthread_t()
                let r = pthread_create(&thread, nil, { context in
                    Unmanaged<ThreadBody>.fromOpaque(context!).takeRetainedValue().body()
                    return nil
                }, Unmanaged.passRetained(body).toOpaque())
                if r != 0 {
                    Unmanaged.passUnretained(body).release()
                    continuation.resume(throwing: SystemdError("pthread_create", errno: r))
                } else {
                    pthread_detach(thread)
                }
            }
        } onCancel: { [control] in
            control.trigger(reason: "task cancelled")
        }
    }

    /// The service thread: signals, the daemon, its run.
    private func runHere() throws -> Int32 {
        // Registered first: a run that fails before it has a daemon (whose
        // loop reads them) gives the signals back and sends again what it
        // held or what waits on this thread, instead of losing them.
        var madeDaemon = false
        defer { SignalForwarding.remove(resending: !madeDaemon) }
        try Signals.block()
        let held = try SignalForwarding.install(Signals.notBlockedEverywhere(SignalSource.Signal.allCases))
        let (code, report): (Int32, DaemonShutdown) = try {
            let daemon = try make()
            madeDaemon = true
            if !held.isEmpty {
                let names = held.map { SignalSource.Signal(rawValue: $0)?.description ?? "signal \($0)" }
                daemon.logger.info("held until the loop's thread ran: \(names.joined(separator: ", "))")
            }
            let forwarded = SignalForwarding.forwarded
            if !forwarded.isEmpty {
                daemon.logger.info("signals forwarded to the loop's thread (another thread does not block them): \(forwarded.map(\.description).joined(separator: ", "))")
            }
            let stopper = LoopStopper(daemon)
            let stopNow = control.state.withLock { s in
                s.stopper = stopper
                return s.shutdownRequested
            }
            // Runs once the loop does (the executor's queue).
            if stopNow { stopper.stop(reason: "graceful shutdown triggered before the start") }
            defer { control.state.withLock { $0.stopper = nil } }
            let code = try daemon.runOnThisThread()
            return (code, DaemonShutdown(exitCode: code, reason: daemon.shutdownReason ?? "stopped", tasks: daemon.taskReport))
        }()
        control.state.withLock { $0.shutdown = report }
        return code
    }
}

/// A service's state, apart from its program type (a cancellation handler
/// may capture it).
private final class ServiceControl: Sendable {
    struct State {
        var ran = false
        var stopper: LoopStopper?
        var shutdownRequested = false
        var shutdown: DaemonShutdown?
    }

    let state = Mutex(State())

    func trigger(reason: String) {
        let stopper = state.withLock { s in
            s.shutdownRequested = true
            return s.stopper
        }
        stopper?.stop(reason: reason)
    }
}

/// A thread's work, as the `pthread_create` argument.
private final class ThreadBody {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}
