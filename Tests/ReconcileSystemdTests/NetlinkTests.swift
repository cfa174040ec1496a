@testable import ReconcileSystemd
import Reconcile
import Testing

/// The pure parts of the kernel backend: parser, state rules, globs.
@Suite struct NetlinkTests {
    func link(_ index: Int32, _ name: String, flags: UInt32, oper: UInt8, master: UInt32 = 0) -> NetlinkMessage {
        .link(LinkMessage(index: index, flags: flags, name: name, operState: oper, master: master), deleted: false)
    }
    func address(_ index: UInt32, _ bytes: [UInt8], prefix: UInt8 = 24, scope: UInt8 = 0, deleted: Bool = false) -> NetlinkMessage {
        .address(AddressMessage(family: bytes.count == 4 ? 2 : 10, prefixLength: prefix, flags: 0, scope: scope, index: index,
                                address: bytes), deleted: deleted)
    }
    func defaultRoute(_ oif: UInt32, via gateway: [UInt8], metric: UInt32 = 0, table: UInt32 = 254,
                      source: [UInt8]? = nil, deleted: Bool = false) -> NetlinkMessage {
        .route(RouteMessage(family: gateway.count == 4 ? 2 : 10, destinationLength: 0, table: table, type: 1,
                            outputInterface: oif, gateway: gateway, priority: metric, preferredSource: source), deleted: deleted)
    }
    func states(_ t: LinkTable) -> [String: ConnectivitySource.OperationalState] {
        Dictionary(uniqueKeysWithValues: t.state(admits: { _ in true }).interfaces.map { ($0.name, $0.state) })
    }
    let carrierFlags: UInt32 = 0x1 | 0x40 | 0x10000
    let up: UInt32 = 0x1, running: UInt32 = 0x40, lowerUp: UInt32 = 0x10000, dormant: UInt32 = 0x20000

    @Test func carrierStateFollowsNetworkdRules() {
        var t = LinkTable()
        t.apply(link(2, "a", flags: 0, oper: 2))
        t.apply(link(3, "b", flags: up, oper: 2))
        t.apply(link(4, "c", flags: up | lowerUp | running, oper: 0))
        t.apply(link(5, "d", flags: up | lowerUp | running | dormant, oper: 0))
        t.apply(link(6, "e", flags: up, oper: 5))
        t.apply(link(7, "f", flags: up | lowerUp | running, oper: 6, master: 9))
        t.apply(link(1, "lo", flags: up | 0x8, oper: 0))
        let s = t.state(admits: { _ in true })
        #expect(s.interfaces.map(\.state) == [.off, .noCarrier, .carrier, .noCarrier, .dormant, .enslaved])
        #expect(s.interfaces.map(\.name) == ["a", "b", "c", "d", "e", "f"])   // loopback ignored
        #expect(s.state == .enslaved)
    }

    @Test func addressScopeDecidesRoutableDegradedAndTentativeIsIgnored() {
        var t = LinkTable()
        t.apply(link(2, "eth0", flags: up | lowerUp | running, oper: 6))
        t.apply(.address(AddressMessage(family: 10, prefixLength: 64, flags: 0x40, scope: 0, index: 2,
                                        address: [0x20, 0x01, 0x0d, 0xb8] + [UInt8](repeating: 0, count: 11) + [1]), deleted: false))
        #expect(t.state(admits: { _ in true }).state == .carrier)   // tentative
        t.apply(.address(AddressMessage(family: 10, prefixLength: 64, flags: 0, scope: 253, index: 2,
                                        address: [0xfe, 0x80] + [UInt8](repeating: 0, count: 13) + [1]), deleted: false))
        #expect(t.state(admits: { _ in true }).state == .degraded)
        t.apply(.address(AddressMessage(family: 2, prefixLength: 24, flags: 0, scope: 0, index: 2, address: [10, 0, 0, 1]), deleted: false))
        let s = t.state(admits: { _ in true })
        #expect(s.state == .routable && !s.online)
        #expect(s.interfaces[0].addresses == ["10.0.0.1/24", "2001:db8::1/64", "fe80::1/64"])
        t.apply(.route(RouteMessage(family: 2, destinationLength: 0, table: 254, type: 1, outputInterface: 2), deleted: false))
        #expect(t.state(admits: { _ in true }).online)
        #expect(!t.state(admits: { $0 != "eth0" }).online)
    }

