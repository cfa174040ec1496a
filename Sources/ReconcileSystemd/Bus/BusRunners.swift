import CSystemd
import Glibc
import Reconcile

/// Whether `name` is a well-known name whose owner must be tracked (not a
/// unique name `:1.5`, not the bus itself).
private func isWellKnown(_ name: String) -> Bool {
    !name.hasPrefix(":") && name != "org.freedesktop.DBus"
}

extension BusSignalSource: SystemdSource {
    /// Adds the match on the driver's shared connection to the configured bus.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        BusSignalRunner(ticket: ticket, configuration: configuration, connection: context.driver.buses.connection(configuration.bus))
    }
}

extension BusNameSource: SystemdSource {
    /// Follows the name's owner on the driver's shared connection.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        BusNameRunner(ticket: ticket, configuration: configuration, connection: context.driver.buses.connection(configuration.bus))
    }
}

extension BusPropertySource: SystemdSource {
    /// Reads and follows the property on the driver's shared connection.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        BusPropertyRunner(ticket: ticket, configuration: configuration, connection: context.driver.buses.connection(configuration.bus))
    }
}

/// A signal match: added when it starts (and after every reconnect),
/// removed when it stops. With a well-known sender only signals from that
/// name's current owner are delivered.
final class BusSignalRunner: RunningSource, BusConnectionClient, BusNameObserver {
    private unowned let ticket: SourceTicket
    private var configuration: BusSignalSource.Configuration
    private let connection: BusConnection
    private var slot: OpaquePointer?
    /// The unique name signals must come from: the tracked owner, or the
    /// configured unique name; nil with a well-known sender: none now.
    private var expectedSender: String?
    private let tracksOwner: Bool
    private var stopped = false
    private var reconnects: RetryAttempts
    /// It left the connection (stopped, or gave up reconnecting).
    private var left = false

    init(ticket: SourceTicket, configuration: BusSignalSource.Configuration, connection: BusConnection) {
        self.ticket = ticket
        self.configuration = configuration
        self.connection = connection
        reconnects = RetryAttempts(configuration.restart)
        tracksOwner = configuration.sender.map(isWellKnown) ?? false
        if !tracksOwner { expectedSender = configuration.sender }
        if tracksOwner, let sender = configuration.sender { connection.watchName(sender, self) }
        connection.register(self)
    }

    func busConnected(_ connection: BusConnection) { addMatch() }

    func busLost(_ failure: SourceFailure) {
        releaseMatch()
        if tracksOwner { expectedSender = nil }
        if !stopped { ticket.fail(failure) }
    }

    func ownerChanged(_ name: String, to owner: String?) { expectedSender = owner }

    func reconnectDecision(at now: Duration) -> RestartSchedule.Decision? { reconnects.decide(at: now) }

    func busReconnecting(_ decision: RestartSchedule.Decision, after delay: Duration) {
        guard !stopped else { return }
        reconnects.announce(decision, after: delay, source: "bus-signal \(configuration.rule)",
                            restarting: { RetryAttempts.announceRestarting(BusSignalSource.Event.restarting(attempt: $0, after: $1), of: BusSignalSource.self, to: ticket) }, fail: ticket.fail, leave: leave)
    }

    func busAnswered() { reconnects.recovered() }

    /// Gave up: follows the bus no more (until its subscription changes).
    private func leave() {
        guard !left else { return }
        left = true
        releaseMatch()
        connection.unregister(self)
        if tracksOwner, let sender = configuration.sender { connection.unwatchName(sender, self) }
    }

    private func addMatch() {
        guard !stopped, slot == nil else { return }
        do {
            slot = try connection.addMatch(configuration.rule, { m, ud, _ in
                guard let ud, let m else { return 0 }
                let me = Unmanaged<BusSignalRunner>.fromOpaque(ud).takeUnretainedValue()
                me.connection.inCallback { me.received(m) }
                return 0
            }, userdata: Unmanaged.passUnretained(self).toOpaque(), installed: { m, ud, _ in
                guard let ud, let error = busMethodError(m) else { return 0 }
                let me = Unmanaged<BusSignalRunner>.fromOpaque(ud).takeUnretainedValue()
                // A match still pending when the connection drops gets an
                // error sd-bus makes up while closing: the loss is reported
                // once, by the connection (`busLost`).
                guard !me.stopped, sd_bus_is_open(sd_bus_message_get_bus(m)) > 0 else { return 0 }
                me.ticket.fail(SourceFailure(operation: "AddMatch \(me.configuration.rule)", reason: "the bus refused the match: \(error)"))
                return 0
            })
        } catch {
            ticket.fail(error.failure)
        }
    }

    private func releaseMatch() {
        if let slot { connection.removeMatch(slot) }
        slot = nil
    }

