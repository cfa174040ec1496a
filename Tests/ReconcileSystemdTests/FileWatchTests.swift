import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// Watches one path; records each event.
struct Watcher: Program {
    let path: String
    var symlinks: FileWatchSource.Symlinks = .follow
    var reportExisting = false
    func start() -> ([FileWatchSource.Event], [Never]) { ([], []) }
    func update(_ m: inout [FileWatchSource.Event], _ e: FileWatchSource.Event) -> [Never] {
        m.append(e)
        return []
    }
    func subscriptions(_ m: [FileWatchSource.Event]) -> Subscriptions<FileWatchSource.Event> {
        Subscriptions { Subscription.watch(path, symlinks: symlinks, reportExisting: reportExisting) { $0 } }
    }
}

extension SystemdTests {
    @Suite struct FileWatch {
        let dir: String
        init() throws { dir = try makeTemporaryDirectory() }

        func events(_ h: Harness<Watcher>) -> [FileWatchSource.Event] { h.runtime.model }

        @Test func seesCreateAfterWatchModifyAndDelete() throws {
            defer { removeTree(dir) }
            let file = dir + "/app.conf"
            let h = try Harness(Watcher(path: file))
            try writeFile(file, "a = 1\n")
            try h.run(until: { events(h).contains(.created) })
            try h.run(for: .milliseconds(20))
            #expect(events(h) == [.created])
            let fd = open(file, O_WRONLY | O_APPEND)
            _ = write(fd, "b = 2\n", 6)
            close(fd)
            try h.run(until: { events(h).count == 2 })
            #expect(events(h) == [.created, .modified])
            unlink(file)
            try h.run(until: { events(h).count == 3 })
            #expect(events(h) == [.created, .modified, .deleted])
        }

        @Test func seesAtomicReplaceAsAChangeOfTheFile() throws {
            defer { removeTree(dir) }
            let file = dir + "/app.conf"
            try writeFile(file, "v1")
            let h = try Harness(Watcher(path: file))
            try writeFile(dir + "/.app.conf.tmp", "v2")
            try h.run(for: .milliseconds(20))
            #expect(events(h).isEmpty)   // the temporary name is filtered out
            rename(dir + "/.app.conf.tmp", file)
            try h.run(until: { !events(h).isEmpty })
            #expect(events(h) == [.replaced])
            // Still watching the new inode.
            try writeFile(file, "v3")
            try h.run(until: { events(h).count == 2 })
            #expect(events(h) == [.replaced, .modified])
        }

        @Test func waitsThroughMissingDirectoriesAndRearmsWhenTheyReturn() throws {
            defer { removeTree(dir) }
            let file = dir + "/a/b/app.conf"
            let h = try Harness(Watcher(path: file))
            try FileManager.default.createDirectory(atPath: dir + "/a/b", withIntermediateDirectories: true)
            try h.run(for: .milliseconds(20))
            try writeFile(file, "x")
            try h.run(until: { events(h) == [.created] })
            // The parent directory is removed: the file is gone.
            removeTree(dir + "/a")
            try h.run(until: { events(h) == [.created, .deleted] })
            // ... and re-created, with the file.
            try FileManager.default.createDirectory(atPath: dir + "/a/b", withIntermediateDirectories: true)
            try writeFile(file, "y")
            try h.run(until: { events(h).count >= 3 })
            #expect(events(h) == [.created, .deleted, .created])
            try writeFile(file, "z")
            try h.run(until: { events(h).count >= 4 })
            #expect(events(h).last == .modified)
        }

        @Test func burstOfWritesIsCoalesced() throws {
            defer { removeTree(dir) }
            let file = dir + "/burst"
            try writeFile(file, "")
            let h = try Harness(Watcher(path: file))
            let fd = open(file, O_WRONLY)
            for _ in 0..<200 { _ = write(fd, "x", 1) }
            close(fd)
            try h.run(until: { !events(h).isEmpty })
            try h.run(for: .milliseconds(30))
            #expect(events(h) == [.modified])
        }

        @Test func queueOverflowIsARescanEvent() throws {
            defer { removeTree(dir) }
            let file = dir + "/watched"
            try writeFile(file, "")
            let h = try Harness(Watcher(path: file))
            // More events than the inotify queue holds, while the loop sleeps.
            let limit = Int((try? String(contentsOfFile: "/proc/sys/fs/inotify/max_queued_events", encoding: .utf8))?
                .trimmingCharacters(in: .whitespacesAndNewlines) ?? "16384") ?? 16384
            for i in 0..<(limit / 2 + 100) {
                let p = dir + "/f\(i)"
                close(open(p, O_CREAT | O_WRONLY, 0o644))
                unlink(p)
            }
            try h.run(until: { events(h).contains(.rescan) }, timeout: .seconds(20))
            // After the rescan the watch still works.
            try writeFile(file, "after")
            try h.run(until: { events(h).last == .modified }, timeout: .seconds(20))
        }

