import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// What the daemon tells the service manager: the order of READY and
/// STOPPING, and the watchdog whatever `WATCHDOG_USEC` says. The probe runs
/// as a child with `NOTIFY_SOCKET` pointing at a socket this test reads.
extension SystemdTests {
    @Suite struct ServiceManagerProtocol {
        let probe = builtExecutable("reconcile-probe")

        /// Everything the child sent until it has been quiet for `quiet`.
        func drain(_ notify: NotifySocket, quiet: Duration = .milliseconds(200)) -> [String] {
            var all: [String] = []
            while let m = notify.receive(timeout: quiet) { all.append(m) }
            return all
        }

        @Test func readyIsNeverSentAfterStopping() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let notify = try NotifySocket(directory: dir)
            // The program's start command stops the daemon.
            let child = try Child(probe, ["stop-at-start"], environment: ["NOTIFY_SOCKET": notify.path])
            #expect(child.line() == "running")
            #expect(child.line() == "stopping")
            #expect(child.line()?.hasPrefix("exit 3 ") == true)
            #expect(child.wait() == 3)
            // The barrier before exit (sd_notify_barrier) comes last.
            #expect(drain(notify) == ["STOPPING=1", "BARRIER=1"])
        }

        @Test func watchdogIntervalBelowTheMinimumIsClamped() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let notify = try NotifySocket(directory: dir)
            let child = try Child(probe, ["daemon"], environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1"])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(child.line() == "running")
            #expect(notify.receive(timeout: .seconds(10)) == "READY=1\nSTATUS=hups 0")
            #expect(child.errorLine(matching: { $0.contains("watchdog") })?.contains("below the minimum 20ms: pinging every 10ms") == true)
            // One second: at most one ping per 10 ms (sd-event's own watchdog
            // sent tens of thousands here), and the pings do come.
            let start = ContinuousClock.now
            var pings = 0
            while ContinuousClock.now - start < .seconds(1) {
                guard let m = notify.receive(timeout: .seconds(1) - (ContinuousClock.now - start)) else { break }
                #expect(m == "WATCHDOG=1")
                pings += 1
            }
            print("watchdog: WATCHDOG_USEC=1 gives \(pings) pings in 1 s")
            #expect(pings <= 101)
            #expect(pings >= 10)
        }

        @Test(arguments: ["9300000000000000", "9223372036854775807", "9223372036854775808", "18446744073709551614", "18446744073709551615"])
        func hugeWatchdogIntervalNeitherTrapsNorPings(usec: String) throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let notify = try NotifySocket(directory: dir)
            let child = try Child(probe, ["daemon"], environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": usec])
            #expect(child.line() == "running")
            #expect(notify.receive(timeout: .seconds(10)) == "READY=1\nSTATUS=hups 0")
            // The first ping would be due in centuries (or never).
            #expect(notify.receive(timeout: .milliseconds(300)) == nil)
            child.signal(SIGTERM)
            #expect(notify.receive(timeout: .seconds(10)) == "STOPPING=1")
            #expect(child.wait() == 0)
        }
    }
}
