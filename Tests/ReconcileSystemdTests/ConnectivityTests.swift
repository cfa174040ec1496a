import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// Runs a shell command to completion (posix_spawn + waitpid: a background
/// grandchild keeping descriptors open does not hold us); records an issue if
/// it fails.
@discardableResult
func sh(_ command: String, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
    var pid: pid_t = 0
    let argv: [UnsafeMutablePointer<CChar>?] = ["/bin/sh", "-c", command].map { (s: String) in strdup(s) } + [nil]
    defer { argv.forEach { free($0) } }
    guard posix_spawn(&pid, "/bin/sh", nil, nil, argv, environ) == 0 else {
        Issue.record("cannot run \(command)", sourceLocation: sourceLocation)
        return false
    }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let code = (status >> 8) & 0xff
    if status & 0x7f != 0 || code != 0 { Issue.record("`\(command)` failed (status \(status))", sourceLocation: sourceLocation) }
    return status == 0
}

/// The probe following connectivity in a fresh network namespace.
final class NetnsProbe {
    let child: Child
    init(_ arguments: [String]) throws {
        child = try Child("/usr/bin/unshare", ["-n", builtExecutable("reconcile-probe"), "connectivity"] + arguments)
    }
    /// `ip ...` (or any command) inside the probe's namespace.
    @discardableResult
    func inside(_ command: String, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        sh(nsenter(child.pid, "-n", command), sourceLocation: sourceLocation)
    }
    /// The next state or failure line (log lines skipped).
    func next(timeout: Duration = .seconds(10)) -> String? {
        child.line(matching: { !$0.hasPrefix("log:") && $0 != "running" }, timeout: timeout)
    }
    /// A log line containing `text`.
    func log(containing text: String, timeout: Duration = .seconds(10)) -> String? {
        child.line(matching: { $0.hasPrefix("log:") && $0.contains(text) }, timeout: timeout)
    }
    /// Expects no further state line for a while.
    func expectQuiet(for duration: Duration = .milliseconds(300), sourceLocation: SourceLocation = #_sourceLocation) {
        if let extra = next(timeout: duration) { Issue.record("unexpected: \(extra)", sourceLocation: sourceLocation) }
    }
    deinit {
        child.signal(SIGTERM)
        _ = child.wait()
    }
}

func line(_ state: String, online: Bool = false, route: Bool = false, _ ifaces: String = "", _ addrs: String = "") -> String {
    "state=\(state) online=\(online) default=\(route) backend=kernel ifaces=\(ifaces) addrs=\(addrs)"
}

extension SystemdTests {
    @Suite struct Connectivity {
        @Test func kernelBackendReportsEachTransitionOnceInOrder() throws {
            let p = try NetnsProbe(["--backend", "kernel", "--include", "veth0"])
            #expect(p.next() == line("off"))
            p.inside("ip link add veth0 type veth peer name veth1")
            p.inside("ip link set veth0 addrgenmode none")
            #expect(p.next() == line("off", "veth0:off:0"))
            p.inside("ip link set veth0 up")
            #expect(p.next() == line("no-carrier", "veth0:no-carrier:0"))
            p.inside("ip link set veth1 up")
            #expect(p.next() == line("carrier", "veth0:carrier:0"))
            p.inside("ip addr add 10.0.0.1/24 dev veth0")
            #expect(p.next() == line("routable", "veth0:routable:1", "10.0.0.1/24"))
            p.inside("ip route add default via 10.0.0.2")
            #expect(p.next() == line("routable", online: true, route: true, "veth0:routable:1", "10.0.0.1/24"))
            p.inside("ip addr add 2001:db8::1/64 dev veth0 nodad")
            #expect(p.next() == line("routable", online: true, route: true, "veth0:routable:2", "10.0.0.1/24,2001:db8::1/64"))
            p.inside("ip route del default")
            #expect(p.next() == line("routable", "veth0:routable:2", "10.0.0.1/24,2001:db8::1/64"))
            p.inside("ip addr del 10.0.0.1/24 dev veth0")
            #expect(p.next() == line("routable", "veth0:routable:1", "2001:db8::1/64"))
            p.inside("ip addr del 2001:db8::1/64 dev veth0")
            #expect(p.next() == line("carrier", "veth0:carrier:0"))
            p.inside("ip addr add fe80::1/64 dev veth0 nodad")
            #expect(p.next() == line("degraded", "veth0:degraded:1", "fe80::1/64"))
            p.inside("ip addr del fe80::1/64 dev veth0")
            #expect(p.next() == line("carrier", "veth0:carrier:0"))
            // Carrier loss: the peer goes down.
            p.inside("ip link set veth1 down")
            #expect(p.next() == line("no-carrier", "veth0:no-carrier:0"))
            p.inside("ip link set veth0 down")
            #expect(p.next() == line("off", "veth0:off:0"))
            // The interface disappears.
            p.inside("ip link del veth0")
            #expect(p.next() == line("off"))
            p.expectQuiet()
        }

