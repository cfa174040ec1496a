import Foundation
import Reconcile
import ReconcileSystemd
import Synchronization
import Testing

/// File watches under hostile file-system changes: symlinked directories,
/// swapped links and directories, writers racing the loop, watch limits and
/// permission errors. Real sd-event loops in temporary directories; the
/// limits and permissions in child processes (a private user namespace, an
/// unprivileged uid), never machine-wide.
extension SystemdTests {
    @Suite struct FileWatchFaults {
        let dir: String
        let probe = builtExecutable("reconcile-probe")
        let indicator = builtExecutable("connectivity-indicator")

        init() throws {
            dir = try makeTemporaryDirectory()
            chmod(dir, 0o755)
        }

        func events(_ h: Harness<Watcher>) -> [FileWatchSource.Event] { h.runtime.model }

        /// CPU time of the calling thread (the loop runs on it).
        func threadCPU() -> Duration {
            var ts = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
            return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
        }

        func append(_ path: String, _ text: String = "y\n") {
            let fd = open(path, O_WRONLY | O_APPEND)
            _ = write(fd, text, text.utf8.count)
            close(fd)
        }

        /// Points `link` at `target` atomically (`ln -sfn`, as deploy tools do).
        func repoint(_ link: String, to target: String) {
            unlink(link + ".tmp")
            symlink(target, link + ".tmp")
            rename(link + ".tmp", link)
        }

        // MARK: Symlinks

        @Test func noFollowUnderASymlinkedDirectoryIsQuietAndSeesChanges() throws {
            defer { removeTree(dir) }
            // `/var/run -> /run` on Debian: the parent is a symlink.
            mkdir(dir + "/run.real", 0o755)
            symlink("run.real", dir + "/run")
            let pid = dir + "/run/x.pid"
            let h = try Harness(Watcher(path: pid, symlinks: .noFollow))
            let before = threadCPU()
            try h.run(for: .milliseconds(300))
            let spent = threadCPU() - before
            #expect(spent < .milliseconds(60), "the idle loop spent \(spent) of CPU in 300 ms")
            #expect(events(h).isEmpty)
            try writeFile(dir + "/run.real/x.pid", "1\n")
            try h.run(until: { events(h) == [.created] })
            append(pid)
            try h.run(until: { events(h).count == 2 })
            unlink(pid)
            try h.run(until: { events(h).count == 3 })
            #expect(events(h) == [.created, .modified, .deleted])
        }

        @Test func noFollowWatchesTheLinkItselfNotItsTarget() throws {
            defer { removeTree(dir) }
            try writeFile(dir + "/one", "1")
            try writeFile(dir + "/two", "2")
            symlink("one", dir + "/link")
            let h = try Harness(Watcher(path: dir + "/link", symlinks: .noFollow))
            append(dir + "/one")
            try h.run(for: .milliseconds(50))
            #expect(events(h).isEmpty)
            repoint(dir + "/link", to: "two")
            try h.run(until: { !events(h).isEmpty })
            try h.run(for: .milliseconds(30))
            #expect(events(h) == [.replaced])
        }

        @Test func configMapDataSwapIsReportedEverySwap() throws {
            defer { removeTree(dir) }
            // Kubernetes' layout: app.conf -> ..data/app.conf, ..data -> ..<timestamp>.
            mkdir(dir + "/..v0", 0o755)
            try writeFile(dir + "/..v0/app.conf", "v0")
            symlink("..v0", dir + "/..data")
            symlink("..data/app.conf", dir + "/app.conf")
            let h = try Harness(Watcher(path: dir + "/app.conf"))
            for i in 1...6 {
                mkdir(dir + "/..v\(i)", 0o755)
                try writeFile(dir + "/..v\(i)/app.conf", "v\(i)")
                repoint(dir + "/..data", to: "..v\(i)")
                removeTree(dir + "/..v\(i - 1)")
                try h.run(until: { events(h).count == i })
                try h.run(for: .milliseconds(20))
                #expect(events(h) == Array(repeating: .replaced, count: i), "after swap \(i)")
            }
            // The current target's writes are seen.
            append(dir + "/..v6/app.conf")
            try h.run(until: { events(h).count == 7 })
            #expect(events(h).last == .modified)
        }

