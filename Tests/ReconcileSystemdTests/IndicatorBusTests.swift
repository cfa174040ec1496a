import Foundation
import Testing

extension SystemdTests {
    /// `connectivity-indicator --bus`: the built binary in a network
    /// namespace serves its state on a private dbus-daemon; clients no one
    /// here wrote (gdbus monitor, busctl, python3-dbus) read it.
    @Suite struct IndicatorBus {
        let indicator = builtExecutable("connectivity-indicator")
        let name = "org.reconcile.Connectivity1"
        let path = "/org/reconcile/Connectivity1"

        struct Line: Decodable, Equatable { let state: String; let online: Bool }

        @Test func aVethChangeReachesAGdbusMonitorWithin100msOfTheIndicatorsOwnReportAndSIGTERMReleasesTheName() throws {
            let bus = try PrivateBus(openToEveryUser: true)
            let child = try Child("/usr/bin/unshare", ["-n", indicator, "--format", "json", "--backend", "kernel", "--include", "veth0",
                                                       "--bus", bus.address])
            defer { child.signal(SIGKILL); _ = child.wait() }
            func inside(_ c: String) { sh(nsenter(child.pid, "-n", c)) }
            func report() -> Line? { child.line().flatMap { try? JSONDecoder().decode(Line.self, from: Data($0.utf8)) } }
            #expect(report() == Line(state: "off", online: false))
            // The name is ours once the bus says so (bounded).
            let deadline = ContinuousClock.now + .seconds(10)
            while capture("busctl --address=\(bus.address) status \(name)") == nil, ContinuousClock.now < deadline { usleep(10_000) }
            #expect(capture("busctl --address=\(bus.address) get-property \(name) \(path) \(name) State") == "s \"off\"\n")

            let monitor = try Child("/usr/bin/gdbus", ["monitor", "--address", bus.address, "--dest", name, "--object-path", path])
            defer { monitor.signal(SIGKILL); _ = monitor.wait() }
            // Its match is in place once it has the owner (asked after the match).
            #expect(monitor.line(matching: { $0.contains("is owned by") }) != nil)

            func step(_ command: String, expect state: String, online: Bool, signal: String, sourceLocation: SourceLocation = #_sourceLocation) {
                inside(command)
                #expect(report() == Line(state: state, online: online), sourceLocation: sourceLocation)
                let reported = ContinuousClock.now
                let seen = monitor.line(matching: { $0.contains("PropertiesChanged") }, timeout: .seconds(2))
                let delay = ContinuousClock.now - reported
                #expect(seen?.contains(signal) == true, "\(seen ?? "no signal")", sourceLocation: sourceLocation)
                #expect(delay < .milliseconds(100), "\(delay)", sourceLocation: sourceLocation)
            }
            inside("ip link add veth0 type veth peer name veth1")
            inside("ip link set veth0 addrgenmode none")
            #expect(report() == Line(state: "off", online: false))
            #expect(monitor.line(matching: { $0.contains("PropertiesChanged") })?.contains("'Interfaces': <[('veth0', 'off', @as [])]>") == true)
            step("ip link set veth0 up", expect: "no-carrier", online: false, signal: "'State': <'no-carrier'>")
            step("ip link set veth1 up", expect: "carrier", online: false, signal: "'State': <'carrier'>")
            step("ip addr add 10.0.0.1/24 dev veth0", expect: "routable", online: false, signal: "'State': <'routable'>")
            step("ip route add default via 10.0.0.2", expect: "routable", online: true, signal: "'Online': <true>")

            // python3-dbus reads the array of structs; gdbus calls Refresh.
            let props = capture("/usr/bin/python3 \(repositoryScript("bus-client.py")) props \(bus.address) \(name) \(path) \(name)")
            let json = props.flatMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: [String: Any]] }?[name]
            #expect(json?["State"] as? String == "routable")
            #expect(json?["Online"] as? Bool == true)
            let interfaces = json?["Interfaces"] as? [[Any]]
            #expect(interfaces?.count == 1)
            #expect(interfaces?.first?[0] as? String == "veth0")
            #expect(interfaces?.first?[2] as? [String] == ["10.0.0.1/24"])
            #expect(capture("gdbus call --address \(bus.address) --dest \(name) --object-path \(path) --method \(name).Refresh") == "('routable',)\n")

