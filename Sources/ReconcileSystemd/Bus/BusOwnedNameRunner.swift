import CSystemd
import Glibc
import Reconcile

extension BusOwnedNameSource: SystemdSource {
    /// Requests the name on the driver's shared connection to its bus.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        guard isValidWellKnownBusName(configuration.name) else {
            throw SourceFailure(operation: "RequestName \(configuration.name)", reason: "'\(configuration.name)' is not a valid well-known bus name")
        }
        return BusOwnedNameRunner(ticket: ticket, configuration: configuration, connection: context.driver.buses.connection(configuration.bus))
    }
}

extension BusPeersSource: SystemdSource {
    /// Follows the peers on the driver's shared connection to its bus.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        BusPeersRunner(ticket: ticket, configuration: configuration, connection: context.driver.buses.connection(configuration.bus))
    }
}

/// A name requested while the subscription runs (`sd_bus_request_name_async`
/// with our own callback: sd-bus's default one closes the connection when
/// the name is taken), released when it stops. NameAcquired / NameLost
/// (unicast from the bus driver, seen through a match on each) say when it
/// comes and goes.
final class BusOwnedNameRunner: RunningSource, BusConnectionClient {
    private unowned let ticket: SourceTicket
    private let configuration: BusOwnedNameSource.Configuration
    private let connection: BusConnection
    private var acquiredSlot: OpaquePointer?
    private var lostSlot: OpaquePointer?
    private var requestSlot: OpaquePointer?
    /// What was last reported (nil: nothing since start or failure).
    private var reported: BusOwnedNameSource.Event?
    private var stopped = false

    init(ticket: SourceTicket, configuration: BusOwnedNameSource.Configuration, connection: BusConnection) {
        self.ticket = ticket
        self.configuration = configuration
        self.connection = connection
        connection.register(self)
    }

    private var userdata: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    private func rule(_ member: String) -> String {
        "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',interface='org.freedesktop.DBus',"
            + "member='\(member)',arg0='\(configuration.name)'"
    }

    func busConnected(_ connection: BusConnection) {
        guard !stopped, requestSlot == nil, let bus = connection.handle else { return }
        do {
            acquiredSlot = try connection.addMatch(rule("NameAcquired"), { m, ud, _ in
                guard let ud else { return 0 }
                let me = Unmanaged<BusOwnedNameRunner>.fromOpaque(ud).takeUnretainedValue()
                me.connection.inCallback { if me.connection.isCurrent(m) { me.report(.acquired) } }
                return 0
            }, userdata: userdata)
            lostSlot = try connection.addMatch(rule("NameLost"), { m, ud, _ in
                guard let ud else { return 0 }
                let me = Unmanaged<BusOwnedNameRunner>.fromOpaque(ud).takeUnretainedValue()
                me.connection.inCallback { if me.connection.isCurrent(m) { me.report(.lost(.replaced)) } }
                return 0
            }, userdata: userdata)
        } catch {
            return ticket.fail(error.failure)
        }
        // sd-bus's flags: REPLACE_EXISTING 1, ALLOW_REPLACEMENT 2, QUEUE 4
        // (without QUEUE it sends DO_NOT_QUEUE).
        var flags: UInt64 = 0
        if configuration.flags.contains(.replaceExisting) { flags |= 1 }
        if configuration.flags.contains(.allowReplacement) { flags |= 2 }
        if configuration.flags.contains(.queue) { flags |= 4 }
        var slot: OpaquePointer?
        let r = sd_bus_request_name_async(bus, &slot, configuration.name, flags, { m, ud, _ in
            guard let ud else { return 0 }
            let me = Unmanaged<BusOwnedNameRunner>.fromOpaque(ud).takeUnretainedValue()
            me.connection.inCallback { me.answered(m) }
            return 0
        }, userdata)
        guard r >= 0 else {
            return ticket.fail(SourceFailure(operation: "sd_bus_request_name_async \(configuration.name)", code: -r,
                                             reason: "cannot request the name"))
        }
        requestSlot = slot
    }