    @Test func masterWithAPortWithoutCarrierIsDegradedCarrier() {
        var t = LinkTable()
        t.apply(link(4, "br0", flags: carrierFlags, oper: 6))
        t.apply(link(2, "veth0", flags: carrierFlags, oper: 6, master: 4))
        t.apply(link(3, "veth2", flags: 0x1, oper: 2, master: 4))
        #expect(states(t) == ["br0": .degradedCarrier, "veth0": .enslaved, "veth2": .noCarrier])
        // networkd's table: degraded-carrier with a global address is routable, with a link one degraded.
        t.apply(address(4, [169, 254, 0, 1], prefix: 16, scope: 253))
        #expect(states(t)["br0"] == .degraded)
        t.apply(address(4, [10, 0, 0, 1]))
        #expect(states(t)["br0"] == .routable)
        // The port gets carrier: the master is plain routable; a master without carrier ignores its ports.
        t.apply(link(3, "veth2", flags: carrierFlags, oper: 6, master: 4))
        #expect(states(t)["br0"] == .routable)
        t.apply(link(4, "br0", flags: 0x1, oper: 2))
        #expect(states(t)["br0"] == .noCarrier)
    }

    @Test func enslavedPortWithLinkLocalAddressStaysEnslaved() {
        var t = LinkTable()
        t.apply(link(2, "veth0", flags: carrierFlags, oper: 6, master: 4))
        t.apply(address(2, [0xfe, 0x80] + [UInt8](repeating: 0, count: 13) + [5], prefix: 64, scope: 253))
        #expect(states(t)["veth0"] == .enslaved)
        t.apply(address(2, [10, 1, 0, 1]))
        #expect(states(t)["veth0"] == .routable)
        // IFF_SLAVE (a bond port) is enslaved too; a master index equal to its own is none.
        t.apply(link(5, "eth1", flags: carrierFlags | 0x800, oper: 6))
        t.apply(link(6, "eth2", flags: carrierFlags, oper: 6, master: 6))
        #expect(states(t)["eth1"] == .enslaved && states(t)["eth2"] == .carrier)
    }

    @Test func bridgePortNotificationsDoNotDeleteTheLink() {
        var t = LinkTable()
        t.apply(link(2, "veth0", flags: carrierFlags, oper: 6, master: 4))
        t.apply(address(2, [10, 1, 0, 1]))
        // `ip link set veth0 nomaster`: an AF_BRIDGE RTM_DELLINK, then the link without master.
        t.apply(.link(LinkMessage(index: 2, flags: carrierFlags, name: "veth0", operState: 6, master: 4, family: 7), deleted: true))
        t.apply(link(2, "veth0", flags: carrierFlags, oper: 6))
        #expect(states(t) == ["veth0": .routable])
    }

    @Test func defaultRoutesAreKeyedByMetricTableAndNexthop() {
        var t = LinkTable()
        t.apply(link(2, "eth0", flags: carrierFlags, oper: 6))
        t.apply(address(2, [10, 0, 0, 1]))
        t.apply(defaultRoute(2, via: [10, 0, 0, 2], metric: 100))
        t.apply(defaultRoute(2, via: [10, 0, 0, 2], metric: 200))
        t.apply(defaultRoute(2, via: [10, 0, 0, 3], metric: 200))
        t.apply(defaultRoute(2, via: [10, 0, 0, 2], metric: 200, table: 253))
        #expect(t.defaultRoutes.count == 4)
        t.apply(defaultRoute(2, via: [10, 0, 0, 2], metric: 100, deleted: true))
        t.apply(defaultRoute(2, via: [10, 0, 0, 2], metric: 200, deleted: true))
        #expect(t.defaultRoutes.count == 2 && t.state(admits: { _ in true }).online)
        // NLM_F_REPLACE replaces every nexthop of the same route (no RTM_DELROUTE for them).
        t.apply(defaultRoute(2, via: [10, 0, 0, 9], metric: 200), replace: true)
        #expect(t.defaultRoutes.keys.filter { $0.table == 254 }.map(\.gateway) == [[10, 0, 0, 9]])
        // Only unicast routes of the main and default tables count.
        var other = LinkTable()
        other.apply(link(2, "eth0", flags: carrierFlags, oper: 6))
        other.apply(defaultRoute(2, via: [10, 0, 0, 2], table: 100))
        other.apply(.route(RouteMessage(family: 2, destinationLength: 0, table: 254, type: 7), deleted: false))   // unreachable
        #expect(other.state(admits: { _ in true }).defaultRoute == false)
    }

    @Test func multipathRouteIsOneEntryPerNexthopAndDeadOnesDoNotCount() {
        var t = LinkTable()
        t.apply(link(2, "eth0", flags: carrierFlags, oper: 6))
        t.apply(link(3, "eth1", flags: carrierFlags, oper: 6))
        var r = RouteMessage(family: 2, destinationLength: 0, table: 254, type: 1)
        r.nexthops = [RouteNexthop(flags: 1, interface: 2, gateway: [10, 0, 0, 2]), RouteNexthop(flags: 0, interface: 3, gateway: [10, 1, 0, 2])]
        t.apply(.route(r, deleted: false))
        #expect(t.defaultRoutes.count == 2)
        #expect(t.state(admits: { $0 == "eth0" }).defaultRoute == false)   // its nexthop is dead
        #expect(t.state(admits: { $0 == "eth1" }).defaultRoute == true)
        t.apply(.route(r, deleted: true))
        #expect(t.defaultRoutes.isEmpty)
    }

