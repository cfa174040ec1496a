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
    let box = Unmanaged.passRetained(retired).toOpaque()
    var s: OpaquePointer?
    let r = sd_event_add_defer(loop.handle, &s, { s, _ in
        sd_event_source_disable_unref(s)   // its destroy callback releases the box
        return 0
    }, box)
    if r >= 0 {
        sd_event_source_set_destroy_callback(s) { ud in Unmanaged<RetiredBus>.fromOpaque(ud!).release() }
    } else {
        // The loop is finishing: keep the connection rather than free it under sd-bus.
        logger.warning("connectivity: cannot defer closing a bus connection (errno \(-r)); it stays open")
    }
}

/// The networkd backend: `org.freedesktop.network1.Manager` properties over
/// sd-bus on the same loop.
///
/// It asks who owns the name (never triggering bus activation), reads the
/// properties from that owner, follows PropertiesChanged from that owner only,
/// and re-reads whenever the owner changes (networkd restarted). No bus, or no
/// networkd, is a failure event. A lost bus connection (sd-bus's synthetic
/// `org.freedesktop.DBus.Local.Disconnected`, after the socket hung up) is a
/// failure event too; the source then reconnects on loop timers with bounded
/// exponential backoff (100 ms doubling to 5 s) and re-reads everything.
final class NetworkdConnectivity: RunningSource {
    /// Reconnect delays: 100 ms, 200 ms, ... at most 5 s.
    static let reconnectInitial: UInt64 = 100_000, reconnectMaximum: UInt64 = 5_000_000
    /// How long a new connection may take to answer its first call.
    static let answerTimeout: UInt64 = 5_000_000

    private let reporter: ConnectivityReporter
    private let loop: EventLoop
    private let logger: DaemonLogger
    private var bus: SystemBus?
    private var slots: [OpaquePointer] = []
    /// Armed from connect until the bus answers GetNameOwner: sd-bus itself
    /// waits up to its authentication timeout (far longer) on a mute socket.
    private var answerTimer: EventSource?
    private lazy var retry = RetryTimer(loop: loop, initial: Self.reconnectInitial, maximum: Self.reconnectMaximum) { [unowned self] in
        connect()
    }
    private var attempts = 0
    /// How deep we are in sd-bus callbacks of this source: a connection must
    /// not be freed while sd-bus is still dispatching on it.
    private var callbackDepth = 0
    private var owner: String?
    private var properties: [String: String] = [:]
    private var stopped = false
    /// The kernel's per-interface detail and default route, beside networkd's verdict.
    private var kernel: NetlinkWatcher?

    /// With `bus`, that connection is used first (`insideItsCallback`: we are
    /// in one of its callbacks, so it must not be freed right away).
    init(ticket: SourceTicket, configuration: ConnectivitySource.Configuration, context: SourceContext,
         bus: SystemBus? = nil, insideItsCallback: Bool = false) {
        reporter = ConnectivityReporter(ticket: ticket, configuration: configuration, loop: context.loop)
        loop = context.loop
        logger = context.logger
        do {
            kernel = try NetlinkWatcher(receiveBuffer: configuration.receiveBuffer, loop: context.loop, logger: context.logger,
                                        onTable: { [weak self] _ in self?.report() }, onFailure: { [weak self] f in
                                            self?.logger.warning("connectivity: kernel detail unavailable: \(f)")
                                        })
        } catch {
            logger.warning("connectivity: kernel detail unavailable: \(error)")
        }
        if let bus {
            if insideItsCallback { inBusCallback { attach(bus) } } else { attach(bus) }
        } else {
            connect()
        }
    }

    private var userdata: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// Runs `body` as one of this source's sd-bus callbacks.
    private func inBusCallback(_ body: () -> Void) {
        callbackDepth += 1
        defer { callbackDepth -= 1 }
        body()
    }

    /// Whether `m` came on the connection in use (not one being retired).
    private func isCurrent(_ m: OpaquePointer?) -> Bool {
        guard !stopped, let bus else { return false }
        return sd_bus_message_get_bus(m) == bus.handle
    }

    private func connect() {
        guard !stopped else { return }
        do {
            attach(try SystemBus(loop: loop))
        } catch {
            reporter.fail(SourceFailure(operation: "sd_bus_open_system", code: error.errno,
                                        reason: "cannot connect to the system bus: \(error.reason)"))
            scheduleReconnect()
        }
    }