        @Test func directoryPathSeesItsEntriesChange() throws {
            defer { removeTree(dir) }
            let sub = dir + "/conf.d"
            try FileManager.default.createDirectory(atPath: sub, withIntermediateDirectories: true)
            let h = try Harness(Watcher(path: sub))
            try writeFile(sub + "/10-x.conf", "x")
            try h.run(until: { events(h).contains(.modified) })
        }

        @Test func followedSymlinkSeesTargetChanges() throws {
            defer { removeTree(dir) }
            try writeFile(dir + "/target", "1")
            symlink(dir + "/target", dir + "/link")
            let h = try Harness(Watcher(path: dir + "/link"))
            try writeFile(dir + "/target", "2")
            try h.run(until: { events(h) == [.modified] })
        }

        @Test func pathsSpelledWithDotsDoubleSlashesAndCombiningMarksWatchWhatTheyName() throws {
            // The path is split on its `/` bytes, as the kernel reads it; the
            // directories' paths are slices of it only while it is written
            // plainly, joined otherwise.
            defer { removeTree(dir) }
            let accent = "\u{301}c"   // a name that begins with a combining mark
            try FileManager.default.createDirectory(atPath: dir + "/a/b", withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: dir + "/" + accent, withIntermediateDirectories: true)
            for (spelled, real) in [(dir + "//a/./b/../b/f.conf", dir + "/a/b/f.conf"),
                                    (dir + "/" + accent + "/g.conf", dir + "/" + accent + "/g.conf")] {
                let h = try Harness(Watcher(path: spelled))
                try writeFile(real, "1")
                try h.run(until: { events(h) == [.created] })
                try writeFile(real, "2")
                try h.run(until: { events(h) == [.created, .modified] })
                unlink(real)
                try h.run(until: { events(h) == [.created, .modified, .deleted] })
            }
        }

        @Test func relativePathIsAFailureEvent() throws {
            defer { removeTree(dir) }
            let h = try Harness(Watcher(path: "relative/path"))
            guard case .failed(let f) = events(h).first else {
                Issue.record("expected a failure, got \(events(h))")
                return
            }
            #expect(f.reason.contains("absolute"))
        }

        @Test func watchesStartedAfterOthersStoppedSeeOnlyTheirOwnPaths() throws {
            // The driver starts stopped watches' runners again for new
            // watches: nothing of the old watch (its directories, names,
            // what its path named) may leak into the new one.
            struct P: Program {
                let dir: String
                struct Model: Equatable { var phase = 0; var seen: [String] = [] }
                enum Message { case event(String, FileWatchSource.Event), next }
                func start() -> (Model, [Never]) { (Model(), []) }
                func update(_ m: inout Model, _ message: Message) -> [Never] {
                    switch message {
                    case .event(let key, let e): m.seen.append("\(key) \(e)")
                    case .next: m.phase += 1
                    }
                    return []
                }
                func subscriptions(_ m: Model) -> Subscriptions<Message> {
                    if m.phase == 0 {
                        return Subscriptions {
                            Subscription.watch(dir + "/a/one") { .event("one", $0) }
                        }
                    }
                    return Subscriptions { Subscription.watch(dir + "/b/three") { .event("three", $0) } }
                }
            }
            defer { removeTree(dir) }
            try FileManager.default.createDirectory(atPath: dir + "/a", withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: dir + "/b", withIntermediateDirectories: true)
            try writeFile(dir + "/a/one", "1")
            let h = try Harness(P(dir: dir))
            try writeFile(dir + "/a/one", "2")
            try h.run(until: { h.runtime.model.seen == ["one modified"] })
            try h.runtime.send(.next)
            #expect(h.driver.runningCount == 1)
            // The old paths change: nothing is seen.
            try writeFile(dir + "/a/one", "3")
            // A file in the new path's directory named as an old watch's
            // file was (a reused record must not remember that name).
            try writeFile(dir + "/b/one", "1")
            try h.run(for: .milliseconds(30))
            #expect(h.runtime.model.seen == ["one modified"])
            // The new path is created and written: seen as its own.
            try writeFile(dir + "/b/three", "1")
            try h.run(until: { h.runtime.model.seen.count >= 2 })
            try writeFile(dir + "/b/three", "2")
            try h.run(until: { h.runtime.model.seen.count >= 3 })
            try h.run(for: .milliseconds(20))
            #expect(h.runtime.model.seen == ["one modified", "three created", "three modified"])
        }
    }
}
