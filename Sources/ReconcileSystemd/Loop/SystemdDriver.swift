import CSystemd
import Glibc
import Reconcile
import Synchronization

/// Runs a runtime's sources on an sd-event loop.
///
/// Every source callback and every message runs on the loop's thread. Other
/// threads reach the runtime through its `Sender` or an `EventPoster`, which
/// wake the loop through an eventfd.
public final class SystemdDriver: Driver {
    /// The loop the sources run on.
    public let loop: EventLoop
    /// The logger sources use (`SourceContext.logger`). Plan steps are logged
    /// by the host from `Runtime.didReconcile` (`Logger.logReconcile(_:)`), not here.
    public var logger: Logger

    /// Running sources live on their tickets (`driverState`); the driver
    /// keeps only their number.
    private var running = 0
    /// Each kind's `SystemdSource` conformance, looked up once per kind.
    private var kinds: [ObjectIdentifier: (any SystemdSource.Type)?] = [:]
    private var lastKind: (id: ObjectIdentifier, type: (any SystemdSource.Type)?)?
    /// Stopped timer runners, armed again by later timer starts (one
    /// allocation and one free less per timer); at most `spareTimerLimit`.
    private var spareTimers: [TimerRunner] = []
    static let spareTimerLimit = 16_384
    private weak var host: (any DriverHost)?
    private var wakeSource: EventSource?
    private var wakeChannel: WakeChannel?
    private var inotifyKeeper: EventSource?
    /// The file watches' shared directory watches (see `DirectoryWatches`).
    lazy var directoryWatches = DirectoryWatches(loop: loop)

    /// A driver for sources on `loop`.
    public init(loop: EventLoop, logger: Logger = Logger()) {
        self.loop = loop
        self.logger = logger
    }

    /// How many sources are running now.
    public var runningCount: Int { running }

    /// The loop's monotonic time (`sd_event_now`: the time of the current
    /// iteration's wakeup), stamped on transcript records.
    public var loopTime: Duration { .microseconds(Int64(clamping: loop.now())) }

