import Testing
@testable import Reconcile

/// A file system made of values, and the shell a file watch's runner is,
/// played on it: every rule of `PathResolution` is checked here without a
/// kernel (the runner's own tests check the same paths against the kernel).
private struct ValueFileSystem {
    enum Entry { case directory, file, link(String) }
    /// By canonical absolute path (no links, no `.` or `..`); `/` is implicit.
    var entries: [String: Entry] = [:]
    /// Inodes, by canonical path: a rename moves an inode.
    var inodes: [String: UInt64] = ["/": 1]
    private var nextInode: UInt64 = 2

    mutating func add(_ path: String, _ entry: Entry) {
        entries[path] = entry
        inodes[path] = nextInode
        nextInode += 1
    }

    /// `rename(from, to)` for a leaf (what the tests swap).
    mutating func rename(_ from: String, _ to: String) {
        entries[to] = entries.removeValue(forKey: from)
        inodes[to] = inodes.removeValue(forKey: from)
    }

    static func join(_ dir: String, _ name: Substring) -> String { dir == "/" ? "/" + name : dir + "/" + name }
    static func parent(_ dir: String) -> String {
        guard let slash = dir.lastIndex(of: "/"), slash != dir.startIndex else { return "/" }
        return String(dir[..<slash])
    }

    struct Outcome {
        /// The canonical path named, or nil.
        var target: String?
        /// Each look-up: the directory looked in (canonical) and the name.
        var lookUps: [String] = []
        /// The names the resolution gave for messages, in order.
        var names: [String] = []
        var links = 0
        var pathTarget: PathTarget = .missing
    }

    func resolve(_ path: String, follow: Bool = true, maximumLinks: Int = 40) -> Outcome {
        var r = PathResolution(path: path, followsFinalLink: follow, maximumLinks: maximumLinks)
        var dir = "/"
        var out = Outcome()
        func found(_ p: String) -> Outcome {
            out.target = p
            out.pathTarget = .found(device: 1, inode: inodes[p]!)
            out.links = r.links
            return out
        }
        for _ in 0..<1_000 {
            switch r.next() {
            case .parent:
                dir = Self.parent(dir)
                r.enteredParent()
            case .currentDirectory:
                out.names.append(String(r.directory))
                return found(dir)
            case .lookUp(let name, _):
                out.lookUps.append("\(dir):\(name)")
                let child = Self.join(dir, name)
                out.names.append(String(r.namePath))
                guard let entry = entries[child] else { out.links = r.links; return out }
                let kind: PathResolution.Kind
                switch entry {
                case .directory: kind = .directory
                case .file: kind = .other
                case .link: kind = .symlink
                }
                switch r.found(kind) {
                case .enter: dir = child
                case .target: return found(child)
                case .readLink:
                    guard case .link(let text) = entry else { Issue.record("read a non-link"); return out }
                    if r.follow(text) { dir = "/" }
                case .namesNothing:
                    out.links = r.links
                    return out
                }
            }
        }
        Issue.record("the resolution of \(path) did not end")
        return out
    }
}

@Suite struct PathResolutionTests {
    private var fs: ValueFileSystem {
        var fs = ValueFileSystem()
        fs.add("/etc", .directory)
        fs.add("/etc/app", .directory)
        fs.add("/etc/app/conf", .file)
        fs.add("/a", .directory)
        fs.add("/a/b", .directory)
        fs.add("/a/b/file", .file)
        return fs
    }

    @Test func aPlainPathLooksUpEachComponentInTheDirectoryBefore() {
        let o = fs.resolve("/etc/app/conf")
        #expect(o.target == "/etc/app/conf")
        #expect(o.lookUps == ["/:etc", "/etc:app", "/etc/app:conf"])
        #expect(o.names == ["/etc", "/etc/app", "/etc/app/conf"])
    }

