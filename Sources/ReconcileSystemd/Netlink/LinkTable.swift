// The kernel's view of links, addresses and routes, and networkd's state
// rules over it. Pure Swift: unit-tested without sockets.
import Reconcile

/// Links, addresses and default routes as the kernel reported them.
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
    struct RouteKey: Hashable {
        var family: UInt8
        var table: UInt32
        var outputInterface: UInt32
        var gateway: [UInt8]
    }

    var links: [Int32: Link] = [:]
    var addresses: [AddressKey: Address] = [:]
    var defaultRoutes: Set<RouteKey> = []

    // IFF_* and IF_OPER_* from <linux/if.h>; RT_SCOPE_*, RTN_*, RT_TABLE_* from rtnetlink.
    static let iffUp: UInt32 = 0x1, iffRunning: UInt32 = 0x40, iffLoopback: UInt32 = 0x8
    static let iffLowerUp: UInt32 = 0x10000, iffDormant: UInt32 = 0x20000
    static let operUnknown: UInt8 = 0, operDormant: UInt8 = 5, operUp: UInt8 = 6
    static let ifaTentative: UInt32 = 0x40
    static let scopeSite: UInt8 = 200, scopeHost: UInt8 = 254
    static let rtnUnicast: UInt8 = 1, tableMain: UInt32 = 254

    mutating func apply(_ m: NetlinkMessage) {
        switch m {
        case .link(let l, let deleted):
            if deleted {
                links[l.index] = nil
                addresses = addresses.filter { $0.key.index != UInt32(bitPattern: l.index) }
                defaultRoutes = defaultRoutes.filter { $0.outputInterface != UInt32(bitPattern: l.index) }
            } else {
                var link = links[l.index] ?? Link(index: l.index, name: "if\(l.index)", flags: 0, operState: 0, master: 0)
                link.flags = l.flags
                if let n = l.name { link.name = n }
                if let o = l.operState { link.operState = o }
                link.master = l.master ?? 0
                links[l.index] = link
            }
        case .address(let a, let deleted):
            let key = AddressKey(index: a.index, family: a.family, address: a.address, prefix: a.prefixLength)
            addresses[key] = deleted ? nil : Address(flags: a.flags, scope: a.scope)
        case .route(let r, let deleted):
            guard r.destinationLength == 0, r.type == Self.rtnUnicast, r.table == Self.tableMain else { return }
            let key = RouteKey(family: r.family, table: r.table, outputInterface: r.outputInterface ?? 0, gateway: r.gateway ?? [])
            if deleted { defaultRoutes.remove(key) } else { defaultRoutes.insert(key) }
        case .done, .error, .other:
            break
        }
    }

    /// networkd's carrier state of a link.
    static func carrierState(_ l: Link) -> ConnectivitySource.OperationalState {
        if l.operState == operDormant { return .dormant }
        let hasCarrier = l.operState == operUp
            || (l.operState == operUnknown && l.flags & (iffLowerUp | iffRunning) == (iffLowerUp | iffRunning)
                && l.flags & iffDormant == 0)
        if hasCarrier { return l.master != 0 ? .enslaved : .carrier }
        return l.flags & iffUp != 0 ? .noCarrier : .off
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
        var interfaces: [ConnectivitySource.Interface] = []
        var overall = ConnectivitySource.OperationalState.off
        var admitted: Set<UInt32> = []
        for link in links.values.sorted(by: { $0.index < $1.index }) {
            guard link.flags & Self.iffLoopback == 0, admits(link.name) else { continue }
            let carrier = Self.carrierState(link)
            var op = carrier
            if carrier >= .carrier, let scope = minScope[UInt32(bitPattern: link.index)] {
                if scope < Self.scopeSite { op = .routable } else if scope < Self.scopeHost { op = .degraded }
            }
            overall = max(overall, op)
            admitted.insert(UInt32(bitPattern: link.index))
            interfaces.append(.init(name: link.name, index: link.index, state: op,
                                    addresses: (addressText[UInt32(bitPattern: link.index)] ?? []).sorted()))
        }
        let hasDefault = defaultRoutes.contains { $0.outputInterface == 0 || admitted.contains($0.outputInterface) }
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
