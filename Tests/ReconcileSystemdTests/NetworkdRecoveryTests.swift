import Foundation
import Reconcile
@testable import ReconcileSystemd
import TestSupport
import Testing

/// A command's standard output (nil if it fails), for ground truth.
func output(_ command: String) -> String? {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/bin/sh")
    p.arguments = ["-c", command]
    let pipe = Pipe()
    p.standardOutput = pipe
    p.standardError = FileHandle.nullDevice
    do { try p.run() } catch { return nil }
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return p.terminationStatus == 0 ? String(decoding: data, as: UTF8.self) : nil
}

/// The probe following networkd (`--backend networkd`) in a sandbox: private
/// network and mount namespaces, a private dbus-daemon, networkd on demand.
final class NetworkdSandbox {
    let sandbox = repositoryScript("networkd-sandbox.sh")
    let child: Child

    init(_ probeArguments: [String] = []) throws {
        child = try Child("/usr/bin/unshare", ["-n", "-m", "--propagation", "private", sandbox,
                                               builtExecutable("reconcile-probe"), "connectivity", "--backend", "networkd"] + probeArguments)
    }

    /// A command in the sandbox's namespaces; records an issue if it fails.
    @discardableResult
    func inside(_ command: String, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        sh(nsenter(child.pid, "-n -m", command), sourceLocation: sourceLocation)
    }

    /// The sandbox script's command `arguments` (`--kill-bus`, ...).
    @discardableResult
    func script(_ arguments: String, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        inside("\(sandbox) \(arguments)", sourceLocation: sourceLocation)
    }

    /// The next state or failure line satisfying `match` (log lines skipped).
    func next(timeout: Duration = .seconds(20), _ match: (String) -> Bool = { _ in true }) -> String? {
        child.line(matching: { !$0.hasPrefix("log:") && $0 != "running" && match($0) }, timeout: timeout)
    }

    /// networkd's own OperationalState and OnlineState, asked on the private bus.
    func networkdSays() -> (state: String, online: Bool)? {
        guard let text = output(nsenter(child.pid, "-n -m", "\(sandbox) --busctl get-property org.freedesktop.network1 "
                                + "/org/freedesktop/network1 org.freedesktop.network1.Manager OperationalState OnlineState")) else { return nil }
        let values = text.split(separator: "\n").map { $0.split(separator: "\"").dropFirst().first.map(String.init) ?? "" }
        guard values.count == 2 else { return nil }
        return (values[0], values[1] == "online" || (values[1].isEmpty && values[0] == "routable"))
    }

    /// Expects the probe's `line` to be what networkd itself says (asked until
    /// it agrees, within 5 s: networkd may still be publishing its state).
    func expectAgreesWithNetworkd(_ line: String?, sourceLocation: SourceLocation = #_sourceLocation) {
        let deadline = ContinuousClock.now + .seconds(5)
        var said: (state: String, online: Bool)?
        repeat {
            said = networkdSays()
            if let said, let line, line.hasPrefix("state=\(said.state) online=\(said.online) ") { return }
            usleep(50_000)
        } while ContinuousClock.now < deadline
        Issue.record("probe: \(line ?? "none"); networkd: \(said.map { "\($0.state) online=\($0.online)" } ?? "no answer")",
                     sourceLocation: sourceLocation)
    }

    /// networkd manages veth0 (static address, required for online); veth1 is its peer.
    func configureVeth() {
        inside("sh -c 'printf \"[Match]\\nName=veth0\\n[Link]\\nRequiredForOnline=routable\\n[Network]\\nAddress=192.168.77.1/24\\nLinkLocalAddressing=no\\n\" > /run/systemd/network/50-veth0.network'")
        inside("ip link add veth0 type veth peer name veth1")
        inside("ip link set veth1 addrgenmode none")
    }

    private var cleanedUp = false

    /// Ends the sandbox's dbus-daemon and networkd (by their PIDs).
    func cleanup() {
        guard !cleanedUp else { return }
        cleanedUp = true
        sh(nsenter(child.pid, "-n -m", "\(sandbox) --cleanup"))
    }

    deinit {
        cleanup()
        child.signal(SIGTERM)
        _ = child.wait()
    }
}

