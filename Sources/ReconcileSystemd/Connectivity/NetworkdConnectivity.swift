import CSystemd
import Glibc
import Reconcile

private let networkdName = "org.freedesktop.network1"
private let managerPath = "/org/freedesktop/network1"
private let managerInterface = "org.freedesktop.network1.Manager"

/// An sd-bus connection to the system bus, attached to a loop.
final class SystemBus {
    let handle: OpaquePointer

    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` if set). The
    /// connect is non-blocking: a socket nobody listens on fails at once
    /// (`ECONNREFUSED`, `ENOENT`); authentication and `Hello` run on the loop.
    /// The corresponding C function is `sd_bus_open_system`.
    init(loop: EventLoop?) throws(SystemdError) {
        var b: OpaquePointer?
        try check("sd_bus_open_system", sd_bus_open_system(&b))
        handle = b!
        if let loop {
            let r = sd_bus_attach_event(handle, loop.handle, 0)
            if r < 0 {
                sd_bus_close_unref(handle)
                throw SystemdError("sd_bus_attach_event", errno: -r)
            }
        }
    }

    /// Detaches and closes without flushing: `sd_bus_flush` waits for the
    /// peer, and a stalled or dead bus must not block the loop. Only method
    /// calls are ever queued here; a lost one is harmless.
    deinit {
        sd_bus_detach_event(handle)
        sd_bus_close_unref(handle)
    }
}

/// A retired connection and its slots (the slots go first).
private final class RetiredBus {
    let bus: SystemBus
    let slots: [OpaquePointer]
    init(_ bus: SystemBus, _ slots: [OpaquePointer]) {
        self.bus = bus
        self.slots = slots
    }
    deinit { for s in slots { sd_bus_slot_unref(s) } }
}

/// Releases `bus` and our `slots` on it: at once, or, when called from inside
/// one of that connection's own callbacks (sd-bus is still dispatching on it
/// and would touch freed memory), on the next loop iteration.
private func retire(_ bus: SystemBus, slots: [OpaquePointer], inItsCallback: Bool, loop: EventLoop, logger: DaemonLogger) {
    // No callback of ours may run on it any more (the source may be gone by then).
    for s in slots { sd_bus_slot_set_userdata(s, nil) }
    let retired = RetiredBus(bus, slots)
    guard inItsCallback else { return }   // released here, when `retired` goes
    if !loop.releaseOnNextIteration(retired) {
        // The loop is finishing: the connection is kept rather than freed under sd-bus.
        logger.warning("connectivity: cannot defer closing a bus connection; it stays open")
    }
}

/// The networkd backend: `org.freedesktop.network1.Manager` properties over
/// the driver's shared system-bus connection (`BusConnection`).
///
/// It follows who owns the name through the connection's name tracking
/// (never triggering bus activation), reads the properties from that owner,
/// follows PropertiesChanged from that owner only, and re-reads whenever the
/// owner changes (networkd restarted). No bus, or no networkd, is a failure
/// event. A bus that is lost or never answers is the connection's failure,
/// reported once per outage; the connection reconnects on the restart
/// mechanism's backoff (the shortest delay its sources' policies ask for;
/// this one's is the configuration's `restart`, each attempt a
/// `.restarting`), and the backend re-adds its match and re-reads
/// everything when it is back. With `.never`, or at its cap, it stays failed.
final class NetworkdConnectivity: RunningSource, BusConnectionClient, BusNameObserver {
    /// Reconnect delays (the shared connection's): 100 ms, 200 ms, ... at most 5 s.
    static let reconnectInitial = BusConnection.reconnectInitial, reconnectMaximum = BusConnection.reconnectMaximum
    /// How long a property read may take.
    static let readTimeout: UInt64 = 5_000_000

    private let reporter: ConnectivityReporter
    private let logger: DaemonLogger
    private let connection: BusConnection
    /// The PropertiesChanged match while the bus is up.
    private var slot: OpaquePointer?
    /// The GetAll in flight.
    private var read: BusPendingCall?
    private var owner: String?
    private var properties: [String: String] = [:]
    private var stopped = false
    /// The kernel's per-interface detail and default route, beside networkd's verdict.
    private var kernel: NetlinkWatcher?
    private var reconnects: RetryAttempts
    /// It left the connection (stopped, or gave up reconnecting).
    private var left = false

    init(ticket: SourceTicket, configuration: ConnectivitySource.Configuration, context: SourceContext) {
        reporter = ConnectivityReporter(ticket: ticket, configuration: configuration, loop: context.loop)
        logger = context.logger
        connection = context.driver.buses.connection(.system)
        reconnects = RetryAttempts(configuration.restart)
        do {
            kernel = try NetlinkWatcher(receiveBuffer: configuration.receiveBuffer, loop: context.loop, logger: context.logger,
                                        onTable: { [weak self] _ in self?.report() }, onFailure: { [weak self] f in
                                            self?.logger.warning("connectivity: kernel detail unavailable: \(f)")
                                        })
        } catch {
            logger.warning("connectivity: kernel detail unavailable: \(error)")
        }
        // The match first, then the owner (whose answer starts the read):
        // no change between the read and the match is missed.
        connection.register(self)
        if !stopped { connection.watchName(networkdName, self) }
    }

    // MARK: The connection's events

    func busConnected(_ connection: BusConnection) {
        guard !stopped, slot == nil else { return }
        let rule = "type='signal',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',path='\(managerPath)',arg0='\(managerInterface)'"
        do {
            slot = try connection.addMatch(rule, NetworkdConnectivity.propertiesChanged, userdata: Unmanaged.passUnretained(self).toOpaque())
        } catch {
            reporter.fail(error.failure)
        }
    }

    func reconnectDecision(at now: Duration) -> RestartSchedule.Decision? { reconnects.decide(at: now) }

    func busReconnecting(_ decision: RestartSchedule.Decision, after delay: Duration) {
        guard !stopped else { return }
        reconnects.announce(decision, after: delay, source: "connectivity networkd",
                            restarting: { reporter.restarting(attempt: $0, after: $1) }, fail: reporter.fail, leave: leave)
    }

    func busAnswered() { reconnects.recovered() }

    /// Gave up (or stopped): follows the bus no more.
    private func leave() {
        guard !left else { return }
        left = true
        read?.cancel()
        read = nil
        releaseMatch()
        connection.unwatchName(networkdName, self)
        connection.unregister(self)
    }

    func busLost(_ failure: SourceFailure) {
        releaseMatch()
        read?.cancel()
        read = nil
        owner = nil
        properties = [:]
        if !stopped { reporter.fail(failure) }
    }

    func ownerChanged(_ name: String, to unique: String?) {
        guard !stopped else { return }
        read?.cancel()
        read = nil
        guard let unique else {
            owner = nil
            properties = [:]
            reporter.fail(SourceFailure(operation: "GetNameOwner \(networkdName)",
                                        reason: "systemd-networkd is not running (\(networkdName) has no owner on the system bus)"))
            return
        }
        owner = unique
        logger.info("connectivity: networkd is \(unique)", ["BUS_OWNER": unique])
        readAll()
    }

    private static let propertiesChanged: sd_bus_message_handler_t = { m, ud, _ in
        guard let ud, let m else { return 0 }   // a released slot
        let me = Unmanaged<NetworkdConnectivity>.fromOpaque(ud).takeUnretainedValue()
        me.connection.inCallback { me.received(m) }
        return 0
    }

    private func received(_ m: OpaquePointer) {
        guard !stopped, connection.isCurrent(m) else { return }
        let sender = sd_bus_message_get_sender(m).map { String(cString: $0) }
        guard let owner, sender == owner else {
            logger.warning("connectivity: ignored PropertiesChanged from \(sender ?? "?"), not networkd's owner \(owner ?? "(none)")",
                           ["SENDER": sender ?? ""])
            return
        }
        var interface: UnsafePointer<CChar>?
        guard CSystemd_bus_message_read_string(m, &interface) >= 0 else { return }
        if let changed = readStringProperties(m) {
            for (k, v) in changed { properties[k] = v }
            report()
        }
    }

    private func readAll() {
        guard let owner else { return }
        read = connection.call(service: owner, path: managerPath, interface: "org.freedesktop.DBus.Properties", method: "GetAll",
                               arguments: [.string(managerInterface)], timeout: Self.readTimeout) { [weak self] result in
            guard let self, !stopped, self.owner == owner else { return }   // the owner changed meanwhile
            read = nil
            switch result {
            case .success(let values):
                properties = stringProperties(values.first)
                report()
            case .failure(let e) where e.name == BusError.disconnected:
                break   // the loss is reported by `busLost`
            case .failure(let e):
                reporter.fail(SourceFailure(operation: "GetAll \(managerInterface)", reason: e.message))
            }
        }
    }

    private func releaseMatch() {
        if let slot { connection.removeMatch(slot) }
        slot = nil
    }

    private func report() {
        guard owner != nil, let opText = properties["OperationalState"] else { return }
        let op = ConnectivitySource.OperationalState(rawValue: opText) ?? .off
        let onlineState = properties["OnlineState"] ?? ""
        let online = onlineState.isEmpty ? op == .routable : onlineState == "online"
        let detail = kernel?.settledTable?.state(admits: reporter.configuration.admits)
        reporter.offer(.init(state: op, online: online, defaultRoute: detail?.defaultRoute,
                             interfaces: detail?.interfaces ?? [], backend: .networkd))
    }

    func retune(to configuration: AnyHashable) throws {
        guard let c = configuration.base as? ConnectivitySource.Configuration else { return }
        reporter.retune(c)
        report()
    }

    func stop() {
        guard !stopped else { return }
        stopped = true
        reporter.stop()
        kernel?.stop()
        kernel = nil
        leave()
    }
}

/// The string values of an `a{sv}` (others skipped).
private func stringProperties(_ value: BusValue?) -> [String: String] {
    guard case .dictionary(_, _, let entries)? = value else { return [:] }
    var out: [String: String] = [:]
    for e in entries {
        if case .string(let k) = e.key, case .string(let v) = e.value.variantContent { out[k] = v }
    }
    return out
}

/// Reads an `a{sv}` whose string values are kept (others skipped).
private func readStringProperties(_ m: OpaquePointer?) -> [String: String]? {
    guard sd_bus_message_enter_container(m, CChar(UInt8(ascii: "a")), "{sv}") > 0 else { return nil }
    var out: [String: String] = [:]
    while sd_bus_message_enter_container(m, CChar(UInt8(ascii: "e")), "sv") > 0 {
        var key: UnsafePointer<CChar>?
        guard sd_bus_message_read_basic(m, CChar(UInt8(ascii: "s")), &key) >= 0, let key else { return nil }
        var type: CChar = 0
        var contents: UnsafePointer<CChar>?
        _ = sd_bus_message_peek_type(m, &type, &contents)
        if let contents, String(cString: contents) == "s" {
            guard sd_bus_message_enter_container(m, CChar(UInt8(ascii: "v")), "s") > 0 else { return nil }
            var value: UnsafePointer<CChar>?
            guard sd_bus_message_read_basic(m, CChar(UInt8(ascii: "s")), &value) >= 0 else { return nil }
            out[String(cString: key)] = value.map { String(cString: $0) } ?? ""
            sd_bus_message_exit_container(m)
        } else {
            guard sd_bus_message_skip(m, "v") >= 0 else { return nil }
        }
        sd_bus_message_exit_container(m)
    }
    sd_bus_message_exit_container(m)
    return out
}

/// `.auto`: networkd if it owns its name on the system bus, else the kernel.
/// NameHasOwner is asked asynchronously (never activating networkd) and given
/// at most 2 s, so a bus that accepts but never answers cannot block the loop.
/// Nothing is reported before the choice; then the chosen backend runs.
final class AutoConnectivity: RunningSource {
    static let askTimeout: UInt64 = 2_000_000

    /// Weak (see `ConnectivityReporter.ticket`).
    private weak var ticket: SourceTicket?
    private var configuration: ConnectivitySource.Configuration
    private let context: SourceContext
    private var bus: SystemBus?
    private var deadline: EventSource?
    private var chosen: (any RunningSource)?
    private var inBusCallback = false
    private var stopped = false

    init(ticket: SourceTicket, configuration: ConnectivitySource.Configuration, context: SourceContext, bus: SystemBus) {
        self.ticket = ticket
        self.configuration = configuration
        self.context = context
        self.bus = bus
        var m: OpaquePointer?
        var r = sd_bus_message_new_method_call(bus.handle, &m, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                                               "org.freedesktop.DBus", "NameHasOwner")
        defer { sd_bus_message_unref(m) }
        if r >= 0 { r = CSystemd_bus_message_append_string(m, networkdName) }
        let box = Unmanaged.passRetained(AskBox(self)).toOpaque()
        var slot: OpaquePointer?
        if r >= 0 {
            r = sd_bus_call_async(bus.handle, &slot, m, { reply, ud, _ in
                guard let me = Unmanaged<AskBox>.fromOpaque(ud!).takeUnretainedValue().owner else { return 0 }
                var owned: Int32 = 0
                let ok = sd_bus_message_is_method_error(reply, nil) == 0 && CSystemd_bus_message_read_bool(reply, &owned) >= 0
                me.inBusCallback = true
                defer { me.inBusCallback = false }
                me.choose(networkd: ok && owned != 0, why: ok ? "networkd is not on the system bus" : "the system bus refused NameHasOwner")
                return 0
            }, box, AutoConnectivity.askTimeout)
        }
        guard r >= 0 else {
            Unmanaged<AskBox>.fromOpaque(box).release()
            choose(networkd: false, why: "cannot ask the system bus (errno \(-r))")
            return
        }
        sd_bus_slot_set_destroy_callback(slot) { ud in Unmanaged<AskBox>.fromOpaque(ud!).release() }
        sd_bus_slot_set_floating(slot, 1)   // the bus holds it now; our reference goes
        sd_bus_slot_unref(slot)
        // sd-bus does not time calls out while it is still authenticating.
        var s: OpaquePointer?
        if sd_event_add_time_relative(context.loop.handle, &s, CLOCK_MONOTONIC, AutoConnectivity.askTimeout, 100_000, { _, _, ud in
            Unmanaged<AutoConnectivity>.fromOpaque(ud!).takeUnretainedValue()
                .choose(networkd: false, why: "the system bus did not answer within \(AutoConnectivity.askTimeout / 1_000_000) s")
            return 0
        }, Unmanaged.passUnretained(self).toOpaque()) >= 0 {
            deadline = EventSource(s!)
        }
    }

    private final class AskBox {
        weak var owner: AutoConnectivity?
        init(_ owner: AutoConnectivity) { self.owner = owner }
    }

    private func choose(networkd: Bool, why: String) {
        deadline?.close(); deadline = nil
        guard !stopped, chosen == nil, let bus else { return }
        self.bus = nil
        // The probe's connection goes; networkd runs on the driver's shared one.
        retire(bus, slots: [], inItsCallback: inBusCallback, loop: context.loop, logger: context.logger)
        // The subscription's ticket gone without a stop: its runner stops this.
        guard let ticket else { return }
        if networkd {
            context.logger.info("connectivity: auto chose networkd")
            chosen = NetworkdConnectivity(ticket: ticket, configuration: configuration, context: context)
            return
        }
        context.logger.info("connectivity: auto chose the kernel (\(why))")
        do {
            chosen = try KernelConnectivity(ticket: ticket, configuration: configuration, context: context)
        } catch let e as SystemdError {
            ticket.fail(e.failure)
        } catch {
            ticket.fail(SourceFailure(operation: "connectivity kernel backend", reason: "\(error)"))
        }
    }

    func retune(to configuration: AnyHashable) throws {
        if let c = configuration.base as? ConnectivitySource.Configuration { self.configuration = c }
        try chosen?.retune(to: configuration)
    }

    func stop() {
        stopped = true
        deadline?.close(); deadline = nil
        chosen?.stop()
        if let bus {
            self.bus = nil
            retire(bus, slots: [], inItsCallback: inBusCallback, loop: context.loop, logger: context.logger)
        }
    }
}

extension ConnectivitySource: SystemdSource {
    /// Starts the configured backend (rtnetlink or networkd over D-Bus) on the context's loop.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        switch configuration.backend {
        case .kernel:
            return try KernelConnectivity(ticket: ticket, configuration: configuration, context: context)
        case .networkd:
            return NetworkdConnectivity(ticket: ticket, configuration: configuration, context: context)
        case .auto:
            // Without a bus (refused, missing socket: known at once), the kernel.
            guard let bus = try? SystemBus(loop: context.loop) else {
                context.logger.info("connectivity: auto chose the kernel (no system bus)")
                return try KernelConnectivity(ticket: ticket, configuration: configuration, context: context)
            }
            return AutoConnectivity(ticket: ticket, configuration: configuration, context: context, bus: bus)
        }
    }
}
