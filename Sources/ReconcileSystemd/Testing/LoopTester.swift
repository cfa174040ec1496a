import Reconcile

/// Runs a program on a real sd-event loop inside a test, with bounded waits:
/// the real driver's timers, file watches, signals and connectivity, on the
/// calling thread.
///
/// ```swift
/// let t = try LoopTester(Autosave())
/// try t.runtime.send(.edited)
/// #expect(try t.run(until: { !$0.dirty }, timeout: .seconds(5)))   // the debounce fired
/// ```
///
/// `ProgramTester` and `VirtualDriver` (in `ReconcileTesting`) test a
/// program's logic on virtual time; this is for what only the real loop
/// shows. The runtime is shut down when the tester goes (or by `shutdown()`).
public final class LoopTester<P: Program> {
    /// The loop the program runs on (created here unless one was given).
    public let loop: EventLoop
    /// The real driver.
    public let driver: SystemdDriver
    /// The started runtime: send messages, read its model and stats.
    public let runtime: Runtime<P>
    private var report: ShutdownReport<P.Message>?

    /// Starts `program` on `loop` (a new owned loop by default).
    /// - Parameters:
    ///   - program: The program under test.
    ///   - loop: The loop to run on; nil creates one.
    ///   - logger: Where the driver logs (errors to stderr by default).
    ///   - perform: The command interpreter.
    /// - Throws: `SystemdError` when the loop cannot be created; what
    ///   `Runtime.start()` throws.
    public init(_ program: P, loop: EventLoop? = nil, logger: DaemonLogger = DaemonLogger(level: .error, handler: LogSink.stderr),
                perform: @escaping (P.Command, Runtime<P>) -> Void = { _, _ in }) throws {
        self.loop = try loop ?? EventLoop()
        driver = SystemdDriver(loop: self.loop, logger: logger)
        runtime = Runtime(program, driver: driver, perform: perform)
        try runtime.start()
    }

    /// The committed model.
    public var model: P.Model { runtime.model }

    /// Runs the loop until `done(model)` holds or `timeout` passes; returns
    /// whether it holds. Never waits longer than `timeout`.
    /// - Throws: `SystemdError` when an iteration of the loop fails.
    @discardableResult
    public func run(until done: (P.Model) -> Bool, timeout: Duration) throws -> Bool {
        try loop.run(until: { done(runtime.model) }, timeout: timeout)
    }

    /// Runs the loop until `done()` holds or `timeout` passes; returns
    /// whether it holds.
    /// - Throws: `SystemdError` when an iteration of the loop fails.
    @discardableResult
    public func run(until done: () -> Bool, timeout: Duration) throws -> Bool {
        try loop.run(until: done, timeout: timeout)
    }

    /// Runs the loop for `duration`, to show that nothing more happens.
    /// - Throws: `SystemdError` when an iteration of the loop fails.
    public func run(for duration: Duration) throws {
        _ = try loop.run(until: { false }, timeout: duration)
    }

    /// Shuts the runtime down (every source stopped once) and returns its
    /// report; later calls return the same report.
    @discardableResult
    public func shutdown() -> ShutdownReport<P.Message> {
        if let report { return report }
        let r = runtime.shutdown()
        report = r
        return r
    }

    deinit { _ = shutdown() }
}