extension SystemdTests {
    /// The networkd backend survives its bus and networkd going away: each loss
    /// is a failure event the program sees, and when they are back the state
    /// is read again (compared with networkd's own answer) and followed.
    @Suite struct NetworkdRecovery {
        @Test func busLossIsAFailureAndTheStateIsReadAgainWhenBusAndNetworkdReturn() throws {
            let s = try NetworkdSandbox(["--include", "veth0"])
            #expect(s.next()?.hasPrefix("failed systemd-networkd is not running") == true)
            s.configureVeth()
            s.script("--start-networkd")
            s.inside("ip link set veth1 up")
            s.expectAgreesWithNetworkd(s.next { $0.hasPrefix("state=routable online=true") })

            // The dbus-daemon dies (SIGKILL by PID): a failure event at once.
            let killed = ContinuousClock.now
            s.script("--kill-bus")
            let lost = s.next(timeout: .seconds(2)) { $0.hasPrefix("failed") }
            #expect(lost == "failed lost the connection to the system bus (Disconnected)")
            #expect(ContinuousClock.now - killed < .seconds(2))
            // It reconnects on a backoff that doubles: 100, 200, 400 ms (the
            // socket is left behind, so each connect is refused at once).
            var delays: [String] = []
            for attempt in 1...3 {
                let log = s.child.line(matching: { $0.contains("reconnecting to the system bus in") && $0.hasSuffix("(attempt \(attempt))") },
                                       timeout: .seconds(5))
                delays.append(log?.split(separator: " ").dropLast(3).last.map(String.init) ?? "none")
            }
            #expect(delays == ["100", "200", "400"])
            // While the bus is down, the world changes: veth0 loses its carrier.
            s.inside("ip link set veth1 down")
            // No state is made up without networkd's word.
            #expect(s.next(timeout: .milliseconds(500)) { $0.hasPrefix("state=") } == nil)

            // The bus comes back; networkd (which stays off a bus it lost) is restarted.
            s.script("--start-bus")
            #expect(s.next(timeout: .seconds(10))?.hasPrefix("failed systemd-networkd is not running") == true)
            s.script("--stop-networkd")
            s.script("--start-networkd")
            let reread = s.next { $0.hasPrefix("state=no-carrier") }
            #expect(reread?.contains("online=false") == true, "\(reread ?? "none")")
            s.expectAgreesWithNetworkd(reread)
            // Later changes arrive.
            s.inside("ip link set veth1 up")
            let later = s.next { $0.hasPrefix("state=routable online=true") }
            #expect(later?.contains("veth0:routable:1") == true, "\(later ?? "none")")
            s.expectAgreesWithNetworkd(later)
        }

        @Test func networkdKilledWhileTheBusLivesIsAFailureAndIsReadAgainOnReturn() throws {
            let s = try NetworkdSandbox(["--include", "veth0"])
            #expect(s.next()?.hasPrefix("failed systemd-networkd is not running") == true)
            s.configureVeth()
            s.script("--start-networkd")
            s.inside("ip link set veth1 up")
            s.expectAgreesWithNetworkd(s.next { $0.hasPrefix("state=routable online=true") })
            // SIGKILL: NameOwnerChanged says its name has no owner.
            let killed = ContinuousClock.now
            s.script("--kill-networkd")
            // A state line still in flight may come first; the failure within 2 s.
            #expect(s.next(timeout: .seconds(2)) { $0.hasPrefix("failed ") }?.hasPrefix("failed systemd-networkd is not running") == true)
            #expect(ContinuousClock.now - killed < .seconds(2))
            s.inside("ip link set veth1 down")
            s.script("--start-networkd")
            let reread = s.next { $0.hasPrefix("state=no-carrier") }
            #expect(reread?.contains("online=false") == true, "\(reread ?? "none")")
            s.expectAgreesWithNetworkd(reread)
            s.inside("ip link set veth1 up")
            s.expectAgreesWithNetworkd(s.next { $0.hasPrefix("state=routable online=true") })
        }

