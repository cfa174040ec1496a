import Foundation
import Testing

/// Runs a shell command and returns its standard output (nil if it failed).
func capture(_ command: String) -> String? {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/bin/sh")
    p.arguments = ["-c", command]
    let out = Pipe()
    p.standardOutput = out
    p.standardError = FileHandle.nullDevice
    guard (try? p.run()) != nil else { return nil }
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return p.terminationStatus == 0 ? String(decoding: data, as: UTF8.self) : nil
}

/// One state line of the probe (`state=… online=… default=… ifaces=a:s:n,…`).
struct ProbeLine: Equatable {
    var state = "", online = false, defaultRoute = false
    var links: [String: String] = [:]

    init?(_ line: String) {
        guard line.hasPrefix("state=") else { return nil }
        for field in line.split(separator: " ") {
            let kv = field.split(separator: "=", maxSplits: 1).map(String.init)
            guard kv.count == 2 else { continue }
            switch kv[0] {
            case "state": state = kv[1]
            case "online": online = kv[1] == "true"
            case "default": defaultRoute = kv[1] == "true"
            case "ifaces":
                for iface in kv[1].split(separator: ",") {
                    let parts = iface.split(separator: ":").map(String.init)
                    if parts.count == 3 { links[parts[0]] = parts[1] }
                }
            default: break
            }
        }
    }
}

/// The latest state a probe reported, read with deadlines.
final class ProbeFollower {
    let child: Child
    private(set) var latest: ProbeLine?
    init(_ child: Child) { self.child = child }

    /// Reads every line already written (waiting at most `wait` for the first).
    func drain(wait: Duration = .milliseconds(50)) {
        var timeout = wait
        while let l = child.line(timeout: timeout) {
            if let p = ProbeLine(l) { latest = p }
            timeout = .milliseconds(1)
        }
    }

    /// Drains until `done(latest)` or the deadline; returns the last state.
    func wait(timeout: Duration = .seconds(10), until done: (ProbeLine) -> Bool) -> ProbeLine? {
        let deadline = ContinuousClock.now + timeout
        repeat {
            drain()
            if let l = latest, done(l) { return l }
        } while ContinuousClock.now < deadline
        return latest
    }
}

/// Whether the kernel's own tables (`ip -j route`, both families) hold a
/// usable unicast default route in the main or default table.
func kernelHasDefaultRoute(namespaceOf pid: Int32) -> Bool? {
    var found = false
    for family in ["-4", "-6"] {
        guard let text = capture(nsenter(pid, "-n", "ip -j \(family) route show table all")),
              let routes = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [[String: Any]] else { return nil }
        found = found || routes.contains { r in
            let table = r["table"] as? String ?? "main"
            let type = r["type"] as? String ?? "unicast"
            let flags = r["flags"] as? [String] ?? []
            return r["dst"] as? String == "default" && type == "unicast" && ["main", "default"].contains(table)
                && !flags.contains("dead")
        }
    }
    return found
}

extension SystemdTests {
    /// The kernel removes routes without RTM_DELROUTE (link down, last IPv4
    /// address removed); the backend's default route must still equal what
    /// `ip -j route` shows after every step.
    @Suite struct KernelBackendFollowsRouteFlushes {
        /// A probe with veth0 up (peer up), no IPv6 link-local noise.
        func probe() throws -> (NetnsProbe, ProbeFollower) {
            let p = try NetnsProbe(["--backend", "kernel", "--include", "veth0"])
            p.inside("ip link add veth0 type veth peer name veth1")
            p.inside("ip link set veth0 addrgenmode none")
            p.inside("ip link set veth1 up")
            p.inside("ip link set veth0 up")
            return (p, ProbeFollower(p.child))
        }

