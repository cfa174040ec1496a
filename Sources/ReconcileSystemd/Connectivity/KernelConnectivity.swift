import CSystemd
import Glibc
import Reconcile

/// The kernel backend: the kernel's links, addresses and routes, reported
/// with networkd's state rules.
final class KernelConnectivity: RunningSource {
    private let reporter: ConnectivityReporter
    private var watcher: NetlinkWatcher?

    init(ticket: SourceTicket, configuration: ConnectivitySource.Configuration, context: SourceContext) throws {
        let reporter = ConnectivityReporter(ticket: ticket, configuration: configuration, loop: context.loop)
        self.reporter = reporter
        watcher = try NetlinkWatcher(
            receiveBuffer: configuration.receiveBuffer, loop: context.loop, logger: context.logger, restart: configuration.restart,
            onTable: { table in reporter.offer(table.state(admits: reporter.configuration.admits, backend: .kernel)) },
            onFailure: { reporter.fail($0) }, onRestarting: { reporter.restarting(attempt: $0, after: $1) })
    }

    func retune(to configuration: AnyHashable) throws {
        guard let c = configuration.base as? ConnectivitySource.Configuration else { return }
        reporter.retune(c)
        if let table = watcher?.settledTable { reporter.offer(table.state(admits: c.admits, backend: .kernel)) }
    }

    func stop() {
        reporter.stop()
        watcher?.stop()
        watcher = nil
    }
}

/// The kernel's view over rtnetlink, on the loop.
///
/// Two sockets: one joined to the link, address and route groups for
/// notifications, one for dumps (flow-controlled by the kernel, so a flood of
/// notifications cannot cut a dump short). Dumps links, then addresses, then
/// routes, one at a time, each repeated when the kernel marks it interrupted.
/// When the notification socket overruns (ENOBUFS) events were lost: the
/// tables are rebuilt from fresh dumps and the corrected state reported.
/// The kernel removes routes without RTM_DELROUTE when a link goes down or
/// loses its last IPv4 address: the table removes them the same way at once,
/// and the routes are dumped again (on the dump socket, without holding the
/// reports back) to confirm it; see `LinkTable.adoptRouteDump`.
/// Only messages from the kernel (sender port id 0) are believed.
/// A dump that cannot be asked for (`sendto` fails) or that the kernel
/// refuses is reported through `onFailure` (the program's failure event) and
/// retried as a full resync on a loop timer (a `Retry` under the restart
/// policy, by default `ConnectivitySource.defaultRetry`: 100 ms doubling to
/// 5 s, back to 100 ms once a full resync completes); nothing is reported from
/// the stale table meanwhile. A read that fails for any other reason than an
/// overrun (ENOMEM, say) is handled the same way: its socket is not read until
/// the resync (a persistent error cannot spin the loop), and the resync
/// rebuilds whatever the lost messages said.
final class NetlinkWatcher {

    private let onTable: (LinkTable) -> Void
    private let onFailure: (SourceFailure) -> Void
    private let logger: DaemonLogger
    private let loop: EventLoop
    private let onRestarting: (Int, Duration) -> Void
    /// The resync's retries under the restart policy (its cap reached: no
    /// resync is scheduled any more, until a full resync completes).
    private lazy var retry = Retry(loop: loop, policy: restart) { [unowned self] in
        resync()
    }
    private let restart: RestartPolicy
    /// A resync was started at once because its timer could not be made
    /// (once per run of failures: reset when a full resync completes).
    private var resyncedWithoutTimer = false
    /// Fault injection for tests: each dump request takes the first errno
    /// here, if any, as `sendto`'s failure instead of reaching the kernel
    /// (0: this request reaches the kernel).
    var injectedSendErrors: [Int32] = []
    /// Fault injection for tests: each read when the socket is readable takes
    /// the first errno here, if any, as `recvmsg`'s failure (nothing is read).
    var injectedReceiveErrors: [Int32] = []
    /// The delay of the last resync scheduled after a failure (µs).
    var lastRetryDelay: UInt64 { retry.lastDelay }
    /// Set by `stop()`. `onFailure` and `onTable` run the program, which may
    /// stop this watcher (and close its sockets, whose numbers a new watcher
    /// may get at once): every path checks this after calling them.
    private var stopped = false
    private let fd: Int32
    private let dumpFD: Int32
    private var source: EventSource?
    private var dumpSource: EventSource?
    private var table = LinkTable()
    private var sequence: UInt32 = 0
    private var dumpQueue: [UInt16] = []
    private var dumping: UInt16?
    private var dumpInterrupted = false
    private var resyncPending = false
    /// Both sockets are left unread until the next resync (a read failed).
    private var readingPaused = false
    /// A full resync is under way (its table is not reported until done).
    private var resyncing = false
    /// The default routes of the route dump under way.
    private var dumpedRoutes: [LinkTable.RouteKey: LinkTable.Route] = [:]
    /// The routes must be dumped again after the dump under way.
    private var routeDumpWanted = false
    /// Route dumps in a row that disagreed with a silent flush.
    private var routeDisputes = 0
    private var buffer = [UInt8](repeating: 0, count: 64 * 1024)
    /// Counters for logs and tests.
    private(set) var resyncs = 0, forged = 0
    /// Resyncs scheduled after a failed or refused dump.
    private(set) var retries = 0