    @Test func emptyAndDotComponentsAreSkipped() {
        let o = fs.resolve("//etc/./app//conf")
        #expect(o.target == "/etc/app/conf")
        #expect(o.lookUps == ["/:etc", "/etc:app", "/etc/app:conf"])
    }

    @Test func theRootAndATrailingDotDotNameTheDirectoryReached() {
        #expect(fs.resolve("/").target == "/")
        #expect(fs.resolve("/etc/app/..").target == "/etc")
        #expect(fs.resolve("/..").target == "/")
        #expect(fs.resolve("/etc/app/..").names.last == "/etc")
    }

    @Test func dotDotGoesUpFromTheDirectoryALinkReachedNotFromThePathsText() {
        var fs = fs
        fs.add("/link", .link("/a/b"))
        // Lexically /link/../etc is /etc; the kernel goes up from /a/b.
        let o = fs.resolve("/link/../b/file")
        #expect(o.target == "/a/b/file")
        #expect(o.lookUps == ["/:link", "/:a", "/a:b", "/a:b", "/a/b:file"])
        #expect(fs.resolve("/link/../../etc/app/conf").target == "/etc/app/conf")
    }

    @Test func aRelativeLinkResolvesInTheLinksDirectory() {
        var fs = fs
        fs.add("/etc/current", .link("app"))
        let o = fs.resolve("/etc/current/conf")
        #expect(o.target == "/etc/app/conf")
        #expect(o.lookUps == ["/:etc", "/etc:current", "/etc:app", "/etc/app:conf"])
        #expect(o.links == 1)
        // The names after the link are joined, not slices of the path.
        #expect(o.names == ["/etc", "/etc/current", "/etc/app", "/etc/app/conf"])
    }

    @Test func anAbsoluteLinkStartsAgainAtTheRoot() {
        var fs = fs
        fs.add("/x", .link("/a/b"))
        let o = fs.resolve("/x/file")
        #expect(o.target == "/a/b/file")
        #expect(o.lookUps == ["/:x", "/:a", "/a:b", "/a/b:file"])
    }

    @Test func aFinalLinkIsFollowedOrNamedItselfAsConfigured() {
        var fs = fs
        fs.add("/etc/conf.link", .link("app/conf"))
        #expect(fs.resolve("/etc/conf.link").target == "/etc/app/conf")
        #expect(fs.resolve("/etc/conf.link", follow: false).target == "/etc/conf.link")
        // A link on the way is followed either way.
        fs.add("/etc/dir.link", .link("app"))
        #expect(fs.resolve("/etc/dir.link/conf", follow: false).target == "/etc/app/conf")
    }

    @Test func aLinkLoopNamesNothingAfterTheKernelsLimit() {
        var fs = fs
        fs.add("/l1", .link("/l2"))
        fs.add("/l2", .link("l1"))
        let o = fs.resolve("/l1/file")
        #expect(o.target == nil)
        #expect(o.links == 41)
        #expect(fs.resolve("/l1", maximumLinks: 3).links == 4)
    }

    @Test func aChainOfFortyLinksResolvesAndFortyOneDoesNot() {
        var fs = fs
        for i in 0..<41 { fs.add("/c\(i)", .link(i == 40 ? "/etc/app/conf" : "c\(i + 1)")) }
        let forty = fs.resolve("/c1")
        #expect(forty.target == "/etc/app/conf")
        #expect(forty.links == 40)
        #expect(fs.resolve("/c0").target == nil)
    }

    @Test func aFileWhereADirectoryIsNeededNamesNothing() {
        let o = fs.resolve("/etc/app/conf/more")
        #expect(o.target == nil)
        #expect(o.lookUps.last == "/etc/app:conf")
    }

    @Test func aMissingComponentStopsTheResolutionWhereItWouldAppear() {
        let o = fs.resolve("/etc/other/conf")
        #expect(o.target == nil)
        #expect(o.lookUps == ["/:etc", "/etc:other"])
    }