    @Test func silentFlushesFollowTheKernelsRules() {
        var t = LinkTable()
        t.apply(link(2, "eth0", flags: carrierFlags, oper: 6))
        t.apply(address(2, [10, 0, 0, 1]))
        t.apply(address(2, [10, 1, 0, 1]))
        t.apply(defaultRoute(2, via: [10, 0, 0, 2]))
        t.apply(defaultRoute(2, via: [10, 1, 0, 2], metric: 5, source: [10, 0, 0, 1]))
        t.apply(defaultRoute(2, via: [0x20, 0x01] + [UInt8](repeating: 0, count: 13) + [2]))
        // The preferred source goes: that route goes, the other stays (its gateway is off-link now, as in the kernel).
        let r1 = t.apply(address(2, [10, 0, 0, 1], deleted: true))
        #expect(r1)
        #expect(t.defaultRoutes.count == 2 && t.silentlyRemoved.count == 1)
        // The last IPv4 address goes: every IPv4 route through the link goes, IPv6 stays.
        let r2 = t.apply(address(2, [10, 1, 0, 1], deleted: true))
        #expect(r2)
        #expect(t.defaultRoutes.keys.map(\.family) == [10])
        // Down: everything through the link goes.
        let r3 = t.apply(link(2, "eth0", flags: 0, oper: 2))
        #expect(r3)
        #expect(t.defaultRoutes.isEmpty)
        let r4 = t.apply(link(2, "eth0", flags: 0, oper: 2))
        #expect(!r4)   // already down: nothing more
    }

    @Test func routeDumpConfirmsOrDisputesSilentFlushes() {
        var t = LinkTable()
        t.apply(link(2, "eth0", flags: carrierFlags, oper: 6))
        t.apply(address(2, [10, 0, 0, 1]))
        t.apply(defaultRoute(2, via: [10, 0, 0, 2]))
        let entry = LinkTable.defaultRouteEntries(RouteMessage(family: 2, destinationLength: 0, table: 254, type: 1,
                                                               outputInterface: 2, gateway: [10, 0, 0, 2], priority: 0))
        let stale = Dictionary(uniqueKeysWithValues: entry.map { ($0.key, $0.route) })
        t.apply(address(2, [10, 0, 0, 1], deleted: true))
        // A dump answered before the kernel's flush still shows the route: disputed, kept removed.
        t.beginRouteDump()
        let r5 = t.adoptRouteDump(stale, trustDump: false)
        #expect(!r5)
        #expect(t.defaultRoutes.isEmpty)
        // A route added (notified) while the next dump runs is kept even if the dump missed it.
        t.beginRouteDump()
        t.apply(defaultRoute(2, via: [10, 0, 0, 7]))
        let r6 = t.adoptRouteDump([:], trustDump: false)
        #expect(r6)
        #expect(t.defaultRoutes.keys.map(\.gateway) == [[10, 0, 0, 7]] && t.silentlyRemoved.isEmpty)
        // After repeated disputes the kernel's answer wins.
        t.apply(address(2, [10, 0, 0, 1]))
        t.apply(address(2, [10, 0, 0, 1], deleted: true))
        t.beginRouteDump()
        let r7 = t.adoptRouteDump(stale, trustDump: true)
        #expect(r7)
        #expect(t.defaultRoutes.count == 1)
        // A route through a link that is down cannot exist: dropped from any dump.
        t.apply(link(2, "eth0", flags: 0, oper: 2))
        t.beginRouteDump()
        #expect(t.adoptRouteDump(stale, trustDump: true) && t.defaultRoutes.isEmpty)
    }