    /// Opens the sockets and starts the first dumps; `onTable` gets the table
    /// after every batch that leaves no dump under way.
    init(receiveBuffer: Int?, loop: EventLoop, logger: DaemonLogger, restart: RestartPolicy = ConnectivitySource.defaultRetry,
         onTable: @escaping (LinkTable) -> Void, onFailure: @escaping (SourceFailure) -> Void,
         onRestarting: @escaping (Int, Duration) -> Void = { _, _ in }) throws {
        self.onTable = onTable
        self.onFailure = onFailure
        self.restart = restart
        self.onRestarting = onRestarting
        self.logger = logger
        self.loop = loop
        let flags = Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
        fd = socket(AF_NETLINK, flags, NETLINK_ROUTE)
        try checkLibc("socket(AF_NETLINK)", fd)
        dumpFD = socket(AF_NETLINK, flags, NETLINK_ROUTE)
        do {
            try checkLibc("socket(AF_NETLINK)", dumpFD)
            if var size = receiveBuffer.map(Int32.init) {
                // SO_RCVBUFFORCE (root) ignores rmem_max; fall back to SO_RCVBUF.
                if setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, 4) < 0 {
                    try checkLibc("setsockopt(SO_RCVBUF)", setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, 4))
                }
            }
            var addr = sockaddr_nl()
            addr.nl_family = sa_family_t(AF_NETLINK)
            addr.nl_groups = UInt32(RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE)
            try checkLibc("bind(AF_NETLINK)", withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_nl>.size)) }
            })
            var bound = sockaddr_nl()
            var len = socklen_t(MemoryLayout<sockaddr_nl>.size)
            _ = withUnsafeMutablePointer(to: &bound) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
            }
            logger.info("connectivity: netlink socket port \(bound.nl_pid)", ["NETLINK_PORT": "\(bound.nl_pid)"])
            var s: OpaquePointer?
            try check("sd_event_add_io", sd_event_add_io(loop.handle, &s, fd, UInt32(EPOLLIN.rawValue), { _, fd, _, ud in
                let me = Unmanaged<NetlinkWatcher>.fromOpaque(ud!).takeUnretainedValue()
                withExtendedLifetime(me) { me.readable(fd) }
                return 0
            }, Unmanaged.passUnretained(self).toOpaque()))
            source = EventSource(s!)
            try check("sd_event_add_io", sd_event_add_io(loop.handle, &s, dumpFD, UInt32(EPOLLIN.rawValue), { _, fd, _, ud in
                let me = Unmanaged<NetlinkWatcher>.fromOpaque(ud!).takeUnretainedValue()
                withExtendedLifetime(me) { me.readable(fd) }
                return 0
            }, Unmanaged.passUnretained(self).toOpaque()))
            dumpSource = EventSource(s!)
            resync()
        } catch {
            source?.close()
            close(fd)
            if dumpFD >= 0 { close(dumpFD) }
            throw error
        }
    }

    /// Starts (or restarts) the three dumps into a fresh table. A socket runs
    /// one dump at a time: during a dump, the restart waits for its end.
    func resync() {
        guard !stopped else { return }
        guard dumping == nil else {
            resyncPending = true
            return
        }
        resyncPending = false
        resyncing = true
        // Sockets left unread after a failed read are read again.
        setReadingPaused(false)
        routeDumpWanted = false
        routeDisputes = 0
        table = LinkTable()
        dumpQueue = [NL.getLink, NL.getAddr, NL.getRoute]
        dumping = nil
        nextDump()
    }

    /// The kernel may have removed routes silently: dump them again (after
    /// the dump under way, if any; a queued route dump will do).
    private func redumpRoutes() {
        if resyncPending || dumpQueue.contains(NL.getRoute) { return }
        if dumping != nil {
            routeDumpWanted = true
            return
        }
        sendDump(NL.getRoute)
    }

    private func nextDump() {
        guard dumping == nil, !dumpQueue.isEmpty else { return }
        let type = dumpQueue.removeFirst()
        sendDump(type)
    }

    private func sendDump(_ type: UInt16) {
        sequence &+= 1
        dumping = type
        dumpInterrupted = false
        if type == NL.getRoute {
            dumpedRoutes = [:]
            table.beginRouteDump()
        }
        var request = dumpRequest(type: type, sequence: sequence)
        var kernel = sockaddr_nl()
        kernel.nl_family = sa_family_t(AF_NETLINK)
        var failed: Int32?
        if !injectedSendErrors.isEmpty, injectedSendErrors[0] != 0 {
            failed = injectedSendErrors.removeFirst()
        } else {
            if !injectedSendErrors.isEmpty { injectedSendErrors.removeFirst() }
            let r = withUnsafePointer(to: &kernel) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(dumpFD, &request, request.count, 0, $0, socklen_t(MemoryLayout<sockaddr_nl>.size))
                }
            }
            if r < 0 { failed = errno }
        }
        if let failed {
            dumping = nil
            dumpFailed(SystemdError("sendto(netlink dump)", errno: failed).failure)
        }
    }

    /// A dump could not be had: the table is stale. Report the failure (the
    /// program's failure event), report nothing until a full resync has
    /// completed, and schedule that resync with backoff.
    private func dumpFailed(_ failure: SourceFailure) {
        dumpQueue = []
        routeDumpWanted = false
        resyncing = true
        onFailure(failure)
        // The program may have stopped this watcher: then nothing is retried
        // (nor with `.never`, nor once the policy's cap was reached).
        guard !stopped, !retry.isArmed else { return }
        switch retry.next() {
        case .never: return
        case .restarting(let n, let after):
            retries += 1
            logger.warning("connectivity: \(failure), resyncing in \(retry.lastDelay / 1000) ms", ["RETRY": "\(retries)"])
            onRestarting(n, after)
        case .gaveUp(let n, let window):
            onFailure(RestartPolicy.capReached(operation: "resync", code: failure.code, attempts: n, retries: "resyncs", within: "\(window)",
                                               then: "; the kernel backend stays stale"))
        case .cannotArm(let error):
            onFailure(SourceFailure(operation: error.function, code: error.errno,
                                    reason: "cannot schedule the netlink resync; the kernel backend stays stale"))
            // No timer will resync: resync now, once per run of failures
            // (if that fails too, the sockets stay unread: a persistent
            // error must not spin the loop).
            guard !stopped, !resyncedWithoutTimer else { return }
            resyncedWithoutTimer = true
            resync()
        }
    }

    private func readable(_ fd: Int32) {
        // `stopped`: handling a message may run the program, which may stop
        // this watcher; its descriptors are closed then (and may already be
        // another socket's).
        while !stopped && !readingPaused {
            if !injectedReceiveErrors.isEmpty {
                readFailed(fd, injectedReceiveErrors.removeFirst())
                return
            }
            var from = sockaddr_nl()
            var iov = iovec()
            let n: Int = buffer.withUnsafeMutableBytes { b in
                iov.iov_base = b.baseAddress
                iov.iov_len = b.count
                return withUnsafeMutablePointer(to: &from) { fromPtr in
                    withUnsafeMutablePointer(to: &iov) { iovPtr in
                        var msg = msghdr()
                        msg.msg_name = UnsafeMutableRawPointer(fromPtr)
                        msg.msg_namelen = socklen_t(MemoryLayout<sockaddr_nl>.size)
                        msg.msg_iov = iovPtr
                        msg.msg_iovlen = 1
                        return recvmsg(fd, &msg, 0)
                    }
                }
            }
            if n < 0 {
                switch errno {
                case EAGAIN, EWOULDBLOCK: settle(); return
                case EINTR: continue
                case ENOBUFS:
                    resyncs += 1
                    logger.notice("connectivity: netlink overrun (ENOBUFS), resyncing", ["RESYNC": "\(resyncs)"])
                    resync()
                    continue
                default:
                    readFailed(fd, errno)
                    return
                }
            }
            guard n > 0 else { return }
            // Believe only the kernel.
            guard from.nl_pid == 0 else {
                forged += 1
                logger.warning("connectivity: dropped a netlink message from port \(from.nl_pid)", ["SENDER_PORT": "\(from.nl_pid)"])
                continue
            }
            buffer.withUnsafeBytes { b in
                for envelope in parseNetlink(UnsafeRawBufferPointer(rebasing: b[0..<n])) {
                    handle(envelope, dumpReply: fd == dumpFD)
                }
            }
        }
    }

    /// Pauses or resumes reading both sockets (`readFailed`, `resync`).
    private func setReadingPaused(_ paused: Bool) {
        guard paused != readingPaused else { return }
        readingPaused = paused
        let enabled = Int32(paused ? SD_EVENT_OFF : SD_EVENT_ON)
        if let s = source?.handle { sd_event_source_set_enabled(s, enabled) }
        if let s = dumpSource?.handle { sd_event_source_set_enabled(s, enabled) }
    }

    /// A read failed other than by an overrun: what it carried is lost, so
    /// the table is stale. Neither socket is read until a resync (which
    /// re-enables them), scheduled with backoff as after a failed dump; the
    /// program gets the failure event.
    private func readFailed(_ fd: Int32, _ code: Int32) {
        setReadingPaused(true)
        // A dump's answer may be what was lost: the resync asks again.
        dumping = nil
        resyncPending = false
        dumpFailed(SystemdError(fd == dumpFD ? "recvmsg(netlink dump)" : "recvmsg(netlink)", errno: code).failure)
    }

    private func handle(_ e: NetlinkEnvelope, dumpReply: Bool) {
        guard dumpReply else {
            if table.apply(e.message, replace: e.flags & NL.fReplace != 0) { redumpRoutes() }
            return
        }
        // The dump socket carries only dump answers; one of an older dump is dropped.
        guard let type = dumping, e.sequence == sequence else { return }
        if e.flags & NL.fDumpIntr != 0 { dumpInterrupted = true }
        switch e.message {
        case .done, .error:
            dumping = nil
            if case .error(let code) = e.message, code != 0 {
                guard code == ENOBUFS || code == EBUSY || code == EINTR else {
                    dumpFailed(SourceFailure(operation: "netlink dump", code: code, reason: "the kernel refused the dump"))
                    return
                }
                resyncPending = true
            }
            if resyncPending { resync(); return }
            if dumpInterrupted { sendDump(type); return }
            if type == NL.getRoute { finishRouteDump() }
            if dumping == nil { nextDump() }
        case .route(let r, _):
            for (key, route) in LinkTable.defaultRouteEntries(r) { dumpedRoutes[key] = route }
        default:
            table.apply(e.message)
        }
    }

    /// A route dump ended: adopt it; dump again when it disputes a silent
    /// flush (the dump may have been answered before the kernel's flush
    /// finished), at most twice, then believe the kernel.
    private func finishRouteDump() {
        let agreed = table.adoptRouteDump(dumpedRoutes, trustDump: routeDisputes >= 2)
        dumpedRoutes = [:]
        if agreed {
            routeDisputes = 0
        } else {
            routeDisputes += 1
            routeDumpWanted = true
            logger.info("connectivity: a route dump still shows routes the kernel removes silently, dumping again",
                        ["ROUTE_DISPUTES": "\(routeDisputes)"])
        }
        if dumpQueue.isEmpty, resyncing {
            // A full resync completed: only now is the backoff reset (a
            // link dump that works while the route dump keeps failing must
            // not keep the retry at its first delay).
            resyncing = false
            retry.recovered()
            resyncedWithoutTimer = false
        }
        if routeDumpWanted {
            routeDumpWanted = false
            sendDump(NL.getRoute)
        }
    }

    /// The table, unless a full resync is under way (nil while one is).
    var settledTable: LinkTable? {
        !resyncing && !resyncPending ? table : nil
    }

    /// After a batch: hand the table on if no dump is under way.
    private func settle() {
        if let t = settledTable { onTable(t) }
    }

    func stop() {
        guard !stopped else { return }
        stopped = true
        retry.close()
        source?.close(); source = nil
        dumpSource?.close(); dumpSource = nil
        close(fd)
        close(dumpFD)
    }
}
