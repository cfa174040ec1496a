import CSystemd
import Glibc
import Reconcile

private let networkdName = "org.freedesktop.network1"
private let managerPath = "/org/freedesktop/network1"
private let managerInterface = "org.freedesktop.network1.Manager"

/// An sd-bus connection to the system bus, attached to a loop.
final class SystemBus {
    let handle: OpaquePointer

    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` if set).
    /// The corresponding C function is `sd_bus_open_system`.
    init(loop: EventLoop?) throws(SystemdError) {
        var b: OpaquePointer?
        try check("sd_bus_open_system", sd_bus_open_system(&b))
        handle = b!
        if let loop {
            let r = sd_bus_attach_event(handle, loop.handle, 0)
            if r < 0 {
                sd_bus_flush_close_unref(handle)
                throw SystemdError("sd_bus_attach_event", errno: -r)
            }
        }
    }

    deinit {
        sd_bus_detach_event(handle)
        sd_bus_flush_close_unref(handle)
    }

    /// Whether `name` has an owner, asked synchronously (never activates it).
    func nameHasOwner(_ name: String) throws(SystemdError) -> Bool {
        var m: OpaquePointer?
        try check("sd_bus_message_new_method_call", sd_bus_message_new_method_call(
            handle, &m, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameHasOwner"))
        defer { sd_bus_message_unref(m) }
        try check("sd_bus_message_append", CSystemd_bus_message_append_string(m, name))
        var error = sd_bus_error()
        var reply: OpaquePointer?
        defer { sd_bus_error_free(&error); sd_bus_message_unref(reply) }
        try check("sd_bus_call NameHasOwner", sd_bus_call(handle, m, 2_000_000, &error, &reply))
        var owned: Int32 = 0
        try check("sd_bus_message_read", CSystemd_bus_message_read_bool(reply, &owned))
        return owned != 0
    }
}

/// The networkd backend: `org.freedesktop.network1.Manager` properties over
/// sd-bus on the same loop.
///
/// It asks who owns the name (never triggering bus activation), reads the
/// properties from that owner, follows PropertiesChanged from that owner only,
/// and re-reads whenever the owner changes (networkd restarted). No bus, or no
/// networkd, is a failure event; the source recovers when networkd appears
/// (a missing bus is retried every 2 s).
final class NetworkdConnectivity: RunningSource {
    private let reporter: ConnectivityReporter
    private let loop: EventLoop
    private let logger: Logger
    private var bus: SystemBus?
    private var slots: [OpaquePointer] = []
    private var pendingCall: OpaquePointer?
    private var retryTimer: EventSource?
    private var owner: String?
    private var properties: [String: String] = [:]
    private var stopped = false
    /// The kernel's per-interface detail and default route, beside networkd's verdict.
    private var kernel: NetlinkWatcher?

    init(ticket: SourceTicket, configuration: ConnectivitySource.Configuration, context: SourceContext, bus: SystemBus? = nil) {
        reporter = ConnectivityReporter(ticket: ticket, configuration: configuration, loop: context.loop)
        loop = context.loop
        logger = context.logger
        self.bus = bus
        do {
            kernel = try NetlinkWatcher(receiveBuffer: configuration.receiveBuffer, loop: context.loop, logger: context.logger,
                                        onTable: { [weak self] _ in self?.report() }, onFailure: { [weak self] f in
                                            self?.logger.warning("connectivity: kernel detail unavailable: \(f)")
                                        })
        } catch {
            logger.warning("connectivity: kernel detail unavailable: \(error)")
        }
        if bus != nil { subscribe() } else { connect() }
    }

    private var userdata: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    private func connect() {
        do {
            bus = try SystemBus(loop: loop)
            subscribe()
        } catch {
            reporter.fail(SourceFailure(operation: "sd_bus_open_system", code: error.errno,
                                        reason: "cannot connect to the system bus: \(error.reason)"))
            scheduleRetry()
        }
    }

    private func scheduleRetry() {
        var s: OpaquePointer?
        if sd_event_add_time_relative(loop.handle, &s, CLOCK_MONOTONIC, 2_000_000, 100_000, { _, _, ud in
            let me = Unmanaged<NetworkdConnectivity>.fromOpaque(ud!).takeUnretainedValue()
            me.retryTimer?.close(); me.retryTimer = nil
            me.connect()
            return 0
        }, userdata) >= 0 {
            retryTimer = EventSource(s!)
        }
    }

    private func subscribe() {
        guard let bus else { return }
        let ownerRule = "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='\(networkdName)'"
        let propsRule = "type='signal',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',path='\(managerPath)',arg0='\(managerInterface)'"
        for (rule, handler) in [(ownerRule, NetworkdConnectivity.ownerChanged), (propsRule, NetworkdConnectivity.propertiesChanged)] as [(String, sd_bus_message_handler_t)] {
            var slot: OpaquePointer?
            let r = sd_bus_add_match_async(bus.handle, &slot, rule, handler, nil, userdata)
            if r < 0 {
                reporter.fail(SystemdError("sd_bus_add_match_async", errno: -r).failure)
                return
            }
            slots.append(slot!)
        }
        askOwner()
    }

    // The C callbacks: sd-bus hands back `userdata` (this object).
    private static let ownerChanged: sd_bus_message_handler_t = { m, ud, _ in
        let me = Unmanaged<NetworkdConnectivity>.fromOpaque(ud!).takeUnretainedValue()
        var name: UnsafePointer<CChar>?, old: UnsafePointer<CChar>?, new: UnsafePointer<CChar>?
        guard CSystemd_bus_message_read_3strings(m, &name, &old, &new) >= 0, let new else { return 0 }
        me.ownerIs(String(cString: new))
        return 0
    }

    private static let propertiesChanged: sd_bus_message_handler_t = { m, ud, _ in
        let me = Unmanaged<NetworkdConnectivity>.fromOpaque(ud!).takeUnretainedValue()
        let sender = sd_bus_message_get_sender(m).map { String(cString: $0) }
        guard let owner = me.owner, sender == owner else {
            me.logger.warning("connectivity: ignored PropertiesChanged from \(sender ?? "?"), not networkd's owner \(me.owner ?? "(none)")",
                              ["SENDER": sender ?? ""])
            return 0
        }
        var interface: UnsafePointer<CChar>?
        guard CSystemd_bus_message_read_string(m, &interface) >= 0 else { return 0 }
        if let changed = readStringProperties(m) {
            for (k, v) in changed { me.properties[k] = v }
            me.report()
        }
        return 0
    }

    private func askOwner() {
        guard let bus else { return }
        var m: OpaquePointer?
        guard sd_bus_message_new_method_call(bus.handle, &m, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                                             "org.freedesktop.DBus", "GetNameOwner") >= 0 else { return }
        defer { sd_bus_message_unref(m) }
        _ = CSystemd_bus_message_append_string(m, networkdName)
        call(m) { me, reply in
            if sd_bus_message_is_method_error(reply, nil) != 0 {
                me.ownerIs("")
            } else {
                var owner: UnsafePointer<CChar>?
                if CSystemd_bus_message_read_string(reply, &owner) >= 0, let owner { me.ownerIs(String(cString: owner)) }
            }
        }
    }

    private func ownerIs(_ unique: String) {
        guard !stopped else { return }
        if unique.isEmpty {
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

    private func readAll() {
        guard let bus, let owner else { return }
        var m: OpaquePointer?
        guard sd_bus_message_new_method_call(bus.handle, &m, owner, managerPath, "org.freedesktop.DBus.Properties", "GetAll") >= 0 else { return }
        defer { sd_bus_message_unref(m) }
        _ = CSystemd_bus_message_append_string(m, managerInterface)
        let askedOwner = owner
        call(m) { me, reply in
            guard me.owner == askedOwner else { return }   // the owner changed meanwhile
            if sd_bus_message_is_method_error(reply, nil) != 0 {
                let e = sd_bus_message_get_error(reply)
                let text = e?.pointee.message.map { String(cString: $0) } ?? "GetAll failed"
                me.reporter.fail(SourceFailure(operation: "GetAll \(managerInterface)", reason: text))
                return
            }
            me.properties = readStringProperties(reply) ?? [:]
            me.report()
        }
    }

    /// One outstanding async call at a time; `done` runs on the loop.
    private func call(_ m: OpaquePointer?, _ done: @escaping (NetworkdConnectivity, OpaquePointer?) -> Void) {
        guard let bus else { return }
        let box = Unmanaged.passRetained(CallBox(self, done)).toOpaque()
        var slot: OpaquePointer?
        let r = sd_bus_call_async(bus.handle, &slot, m, { reply, ud, _ in
            let box = Unmanaged<CallBox>.fromOpaque(ud!).takeRetainedValue()
            if let me = box.owner, !me.stopped { box.done(me, reply) }
            return 0
        }, box, 5_000_000)
        if r < 0 {
            Unmanaged<CallBox>.fromOpaque(box).release()
            reporter.fail(SystemdError("sd_bus_call_async", errno: -r).failure)
            return
        }
        // Floating: the slot is released with the bus or after the reply.
        sd_bus_slot_set_floating(slot, 1)
    }

    final class CallBox {
        weak var owner: NetworkdConnectivity?
        let done: (NetworkdConnectivity, OpaquePointer?) -> Void
        init(_ owner: NetworkdConnectivity, _ done: @escaping (NetworkdConnectivity, OpaquePointer?) -> Void) {
            self.owner = owner
            self.done = done
        }
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
        stopped = true
        reporter.stop()
        kernel?.stop()
        kernel = nil
        retryTimer?.close(); retryTimer = nil
        for s in slots { sd_bus_slot_unref(s) }
        slots = []
        bus = nil
    }
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

extension ConnectivitySource: SystemdSource {
    /// Starts the configured backend (rtnetlink or networkd over D-Bus) on the context's loop.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        switch configuration.backend {
        case .kernel:
            return try KernelConnectivity(ticket: ticket, configuration: configuration, context: context)
        case .networkd:
            return NetworkdConnectivity(ticket: ticket, configuration: configuration, context: context)
        case .auto:
            // networkd if it owns its name now; else the kernel.
            if let bus = try? SystemBus(loop: context.loop), (try? bus.nameHasOwner(networkdName)) == true {
                context.logger.info("connectivity: auto chose networkd")
                return NetworkdConnectivity(ticket: ticket, configuration: configuration, context: context, bus: bus)
            }
            context.logger.info("connectivity: auto chose the kernel (networkd is not on the system bus)")
            return try KernelConnectivity(ticket: ticket, configuration: configuration, context: context)
        }
    }
}