    @Test func parsesRouteAttributesAndMultipath() {
        var m: [UInt8] = []
        func put32(_ v: UInt32) { withUnsafeBytes(of: v) { m.append(contentsOf: $0) } }
        func put16(_ v: UInt16) { withUnsafeBytes(of: v) { m.append(contentsOf: $0) } }
        // RTM_NEWROUTE, NLM_F_REPLACE: rtmsg (AF_INET, dst 0, tos 4, table 254, unicast), RTA_PRIORITY 300,
        // RTA_PREFSRC 10.0.0.1, RTA_MULTIPATH with two nexthops (one RTA_GATEWAY, one RTA_VIA).
        let body: [UInt8] = [2, 0, 0, 4, 254, 3, 0, 1, 0, 0, 0, 0]
        var attrs: [UInt8] = []
        func attr(_ type: UInt16, _ payload: [UInt8]) {
            withUnsafeBytes(of: UInt16(4 + payload.count)) { attrs.append(contentsOf: $0) }
            withUnsafeBytes(of: type) { attrs.append(contentsOf: $0) }
            attrs += payload + [UInt8](repeating: 0, count: (4 - payload.count % 4) % 4)
        }
        attr(6, [44, 1, 0, 0])
        attr(7, [10, 0, 0, 1])
        var hops: [UInt8] = []
        hops += [16, 0, 1, 0, 2, 0, 0, 0] + [8, 0, 5, 0, 10, 0, 0, 2]          // dead, ifindex 2, gateway 10.0.0.2
        hops += [32, 0, 0, 0, 3, 0, 0, 0] + [22, 0, 18, 0, 10, 0] + [UInt8](repeating: 0, count: 15) + [9] + [0, 0]  // via IPv6
        attr(9, hops)
        put32(UInt32(16 + body.count + attrs.count)); put16(24); put16(0x100); put32(1); put32(0)
        m += body + attrs
        let e = m.withUnsafeBytes { parseNetlink($0) }
        #expect(e.count == 1 && e.first?.flags == 0x100)
        guard case .route(let r, false)? = e.first?.message else { Issue.record("not a route: \(e)"); return }
        #expect(r.tos == 4 && r.priority == 300 && r.preferredSource == [10, 0, 0, 1])
        #expect(r.nexthops == [RouteNexthop(flags: 1, interface: 2, gateway: [10, 0, 0, 2]),
                               RouteNexthop(flags: 0, interface: 3, gateway: [UInt8](repeating: 0, count: 15) + [9])])
        // Every prefix of it parses without trapping.
        for n in 0..<m.count { _ = Array(m[0..<n]).withUnsafeBytes { parseNetlink($0) } }
    }

    @Test(arguments: [
        ("eth*", "eth0", true), ("eth*", "wlan0", false), ("*", "", true), ("e?h0", "eth0", true),
        ("wl[a-z]n0", "wlan0", true), ("wl[!a]n0", "wlan0", false), ("[", "[", true), ("veth[0-9]", "veth10", false),
    ])
    func globMatchesLikeAShell(pattern: String, name: String, expected: Bool) {
        #expect(ConnectivitySource.glob(pattern, matches: name) == expected)
    }

    @Test func formatsAddressesLikeInetNtop() {
        #expect(formatAddress([192, 0, 2, 1]) == "192.0.2.1")
        #expect(formatAddress([UInt8](repeating: 0, count: 16)) == "::")
        #expect(formatAddress([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]) == "2001:db8:0:1::1")
        #expect(formatAddress([UInt8](repeating: 0, count: 10) + [0xff, 0xff, 10, 0, 0, 1]) == "::ffff:10.0.0.1")
    }

    @Test func parserSurvivesTruncatedAndGarbageInput() {
        let garbage: [[UInt8]] = [[], [1, 2, 3], [UInt8](repeating: 0xff, count: 64), [20, 0, 0, 0, 16, 0] + [UInt8](repeating: 0, count: 14),
                                  [16, 0, 0, 0, 20, 0, 0, 0] + [UInt8](repeating: 0, count: 8)]
        for g in garbage {
            _ = g.withUnsafeBytes { parseNetlink($0) }
        }
        // Found by the fuzzer: an NLMSG_ERROR whose code is Int32.min (negating it trapped).
        let errorMin: [UInt8] = [0x24, 0, 0, 0, 2, 0, 0, 0, 1, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0x80] + [UInt8](repeating: 0, count: 16)
        #expect(errorMin.withUnsafeBytes { parseNetlink($0) }.first?.message == .error(errno: Int32.min))
        // A link message cut in its attributes still yields what was complete.
        var m: [UInt8] = []
        func put32(_ v: UInt32) { withUnsafeBytes(of: v) { m.append(contentsOf: $0) } }
        func put16(_ v: UInt16) { withUnsafeBytes(of: v) { m.append(contentsOf: $0) } }
        put32(16 + 16 + 12); put16(16); put16(0); put32(0); put32(0)
        m += [0, 0]; put16(1); put32(7); put32(1); put32(0)
        put16(12); put16(3); m += Array("veth0\0\0\0".utf8)
        let parsed = m.withUnsafeBytes { parseNetlink($0) }
        #expect(parsed.count == 1)
        if case .link(let l, _) = parsed.first?.message { #expect(l.name == "veth0" && l.index == 7) }
        let cut = Array(m.dropLast(3))
        #expect(cut.withUnsafeBytes { parseNetlink($0) }.isEmpty)
    }
}