        @Test func renameBehindAFollowedLinkIsReportedEveryTime() throws {
            defer { removeTree(dir) }
            mkdir(dir + "/data", 0o755)
            try writeFile(dir + "/data/app.conf", "0")
            symlink("data/app.conf", dir + "/app.conf")
            let h = try Harness(Watcher(path: dir + "/app.conf"))
            for i in 1...4 {
                try writeFile(dir + "/data/tmp", "\(i)")
                rename(dir + "/data/tmp", dir + "/data/app.conf")
                try h.run(until: { events(h).count == i })
            }
            try h.run(for: .milliseconds(20))
            #expect(events(h) == Array(repeating: .replaced, count: 4))
        }

        @Test func swappedSymlinkedAncestorFollowsWhatThePathNamesNow() throws {
            defer { removeTree(dir) }
            for v in ["v1", "v2"] {
                mkdir(dir + "/" + v, 0o755)
                try writeFile(dir + "/\(v)/app.conf", v)
            }
            symlink("v1", dir + "/current")
            let h = try Harness(Watcher(path: dir + "/current/app.conf"))
            append(dir + "/v1/app.conf")
            try h.run(until: { events(h) == [.modified] })
            // Deploy: current -> v2. The path names another file now.
            repoint(dir + "/current", to: "v2")
            try h.run(until: { events(h).count == 2 })
            #expect(events(h) == [.modified, .replaced])
            // The old target is no longer what the path names ...
            append(dir + "/v1/app.conf")
            try h.run(for: .milliseconds(50))
            #expect(events(h).count == 2)
            // ... the new one is.
            append(dir + "/v2/app.conf")
            try h.run(until: { events(h).count == 3 })
            #expect(events(h) == [.modified, .replaced, .modified])
        }

        @Test func renamedDirectoryOnTheWayIsADeletionAndItsReturnACreation() throws {
            defer { removeTree(dir) }
            try FileManager.default.createDirectory(atPath: dir + "/a/b", withIntermediateDirectories: true)
            try writeFile(dir + "/a/b/app.conf", "x")
            let h = try Harness(Watcher(path: dir + "/a/b/app.conf"))
            rename(dir + "/a", dir + "/a.old")
            try h.run(until: { events(h) == [.deleted] })
            // Writes under the old name are not the watched path's.
            append(dir + "/a.old/b/app.conf")
            try h.run(for: .milliseconds(50))
            #expect(events(h) == [.deleted])
            rename(dir + "/a.old", dir + "/a")
            try h.run(until: { events(h) == [.deleted, .created] })
        }

        @Test func watchesSharingDirectoriesKeepWorkingWhenOneStops() throws {
            defer { removeTree(dir) }
            try writeFile(dir + "/a.conf", "a")
            try writeFile(dir + "/b.conf", "b")
            // Both watches look names up in `/`, the temporary directories
            // and `dir`: one shared inotify source each on this loop.
            let h = try Harness(TwoWatches(a: dir + "/a.conf", b: dir + "/b.conf"))
            append(dir + "/a.conf")
            append(dir + "/b.conf")
            try h.run(until: { h.runtime.model.a == [.modified] && h.runtime.model.b == [.modified] })
            try h.runtime.send(.dropA)
            try h.run(for: .milliseconds(10))
            append(dir + "/a.conf")
            append(dir + "/b.conf")
            try h.run(until: { h.runtime.model.b.count == 2 })
            try h.run(for: .milliseconds(30))
            #expect(h.runtime.model.a == [.modified])
            #expect(h.runtime.model.b == [.modified, .modified])
            // The remaining watch still sees its file replaced and deleted.
            try writeFile(dir + "/b.tmp", "b2")
            rename(dir + "/b.tmp", dir + "/b.conf")
            unlink(dir + "/b.conf")
            try h.run(until: { h.runtime.model.b.count == 3 })
            #expect(h.runtime.model.b.last == .deleted)
        }

        // MARK: Coalescing

