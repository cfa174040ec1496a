import Foundation
import Testing

/// The built `connectivity-indicator`, end to end, in private network namespaces.
extension SystemdTests {
    @Suite struct IndicatorProcess {
        let indicator = builtExecutable("connectivity-indicator")

        struct Line: Decodable, Equatable { let state: String; let online: Bool }

        func decode(_ line: String?) -> Line? {
            line.flatMap { try? JSONDecoder().decode(Line.self, from: Data($0.utf8)) }
        }

        /// The shipped binary replays (`--replay`) without the test kit: it
        /// links no Swift Testing library, dynamically or statically.
        @Test func theShippedIndicatorLinksNoSwiftTesting() throws {
            let needed = try #require(capture("ldd '\(indicator)'"))
            #expect(needed.contains("libswiftCore"))
            #expect(!needed.contains("libTesting") && !needed.contains("TestingInterop"))
            let symbols = try #require(capture("nm '\(indicator)'"))
            #expect(symbols.contains("replaySession"))
            // Swift Testing's mangled module prefix.
            #expect(!symbols.contains("s7Testing"))
        }

        @Test func jsonGivesExactlyOneLinePerScriptedChange() throws {
            let child = try Child("/usr/bin/unshare", ["-n", indicator, "--format", "json", "--backend", "kernel", "--include", "veth0"])
            defer { child.signal(SIGTERM); _ = child.wait() }
            func inside(_ c: String) { sh(nsenter(child.pid, "-n", c)) }
            #expect(decode(child.line()) == Line(state: "off", online: false))
            inside("ip link add veth0 type veth peer name veth1")
            inside("ip link set veth0 addrgenmode none")
            #expect(decode(child.line()) == Line(state: "off", online: false))
            inside("ip link set veth0 up")
            #expect(decode(child.line()) == Line(state: "no-carrier", online: false))
            inside("ip link set veth1 up")
            #expect(decode(child.line()) == Line(state: "carrier", online: false))
            inside("ip addr add 10.0.0.1/24 dev veth0")
            #expect(decode(child.line()) == Line(state: "routable", online: false))
            inside("ip route add default via 10.0.0.2")
            #expect(decode(child.line()) == Line(state: "routable", online: true))
            inside("ip addr del 10.0.0.1/24 dev veth0")
            #expect(decode(child.line()) == Line(state: "carrier", online: false))
            #expect(child.line(timeout: .milliseconds(300)) == nil)
        }

        @Test func onceExitsZeroWhenOnlineAndOneWhenNot() throws {
            let offline = try Child("/usr/bin/unshare", ["-n", indicator, "--once", "--backend", "kernel"])
            #expect(offline.line() == "offline (off)")
            #expect(offline.wait() == 1)
            let online = try Child("/usr/bin/unshare", ["-n", "/bin/sh", "-c", """
                ip link add veth0 type veth peer name veth1 && ip link set veth0 up && ip link set veth1 up &&
                ip addr add 10.0.0.1/24 dev veth0 && ip route add default via 10.0.0.2 && exec "$0" --once --backend kernel
                """, indicator])
            #expect(online.line() == "online via veth0")
            #expect(online.wait() == 0)
        }

        /// The verdict is given under the config file's settings: the
        /// connectivity source waits for the file's first read (which runs
        /// off the loop thread). Here the file excludes the only routable
        /// link, so the answer is offline, where the command line alone
        /// would say online.
        @Test func onceWithAConfigFileGivesTheVerdictUnderItsSettings() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let config = dir + "/indicator.conf"
            try writeFile(config, "backend = kernel\nexclude = veth0\n")
            for _ in 0..<3 {
                let child = try Child("/usr/bin/unshare", ["-n", "/bin/sh", "-c", """
                    ip link add veth0 type veth peer name veth1 && ip link set veth0 up && ip link set veth1 up &&
                    ip addr add 10.0.0.1/24 dev veth0 && ip route add default via 10.0.0.2 && exec "$0" --once --config "$1"
                    """, indicator, config])
                let line = child.line()
                #expect(line?.hasPrefix("offline") == true, "\(line ?? "no line")")
                #expect(child.wait() == 1)
            }
        }

        @Test func invalidOptionIsOneLineOnStderrAndExitTwo() throws {
            let child = try Child(indicator, ["--format", "xml"])
            #expect(child.errorLine(matching: { _ in true }) == "connectivity-indicator: bad value 'xml' for --format (accepted: text, json, waybar)")
            #expect(child.wait() == 2)
            #expect(child.line(timeout: .milliseconds(100)) == nil)
            let unknown = try Child(indicator, ["--colour"])
            #expect(unknown.errorLine(matching: { _ in true })?.hasPrefix("connectivity-indicator: unknown option '--colour'") == true)
            #expect(unknown.wait() == 2)
        }

        @Test func invalidConfigKeepsTheOldOne() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let config = dir + "/indicator.conf"
            try writeFile(config, "backend = kernel\ninclude = veth0\n")
            let child = try Child("/usr/bin/unshare", ["-n", indicator, "--format", "json", "--config", config])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(decode(child.line()) == Line(state: "off", online: false))
            #expect(child.errorLine(matching: { $0.contains("applied") }) != nil)
            try writeFile(config, "backend = kernel\ninclude = veth0\nsettle = soon\n")
            #expect(child.errorLine(matching: { $0.contains("line 3") })?.contains("bad settle 'soon'") == true)
            // Still the old configuration: veth0 is reported, veth1 is not.
            sh(nsenter(child.pid, "-n", "ip link add veth0 type veth peer name veth1"))
            let line = child.line(matching: { $0.contains("veth") })
            #expect(line?.contains("\"veth0\"") == true && line?.contains("veth1") == false)
        }
    }
}
