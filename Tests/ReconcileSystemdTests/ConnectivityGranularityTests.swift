import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// The kernel's IPv4 addresses on `device` in `probe`'s namespace (`ip -j`), as `a.b.c.d/len`.
func kernelAddresses(_ probe: NetnsProbe, _ device: String) -> [String]? {
    guard let text = output(nsenter(probe.child.pid, "-n", "ip -j -4 addr show dev \(device)")),
          let links = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [[String: Any]] else { return nil }
    return links.flatMap { ($0["addr_info"] as? [[String: Any]]) ?? [] }.compactMap { a in
        guard let local = a["local"] as? String, let len = a["prefixlen"] as? Int else { return nil }
        return "\(local)/\(len)"
    }
}

/// The `addrs=` field of a probe line.
func reportedAddresses(_ line: String?) -> [String]? {
    guard let field = line?.split(separator: " ").first(where: { $0.hasPrefix("addrs=") }) else { return nil }
    return field.dropFirst(6).split(separator: ",").map(String.init)
}

extension SystemdTests {
    /// A connectivity subscription says what it wants to be woken for (the
    /// online verdict, the overall state, the full detail), on a real loop in a
    /// fresh network namespace, and changes it in place.
    @Suite struct ConnectivityGranularity {
        @Test func onlineOnlySubscriptionWakesForTheVerdictAloneAndRetunesInPlace() throws {
            let p = try NetnsProbe(["--backend", "kernel", "--include", "veth0", "--granularity", "online,full"])
            #expect(p.next() == line("off"))   // the first event is the initial state
            p.inside("ip link add veth0 type veth peer name veth1")
            p.inside("ip link set veth0 addrgenmode none")
            p.inside("ip link set veth0 up")
            p.inside("ip link set veth1 up")
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            // off -> no-carrier -> carrier -> routable, still offline: no wake-up.
            p.expectQuiet()
            p.inside("ip route add default via 10.0.0.2")
            #expect(p.next() == line("routable", online: true, route: true, "veth0:routable:1", "10.0.0.1/24"))
            // An address change that leaves the verdict as it is: no wake-up.
            p.inside("ip addr add 10.0.0.5/24 dev veth0")
            p.expectQuiet()
            // The verdict changes: a wake-up, with the whole current state.
            p.inside("ip route del default")
            let offline = p.next()
            #expect(offline == line("routable", "veth0:routable:2", "10.0.0.1/24,10.0.0.5/24"))
            #expect(reportedAddresses(offline).map(Set.init) == kernelAddresses(p, "veth0").map(Set.init))
            p.inside("ip route add default via 10.0.0.2")
            #expect(p.next() == line("routable", online: true, route: true, "veth0:routable:2", "10.0.0.1/24,10.0.0.5/24"))
            p.inside("ip addr add 10.0.0.6/24 dev veth0")
            p.expectQuiet()

            // Retune to full detail: what was held back is reported at once...
            p.child.signal(SIGUSR1)
            #expect(p.next() == "granularity full")
            let full = p.next()
            #expect(full == line("routable", online: true, route: true, "veth0:routable:3", "10.0.0.1/24,10.0.0.5/24,10.0.0.6/24"))
            #expect(reportedAddresses(full).map(Set.init) == kernelAddresses(p, "veth0").map(Set.init))
            // ...by the same activation: a retune, no stop, no restart
            // (three starts: the connectivity watch and two signals).
            p.child.signal(SIGUSR2)
            #expect(p.next() == "stats starts=3 stops=0 retunes=1 restarts=0")
            // And now an address change alone wakes it.
            p.inside("ip addr del 10.0.0.6/24 dev veth0")
            #expect(p.next() == line("routable", online: true, route: true, "veth0:routable:2", "10.0.0.1/24,10.0.0.5/24"))
            p.expectQuiet()
        }

        @Test func overallSubscriptionWakesForStatesAndRoutesNotAddresses() throws {
            let p = try NetnsProbe(["--backend", "kernel", "--include", "veth0", "--granularity", "overall,online"])
            #expect(p.next() == line("off"))
            p.inside("ip link add veth0 type veth peer name veth1")
            p.inside("ip link set veth0 addrgenmode none")
            // A new interface, still off: the overall state is unchanged.
            p.expectQuiet()
            p.inside("ip link set veth0 up")
            #expect(p.next() == line("no-carrier", "veth0:no-carrier:0"))
            p.inside("ip link set veth1 up")
            #expect(p.next() == line("carrier", "veth0:carrier:0"))
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            #expect(p.next() == line("routable", "veth0:routable:1", "10.0.0.1/24"))
            p.inside("ip addr add 10.0.0.5/24 dev veth0")
            p.expectQuiet()
            p.inside("ip route add default via 10.0.0.2")
            #expect(p.next() == line("routable", online: true, route: true, "veth0:routable:2", "10.0.0.1/24,10.0.0.5/24"))
            // Retune to the coarser online-only: nothing to report.
            p.child.signal(SIGUSR1)
            #expect(p.next() == "granularity online")
            p.expectQuiet()
            // Carrier loss: not routable, so offline: one wake-up.
            p.inside("ip link set veth1 down")
            let down = p.next()
            #expect(down?.hasPrefix("state=no-carrier online=false") == true, "\(down ?? "none")")
            p.child.signal(SIGUSR2)
            #expect(p.next() == "stats starts=3 stops=0 retunes=1 restarts=0")
        }
    }
}