            // SIGTERM: the daemon stops, the name is gone from the bus.
            child.signal(SIGTERM)
            #expect(child.wait() == 0)
            let names = capture("busctl --address=\(bus.address) call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus ListNames")
            #expect(names != nil && names?.contains(name) == false, "\(names ?? "")")
        }
    }
}

extension SystemdTests.IndicatorBus {
    /// The shipped system-bus policy, on a dbus-daemon configured as
    /// Debian's system bus (deny by default): root's indicator owns the
    /// name; nobody reads, watches and refreshes, and may neither write nor
    /// take the name.
    @Test func theShippedSystemBusPolicyLetsRootOwnAndAnyoneReadAndRefresh() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        chmod(dir, 0o755)
        let policy = FileManager.default.currentDirectoryPath + "/Examples/connectivity-indicator/dbus-1/system.d/org.reconcile.Connectivity1.conf"
        try writeFile(dir + "/system.conf", """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>system</type>
              <listen>unix:path=\(dir)/bus</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow user="*"/>
                <deny own="*"/>
                <deny send_type="method_call"/>
                <allow send_type="signal"/>
                <allow send_requested_reply="true" send_type="method_return"/>
                <allow send_requested_reply="true" send_type="error"/>
                <allow receive_type="method_call"/>
                <allow receive_type="method_return"/>
                <allow receive_type="error"/>
                <allow receive_type="signal"/>
                <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
                <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
                <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
              </policy>
              <include>\(policy)</include>
            </busconfig>
            """)
        #expect(sh("dbus-daemon --config-file=\(dir)/system.conf --fork --nopidfile --print-pid=3 3>\(dir)/pid </dev/null >/dev/null 2>&1"))
        let daemonPid = pid_t((try? String(contentsOfFile: dir + "/pid", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 0
        defer { if daemonPid > 0 { kill(daemonPid, SIGKILL); waitGone(daemonPid) } }
        try #require(daemonPid > 0)
        chmod(dir + "/bus", 0o777)
        let address = "unix:path=\(dir)/bus"
        let child = try Child(indicator, ["--format", "json", "--backend", "kernel", "--include", "nothing0", "--bus", address])
        defer { child.signal(SIGKILL); _ = child.wait() }
        #expect(child.line() != nil)
        let deadline = ContinuousClock.now + .seconds(10)
        while capture("busctl --address=\(address) status \(name)") == nil, ContinuousClock.now < deadline { usleep(10_000) }

        let nobody = "setpriv --reuid nobody --regid nogroup --clear-groups"
        #expect(capture("\(nobody) busctl --address=\(address) get-property \(name) \(path) \(name) Online") == "b false\n")
        #expect(capture("\(nobody) gdbus call --address \(address) --dest \(name) --object-path \(path) --method \(name).Refresh") == "('off',)\n")
        #expect(capture("\(nobody) busctl --address=\(address) introspect \(name) \(path)")?.contains(".Refresh") == true)
        // Set is not allowed by the policy (the daemon refuses it, the service never sees it).
        #expect(capture("\(nobody) busctl --address=\(address) set-property \(name) \(path) \(name) State s x") == nil)
        let own = capture("\(nobody) /usr/bin/python3 \(repositoryScript("bus-client.py")) own \(address) \(name) 0; true")
        #expect(own == "error org.freedesktop.DBus.Error.AccessDenied\n", "\(own ?? "")")
        // Still ours.
        #expect(capture("busctl --address=\(address) get-property \(name) \(path) \(name) State") == "s \"off\"\n")
    }
}
