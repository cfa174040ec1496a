import CSystemd
import Glibc
import Reconcile

extension ListenerSource: SystemdSource {
    /// Watches the listening socket with `sd_event_add_io` and accepts on
    /// it; a configuration with an `address` binds it first (`SocketActivation.bind`).
    ///
    /// - Throws: `SourceFailure` when the address cannot be bound, or `fd`
    ///   is not a listening socket or cannot be watched.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        try ListenerRunner(ticket: ticket, configuration: configuration, driver: context.driver)
    }
}

/// Accepts connections (a bounded number per dispatch), refusing and
/// counting those beyond the limit.
final class ListenerRunner: RunningSource {
    /// Connections accepted per dispatch at most.
    static let acceptBudget = 64

    /// Weak: the ticket's driver state holds this runner (through the
    /// driver's `ForeignRunner`), and a runner whose ticket goes away
    /// without a stop (a runtime dropped without `shutdown()`) stops in
    /// that runner's deinit; held strongly it was a cycle, and the source
    /// ran on while the driver lived. Cleared at stop.
    private weak var ticket: SourceTicket?
    private var configuration: ListenerSource.Configuration
    private let state: IOState
    private var source: OpaquePointer?
    /// Connections accepted and not yet closed.
    private(set) var openCount = 0
    private var refused = 0

    init(ticket: SourceTicket, configuration: ListenerSource.Configuration, driver: SystemdDriver) throws {
        self.ticket = ticket
        self.configuration = configuration
        state = driver.io
        if let address = configuration.address {
            // Bound here, owned by this attempt (a restart binds again).
            do { self.configuration.fd = try SocketActivation.bind(address) } catch {
                throw SourceFailure(operation: error.function, code: error.errno,
                                    reason: "cannot listen on \(address): \(error.reason)")
            }
            self.configuration.ownsDescriptor = true
        }
        let fd = self.configuration.fd
        do {
            var listening: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            if getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || listening == 0 {
                throw SourceFailure(operation: "listen on fd \(fd)", code: listening == 0 ? EINVAL : errno,
                                    reason: "descriptor \(fd) is not a listening stream socket")
            }
            let nb = CSystemd_set_nonblocking(fd)
            if nb < 0 { throw SourceFailure(operation: "fcntl(\(fd), O_NONBLOCK)", code: -nb, reason: errorText(-nb)) }
            var s: OpaquePointer?
            let r = sd_event_add_io(driver.loop.handle, &s, fd, UInt32(EPOLLIN.rawValue), { _, _, _, ud in
                Unmanaged<ListenerRunner>.fromOpaque(ud!).takeUnretainedValue().accept()
                return 0
            }, Unmanaged.passUnretained(self).toOpaque())
            if r < 0 { throw SourceFailure(operation: "sd_event_add_io(\(fd))", code: -r, reason: errorText(-r)) }
            EventSource.account(s!)
            source = s
        } catch {
            if self.configuration.ownsDescriptor { Glibc.close(fd) }
            throw error
        }
    }

    /// Only the limit changes in place (the socket stays this runner's).
    func retune(to configuration: AnyHashable) throws {
        if let c = configuration.base as? ListenerSource.Configuration { self.configuration.connectionLimit = c.connectionLimit }
    }

    func connectionEnded() { openCount -= 1 }

    private func accept() {
        var events: [ListenerSource.Event] = []
        var refusedNow = false
        var failure: Int32 = 0
        for _ in 0..<Self.acceptBudget {
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let c = withUnsafeMutablePointer(to: &storage) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    CSystemd_accept(configuration.fd, $0, &length)
                }
            }
            if c < 0 {
                let e = errno
                if e == EINTR || e == ECONNABORTED || e == EPROTO { continue }
                if e != EAGAIN && e != EWOULDBLOCK { failure = e }
                break
            }
            if openCount >= configuration.connectionLimit {
                Glibc.close(c)
                refused += 1
                refusedNow = true
                continue
            }
            let credentials = Int32(storage.ss_family) == AF_UNIX ? peerCredentials(c) : nil
            openCount += 1
            let id = state.register(fd: c, listener: self)
            events.append(.accepted(Connection(id: id, fd: c, listener: configuration.name,
                                               peer: peerAddress(storage, length), credentials: credentials)))
        }
        if refusedNow { events.append(.refused(total: refused)) }
        if failure != 0, let source {
            // EMFILE and the like would be reported again at once: the
            // listener stops accepting until it is restarted.
            sd_event_source_set_enabled(source, Int32(SD_EVENT_OFF))
        }
        // One batch: one reconcile after the dispatch's accepts, not one per
        // connection (each a reconcile over every open connection).
        if let ticket, !ticket.emit(batch: events, of: ListenerSource.self) {
            for event in events {
                guard let ticket = self.ticket else { return }
                ticket.emit(event)
            }
        }
        if failure != 0 {
            ticket?.fail(SourceFailure(operation: "accept4(\(configuration.fd))", code: failure,
                                       reason: "\(errorText(failure)); the listener accepts no more connections until it restarts"))
        }
    }

    func stop() {
        ticket = nil
        if let source { sd_event_source_disable_unref(source) }
        source = nil
        state.listenerStopped(self)
        if configuration.ownsDescriptor, configuration.fd >= 0 { Glibc.close(configuration.fd) }
        configuration.fd = -1
    }

    deinit { if source != nil || configuration.fd >= 0 { stop() } }
}