        @Test func oneAppendWhoseWriterClosesLateIsOneModification() throws {
            defer { removeTree(dir) }
            let file = dir + "/f"
            try writeFile(file, "x\n")
            let h = try Harness(Watcher(path: file))
            // `echo y >> f` racing the loop: the loop runs between the write
            // and the close.
            let fd = open(file, O_WRONLY | O_APPEND)
            _ = write(fd, "y\n", 2)
            try h.run(for: .milliseconds(50))
            close(fd)
            try h.run(until: { !events(h).isEmpty })
            try h.run(for: .milliseconds(50))
            #expect(events(h) == [.modified])
        }

        @Test func recreationRacingTheLoopIsCreatedThenOneModification() throws {
            defer { removeTree(dir) }
            let file = dir + "/f"
            try writeFile(file, "x\n")
            let h = try Harness(Watcher(path: file))
            unlink(file)
            try h.run(until: { events(h) == [.deleted] })
            // `echo x > f`: the loop runs after the create, after the write,
            // and after the close.
            let fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            try h.run(until: { events(h) == [.deleted, .created] })
            _ = write(fd, "x\n", 2)
            try h.run(for: .milliseconds(50))
            close(fd)
            try h.run(until: { events(h).count == 3 })
            try h.run(for: .milliseconds(50))
            #expect(events(h) == [.deleted, .created, .modified])
        }

        @Test func recreationWithinOneDispatchIsOneCreation() throws {
            defer { removeTree(dir) }
            let file = dir + "/f"
            try writeFile(file, "x\n")
            let h = try Harness(Watcher(path: file))
            unlink(file)
            try h.run(until: { events(h) == [.deleted] })
            let fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            _ = write(fd, "x\n", 2)
            close(fd)
            try h.run(until: { events(h).count == 2 })
            try h.run(for: .milliseconds(50))
            #expect(events(h) == [.deleted, .created])
        }

        @Test func twentyThousandAppendsThroughOneDescriptorAreOneModification() throws {
            defer { removeTree(dir) }
            let file = dir + "/log"
            try writeFile(file, "")
            let h = try Harness(Watcher(path: file))
            let done = DoneFlag()
            // A writer on another thread while the loop runs.
            let writer = Thread {
                let fd = open(file, O_WRONLY | O_APPEND)
                for _ in 0..<20_000 { _ = write(fd, "x\n", 2) }
                close(fd)
                done.set()
            }
            writer.start()
            try h.run(until: { done.isSet && !events(h).isEmpty }, timeout: .seconds(20))
            try h.run(for: .milliseconds(50))
            #expect(events(h) == [.modified])
        }

        @Test func burstOfWriteSessionsWhileTheLoopIsBusyIsOneModification() throws {
            defer { removeTree(dir) }
            let file = dir + "/f"
            try writeFile(file, "")
            let h = try Harness(Watcher(path: file))
            for _ in 0..<2_000 { append(file, "x") }
            try h.run(until: { !events(h).isEmpty })
            try h.run(for: .milliseconds(50))
            #expect(events(h) == [.modified])
        }

        // MARK: Initial state

        @Test func reportExistingGivesOneExistsFirstWhenThePathIsThere() throws {
            defer { removeTree(dir) }
            let file = dir + "/app.conf"
            try writeFile(file, "a")
            let h = try Harness(Watcher(path: file, reportExisting: true))
            try h.run(until: { !events(h).isEmpty })
            try h.run(for: .milliseconds(30))
            #expect(events(h) == [.exists])
            append(file)
            try h.run(until: { events(h).count == 2 })
            #expect(events(h) == [.exists, .modified])
        }

        @Test func reportExistingIsSilentUntilAMissingPathAppears() throws {
            defer { removeTree(dir) }
            let file = dir + "/later/app.conf"
            let h = try Harness(Watcher(path: file, reportExisting: true))
            try h.run(for: .milliseconds(50))
            #expect(events(h).isEmpty)
            mkdir(dir + "/later", 0o755)
            try writeFile(file, "a")
            try h.run(until: { events(h) == [.created] })
        }

        @Test func withoutReportExistingAnExistingPathIsSilent() throws {
            defer { removeTree(dir) }
            try writeFile(dir + "/app.conf", "a")
            let h = try Harness(Watcher(path: dir + "/app.conf"))
            try h.run(for: .milliseconds(50))
            #expect(events(h).isEmpty)
        }

        // MARK: Failures and recovery (child processes)

