// The kernel's view of links, addresses and routes, and networkd's state
// rules over it. Pure Swift: unit-tested without sockets.
import Reconcile

/// Links, addresses and default routes as the kernel reported them.
///
/// The kernel removes some routes without an RTM_DELROUTE: every IPv4 route
/// through a link that goes down, every IPv4 route through a link whose last
/// IPv4 address is removed, and (on older kernels) routes whose preferred
/// source address is removed. `apply` removes them the same way and says so;
/// the watcher then dumps the routes again and `adoptRouteDump` settles any
/// disagreement (see there).
struct LinkTable {
    struct Link {
        var index: Int32
        var name: String
        var flags: UInt32
        var operState: UInt8
        var master: UInt32
    }
    struct AddressKey: Hashable {
        var index: UInt32
        var family: UInt8
        var address: [UInt8]
        var prefix: UInt8
    }
    struct Address {
        var flags: UInt32
        var scope: UInt8
    }
    /// What the kernel uses to tell routes apart: a route's identity (table,
    /// destination and source prefixes, TOS, metric) plus one nexthop (type,
    /// gateway, device or nexthop object). A multipath route is one entry per
    /// nexthop. Two default routes differing by metric, table or gateway are
    /// two entries.
    struct RouteKey: Hashable {
        var family: UInt8
        var table: UInt32
        var destinationLength: UInt8
        var destination: [UInt8]
        var sourceLength: UInt8
        var source: [UInt8]
        var tos: UInt8
        var priority: UInt32
        var type: UInt8
        var gateway: [UInt8]
        var outputInterface: UInt32
        var nexthopID: UInt32

        /// The route without its nexthop: what NLM_F_REPLACE replaces.
        func sameRoute(as other: RouteKey) -> Bool {
            family == other.family && table == other.table && destinationLength == other.destinationLength
                && destination == other.destination && sourceLength == other.sourceLength && source == other.source
                && tos == other.tos && priority == other.priority
        }
    }
    struct Route: Equatable {
        var preferredSource: [UInt8]
        /// RTNH_F_DEAD: the nexthop is not used.
        var dead: Bool
    }

    var links: [Int32: Link] = [:]
    var addresses: [AddressKey: Address] = [:]
    /// Default routes (destination length 0) of every table.
    private(set) var defaultRoutes: [RouteKey: Route] = [:]
    /// Routes `apply` removed without an RTM_DELROUTE, not yet confirmed by a dump.
    private(set) var silentlyRemoved: Set<RouteKey> = []
    /// While a route dump is under way: every change made to `defaultRoutes`
    /// since it was requested (nil: a removal), applied over its answer.
    private var routeChanges: [RouteKey: Route?]?

    // IFF_* and IF_OPER_* from <linux/if.h>; RT_SCOPE_*, RTN_*, RT_TABLE_* from rtnetlink.
    static let iffUp: UInt32 = 0x1, iffRunning: UInt32 = 0x40, iffLoopback: UInt32 = 0x8, iffSlave: UInt32 = 0x800
    static let iffLowerUp: UInt32 = 0x10000, iffDormant: UInt32 = 0x20000
    static let operUnknown: UInt8 = 0, operDormant: UInt8 = 5, operUp: UInt8 = 6
    static let ifaTentative: UInt32 = 0x40
    static let scopeSite: UInt8 = 200, scopeHost: UInt8 = 254
    static let rtnUnicast: UInt8 = 1, tableDefault: UInt32 = 253, tableMain: UInt32 = 254
    static let rtnhDead: UInt32 = 0x1