    /// Connects the runtime: an eventfd on the loop pumps its inbox when woken.
    public func attach(_ host: any DriverHost) throws -> Waker {
        self.host = host
        let efd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        try checkLibc("eventfd", efd)
        var s: OpaquePointer?
        let r = sd_event_add_io(loop.handle, &s, efd, UInt32(EPOLLIN.rawValue), { _, fd, _, ud in
            var value: UInt64 = 0
            _ = read(fd, &value, 8)
            Unmanaged<SystemdDriver>.fromOpaque(ud!).takeUnretainedValue().host?.pumpInbox()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        if r < 0 {
            close(efd)
            throw SystemdError("sd_event_add_io", errno: -r)
        }
        wakeSource = EventSource(s!)
        let channel = WakeChannel(fd: efd)
        wakeChannel = channel
        return Waker { channel.wake() }
    }

    /// Starts the ticket's source on the loop; a kind that is not a `SystemdSource`, or a start that throws, becomes a failure event.
    public func start(_ ticket: SourceTicket) {
        // The built-in kinds directly (their configuration read by one
        // class compare, no existential on the way); others through their
        // `SystemdSource` conformance.
        let source = ticket.source
        switch ObjectIdentifier(source) {
        case ObjectIdentifier(TimerSource.self): startTimer(ticket); return
        case ObjectIdentifier(FileWatchSource.self): start(ticket, FileWatchSource.self); return
        case ObjectIdentifier(SignalSource.self): start(ticket, SignalSource.self); return
        default: break
        }
        guard let kind = systemdKind(source) else {
            if let kind = ticket.source as? any TaskBackedSource.Type {
                // A task on the loop's executor (StreamSource).
                ticket.driverState = TaskSourceRunner(stop: kind.startTask(ticket, executor: loop.taskExecutor))
                running += 1
                return
            }
            ticket.fail(SourceFailure(operation: "start \(ticket.id)",
                                      reason: "the sd-event driver cannot run source kind '\(ticket.id.kind)' (it does not conform to SystemdSource)"))
            return
        }
        do {
            ticket.driverState = try kind._start(ticket, context: SourceContext(loop: loop, logger: logger, driver: self))
            running += 1
        } catch {
            ticket.fail(Self.failure(error, ticket))
        }
    }

    /// Applies the ticket's new configuration in place; an error becomes a failure event.
    public func retune(_ ticket: SourceTicket, from old: AnyHashable) {
        guard let state = ticket.driverState else { return }
        if let timer = Self.timerRunner(state) {
            guard let configuration = ticket.configuration(as: TimerSource.self) else { return }
            do { try timer.retune(to: configuration) } catch { ticket.fail(error.failure) }
            return
        }
        guard let source = Self.runningSource(state) else { return }
        do { try source.retune(to: ticket.configuration) } catch { ticket.fail(Self.failure(error, ticket)) }
    }

    /// Stops the source; it emits nothing afterwards.
    public func stop(_ ticket: SourceTicket) {
        guard let state = ticket.driverState else { return }
        if let timer = Self.timerRunner(state) {
            ticket.driverState = nil
            running -= 1
            timer.stop()
            if spareTimers.count < Self.spareTimerLimit { spareTimers.append(timer) }
            return
        }
        guard let source = Self.runningSource(state) else { return }
        ticket.driverState = nil
        running -= 1
        source.stop()
    }

    /// A timer: its configuration read through the box's typed accessor, a
    /// stopped runner reused when there is one (no `SourceContext`, no
    /// existential on the way).
    private func startTimer(_ ticket: SourceTicket) {
        guard let configuration = ticket.configuration(as: TimerSource.self) else {
            ticket.fail(SourceFailure(operation: "start \(ticket.id)", reason: "configuration is not \(TimerSource.Configuration.self)"))
            return
        }
        let runner = spareTimers.popLast() ?? TimerRunner(loop: loop)
        do {
            try runner.start(ticket, configuration)
        } catch {
            ticket.fail(error.failure)
            return
        }
        ticket.driverState = runner
        running += 1
    }

    /// A built-in kind other than timers, specialised for `S`.
    @inline(__always)
    private func start<S: SystemdSource>(_ ticket: SourceTicket, _: S.Type) {
        guard let configuration = ticket.configuration(as: S.self) else {
            ticket.fail(SourceFailure(operation: "start \(ticket.id)", reason: "configuration is not \(S.Configuration.self)"))
            return
        }
        do {
            ticket.driverState = try S.start(ticket, configuration, context: SourceContext(loop: loop, logger: logger, driver: self))
            running += 1
        } catch {
            ticket.fail(Self.failure(error, ticket))
        }
    }

    /// `state` as a running source: the built-in runners by one compare of
    /// their class, others through their conformance.
    private static func runningSource(_ state: AnyObject) -> (any RunningSource)? {
        switch ObjectIdentifier(type(of: state)) {
        case ObjectIdentifier(FileWatchRunner.self): unsafeDowncast(state, to: FileWatchRunner.self)
        case ObjectIdentifier(SignalRunner.self): unsafeDowncast(state, to: SignalRunner.self)
        default: state as? any RunningSource
        }
    }

    /// `state` as a `TimerRunner`, by one compare of its class (no
    /// conformance lookup).
    @inline(__always)
    private static func timerRunner(_ state: AnyObject) -> TimerRunner? {
        ObjectIdentifier(type(of: state)) == ObjectIdentifier(TimerRunner.self) ? unsafeDowncast(state, to: TimerRunner.self) : nil
    }

    /// The `SystemdSource` conformance of `type`, cached per kind.
    private func systemdKind(_ type: any Source.Type) -> (any SystemdSource.Type)? {
        let id = ObjectIdentifier(type)
        if let last = lastKind, last.id == id { return last.type }
        let kind: (any SystemdSource.Type)?
        if let known = kinds[id] { kind = known } else {
            kind = type as? any SystemdSource.Type
            kinds[id] = kind
        }
        lastKind = (id, kind)
        return kind
    }

    /// Disconnects the runtime. The runtime has stopped every source by
    /// then (`Runtime.shutdown` stops all before it detaches).
    public func detach() {
        wakeSource?.close()
        wakeSource = nil
        inotifyKeeper?.close()
        inotifyKeeper = nil
        wakeChannel?.close()
        wakeChannel = nil
        host = nil
    }

    /// sd-event closes its inotify fd when the last watch goes, and closing
    /// an inotify fd waits for an RCU grace period (about a millisecond): a
    /// watch that never fires keeps the fd while the driver is attached. It
    /// shares `/` with file watches, so it asks for their mask (see
    /// `FileWatchRunner.mask`).
    func keepInotifyOpen() {
        guard inotifyKeeper == nil else { return }
        var s: OpaquePointer?
        if sd_event_add_inotify(loop.handle, &s, "/", FileWatchRunner.mask, { _, _, _ in 0 }, nil) >= 0 {
            inotifyKeeper = EventSource(s!)
        }
    }

    static func failure(_ error: any Error, _ ticket: SourceTicket) -> SourceFailure {
        switch error {
        case let e as SourceFailure: e
        case let e as SystemdError: e.failure
        default: SourceFailure(operation: "start \(ticket.id)", reason: String(describing: error))
        }
    }
}

/// The eventfd other threads write to; closed under the same lock, so a late
/// wake never writes to a reused descriptor.
final class WakeChannel: Sendable {
    private let fd: Mutex<Int32>

    init(fd: Int32) { self.fd = Mutex(fd) }

    func wake() {
        fd.withLock { fd in
            guard fd >= 0 else { return }
            var one: UInt64 = 1
            _ = write(fd, &one, 8)
        }
    }

    func close() {
        fd.withLock { fd in
            if fd >= 0 { Glibc.close(fd) }
            fd = -1
        }
    }
}
