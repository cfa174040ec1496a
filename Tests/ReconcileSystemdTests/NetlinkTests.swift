@testable import ReconcileSystemd
import Reconcile
import Testing

/// The pure parts of the kernel backend: parser, state rules, globs.
@Suite struct NetlinkTests {
    func link(_ index: Int32, _ name: String, flags: UInt32, oper: UInt8, master: UInt32 = 0) -> NetlinkMessage {
        .link(LinkMessage(index: index, flags: flags, name: name, operState: oper, master: master), deleted: false)
    }
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

    @Test(arguments: [
        ("eth*", "eth0", true), ("eth*", "wlan0", false), ("*", "", true), ("e?h0", "eth0", true),
        ("wl[a-z]n0", "wlan0", true), ("wl[!a]n0", "wlan0", false), ("[", "[", true), ("veth[0-9]", "veth10", false),
    ])
    func globMatchesLikeAShell(pattern: String, name: String, expected: Bool) {
        #expect(glob(pattern, matches: name) == expected)
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