        @Test func enslavedLinkIsReported() throws {
            let p = try NetnsProbe(["--backend", "kernel", "--include", "veth0"])
            #expect(p.next() == line("off"))
            p.inside("ip link add veth0 type veth peer name veth1")
            p.inside("ip link set veth0 addrgenmode none")
            #expect(p.next() == line("off", "veth0:off:0"))
            p.inside("ip link add br0 type bridge")
            p.inside("ip link set veth0 master br0")
            p.inside("ip link set veth1 up")
            p.inside("ip link set veth0 up")
            #expect(p.child.line(matching: { $0.contains("veth0:enslaved") }, timeout: .seconds(10)) == line("enslaved", "veth0:enslaved:0"))
        }

        @Test func includeAndExcludeFiltersChooseTheInterfaces() throws {
            let p = try NetnsProbe(["--backend", "kernel", "--include", "veth*", "--exclude", "veth1"])
            #expect(p.next() == line("off"))
            p.inside("ip link add veth0 type veth peer name veth1")
            p.inside("ip link add other0 type veth peer name other1")
            #expect(p.next() == line("off", "veth0:off:0"))
            p.inside("ip link set veth1 up")
            p.inside("ip link set other0 up")
            p.expectQuiet()
        }

        @Test func overrunResyncsToTheTrueFinalState() throws {
            let p = try NetnsProbe(["--backend", "kernel", "--include", "veth0", "--rcvbuf", "4096"])
            #expect(p.next() == line("off"))
            p.inside("ip link add veth0 type veth peer name veth1")
            p.inside("ip link set veth0 addrgenmode none")
            #expect(p.next() == line("off", "veth0:off:0"))
            let batch = (0..<600).map { "address add 10.9.\($0 / 250).\($0 % 250 + 1)/32 dev veth0" }.joined(separator: "\n")
            let file = NSTemporaryDirectory() + "reconcile-flood-\(getpid())"
            try batch.write(toFile: file, atomically: true, encoding: .utf8)
            defer { unlink(file) }
            p.inside("ip -batch \(file)")
            #expect(p.log(containing: "overrun") != nil)
            // The last report shows all 600 addresses, however many events were lost.
            let final = p.child.line(matching: { $0.contains("veth0:off:600") }, timeout: .seconds(20))
            #expect(final != nil)
        }

        @Test func forgedNetlinkMessageChangesNothing() throws {
            let p = try NetnsProbe(["--backend", "kernel"])
            let port = try #require(p.log(containing: "netlink socket port")?.split(separator: " ").last)
            #expect(p.next() == line("off"))
            p.inside("\(builtExecutable("reconcile-probe")) forge \(port)")
            #expect(p.log(containing: "dropped a netlink message") != nil)
            p.expectQuiet()
        }

        @Test func settleReportsOnlyAStateThatHeld() throws {
            let p = try NetnsProbe(["--backend", "kernel", "--include", "veth0", "--settle", "300"])
            #expect(p.next() == line("off"))
            p.inside("ip link add veth0 type veth peer name veth1")
            p.inside("ip link set veth0 addrgenmode none")
            let start = ContinuousClock.now
            // A flap: up and down again within the settle time.
            p.inside("sh -c 'ip link set veth0 up && ip link set veth0 down'")
            #expect(p.next() == line("off", "veth0:off:0"))
            #expect(ContinuousClock.now - start >= .milliseconds(250))
            p.expectQuiet(for: .milliseconds(500))
        }
    }
}

/// The repository's scripts directory (tests run from the package root).
func repositoryScript(_ name: String) -> String {
    FileManager.default.currentDirectoryPath + "/scripts/" + name
}