    /// RequestName's reply: 1 primary owner, 2 queued, 3 exists, 4 already owner.
    private func answered(_ m: OpaquePointer?) {
        guard !stopped, let m, connection.isCurrent(m) else { return }
        if let e = busMethodError(m) {
            return fail(SourceFailure(operation: "RequestName \(configuration.name)", reason: "the bus refused the name: \(e)"))
        }
        switch (try? BusMarshalling.readAll(m))?.first?.uint64 {
        case 1, 4: report(.acquired)
        case 2: report(.lost(.queued))
        case 3:
            fail(SourceFailure(operation: "RequestName \(configuration.name)", code: EEXIST,
                               reason: "\(configuration.name) is owned by another connection that does not allow replacement"))
        default:
            fail(SourceFailure(operation: "RequestName \(configuration.name)", reason: "the bus gave an unexpected answer"))
        }
    }

    private func report(_ event: BusOwnedNameSource.Event) {
        guard !stopped, reported != event else { return }
        reported = event
        ticket.emit(event)
    }

    private func fail(_ failure: SourceFailure) {
        reported = nil
        ticket.fail(failure)
    }

    private func releaseSlots() {
        for slot in [acquiredSlot, lostSlot].compactMap({ $0 }) { connection.removeMatch(slot) }
        acquiredSlot = nil
        lostSlot = nil
        if let requestSlot {
            sd_bus_slot_set_userdata(requestSlot, nil)
            sd_bus_slot_unref(requestSlot)
        }
        requestSlot = nil
    }

    func busLost(_ failure: SourceFailure) {
        releaseSlots()
        reported = nil
        if !stopped { ticket.fail(failure) }
    }

    func retune(to configuration: AnyHashable) throws {}

    func stop() {
        guard !stopped else { return }
        stopped = true
        releaseSlots()
        // Released whether we own it or wait in its queue (a floating slot;
        // our own no-op callback, never sd-bus's default).
        if connection.isUp, let bus = connection.handle {
            _ = sd_bus_release_name_async(bus, nil, configuration.name, { _, _, _ in 0 }, nil)
        }
        connection.unregister(self)
    }

    deinit { stop() }
}

/// Peers followed by their unique names on the connection's name watches
/// (NameOwnerChanged with arg0 = the name, plus GetNameOwner): `.left`
/// once per peer that is not or no longer on the bus. Not `sd_bus_track`:
/// its `add_name` makes a synchronous round trip on the loop and its
/// handler runs when the whole set is empty, not per peer.
final class BusPeersRunner: RunningSource, BusConnectionClient, BusNameObserver {
    private unowned let ticket: SourceTicket
    private var peers: Set<String>
    private var left: Set<String> = []
    private let connection: BusConnection
    private var stopped = false

    init(ticket: SourceTicket, configuration: BusPeersSource.Configuration, connection: BusConnection) {
        self.ticket = ticket
        self.peers = configuration.peers
        self.connection = connection
        connection.register(self)
        for p in peers { connection.watchName(p, self) }
    }

    func busConnected(_ connection: BusConnection) {}

    func busLost(_ failure: SourceFailure) {
        if !stopped { ticket.fail(failure) }
    }

    func ownerChanged(_ name: String, to owner: String?) {
        guard !stopped, owner == nil, peers.contains(name), left.insert(name).inserted else { return }
        ticket.emit(BusPeersSource.Event.left(name))
    }

    func retune(to configuration: AnyHashable) throws {
        guard let c = configuration.base as? BusPeersSource.Configuration else { return }
        let old = peers
        peers = c.peers
        for p in old.subtracting(c.peers) {
            connection.unwatchName(p, self)
            left.remove(p)
        }
        for p in c.peers.subtracting(old) { connection.watchName(p, self) }
    }

    func stop() {
        guard !stopped else { return }
        stopped = true
        for p in peers { connection.unwatchName(p, self) }
        connection.unregister(self)
    }

    deinit { stop() }
}
