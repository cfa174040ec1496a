import Foundation
import Testing

/// A real systemd-networkd and the kernel backend in the same private
/// namespaces (scripts/networkd-sandbox.sh), compared link by link.
final class NetworkdBeside {
    let sandbox = repositoryScript("networkd-sandbox.sh")
    let links = repositoryScript("networkd-links.sh")
    let child: Child
    let probe: ProbeFollower

    init() throws {
        child = try Child("/usr/bin/unshare", ["-n", "-m", "--propagation", "private", sandbox,
                                               builtExecutable("reconcile-probe"), "connectivity", "--backend", "kernel"])
        probe = ProbeFollower(child)
        // The probe's first state: the sandbox (bus, tmpfs) is ready.
        _ = probe.wait { _ in true }
        inside("\(sandbox) --start-networkd")
        inside("\(sandbox) --wait-networkd")
    }

    @discardableResult
    func inside(_ command: String, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        sh(nsenter(child.pid, "-n -m", command), sourceLocation: sourceLocation)
    }

    /// networkd's per-link OperationalState (loopback left out) and its
    /// manager's, from `networkctl list --json=short` and the bus.
    func networkd() -> (links: [String: String], overall: String)? {
        guard let text = capture(nsenter(child.pid, "-n -m", links)),
              let json = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
              let list = json["Interfaces"] as? [[String: Any]],
              let reply = capture(nsenter(child.pid, "-n -m", "\(sandbox) --busctl get-property org.freedesktop.network1 /org/freedesktop/network1 org.freedesktop.network1.Manager OperationalState"))
        else { return nil }
        var links: [String: String] = [:]
        for l in list where l["Type"] as? String != "loopback" {
            if let name = l["Name"] as? String, let state = l["OperationalState"] as? String { links[name] = state }
        }
        // `s "routable"`
        let overall = reply.split(separator: "\"").dropFirst().first.map(String.init) ?? reply
        return (links, overall)
    }

    /// Runs `commands`, then waits (bounded) until the kernel backend and
    /// networkd both show `expected` (every link) and `overall`; records
    /// what each showed when they do not.
    func step(_ name: String, _ commands: [String], expect expected: [String: String], overall: String,
              sourceLocation: SourceLocation = #_sourceLocation) {
        for c in commands { inside(c, sourceLocation: sourceLocation) }
        let deadline = ContinuousClock.now + .seconds(15)
        var kernel: ProbeLine?
        var theirs: (links: [String: String], overall: String)?
        repeat {
            probe.drain()
            kernel = probe.latest
            theirs = networkd()
            if kernel?.links == expected && kernel?.state == overall && theirs?.links == expected && theirs?.overall == overall {
                return
            }
        } while ContinuousClock.now < deadline
        Issue.record("""
            \(name): expected \(overall) \(expected.sorted { $0.key < $1.key })
              kernel:   \(kernel?.state ?? "-") \((kernel?.links ?? [:]).sorted { $0.key < $1.key })
              networkd: \(theirs?.overall ?? "-") \((theirs?.links ?? [:]).sorted { $0.key < $1.key })
            """, sourceLocation: sourceLocation)
    }

    deinit {
        sh(nsenter(child.pid, "-n -m", "\(sandbox) --cleanup"))
        child.signal(SIGTERM)
        _ = child.wait()
    }
}