        @Test func aBusThatNeverAnswersIsAFailureAndDoesNotStallTheLoop() throws {
            let bus = try MuteBus()
            let child = try Child("/usr/bin/unshare", ["-n", builtExecutable("reconcile-probe"), "connectivity", "--backend", "networkd"],
                                  environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(child.line(matching: { $0 == "running" }, timeout: .seconds(10)) != nil)
            // The loop answers while the bus is silent.
            let asked = ContinuousClock.now
            child.signal(SIGUSR2)
            #expect(child.line(matching: { $0.hasPrefix("stats") }, timeout: .seconds(2)) != nil)
            #expect(ContinuousClock.now - asked < .seconds(1))
            // No answer within 5 s: a failure event, then a reconnect.
            let failed = child.line(matching: { $0.hasPrefix("failed") }, timeout: .seconds(10))
            #expect(failed == "failed the system bus did not answer within 5 s")
            #expect(ContinuousClock.now - asked < .seconds(7))
            #expect(child.line(matching: { $0.contains("reconnecting to the system bus in 100 ms") }, timeout: .seconds(2)) != nil)
        }

        @Test func autoWithABusThatNeverAnswersChoosesTheKernelWithoutBlockingTheLoop() throws {
            let bus = try MuteBus()
            let child = try Child("/usr/bin/unshare", ["-n", builtExecutable("reconcile-probe"), "connectivity", "--backend", "auto"],
                                  environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(child.line(matching: { $0 == "running" }, timeout: .seconds(10)) != nil)
            // The signal watches start in the same reconcile, after the
            // connectivity watch: a blocking start would delay the answer.
            let asked = ContinuousClock.now
            child.signal(SIGUSR2)
            #expect(child.line(matching: { $0.hasPrefix("stats") }, timeout: .seconds(2)) != nil)
            #expect(ContinuousClock.now - asked < .seconds(1))
            #expect(child.line(matching: { $0.contains("auto chose") }, timeout: .seconds(5))
                    == "log: connectivity: auto chose the kernel (the system bus did not answer within 2 s)")
            #expect(child.line(matching: { $0.hasPrefix("state=") }, timeout: .seconds(5))?.contains("backend=kernel") == true)
        }

        /// The program drops the watch from its failure event, which sd-bus
        /// delivers from inside a callback of the very connection being given
        /// up: the stop is clean (released on the next loop iteration).
        @Test(arguments: ["lost the connection", "networkd is not running"])
        func programDroppingTheWatchOnAFailureStopsItCleanly(_ reason: String) throws {
            let s = try NetworkdSandbox(["--drop-on", reason])
            let first = s.next()
            #expect(first?.hasPrefix("failed systemd-networkd is not running") == true)
            if !reason.contains("not running") {
                s.configureVeth()
                s.script("--start-networkd")
                #expect(s.next { $0.hasPrefix("state=") } != nil)
                s.script("--kill-bus")
                // networkd may still have been configuring the link: state
                // lines sent before the bus died may come first (seen under
                // ASan in CI), nothing else.
                #expect(s.next(timeout: .seconds(2)) { !$0.hasPrefix("state=") } == "failed lost the connection to the system bus (Disconnected)")
            }
            #expect(s.next(timeout: .seconds(2)) == "dropped the watch")
            s.child.signal(SIGUSR2)
            #expect(s.next(timeout: .seconds(2)) == "stats starts=3 stops=1 retunes=0 restarts=0")
            // The daemons go first: the namespaces are reached through the probe.
            s.cleanup()
            s.child.signal(SIGTERM)
            #expect(s.child.line(matching: { $0.hasPrefix("exit") }, timeout: .seconds(5)) == "exit 0 stops=3 starts=3 live=0")
        }

        @Test func backoffDoublesUpToItsBoundAndResets() {
            // The reconnect's delays come from the core's one backoff (RestartSchedule).
            var schedule = RestartSchedule(Backoff(initial: .microseconds(Int64(NetworkdConnectivity.reconnectInitial)),
                                                   maximum: .microseconds(Int64(NetworkdConnectivity.reconnectMaximum))))
            var random = SplitMix64(seed: 1)
            func take(_ s: inout RestartSchedule) -> Int64 {
                guard case .restart(_, let d) = s.next(at: .zero, random: &random) else { return -1 }
                return d.saturatingMicroseconds
            }
            let delays = (0..<9).map { _ in take(&schedule) }
            #expect(delays == [100_000, 200_000, 400_000, 800_000, 1_600_000, 3_200_000, 5_000_000, 5_000_000, 5_000_000])
            schedule.recovered()
            #expect(take(&schedule) == 100_000)
            // Growing past the integer range stays at the bound (no trap, no wrap to 0).
            var huge = RestartSchedule(Backoff(initial: .microseconds(.max / 2 + 1), maximum: .microseconds(.max)))
            #expect([take(&huge), take(&huge), take(&huge)] == [Int64.max / 2 + 1, Int64.max, Int64.max])
        }
    }
}

/// A unix socket that accepts connections (the kernel queues them) and never
/// speaks: a client's connect succeeds and its authentication never ends.
final class MuteBus {
    let directory: String
    let fd: Int32
    var address: String { "unix:path=\(directory)/mute.sock" }

    init() throws {
        directory = try makeTemporaryDirectory()
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let path = Array((directory + "/mute.sock").utf8)
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: path.prefix($0.count - 1)) }
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, listen(fd, 64) == 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
    }

    deinit {
        close(fd)
        removeTree(directory)
    }
}
