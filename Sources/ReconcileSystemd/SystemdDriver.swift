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
    /// Where the driver logs each start, retune, stop and failure.
    public var logger: Logger

    private var running: [ObjectIdentifier: any RunningSource] = [:]
    private weak var host: (any DriverHost)?
    private var wakeSource: EventSource?
    private var wakeChannel: WakeChannel?
    private var inotifyKeeper: EventSource?

    /// A driver for sources on `loop`.
    public init(loop: EventLoop, logger: Logger = Logger()) {
        self.loop = loop
        self.logger = logger
    }

    /// How many sources are running now.
    public var runningCount: Int { running.count }

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

    public func start(_ ticket: SourceTicket) {
        logger.debug("start \(ticket.id) \(ticket.activation): \(ticket.configuration.base)",
                     ["SUBSCRIPTION": "\(ticket.id)", "ACTIVATION": "\(ticket.activation.generation)", "OUTCOME": "start"])
        if let kind = ticket.source as? any TaskBackedSource.Type {
            // A task on the loop's executor (StreamSource).
            running[ObjectIdentifier(ticket)] = TaskSourceRunner(stop: kind.startTask(ticket, executor: loop.taskExecutor))
            return
        }
        guard let kind = ticket.source as? any SystemdSource.Type else {
            ticket.fail(SourceFailure(operation: "start \(ticket.id)",
                                      reason: "the sd-event driver cannot run source kind '\(ticket.id.kind)' (it does not conform to SystemdSource)"))
            return
        }
        do {
            running[ObjectIdentifier(ticket)] = try kind._start(ticket, context: SourceContext(loop: loop, logger: logger, driver: self))
        } catch {
            ticket.fail(Self.failure(error, ticket))
        }
    }

    public func retune(_ ticket: SourceTicket, from old: AnyHashable) {
        logger.debug("retune \(ticket.id) \(ticket.activation): \(old.base) -> \(ticket.configuration.base)",
                     ["SUBSCRIPTION": "\(ticket.id)", "ACTIVATION": "\(ticket.activation.generation)", "OUTCOME": "retune"])
        guard let source = running[ObjectIdentifier(ticket)] else { return }
        do { try source.retune(to: ticket.configuration) } catch { ticket.fail(Self.failure(error, ticket)) }
    }

    public func stop(_ ticket: SourceTicket) {
        logger.debug("stop \(ticket.id) \(ticket.activation)",
                     ["SUBSCRIPTION": "\(ticket.id)", "ACTIVATION": "\(ticket.activation.generation)", "OUTCOME": "stop"])
        running.removeValue(forKey: ObjectIdentifier(ticket))?.stop()
    }

    public func detach() {
        for (_, s) in running { s.stop() }
        running = [:]
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
    /// watch that never fires keeps the fd while the driver is attached.
    func keepInotifyOpen() {
        guard inotifyKeeper == nil else { return }
        var s: OpaquePointer?
        if sd_event_add_inotify(loop.handle, &s, "/", UInt32(IN_DELETE_SELF), { _, _, _ in 0 }, nil) >= 0 {
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
