import Foundation
import Testing

/// The built indicator following a stand-in logind (python3-dbus) on a
/// private bus given as its system bus, in a private network namespace.
extension SystemdTests {
    @Suite struct IndicatorSleep {
        let indicator = builtExecutable("connectivity-indicator")
        struct Line: Decodable, Equatable { let state: String; let online: Bool }
        func decode(_ line: String?) -> Line? {
            line.flatMap { try? JSONDecoder().decode(Line.self, from: Data($0.utf8)) }
        }

        /// The bus daemon's count of match rules, all connections (Debug.Stats).
        func matchRules(_ bus: PrivateBus) -> Int? {
            guard let text = capture("busctl --address=\(bus.address) call org.freedesktop.DBus /org/freedesktop/DBus "
                                     + "org.freedesktop.DBus.Debug.Stats GetStats") else { return nil }
            let words = text.split(separator: " ")
            guard let i = words.firstIndex(of: "\"MatchRules\""), i + 2 < words.count else { return nil }
            return Int(words[i + 2])
        }

        @Test func silentWhileLogindSaysTheMachineSleepsThenOneFreshReportAndNoSignalFromAnotherSender() throws {
            let bus = try PrivateBus()
            let logind = try Standin(bus, name: "org.freedesktop.login1")
            let rules = try #require(matchRules(bus))
            let child = try Child("/usr/bin/unshare", ["-n", indicator, "--format", "json", "--backend", "kernel", "--include", "veth0"],
                                  environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
            defer { child.signal(SIGTERM); _ = child.wait() }
            func inside(_ c: String) { sh(nsenter(child.pid, "-n", c)) }
            #expect(decode(child.line()) == Line(state: "off", online: false))
            // The indicator's match is in place (bounded wait on the bus's own count).
            let deadline = ContinuousClock.now + .seconds(10)
            while (matchRules(bus) ?? 0) <= rules, ContinuousClock.now < deadline { usleep(10_000) }
            #expect((matchRules(bus) ?? 0) > rules)

            // The same signal from a connection that does not own logind's name: ignored.
            #expect(run("gdbus emit --address \(bus.address) --object-path /org/freedesktop/login1 "
                        + "--signal org.freedesktop.login1.Manager.PrepareForSleep true"))
            inside("ip link add veth0 type veth peer name veth1")
            inside("ip link set veth0 addrgenmode none")
            #expect(decode(child.line()) == Line(state: "off", online: false))

            // From logind's owner: paused (said once, on stderr). Sent again
            // until seen, in case the indicator had not yet learnt the owner
            // (a repeated PrepareForSleep(true) changes nothing).
            var paused: String?
            for _ in 0..<10 where paused == nil {
                logind.command("sleep true")
                paused = child.errorLine(matching: { $0.contains("preparing for sleep") }, timeout: .seconds(1))
            }
            #expect(paused != nil)
            inside("ip link set veth0 up")
            inside("ip link set veth1 up")
            // Nothing printed while the machine sleeps.
            #expect(child.line(timeout: .milliseconds(300)) == nil)

            // Resumed: one fresh report of the state now.
            logind.command("sleep false")
            #expect(decode(child.line()) == Line(state: "carrier", online: false))
            #expect(child.errorLine(matching: { $0.contains("resumed") }) != nil)
            #expect(child.line(timeout: .milliseconds(300)) == nil)
            // And live again.
            inside("ip addr add 10.0.0.1/24 dev veth0")
            #expect(decode(child.line()) == Line(state: "routable", online: false))
        }

        @Test func logindOnWithoutASystemBusSaysSoOnceAndRunsAsBefore() throws {
            let child = try Child("/usr/bin/unshare", ["-n", indicator, "--format", "json", "--backend", "kernel", "--logind", "on"])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(decode(child.line()) == Line(state: "off", online: false))
            #expect(child.errorLine(matching: { $0.contains("system bus") }) != nil)
            #expect(child.errorLine(matching: { _ in true }, timeout: .milliseconds(500)) == nil)
        }

        @Test func withoutASystemBusTheIndicatorRunsAsBeforeAndSaysNothingAboutIt() throws {
            let child = try Child("/usr/bin/unshare", ["-n", indicator, "--format", "json", "--backend", "kernel", "--include", "veth0"])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(decode(child.line()) == Line(state: "off", online: false))
            sh(nsenter(child.pid, "-n", "ip link add veth0 type veth peer name veth1"))
            #expect(decode(child.line()) == Line(state: "off", online: false))
            #expect(child.errorLine(matching: { _ in true }, timeout: .milliseconds(500)) == nil)
        }
    }
}