    /// Applies one message. `replace`: the RTM_NEWROUTE notification carried
    /// NLM_F_REPLACE. Returns true when the kernel may have removed routes
    /// without telling (the caller should dump the routes again).
    @discardableResult
    mutating func apply(_ m: NetlinkMessage, replace: Bool = false) -> Bool {
        switch m {
        case .link(let l, _) where l.family == NL.afBridge:
            // A bridge port's own notifications (its RTM_DELLINK means it
            // left the bridge, not that the link is gone); the link's
            // AF_UNSPEC messages carry the same flags and master.
            return false
        case .link(let l, let deleted):
            let index = UInt32(bitPattern: l.index)
            if deleted {
                links[l.index] = nil
                addresses = addresses.filter { $0.key.index != index }
                removeRoutes { key, _ in key.outputInterface == index }
                return false
            }
            let known = links[l.index]
            var link = known ?? Link(index: l.index, name: "if\(l.index)", flags: 0, operState: 0, master: 0)
            let wasUp = link.flags & Self.iffUp != 0
            let oldMaster = link.master
            link.flags = l.flags
            if let n = l.name { link.name = n }
            if let o = l.operState { link.operState = o }
            link.master = l.master == index ? 0 : l.master ?? 0
            links[l.index] = link
            if wasUp && l.flags & Self.iffUp == 0 {
                // Down: the kernel drops every route through the link (IPv4 silently).
                removeRoutes(silently: true) { key, _ in key.outputInterface == index }
                return true
            }
            // A new master (a VRF) can move the link's routes.
            return known != nil && oldMaster != link.master
        case .address(let a, let deleted):
            let key = AddressKey(index: a.index, family: a.family, address: a.address, prefix: a.prefixLength)
            guard deleted else {
                addresses[key] = Address(flags: a.flags, scope: a.scope)
                return false
            }
            addresses[key] = nil
            guard a.family == NL.afInet else { return false }
            // Routes preferring the removed source go (unless another link has it).
            if !addresses.keys.contains(where: { $0.family == NL.afInet && $0.address == a.address }) {
                removeRoutes(silently: true) { key, route in key.family == NL.afInet && route.preferredSource == a.address }
            }
            // The link's last IPv4 address: the kernel drops its IPv4 routes.
            if !addresses.keys.contains(where: { $0.index == a.index && $0.family == NL.afInet }) {
                removeRoutes(silently: true) { key, _ in key.family == NL.afInet && key.outputInterface == a.index }
            }
            return true
        case .route(let r, let deleted):
            let entries = Self.defaultRouteEntries(r)
            if replace && !deleted, let first = entries.first?.key {
                removeRoutes { key, _ in key.sameRoute(as: first) }
            }
            for (key, route) in entries {
                setRoute(key, deleted ? nil : route)
                if !deleted { silentlyRemoved.remove(key) }
            }
            return false
        case .done, .error, .other:
            return false
        }
    }

    /// The entries of a route message, if it is a default route: one per nexthop.
    static func defaultRouteEntries(_ r: RouteMessage) -> [(key: RouteKey, route: Route)] {
        guard r.destinationLength == 0 else { return [] }
        var key = RouteKey(family: r.family, table: r.table, destinationLength: 0, destination: [],
                           sourceLength: r.sourceLength, source: r.source ?? [], tos: r.tos, priority: r.priority ?? 0,
                           type: r.type, gateway: r.gateway ?? [], outputInterface: r.outputInterface ?? 0,
                           nexthopID: r.nexthopID ?? 0)
        let source = r.preferredSource ?? []
        guard !r.nexthops.isEmpty else {
            return [(key, Route(preferredSource: source, dead: r.flags & rtnhDead != 0))]
        }
        return r.nexthops.map { hop in
            key.gateway = hop.gateway ?? []
            key.outputInterface = hop.interface
            return (key, Route(preferredSource: source, dead: UInt32(hop.flags) & rtnhDead != 0))
        }
    }

    /// A route dump was requested: record changes until `adoptRouteDump`.
    mutating func beginRouteDump() {
        if routeChanges == nil { routeChanges = [:] }
    }

    /// Adopts the default routes of a completed dump, with the changes seen
    /// since it was requested applied over it. The kernel never keeps a route
    /// through a link that is down or gone, so such entries (a dump answered
    /// before the kernel's flush finished) are dropped. A dumped route that
    /// `apply` removed silently is a disagreement: unless `trustDump`, it
    /// stays removed and false is returned (the caller dumps again); with
    /// `trustDump` the kernel's answer wins.
    @discardableResult
    mutating func adoptRouteDump(_ dumped: [RouteKey: Route], trustDump: Bool) -> Bool {
        var merged = dumped
        for (key, change) in routeChanges ?? [:] { merged[key] = change }
        routeChanges = nil
        merged = merged.filter { key, _ in
            key.outputInterface == 0 || links[Int32(bitPattern: key.outputInterface)].map { $0.flags & Self.iffUp != 0 } == true
        }
        let disputed = silentlyRemoved.filter { merged[$0] != nil }
        if !disputed.isEmpty && !trustDump {
            for key in disputed { merged[key] = nil }
            defaultRoutes = merged
            return false
        }
        defaultRoutes = merged
        silentlyRemoved = []
        return true
    }

    private mutating func setRoute(_ key: RouteKey, _ route: Route?) {
        defaultRoutes[key] = route
        if routeChanges != nil { routeChanges![key] = .some(route) }
    }

    private mutating func removeRoutes(silently: Bool = false, _ match: (RouteKey, Route) -> Bool) {
        for (key, route) in defaultRoutes where match(key, route) {
            setRoute(key, nil)
            if silently { silentlyRemoved.insert(key) }
        }
    }

    /// networkd's carrier state of a link on its own (without its ports).
    static func carrierState(_ l: Link) -> ConnectivitySource.OperationalState {
        if l.operState == operDormant { return .dormant }
        let hasCarrier = l.operState == operUp
            || (l.operState == operUnknown && l.flags & (iffLowerUp | iffRunning) == (iffLowerUp | iffRunning)
                && l.flags & iffDormant == 0)
        if hasCarrier { return l.master != 0 || l.flags & iffSlave != 0 ? .enslaved : .carrier }
        return l.flags & iffUp != 0 ? .noCarrier : .off
    }