    private func received(_ m: OpaquePointer) {
        guard !stopped, connection.isCurrent(m) else { return }
        let sender = sd_bus_message_get_sender(m).map { String(cString: $0) } ?? ""
        // sd-bus's local matcher accepts any sender for a well-known-name
        // match when another match let the signal in: compare unique names.
        if configuration.sender != nil, sender != expectedSender { return }
        let arguments: [BusValue]
        do { arguments = try BusMarshalling.readAll(m) } catch {
            ticket.fail(SourceFailure(operation: "read signal \(sd_bus_message_get_member(m).map { String(cString: $0) } ?? "")", code: error.errno,
                                      reason: "a signal from \(sender) could not be decoded and was skipped: \(error.reason)"))
            return
        }
        let text = { (p: UnsafePointer<CChar>?) in p.map { String(cString: $0) } ?? "" }
        ticket.emit(BusSignalSource.Event.received(BusSignal(
            sender: sender, path: text(sd_bus_message_get_path(m)), interface: text(sd_bus_message_get_interface(m)),
            member: text(sd_bus_message_get_member(m)), arguments: arguments)))
    }

    func retune(to configuration: AnyHashable) throws {
        guard let c = configuration.base as? BusSignalSource.Configuration, c != self.configuration else { return }
        self.configuration = c
        guard connection.isUp else { return }
        let old = slot
        slot = nil
        addMatch()   // the new match first, then the old one goes: nothing is missed between
        if let old { connection.removeMatch(old) }
    }

    func stop() {
        guard !stopped else { return }
        stopped = true
        leave()
    }

    deinit { stop() }
}

/// A name's owner: `.appeared(owner:)` / `.vanished`, the current state first.
final class BusNameRunner: RunningSource, BusConnectionClient, BusNameObserver {
    private unowned let ticket: SourceTicket
    private let configuration: BusNameSource.Configuration
    private let connection: BusConnection
    /// What was last reported: nil nothing (or a failure since).
    private var reported: String??
    private var stopped = false
    private var reconnects: RetryAttempts
    /// It left the connection (stopped, or gave up reconnecting).
    private var left = false

    init(ticket: SourceTicket, configuration: BusNameSource.Configuration, connection: BusConnection) {
        self.ticket = ticket
        self.configuration = configuration
        self.connection = connection
        reconnects = RetryAttempts(configuration.restart)
        connection.register(self)
        connection.watchName(configuration.name, self)
    }

    func busConnected(_ connection: BusConnection) {}

    func busLost(_ failure: SourceFailure) {
        reported = nil
        if !stopped { ticket.fail(failure) }
    }

    func ownerChanged(_ name: String, to owner: String?) {
        guard !stopped, reported != .some(owner) else { return }
        reported = .some(owner)
        ticket.emit(owner.map { BusNameSource.Event.appeared(owner: $0) } ?? .vanished)
    }

    func reconnectDecision(at now: Duration) -> RestartSchedule.Decision? { reconnects.decide(at: now) }

    func busReconnecting(_ decision: RestartSchedule.Decision, after delay: Duration) {
        guard !stopped else { return }
        reconnects.announce(decision, after: delay, source: "bus-name \(configuration.name)",
                            restarting: { RetryAttempts.announceRestarting(BusNameSource.Event.restarting(attempt: $0, after: $1), of: BusNameSource.self, to: ticket) }, fail: ticket.fail, leave: leave)
    }

    func busAnswered() { reconnects.recovered() }

    /// Gave up (or stopped): follows the bus no more.
    private func leave() {
        guard !left else { return }
        left = true
        connection.unregister(self)
        connection.unwatchName(configuration.name, self)
    }

    func retune(to configuration: AnyHashable) throws {}

    func stop() {
        guard !stopped else { return }
        stopped = true
        leave()
    }

    deinit { stop() }
}

/// One property followed: read from the service's current owner, changed
/// by its PropertiesChanged (an invalidated property is read again),
/// `.vanished` when the owner goes, read again when it is back.
final class BusPropertyRunner: RunningSource, BusConnectionClient, BusNameObserver {
    private unowned let ticket: SourceTicket
    private let configuration: BusPropertySource.Configuration
    private let connection: BusConnection
    private var slot: OpaquePointer?
    private var owner: String?
    /// The last value reported; nil: none since start, vanish or failure.
    private var last: BusValue?
    private var vanishedReported = false
    private var read: BusPendingCall?
    private var stopped = false
    private var reconnects: RetryAttempts
    /// It left the connection (stopped, or gave up reconnecting).
    private var left = false

    init(ticket: SourceTicket, configuration: BusPropertySource.Configuration, connection: BusConnection) {
        self.ticket = ticket
        self.configuration = configuration
        self.connection = connection
        reconnects = RetryAttempts(configuration.restart)
        connection.register(self)
        connection.watchName(configuration.service, self)
    }

