import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// The daemon glue, process-wide: run `reconcile-probe` as a child.
extension SystemdTests {
    @Suite struct DaemonProcess {
        let probe = builtExecutable("reconcile-probe")

        @Test func notifiesReadyStatusAndStoppingAndHandlesSignals() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let notify = try NotifySocket(directory: dir)
            let child = try Child(probe, ["daemon"], environment: ["NOTIFY_SOCKET": notify.path])
            #expect(child.line() == "running")
            #expect(notify.receive(timeout: .seconds(10)) == "READY=1\nSTATUS=hups 0")
            // A real kill reaches the program as a message.
            child.signal(SIGHUP)
            #expect(child.line() == "signal SIGHUP from \(getpid())")
            #expect(notify.receive(timeout: .seconds(10)) == "STATUS=hups 1")
            child.signal(SIGUSR1)
            #expect(child.line() == "signal SIGUSR1 from \(getpid())")
            // SIGTERM: STOPPING, every source stopped once, exit 0.
            child.signal(SIGTERM)
            #expect(notify.receive(timeout: .seconds(10)) == "STOPPING=1")
            #expect(child.line() == "exit 0 stops=2 starts=2 live=0")
            #expect(child.wait() == 0)
        }

        @Test func pingsTheWatchdogWhenAskedTo() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let notify = try NotifySocket(directory: dir)
            let child = try Child(probe, ["daemon"], environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"])
            #expect(child.line() == "running")
            let seen = notify.receive(until: { $0 == "WATCHDOG=1" }, timeout: .seconds(5))
            #expect(seen.first == "READY=1\nSTATUS=hups 0")
            #expect(seen.last == "WATCHDOG=1")
            let more = notify.receive(until: { $0 == "WATCHDOG=1" }, timeout: .seconds(5))
            #expect(more.last == "WATCHDOG=1")
            child.signal(SIGTERM)
            #expect(child.wait() == 0)
        }

        @Test func permissionDeniedIsAFailureEvent() throws {
            // Root ignores file modes, so the probe runs as nobody.
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            try FileManager.default.createDirectory(atPath: dir + "/private", withIntermediateDirectories: true)
            try writeFile(dir + "/private/secret", "x")
            chmod(dir, 0o755)
            chmod(dir + "/private", 0o700)
            let child = try Child("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", probe, "watch", dir + "/private/secret"])
            #expect(child.line() == "running")
            let line = child.line()
            #expect(line == "failed \(EACCES) Permission denied")
            child.signal(SIGTERM)
            #expect(child.wait() == 0)
        }

        @Test func watchLimitIsAFailureEvent() throws {
            // A user namespace with an inotify watch limit of 0.
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let child = try Child("/usr/bin/unshare", ["-U", "-r", "/bin/sh", "-c",
                "echo 0 > /proc/sys/user/max_inotify_watches && exec \"$0\" watch \"$1\"", probe, dir + "/file"])
            #expect(child.line() == "running")
            #expect(child.line() == "failed \(ENOSPC) No space left on device")
            child.signal(SIGTERM)
            #expect(child.wait() == 0)
        }
    }
}