extension SystemdTests {
    /// networkd 252's operational states, computed by the kernel backend:
    /// each step's per-link and overall states must equal networkd's.
    @Suite struct KernelBackendAgreesWithNetworkd {
        @Test func bridgePortsMastersAndAddressesOfEveryScope() throws {
            let n = try NetworkdBeside()
            var s: [String: String] = [:]
            n.step("no links", [], expect: s, overall: "off")
            n.step("links created, down", [
                "ip link add veth0 type veth peer name veth1", "ip link add veth2 type veth peer name veth3",
                "ip link add br0 type bridge",
            ] + ["veth0", "veth1", "veth2", "veth3", "br0"].map { "ip link set \($0) addrgenmode none" },
                   expect: ["veth0": "off", "veth1": "off", "veth2": "off", "veth3": "off", "br0": "off"], overall: "off")
            // A bridge without ports has carrier (this kernel); with ports, it has carrier when one does.
            s = ["veth0": "off", "veth1": "off", "veth2": "off", "veth3": "off", "br0": "carrier"]
            n.step("bridge up, no ports", ["ip link set br0 up"], expect: s, overall: "carrier")
            s["br0"] = "no-carrier"
            n.step("ports attached, down", ["ip link set veth0 master br0", "ip link set veth2 master br0"], expect: s, overall: "no-carrier")
            s["veth0"] = "no-carrier"
            n.step("port up, its peer down", ["ip link set veth0 up"], expect: s, overall: "no-carrier")
            s["veth0"] = "enslaved"; s["veth1"] = "carrier"; s["br0"] = "degraded-carrier"
            n.step("one port with carrier, one off", ["ip link set veth1 up"], expect: s, overall: "enslaved")
            s["veth2"] = "enslaved"; s["veth3"] = "carrier"; s["br0"] = "carrier"
            n.step("both ports with carrier", ["ip link set veth2 up", "ip link set veth3 up"], expect: s, overall: "enslaved")
            s["veth2"] = "no-carrier"; s["veth3"] = "off"; s["br0"] = "degraded-carrier"
            n.step("a port loses carrier", ["ip link set veth3 down"], expect: s, overall: "enslaved")
            s["br0"] = "routable"
            n.step("global address on the master", ["ip addr add 192.168.50.1/24 dev br0"], expect: s, overall: "routable")
            s["br0"] = "degraded"
            n.step("link-scope address on the master", [
                "ip addr del 192.168.50.1/24 dev br0", "ip addr add 169.254.9.1/16 dev br0 scope link",
            ], expect: s, overall: "enslaved")
            s["veth2"] = "enslaved"; s["veth3"] = "carrier"
            n.step("port carrier back", ["ip link set veth3 up"], expect: s, overall: "enslaved")
            // What was found: a port with a link-local address is enslaved, not degraded.
            n.step("link-local address on a port", ["ip addr add fe80::5/64 dev veth0 nodad"], expect: s, overall: "enslaved")
            s["veth0"] = "routable"
            n.step("global address on a port", ["ip addr add 10.1.0.1/24 dev veth0"], expect: s, overall: "routable")
            n.step("site-scope address on a port", ["ip addr add fec0::1/64 dev veth2 scope site nodad"], expect: s, overall: "routable")
            n.step("host-scope address on a peer", ["ip addr add 10.2.0.1/32 dev veth1 scope host"], expect: s, overall: "routable")
            s["veth3"] = "degraded"
            n.step("site-scope address on a peer", ["ip addr add 10.3.0.1/24 dev veth3 scope site"], expect: s, overall: "routable")
            s = ["veth0": "off", "veth1": "no-carrier", "veth2": "off", "veth3": "no-carrier", "br0": "no-carrier"]
            n.step("both ports down", ["ip link set veth0 down", "ip link set veth2 down"], expect: s, overall: "no-carrier")
            s["veth2"] = nil; s["veth3"] = nil
            n.step("a port deleted", ["ip link del veth2"], expect: s, overall: "no-carrier")
        }

        @Test func dormantLinks() throws {
            let n = try NetworkdBeside()
            var s = ["veth4": "off", "veth5": "off"]
            n.step("created", ["ip link add veth4 type veth peer name veth5", "ip link set veth4 addrgenmode none",
                               "ip link set veth5 addrgenmode none", "ip link set veth4 mode dormant"], expect: s, overall: "off")
            s["veth4"] = "no-carrier"
            n.step("up without carrier", ["ip link set veth4 up"], expect: s, overall: "no-carrier")
            s["veth4"] = "dormant"; s["veth5"] = "carrier"
            n.step("carrier in dormant mode", ["ip link set veth5 up"], expect: s, overall: "carrier")
            n.step("a global address while dormant", ["ip addr add 10.4.0.1/24 dev veth4"], expect: s, overall: "carrier")
            s["veth4"] = "no-carrier"; s["veth5"] = "off"
            n.step("carrier lost", ["ip link set veth5 down"], expect: s, overall: "no-carrier")
        }
    }
}
