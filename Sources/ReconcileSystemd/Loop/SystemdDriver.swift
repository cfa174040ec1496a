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

    /// Running sources live on their tickets (`driverState`, an
    /// `OwnedSource`), linked unretained into this list so `detach` and
    /// deinit can stop the ones the runtime did not.
    private let owned = OwnedSources()
    /// Each kind's `SystemdSource` conformance, looked up once per kind.
    private var kinds: [ObjectIdentifier: (any SystemdSource.Type)?] = [:]
    private var lastKind: (id: ObjectIdentifier, type: (any SystemdSource.Type)?)?
    /// Stopped timers (unlinked nodes holding a `TimerRunner`), armed again
    /// by later timer starts (no allocation and no free per timer); at most
    /// `spareTimerLimit`.
    private var spareTimers: [OwnedSource] = []
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
    public var runningCount: Int { owned.count }

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
                ticket.driverState = owned.add(TaskSourceRunner(stop: kind.startTask(ticket, executor: loop.taskExecutor)), ticket)
                return
            }
            ticket.fail(SourceFailure(operation: "start \(ticket.id)",
                                      reason: "the sd-event driver cannot run source kind '\(ticket.id.kind)' (it does not conform to SystemdSource)"))
            return
        }
        do {
            ticket.driverState = owned.add(try kind._start(ticket, context: SourceContext(loop: loop, logger: logger, driver: self)), ticket)
        } catch {
            ticket.fail(Self.failure(error, ticket))
        }
    }

    /// Applies the ticket's new configuration in place; an error becomes a failure event.
    public func retune(_ ticket: SourceTicket, from old: AnyHashable) {
        guard let node = ticket.driverState as? OwnedSource else { return }
        if let timer = Self.timerRunner(node.source) {
            guard let configuration = ticket.configuration(as: TimerSource.self) else { return }
            do { try timer.retune(to: configuration) } catch { ticket.fail(error.failure) }
            return
        }
        let source = node.source
        do { try source.retune(to: ticket.configuration) } catch { ticket.fail(Self.failure(error, ticket)) }
    }

    /// Stops the source; it emits nothing afterwards.
    public func stop(_ ticket: SourceTicket) {
        guard let source = ticket.driverState as? OwnedSource else { return }
        ticket.driverState = nil
        source.stop()
        if Self.timerRunner(source.source) != nil, spareTimers.count < Self.spareTimerLimit { spareTimers.append(source) }
    }

    /// A timer: its configuration read through the box's typed accessor, a
    /// stopped runner reused when there is one (no `SourceContext`, no
    /// existential on the way).
    private func startTimer(_ ticket: SourceTicket) {
        guard let configuration = ticket.configuration(as: TimerSource.self) else {
            ticket.fail(SourceFailure(operation: "start \(ticket.id)", reason: "configuration is not \(TimerSource.Configuration.self)"))
            return
        }
        let node = spareTimers.popLast() ?? OwnedSource(TimerRunner(loop: loop))
        do {
            try unsafeDowncast(node.source as AnyObject, to: TimerRunner.self).start(ticket, configuration)
        } catch {
            spareTimers.append(node)
            ticket.fail(error.failure)
            return
        }
        ticket.driverState = owned.link(node, ticket)
    }

    /// A built-in kind other than timers, specialised for `S`.
    @inline(__always)
    private func start<S: SystemdSource>(_ ticket: SourceTicket, _: S.Type) {
        guard let configuration = ticket.configuration(as: S.self) else {
            ticket.fail(SourceFailure(operation: "start \(ticket.id)", reason: "configuration is not \(S.Configuration.self)"))
            return
        }
        do {
            ticket.driverState = owned.add(try S.start(ticket, configuration, context: SourceContext(loop: loop, logger: logger, driver: self)), ticket)
        } catch {
            ticket.fail(Self.failure(error, ticket))
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

    /// Disconnects the runtime. `Runtime.shutdown` stops every source before
    /// it detaches; a source still running here (the driver detached without
    /// a shutdown) is stopped now, with one warning: nothing this driver
    /// started stays armed on the loop after it detached.
    public func detach() {
        let left = owned.stopAll()
        if left > 0 {
            logger.warning("detach: stopped \(left) source(s) still running (the runtime did not shut down first)")
        }
        wakeSource?.close()
        wakeSource = nil
        inotifyKeeper?.close()
        inotifyKeeper = nil
        wakeChannel?.close()
        wakeChannel = nil
        host = nil
    }

    /// A driver that goes away (a runtime dropped without `shutdown()`, and
    /// with it its driver) detaches: it stops every source it still owns, so
    /// none fires into a program that is gone, and closes its eventfd.
    deinit { detach() }

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

/// A running source the driver started: owned by its ticket (`driverState`),
/// linked unretained into the driver's `OwnedSources`. Stopped exactly once:
/// by `SystemdDriver.stop`, by the driver's detach or deinit, or when its
/// ticket goes away without a stop.
final class OwnedSource {
    let source: any RunningSource
    /// The ticket whose `driverState` holds this (it outlives this object);
    /// nil in a node not linked yet. A stopped timer's node is linked again
    /// for the next timer (`SystemdDriver.spareTimers`).
    fileprivate unowned(unsafe) var ticket: SourceTicket?
    /// The list this is linked into; nil once unlinked. Unretained: the
    /// driver unlinks every node before its list goes (detach, deinit).
    fileprivate unowned(unsafe) var list: OwnedSources?
    fileprivate var prev: Unmanaged<OwnedSource>?
    fileprivate var next: Unmanaged<OwnedSource>?

    /// A node for `source`, not linked yet (`OwnedSources.link`).
    init(_ source: any RunningSource) {
        self.source = source
    }

    /// Unlinks and stops the source (a second call does nothing).
    func stop() {
        guard let list else { return }
        list.unlink(self)
        source.stop()
    }

    deinit { stop() }
}

/// The driver's running sources, a doubly linked list through their
/// `OwnedSource` (O(1) add and remove, no table).
final class OwnedSources {
    private var head: Unmanaged<OwnedSource>?
    private(set) var count = 0

    /// Links `source` started for `ticket`; returns its `driverState`.
    func add(_ source: any RunningSource, _ ticket: SourceTicket) -> OwnedSource {
        link(OwnedSource(source), ticket)
    }

    /// Links `node` (new, or stopped and unlinked) for `ticket`; returns it.
    func link(_ node: OwnedSource, _ ticket: SourceTicket) -> OwnedSource {
        node.ticket = ticket
        node.list = self
        node.next = head
        head?.takeUnretainedValue().prev = Unmanaged.passUnretained(node)
        head = Unmanaged.passUnretained(node)
        count += 1
        return node
    }

    fileprivate func unlink(_ node: OwnedSource) {
        if let p = node.prev { p.takeUnretainedValue().next = node.next } else { head = node.next }
        node.next?.takeUnretainedValue().prev = node.prev
        node.prev = nil
        node.next = nil
        node.list = nil
        count -= 1
    }

    /// Stops every source still linked and clears its ticket's
    /// `driverState` (which also breaks a source -> ticket cycle); returns
    /// how many there were.
    func stopAll() -> Int {
        var stopped = 0
        while let first = head {
            let node = first.takeUnretainedValue()
            withExtendedLifetime(node) {
                node.stop()
                if let ticket = node.ticket, ticket.driverState === node { ticket.driverState = nil }
            }
            stopped += 1
        }
        return stopped
    }
}