    private var rule: String {
        BusSignalSource.Configuration(bus: configuration.bus, sender: configuration.service, path: configuration.path,
                                      interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged",
                                      arguments: [0: configuration.interface]).rule
    }

    func busConnected(_ connection: BusConnection) {
        guard !stopped, slot == nil else { return }
        do {
            slot = try connection.addMatch(rule, { m, ud, _ in
                guard let ud, let m else { return 0 }
                let me = Unmanaged<BusPropertyRunner>.fromOpaque(ud).takeUnretainedValue()
                me.connection.inCallback { me.changed(m) }
                return 0
            }, userdata: Unmanaged.passUnretained(self).toOpaque())
        } catch {
            ticket.fail(error.failure)
        }
    }

    func busLost(_ failure: SourceFailure) {
        if let slot { connection.removeMatch(slot) }
        slot = nil
        read?.cancel(); read = nil
        owner = nil
        last = nil
        vanishedReported = false
        if !stopped { ticket.fail(failure) }
    }

    func ownerChanged(_ name: String, to owner: String?) {
        guard !stopped else { return }
        self.owner = owner
        read?.cancel(); read = nil
        if owner == nil {
            last = nil
            if !vanishedReported {
                vanishedReported = true
                ticket.emit(BusPropertySource.Event.vanished)
            }
            return
        }
        vanishedReported = false
        readValue()
    }

    private func readValue() {
        guard !stopped, let owner else { return }
        read?.cancel()
        let c = configuration
        read = connection.call(service: owner, path: c.path, interface: "org.freedesktop.DBus.Properties", method: "Get",
                               arguments: [.string(c.interface), .string(c.property)], timeout: nil) { [weak self] result in
            guard let self, !stopped else { return }
            read = nil
            switch result {
            case .success(let values):
                guard let value = values.first else {
                    return ticket.fail(SourceFailure(operation: "Get \(c.interface).\(c.property)", reason: "the reply has no value"))
                }
                deliver(value.variantContent)
            case .failure(let e):
                guard e.name != BusError.disconnected else { return }   // the loss is reported once, by the connection
                ticket.fail(SourceFailure(operation: "Get \(c.interface).\(c.property)", reason: "\(e.name): \(e.message)"))
            }
        }
    }

    private func changed(_ m: OpaquePointer) {
        guard !stopped, connection.isCurrent(m) else { return }
        let sender = sd_bus_message_get_sender(m).map { String(cString: $0) }
        guard let owner, sender == owner else { return }   // only the current owner is believed
        let args: [BusValue]
        do { args = try BusMarshalling.readAll(m) } catch {
            return ticket.fail(SourceFailure(operation: "read PropertiesChanged", code: error.errno,
                                             reason: "a PropertiesChanged from \(owner) could not be decoded and was skipped: \(error.reason)"))
        }
        guard args.count >= 2 else { return }
        if let value = args[1][configuration.property] {
            deliver(value)
        } else if args.count >= 3, let invalidated = args[2].elements,
                  invalidated.contains(where: { $0.string == configuration.property }) {
            readValue()
        }
    }

    private func deliver(_ value: BusValue) {
        if let expected = configuration.type, value.type != expected {
            ticket.fail(SourceFailure(operation: "\(configuration.interface).\(configuration.property)",
                                      reason: "the value is of type \(value.type), the program expects \(expected)"))
            return
        }
        guard value != last else { return }
        last = value
        ticket.emit(BusPropertySource.Event.value(value))
    }

    func reconnectDecision(at now: Duration) -> RestartSchedule.Decision? { reconnects.decide(at: now) }

    func busReconnecting(_ decision: RestartSchedule.Decision, after delay: Duration) {
        guard !stopped else { return }
        let c = configuration
        reconnects.announce(decision, after: delay, source: "bus-property \(c.service) \(c.interface).\(c.property)",
                            restarting: { RetryAttempts.announceRestarting(BusPropertySource.Event.restarting(attempt: $0, after: $1), of: BusPropertySource.self, to: ticket) }, fail: ticket.fail, leave: leave)
    }

    func busAnswered() { reconnects.recovered() }

    /// Gave up (or stopped): follows the bus no more.
    private func leave() {
        guard !left else { return }
        left = true
        read?.cancel(); read = nil
        if let slot { connection.removeMatch(slot) }
        slot = nil
        connection.unregister(self)
        connection.unwatchName(configuration.service, self)
    }

    func retune(to configuration: AnyHashable) throws {}

    func stop() {
        guard !stopped else { return }
        stopped = true
        leave()
    }

    deinit { stop() }
}