        /// Waits until the probe's default route equals `expected`, then checks
        /// that it equals the kernel's tables too.
        func expectDefault(_ expected: Bool, online: Bool? = nil, _ f: ProbeFollower, _ p: NetnsProbe,
                           _ step: String, sourceLocation: SourceLocation = #_sourceLocation) {
            let seen = f.wait { $0.defaultRoute == expected && (online == nil || $0.online == online) }
            #expect(seen?.defaultRoute == expected, "\(step): probe", sourceLocation: sourceLocation)
            if let online { #expect(seen?.online == online, "\(step): online", sourceLocation: sourceLocation) }
            #expect(kernelHasDefaultRoute(namespaceOf: p.child.pid) == expected, "\(step): ip -j route", sourceLocation: sourceLocation)
            // Nothing else arrives that would contradict it.
            f.drain(wait: .milliseconds(200))
            #expect(f.latest?.defaultRoute == expected, "\(step): later", sourceLocation: sourceLocation)
        }

        @Test func linkDownAndUpLeavesNoDefaultRoute() throws {
            let (p, f) = try probe()
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            p.inside("ip route add default via 10.0.0.2")
            expectDefault(true, online: true, f, p, "default via 10.0.0.2")
            // The kernel drops the IPv4 routes of a downed link without RTM_DELROUTE.
            p.inside("sh -c 'ip link set veth0 down; ip link set veth0 up'")
            expectDefault(false, online: false, f, p, "down/up")
            #expect(f.latest?.state == "routable")   // the address stays, the route does not
        }

        @Test func removingTheLastAddressRemovesTheDefaultRouteThroughIt() throws {
            let (p, f) = try probe()
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            p.inside("ip route add default via 10.0.0.2")
            expectDefault(true, online: true, f, p, "default via 10.0.0.2")
            p.inside("ip addr del 10.0.0.1/24 dev veth0")
            expectDefault(false, online: false, f, p, "last address removed")
        }

        @Test func anotherAddressKeepsTheDefaultRouteButNotTheOnePreferringTheRemovedSource() throws {
            let (p, f) = try probe()
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            p.inside("ip addr add 10.1.0.1/24 dev veth0")
            p.inside("ip route add default via 10.1.0.2 src 10.0.0.1")
            expectDefault(true, online: true, f, p, "default preferring 10.0.0.1")
            p.inside("ip addr del 10.0.0.1/24 dev veth0")
            expectDefault(false, online: false, f, p, "its source removed")
            // A gateway outside every remaining subnet: the kernel keeps the route.
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            p.inside("ip route add default via 10.0.0.2")
            expectDefault(true, online: true, f, p, "default via 10.0.0.2")
            p.inside("ip addr del 10.0.0.1/24 dev veth0")
            expectDefault(true, online: true, f, p, "gateway's subnet removed, 10.1.0.1 stays")
        }

        @Test func ipv6DefaultRouteFollowsLinkDownAndAddressRemoval() throws {
            let (p, f) = try probe()
            p.inside("ip addr add 2001:db8::1/64 dev veth0 nodad")
            p.inside("ip -6 route add default via 2001:db8::2")
            expectDefault(true, online: true, f, p, "IPv6 default")
            // Removing the address keeps an IPv6 default route (the kernel says so).
            p.inside("ip addr del 2001:db8::1/64 dev veth0")
            expectDefault(true, online: false, f, p, "IPv6 address removed")
            p.inside("ip addr add 2001:db8::1/64 dev veth0 nodad")
            expectDefault(true, online: true, f, p, "IPv6 address back")
            p.inside("sh -c 'ip link set veth0 down; ip link set veth0 up'")
            expectDefault(false, online: false, f, p, "IPv6 down/up")
        }

        @Test func defaultRoutesDifferingByMetricOrTableAreDistinct() throws {
            let (p, f) = try probe()
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            p.inside("ip route add default via 10.0.0.2 metric 100")
            p.inside("ip route add default via 10.0.0.2 metric 200")
            expectDefault(true, online: true, f, p, "two metrics")
            p.inside("ip route del default via 10.0.0.2 metric 100")
            expectDefault(true, online: true, f, p, "metric 100 deleted")
            // The kernel's `default` table (consulted by its default rules).
            p.inside("ip route add default via 10.0.0.3 metric 200 table default")
            p.inside("ip route del default via 10.0.0.2 metric 200")
            expectDefault(true, online: true, f, p, "main deleted, table default stays")
            p.inside("ip route del default table default")
            expectDefault(false, online: false, f, p, "none left")
            // IPv6: same destination and gateway, two metrics.
            p.inside("ip addr add 2001:db8::1/64 dev veth0 nodad")
            p.inside("ip -6 route add default via 2001:db8::2 metric 100")
            p.inside("ip -6 route add default via 2001:db8::2 metric 200")
            expectDefault(true, online: true, f, p, "two IPv6 metrics")
            p.inside("ip -6 route del default via 2001:db8::2 metric 100")
            expectDefault(true, online: true, f, p, "IPv6 metric 100 deleted")
            // A replace (no RTM_DELROUTE for the replaced route).
            p.inside("ip -6 route replace default via 2001:db8::3 metric 200")
            expectDefault(true, online: true, f, p, "IPv6 replaced")
            p.inside("ip -6 route del default via 2001:db8::3 metric 200")
            expectDefault(false, online: false, f, p, "IPv6 none left")
        }

        @Test func defaultRouteInAnotherTableDoesNotCount() throws {
            let (p, f) = try probe()
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            p.inside("ip route add default via 10.0.0.2 table 100")
            p.inside("ip route add unreachable default metric 9999")
            // A usable default in main, seen, then removed: what is left (the
            // other table's and the unreachable one) must not count.
            p.inside("ip route add default via 10.0.0.2 metric 50")
            expectDefault(true, online: true, f, p, "main default added beside them")
            p.inside("ip route del default via 10.0.0.2 metric 50")
            expectDefault(false, online: false, f, p, "only another table's and an unreachable default left")
            #expect(f.latest?.state == "routable")
        }
    }
}