extension SystemdTests {
    /// A real systemd-networkd on a private dbus-daemon, in private network
    /// and mount namespaces (the recipe in SYSTEMD-NOTES, as a script).
    @Suite struct Networkd {
        @Test func followsNetworkdThroughRestartsAndIgnoresForgeries() throws {
            let sandbox = repositoryScript("networkd-sandbox.sh")
            let child = try Child("/usr/bin/unshare", ["-n", "-m", "--propagation", "private", sandbox,
                                                       builtExecutable("reconcile-probe"), "connectivity", "--backend", "networkd"])
            defer {
                sh(nsenter(child.pid, "-n -m", "\(sandbox) --cleanup"))
                child.signal(SIGTERM)
                _ = child.wait()
            }
            func inside(_ command: String, sourceLocation: SourceLocation = #_sourceLocation) {
                sh(nsenter(child.pid, "-n -m", command), sourceLocation: sourceLocation)
            }
            func next(_ match: (String) -> Bool) -> String? {
                child.line(matching: { !$0.hasPrefix("log:") && $0 != "running" && match($0) }, timeout: .seconds(20))
            }
            // No networkd on the bus: a failure event.
            #expect(next { _ in true }?.hasPrefix("failed systemd-networkd is not running") == true)
            // networkd manages veth0 and requires it for online.
            inside("sh -c 'printf \"[Match]\\nName=veth0\\n[Link]\\nRequiredForOnline=routable\\n[Network]\\nAddress=192.168.77.1/24\\nLinkLocalAddressing=no\\n\" > /run/systemd/network/50-veth0.network'")
            inside("ip link add veth0 type veth peer name veth1")
            inside("\(sandbox) --start-networkd")
            // Recovery: the state arrives; veth0 has no carrier (its peer is
            // down), so networkd says offline.
            let first = next { $0.hasPrefix("state=") }
            #expect(first?.contains("online=false") == true, "first: \(first ?? "none")")
            // The peer comes up: networkd configures veth0, OnlineState goes online.
            inside("ip link set veth1 up")
            let online = next { $0.contains("state=routable online=true") }
            // networkd's verdict, with the kernel's per-interface detail.
            #expect(online?.contains("veth0:routable:1") == true && online?.contains("192.168.77.1/24") == true,
                    "\(online ?? "none")")
            // A PropertiesChanged from another connection is ignored.
            inside("\(sandbox) --busctl emit /org/freedesktop/network1 org.freedesktop.DBus.Properties PropertiesChanged sa{sv}as org.freedesktop.network1.Manager 1 OperationalState s off 0")
            #expect(child.line(matching: { $0.contains("ignored PropertiesChanged") }, timeout: .seconds(10)) != nil)
            #expect(child.line(matching: { $0.hasPrefix("state=") }, timeout: .milliseconds(300)) == nil)
            // networkd restarts: a failure while it is gone, then the state again.
            inside("\(sandbox) --stop-networkd")
            #expect(next { $0.hasPrefix("failed") }?.hasPrefix("failed systemd-networkd is not running") == true)
            inside("\(sandbox) --start-networkd")
            #expect(next { $0.contains("state=routable online=true") }?.contains("backend=networkd") == true)
        }

        @Test func autoChoosesNetworkdWhenItOwnsItsName() throws {
            let sandbox = repositoryScript("networkd-sandbox.sh")
            // Start networkd first, then the probe with --backend auto.
            let child = try Child("/usr/bin/unshare", ["-n", "-m", "--propagation", "private", "/bin/sh", "-c",
                "exec \"$0\" sh -c '\"$0\" --start-networkd && \"$0\" --wait-networkd && exec \"$1\" connectivity --backend auto' \"$0\" \"$1\"",
                sandbox, builtExecutable("reconcile-probe")])
            defer { child.signal(SIGTERM); _ = child.wait() }
            defer { sh(nsenter(child.pid, "-n -m", "\(sandbox) --cleanup")) }
            #expect(child.line(matching: { $0.contains("auto chose") }, timeout: .seconds(20))?.contains("networkd") == true)
            #expect(child.line(matching: { $0.hasPrefix("state=") }, timeout: .seconds(20))?.contains("backend=networkd") == true)
        }

        @Test func autoFallsBackToTheKernelWithoutNetworkd() throws {
            let child = try Child("/usr/bin/unshare", ["-n", builtExecutable("reconcile-probe"), "connectivity", "--backend", "auto"],
                                  environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/bus"])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(child.line(matching: { $0.hasPrefix("state=") }, timeout: .seconds(10))?.contains("backend=kernel") == true)
        }
    }
}