    @Test func aSwappedDirectoryIsAReplacementAndAReturnIsACreation() {
        var fs = fs
        fs.add("/a/c", .directory)
        fs.add("/a/c/file", .file)
        let before = fs.resolve("/a/b/file").pathTarget
        // rename(/a/c, /a/b) over it: the same path now names another inode.
        fs.entries["/a/b/file"] = nil
        fs.rename("/a/c/file", "/a/b/file")
        let after = fs.resolve("/a/b/file").pathTarget
        #expect(before != after)
        #expect(after.change(from: before, touched: true, recovering: false) == .replaced)
        fs.entries["/a/b/file"] = nil
        let gone = fs.resolve("/a/b/file").pathTarget
        #expect(gone.change(from: after, touched: true, recovering: false) == .deleted)
        fs.add("/a/b/file", .file)
        #expect(fs.resolve("/a/b/file").pathTarget.change(from: gone, touched: true, recovering: false) == .created)
    }

    @Test func aRepointedLinkToTheSameFileIsAReplacementOnlyWhenANameWasTouched() {
        let same = PathTarget.found(device: 1, inode: 7)
        #expect(same.change(from: same, touched: true, recovering: false) == .replaced)
        #expect(same.change(from: same, touched: false, recovering: false) == nil)
        #expect(PathTarget.missing.change(from: .missing, touched: true, recovering: false) == nil)
    }

    @Test func aWatchArmedAgainAfterAFailureSaysWhatIsThereNow() {
        let file = PathTarget.found(device: 1, inode: 7)
        #expect(file.change(from: .missing, touched: false, recovering: true) == .exists)
        #expect(file.change(from: file, touched: false, recovering: true) == .exists)
        #expect(PathTarget.missing.change(from: file, touched: false, recovering: true) == .deleted)
        #expect(PathTarget.missing.change(from: .missing, touched: false, recovering: true) == nil)
    }

    @Test func aPathWithNoLinksAllocatesNoNamePerComponent() {
        // The names handed out are slices of the path itself.
        var r = PathResolution(path: "/etc/app/conf", followsFinalLink: true)
        var bases: [Bool] = []
        while case .lookUp(let name, let own) = r.next() {
            #expect(own)
            bases.append(r.namePath.base.utf8.elementsEqual("/etc/app/conf".utf8))
            #expect(r.found(name == "conf" ? .other : .directory) != .namesNothing)
            if name == "conf" { break }
        }
        #expect(bases == [true, true, true])
    }
}

@Suite struct FileWatchCoalescingTests {
    private func coalesced(_ events: [FileWatchSource.Event]) -> [FileWatchSource.Event] {
        var c = FileWatchChanges()
        for e in events { c.record(e) }
        return c.take()
    }

    @Test func noEventTwiceInARow() {
        #expect(coalesced([.modified, .modified, .modified]) == [.modified])
        #expect(coalesced([.deleted, .deleted]) == [.deleted])
    }

    @Test func aModificationBesideAReadItAgainEventAddsNothing() {
        #expect(coalesced([.created, .modified]) == [.created])
        #expect(coalesced([.modified, .replaced]) == [.replaced])
        #expect(coalesced([.modified, .exists, .modified]) == [.exists])
        #expect(coalesced([.rescan, .modified]) == [.rescan])
    }

    @Test func aModificationAfterADeletionAloneIsKept() {
        #expect(coalesced([.deleted, .modified]) == [.deleted, .modified])
        #expect(coalesced([.deleted, .created, .modified]) == [.deleted, .created])
    }

    @Test func aFailureIsKeptInOrder() {
        let f = SourceFailure(operation: "watch /x", code: 13, reason: "denied")
        #expect(coalesced([.modified, .failed(f), .failed(f)]) == [.modified, .failed(f)])
    }

    @Test func takeLeavesNothingAndClearDropsWhatIsPending() {
        var c = FileWatchChanges()
        c.record(.created)
        #expect(c.take() == [.created])
        #expect(c.isEmpty)
        c.record(.deleted)
        c.clear()
        #expect(c.isEmpty)
    }
}