        @Test func directoryWatchAtTheWatchLimitFailsThenRecoversWhenTheLimitRises() throws {
            defer { removeTree(dir) }
            let watched = dir + "/conf.d"
            mkdir(watched, 0o755)
            // The probe in a private user namespace whose inotify watch limit
            // lets it watch every directory on the way but not the watched
            // directory itself (one watch per directory: `/`, then each
            // ancestor; the driver's idle watch shares `/`).
            let limit = watched.split(separator: "/").count
            let child = try Child("/usr/bin/unshare", ["-U", "-r", "/bin/sh", "-c",
                "echo \(limit) > /proc/sys/user/max_inotify_watches && exec \"$0\" watch \"$1\"", probe, watched])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(child.line() == "running")
            #expect(child.line() == "failed \(ENOSPC) No space left on device")
            // The limit of that namespace only; the machine's stays as it is.
            // Each retry is announced (the default policy: 100 ms doubling).
            #expect(child.line() == "file restarting(attempt: 1, after: 0.1 seconds)")
            sh(nsenter(child.pid, "-U", "sh -c 'echo 100 > /proc/sys/user/max_inotify_watches'"))
            #expect(child.line(skipping: "file restarting", timeout: .seconds(15)) == "file exists")
            try writeFile(watched + "/10-x.conf", "x")
            #expect(child.line() == "file modified")
        }

        @Test func permissionDeniedThenFixedComesBack() throws {
            defer { removeTree(dir) }
            // Root ignores file modes, so the probe runs as nobody.
            mkdir(dir + "/private", 0o700)
            try writeFile(dir + "/private/secret", "x")
            let child = try Child("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", probe, "watch", dir + "/private/secret"])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(child.line() == "running")
            #expect(child.line() == "failed \(EACCES) Permission denied")
            #expect(child.line() == "file restarting(attempt: 1, after: 0.1 seconds)")
            chmod(dir + "/private", 0o755)
            #expect(child.line(skipping: "file restarting", timeout: .seconds(15)) == "file exists")
            try writeFile(dir + "/private/secret", "y")
            #expect(child.line() == "file modified")
        }

        @Test func indicatorConfigWatchComesBackAfterAPermissionError() throws {
            defer { removeTree(dir) }
            let confDir = dir + "/conf"
            let config = confDir + "/indicator.conf"
            mkdir(confDir, 0o755)
            try writeFile(config, "backend = kernel\ninclude = veth0\n")
            let child = try Child("/usr/bin/unshare", ["-n", "/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                                      indicator, "--format", "json", "--config", config])
            defer { child.signal(SIGTERM); _ = child.wait() }
            #expect(child.errorLine(matching: { $0.contains("applied") }) != nil)
            // The directory is recreated without access for the indicator ...
            removeTree(confDir)
            mkdir(confDir, 0o700)
            try writeFile(config, "backend = kernel\ninclude = veth1\n")
            chmod(config, 0o644)
            #expect(child.errorLine(matching: { $0.contains("config watch") })?.contains("Permission denied") == true)
            // ... then fixed: the watch comes back and the file is read.
            chmod(confDir, 0o755)
            #expect(child.errorLine(matching: { $0.contains("applied") }, timeout: .seconds(15)) != nil)
            sh(nsenter(child.pid, "-n", "ip link add veth0 type veth peer name veth1"))
            let line = child.line(matching: { $0.contains("veth") })
            #expect(line?.contains("\"veth1\"") == true && line?.contains("\"veth0\"") == false)
        }
    }
}

/// Watches two paths; `dropA` stops the first watch.
struct TwoWatches: Program {
    let a: String
    let b: String
    struct Model: Equatable { var a: [FileWatchSource.Event] = []; var b: [FileWatchSource.Event] = []; var watchA = true }
    enum Message: Sendable { case a(FileWatchSource.Event), b(FileWatchSource.Event), dropA }
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .a(let e): m.a.append(e)
        case .b(let e): m.b.append(e)
        case .dropA: m.watchA = false
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions {
            if m.watchA { Subscription.watch(a) { .a($0) } }
            Subscription.watch(b) { .b($0) }
        }
    }
}

/// A flag one thread sets and another reads.
final class DoneFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}