    /// Watches `bus` for its loss, for networkd's owner and properties, then asks for the owner.
    private func attach(_ bus: SystemBus) {
        self.bus = bus
        var filter: OpaquePointer?
        var r = sd_bus_add_filter(bus.handle, &filter, NetworkdConnectivity.localSignal, userdata)
        guard r >= 0 else { return lose(SystemdError("sd_bus_add_filter", errno: -r).failure) }
        slots.append(filter!)
        let ownerRule = "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='\(networkdName)'"
        let propsRule = "type='signal',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',path='\(managerPath)',arg0='\(managerInterface)'"
        for (rule, handler) in [(ownerRule, NetworkdConnectivity.ownerChanged), (propsRule, NetworkdConnectivity.propertiesChanged)] as [(String, sd_bus_message_handler_t)] {
            var slot: OpaquePointer?
            r = sd_bus_add_match_async(bus.handle, &slot, rule, handler, nil, userdata)
            guard r >= 0 else { return lose(SystemdError("sd_bus_add_match_async", errno: -r).failure) }
            slots.append(slot!)
        }
        armAnswerTimer()
        askOwner()
    }

    private func armAnswerTimer() {
        answerTimer?.close(); answerTimer = nil
        var s: OpaquePointer?
        let r = sd_event_add_time_relative(loop.handle, &s, CLOCK_MONOTONIC, NetworkdConnectivity.answerTimeout, 100_000, { _, _, ud in
            let me = Unmanaged<NetworkdConnectivity>.fromOpaque(ud!).takeUnretainedValue()
            me.answerTimer?.close(); me.answerTimer = nil
            me.lose(SourceFailure(operation: "GetNameOwner \(networkdName)", code: ETIMEDOUT,
                                  reason: "the system bus did not answer within \(NetworkdConnectivity.answerTimeout / 1_000_000) s"))
            return 0
        }, userdata)
        if r >= 0 { answerTimer = EventSource(s!) }
    }

    /// The bus answered: it is alive; the next loss starts the backoff afresh.
    private func answered() {
        answerTimer?.close(); answerTimer = nil
        retry.reset()
        attempts = 0
    }

    /// The connection is unusable: report `failure`, drop it, try again later.
    private func lose(_ failure: SourceFailure) {
        guard !stopped else { return }
        owner = nil
        properties = [:]
        retireBus()
        reporter.fail(failure)
        scheduleReconnect()
    }

    private func retireBus() {
        answerTimer?.close(); answerTimer = nil
        guard let bus else { return }
        self.bus = nil
        retire(bus, slots: slots, inItsCallback: callbackDepth > 0, loop: loop, logger: logger)
        slots = []
    }

    private func scheduleReconnect() {
        guard !stopped, !retry.isArmed else { return }
        do {
            let delay = try retry.schedule()
            attempts += 1
            logger.info("connectivity: reconnecting to the system bus in \(delay / 1000) ms (attempt \(attempts))",
                        ["RECONNECT_ATTEMPT": "\(attempts)", "RECONNECT_DELAY_USEC": "\(delay)"])
        } catch {
            reporter.fail(SourceFailure(operation: error.function, code: error.errno,
                                        reason: "cannot schedule a reconnect to the system bus; the source stays down"))
        }
    }

    // The C callbacks: sd-bus hands back `userdata` (this object).

    /// sd-bus synthesizes `org.freedesktop.DBus.Local.Disconnected` when the
    /// connection ends (the daemon died, the socket hung up); only sd-bus can
    /// send on that interface.
    private static let localSignal: sd_bus_message_handler_t = { m, ud, _ in
        guard sd_bus_message_is_signal(m, "org.freedesktop.DBus.Local", "Disconnected") > 0 else { return 0 }
        guard let ud else { return 0 }   // a retired slot
        let me = Unmanaged<NetworkdConnectivity>.fromOpaque(ud).takeUnretainedValue()
        me.inBusCallback {
            guard me.isCurrent(m) else { return }
            me.logger.warning("connectivity: lost the system bus connection")
            me.lose(SourceFailure(operation: "sd-bus", code: ECONNRESET,
                                  reason: "lost the connection to the system bus (Disconnected)"))
        }
        return 0
    }

    private static let ownerChanged: sd_bus_message_handler_t = { m, ud, _ in
        guard let ud else { return 0 }   // a retired slot
        let me = Unmanaged<NetworkdConnectivity>.fromOpaque(ud).takeUnretainedValue()
        me.inBusCallback {
            guard me.isCurrent(m) else { return }
            var name: UnsafePointer<CChar>?, old: UnsafePointer<CChar>?, new: UnsafePointer<CChar>?
            guard CSystemd_bus_message_read_3strings(m, &name, &old, &new) >= 0, let new else { return }
            me.ownerIs(String(cString: new))
        }
        return 0
    }

    private static let propertiesChanged: sd_bus_message_handler_t = { m, ud, _ in
        guard let ud else { return 0 }   // a retired slot
        let me = Unmanaged<NetworkdConnectivity>.fromOpaque(ud).takeUnretainedValue()
        me.inBusCallback {
            guard me.isCurrent(m) else { return }
            let sender = sd_bus_message_get_sender(m).map { String(cString: $0) }
            guard let owner = me.owner, sender == owner else {
                me.logger.warning("connectivity: ignored PropertiesChanged from \(sender ?? "?"), not networkd's owner \(me.owner ?? "(none)")",
                                  ["SENDER": sender ?? ""])
                return
            }
            var interface: UnsafePointer<CChar>?
            guard CSystemd_bus_message_read_string(m, &interface) >= 0 else { return }
            if let changed = readStringProperties(m) {
                for (k, v) in changed { me.properties[k] = v }
                me.report()
            }
        }
        return 0
    }