    /// networkd's carrier state with ports: a link with carrier (or
    /// enslaved) one of whose ports has less than carrier is
    /// `degraded-carrier`. `ports` maps a master's index to its ports.
    static func carrierState(_ l: Link, ports: [Int32: [Link]], depth: Int = 0) -> ConnectivitySource.OperationalState {
        let own = carrierState(l)
        guard own >= .carrier, depth < 8, let mine = ports[l.index] else { return own }
        let degraded = mine.contains { carrierState($0, ports: ports, depth: depth + 1) < .carrier }
        return degraded ? .degradedCarrier : own
    }

    /// networkd's operational state from the carrier and address states
    /// (the table in networkd-link.c's `link_update_operstate`).
    static func operationalState(carrier: ConnectivitySource.OperationalState,
                                 minimumScope: UInt8?) -> ConnectivitySource.OperationalState {
        let address: ConnectivitySource.OperationalState =
            minimumScope.map { $0 < scopeSite ? .routable : $0 < scopeHost ? .degraded : .off } ?? .off
        if carrier == .degradedCarrier && (address == .routable || address == .degraded) { return address }
        if carrier < .carrier || address == .off { return carrier }
        if address == .routable { return .routable }
        return carrier == .carrier ? .degraded : .enslaved
    }

    /// Whether a usable unicast default route exists in a table the kernel's
    /// default rules consult (main, default), through `admitted` links (or none).
    func hasDefaultRoute(through admitted: Set<UInt32>) -> Bool {
        defaultRoutes.contains { key, route in
            key.type == Self.rtnUnicast && !route.dead && (key.table == Self.tableMain || key.table == Self.tableDefault)
                && (key.outputInterface == 0 || admitted.contains(key.outputInterface))
        }
    }

    /// The state the subscriber sees, with `admits` as the interface filter.
    func state(admits: (String) -> Bool, backend: ConnectivitySource.Backend = .kernel) -> ConnectivitySource.State {
        var minScope: [UInt32: UInt8] = [:]
        var addressText: [UInt32: [String]] = [:]
        for (key, a) in addresses {
            addressText[key.index, default: []].append("\(formatAddress(key.address))/\(key.prefix)")
            if a.flags & Self.ifaTentative == 0 {
                minScope[key.index] = min(minScope[key.index] ?? 255, a.scope)
            }
        }
        var ports: [Int32: [Link]] = [:]
        for link in links.values where link.master != 0 {
            ports[Int32(bitPattern: link.master), default: []].append(link)
        }
        var interfaces: [ConnectivitySource.Interface] = []
        var overall = ConnectivitySource.OperationalState.off
        var admitted: Set<UInt32> = []
        for link in links.values.sorted(by: { $0.index < $1.index }) {
            guard link.flags & Self.iffLoopback == 0, admits(link.name) else { continue }
            let index = UInt32(bitPattern: link.index)
            let op = Self.operationalState(carrier: Self.carrierState(link, ports: ports), minimumScope: minScope[index])
            overall = max(overall, op)
            admitted.insert(index)
            interfaces.append(.init(name: link.name, index: link.index, state: op,
                                    addresses: (addressText[index] ?? []).sorted()))
        }
        let hasDefault = hasDefaultRoute(through: admitted)
        return .init(state: overall, online: overall == .routable && hasDefault, defaultRoute: hasDefault,
                     interfaces: interfaces, backend: backend)
    }
}

/// `192.0.2.1` or RFC 5952 IPv6 (`fe80::1`).
func formatAddress(_ b: [UInt8]) -> String {
    if b.count == 4 { return b.map(String.init).joined(separator: ".") }
    guard b.count == 16 else { return b.map { String($0, radix: 16) }.joined(separator: ":") }
    var groups: [UInt16] = []
    for i in stride(from: 0, to: 16, by: 2) { groups.append(UInt16(b[i]) << 8 | UInt16(b[i + 1])) }
    // IPv4-mapped ::ffff:a.b.c.d
    if groups[0..<5].allSatisfy({ $0 == 0 }) && groups[5] == 0xffff {
        return "::ffff:" + b[12..<16].map(String.init).joined(separator: ".")
    }
    var bestStart = -1, bestLen = 0, i = 0
    while i < 8 {
        if groups[i] == 0 {
            var j = i
            while j < 8 && groups[j] == 0 { j += 1 }
            if j - i > bestLen && j - i >= 2 { bestStart = i; bestLen = j - i }
            i = j
        } else { i += 1 }
    }
    func hex(_ r: ArraySlice<UInt16>) -> String { r.map { String($0, radix: 16) }.joined(separator: ":") }
    if bestStart < 0 { return hex(groups[...]) }
    return hex(groups[0..<bestStart]) + "::" + hex(groups[(bestStart + bestLen)...])
}