    private func askOwner() {
        guard let bus else { return }
        var m: OpaquePointer?
        var r = sd_bus_message_new_method_call(bus.handle, &m, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                                               "org.freedesktop.DBus", "GetNameOwner")
        guard r >= 0 else { return lose(SystemdError("sd_bus_message_new_method_call", errno: -r).failure) }
        defer { sd_bus_message_unref(m) }
        r = CSystemd_bus_message_append_string(m, networkdName)
        guard r >= 0 else { return lose(SystemdError("sd_bus_message_append", errno: -r).failure) }
        call(m) { me, reply in
            if let e = methodError(reply) {
                if e.name == "org.freedesktop.DBus.Error.NameHasNoOwner" {
                    me.answered()
                    me.ownerIs("")
                } else {
                    // The bus did not answer properly (a timeout: a stalled daemon): start over.
                    me.lose(SourceFailure(operation: "GetNameOwner \(networkdName)", reason: "the system bus did not answer: \(e.message)"))
                }
                return
            }
            me.answered()
            var owner: UnsafePointer<CChar>?
            if CSystemd_bus_message_read_string(reply, &owner) >= 0, let owner { me.ownerIs(String(cString: owner)) }
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
        var r = sd_bus_message_new_method_call(bus.handle, &m, owner, managerPath, "org.freedesktop.DBus.Properties", "GetAll")
        guard r >= 0 else { return lose(SystemdError("sd_bus_message_new_method_call", errno: -r).failure) }
        defer { sd_bus_message_unref(m) }
        r = CSystemd_bus_message_append_string(m, managerInterface)
        guard r >= 0 else { return lose(SystemdError("sd_bus_message_append", errno: -r).failure) }
        let askedOwner = owner
        call(m) { me, reply in
            guard me.owner == askedOwner else { return }   // the owner changed meanwhile
            if let e = methodError(reply) {
                me.reporter.fail(SourceFailure(operation: "GetAll \(managerInterface)", reason: e.message))
                return
            }
            me.properties = readStringProperties(reply) ?? [:]
            me.report()
        }
    }

    /// An async call on the current connection; `done` runs on the loop with
    /// the reply, unless the connection was closed meanwhile (its loss is
    /// handled by `Disconnected`, which follows the synthetic error replies).
    private func call(_ m: OpaquePointer?, _ done: @escaping (NetworkdConnectivity, OpaquePointer?) -> Void) {
        guard let bus else { return }
        let box = Unmanaged.passRetained(CallBox(self, done)).toOpaque()
        var slot: OpaquePointer?
        let r = sd_bus_call_async(bus.handle, &slot, m, { reply, ud, _ in
            let box = Unmanaged<CallBox>.fromOpaque(ud!).takeUnretainedValue()
            guard let me = box.owner, me.isCurrent(reply), sd_bus_is_open(sd_bus_message_get_bus(reply)) > 0 else { return 0 }
            me.inBusCallback { box.done(me, reply) }
            return 0
        }, box, 5_000_000)
        if r < 0 {
            Unmanaged<CallBox>.fromOpaque(box).release()
            lose(SystemdError("sd_bus_call_async", errno: -r).failure)
            return
        }
        // The box lives as long as the slot: after the reply, or until the
        // connection is freed with the call still pending.
        sd_bus_slot_set_destroy_callback(slot) { ud in Unmanaged<CallBox>.fromOpaque(ud!).release() }
        // Floating: the bus holds the slot (released after the reply, or with
        // the bus); our own reference goes now.
        sd_bus_slot_set_floating(slot, 1)
        sd_bus_slot_unref(slot)
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
        retry.close()
        retireBus()
    }
}

/// A method error reply's name and message (nil for a method return).
private func methodError(_ reply: OpaquePointer?) -> (name: String, message: String)? {
    guard sd_bus_message_is_method_error(reply, nil) != 0 else { return nil }
    let e = sd_bus_message_get_error(reply)
    let name = e?.pointee.name.map { String(cString: $0) } ?? ""
    return (name, e?.pointee.message.map { String(cString: $0) } ?? (name.isEmpty ? "method call failed" : name))
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

    private let ticket: SourceTicket
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
        if networkd {
            context.logger.info("connectivity: auto chose networkd")
            chosen = NetworkdConnectivity(ticket: ticket, configuration: configuration, context: context, bus: bus,
                                          insideItsCallback: inBusCallback)
            return
        }
        retire(bus, slots: [], inItsCallback: inBusCallback, loop: context.loop, logger: context.logger)
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
