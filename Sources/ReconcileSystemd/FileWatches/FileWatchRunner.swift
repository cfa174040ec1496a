import CSystemd
import Glibc
import Reconcile

/// `O_PATH` (`<fcntl.h>` declares it only under `_GNU_SOURCE`; the same
/// value on x86-64 and arm64).
private let O_PATH: Int32 = 0o10_000_000

extension FileWatchSource: SystemdSource {
    /// Arms inotify watches for `configuration` on the context's loop.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        context.driver.keepInotifyOpen()
        let runner = FileWatchRunner(loop: context.loop, directories: context.driver.directoryWatches)
        try runner.start(ticket, configuration)
        return runner
    }
}

/// Watches one path, as named, through inotify on the loop.
///
/// The path is resolved one component at a time, the way the kernel does,
/// and every directory a name is looked up in is watched *before* the name
/// is looked up (through an `O_PATH` descriptor, so the watch is on exactly
/// that directory): no change after that can go unseen. A change of any
/// looked-up name (created, deleted, moved, a symlink re-pointed) resolves
/// the path again and compares what it names now with what it named before;
/// the difference is the event (`created`, `deleted`, `replaced`). Writes to
/// the file are seen on its directory, filtered by name (`IN_CLOSE_WRITE`,
/// `IN_ATTRIB`); a directory is also watched for its entries.
///
/// Events seen within one loop dispatch are coalesced and emitted by a
/// lower-priority deferred source, after the inotify events of that dispatch.
/// A watch that cannot be armed (EACCES, ENOSPC, EMFILE) reports `.failed`
/// once and retries with a bounded backoff; once armed again it reports the
/// path's state (`.exists`, or `.deleted` if it existed before).
///
/// A stopped runner can be started again for another ticket, with its
/// `Watch` records and lists: the driver keeps stopped runners for later
/// starts (`SystemdDriver.spareWatches`).
final class FileWatchRunner: DriverRunner {
    /// What one runner wants of one watched directory; a subscriber of the
    /// loop's shared `DirectoryWatches` entry for that directory.
    final class Watch {
        unowned let runner: FileWatchRunner
        /// Names of the path looked up in this directory: a change of one
        /// re-resolves the path. Almost always one, a component of the
        /// watched path as written: kept as its range in the runner's `path`
        /// (no string, no reference count). Others (through symlinks or
        /// `..`) are kept as slices.
        var name: Range<String.Index>?
        var moreNames: [Substring] = []
        /// `n`, a slice of the runner's `path` when `own`.
        func insertName(_ n: Substring, own: Bool) {
            if own, name == nil {
                name = n.startIndex..<n.endIndex
            } else if !(name.map { runner.path.utf8[$0].elementsEqual(n.utf8) } ?? false), !moreNames.contains(n) {
                moreNames.append(n)
            }
        }
        func hasName(_ n: String) -> Bool {
            name.map { runner.path.utf8[$0].elementsEqual(n.utf8) } ?? false || moreNames.contains { $0 == n }
        }
        /// The final name, when this directory holds the watched file: its
        /// writes and attribute changes are modifications. A range in the
        /// runner's `path` when it is the path's own, else `otherContent`.
        var content: Range<String.Index>?
        var otherContent: Substring?
        func setContent(_ n: Substring, own: Bool) {
            if own { content = n.startIndex..<n.endIndex } else { otherContent = n }
        }
        func isContent(_ n: String) -> Bool {
            if let r = content { return runner.path.utf8[r].elementsEqual(n.utf8) }
            return otherContent.map { $0 == n } ?? false
        }
        /// This directory is the watched path: its entries changing is a
        /// modification.
        var entries = false
        var entry: DirectoryWatches.Entry?
        /// Where this watch is in its entry's `watches`.
        var slot = 0
        init(_ runner: FileWatchRunner) {
            self.runner = runner
        }
        var isOpen: Bool { entry != nil }
        func close() {
            entry?.remove(self)
            entry = nil
        }
        /// Closed and cleared, for the runner's next resolution.
        func recycle() {
            close()
            name = nil
            if !moreNames.isEmpty { moreNames.removeAll(keepingCapacity: true) }
            content = nil
            if otherContent != nil { otherContent = nil }
            entries = false
        }
    }

    /// What the path names.
    typealias Target = PathTarget

    /// Symlinks followed in one resolution before the path is taken to name
    /// nothing (the kernel's limit, `ELOOP`).
    static let maximumLinks = 40

    // `ticket` (the base's, unretained: it owns this runner while it runs;
    // read only while the flush source is armed).
    private let loop: EventLoop
    private let directories: DirectoryWatches
    fileprivate private(set) var path = ""
    /// At most this many components (its `/` bytes, plus one).
    private var componentBound = 0
    private var follow = true
    /// Counts starts: a flush that emits checks that it is still the same
    /// run (the program may stop this runner, and a start reuse it, from an
    /// emitted event).
    private var run = 0

    // The lists: no dynamic exclusivity checks (the loop thread only; no
    // access to one overlaps another access to it).
    @exclusivity(unchecked) private var watches: [Watch] = []
    /// The list the next resolution fills (the previous `watches`, emptied:
    /// no array per resolution).
    @exclusivity(unchecked) private var scratch: [Watch] = []
    /// Closed watches, reused by later resolutions and runs.
    @exclusivity(unchecked) private var spare: [Watch] = []
    /// The deferred flush source, owned here (no wrapper object); counted
    /// in `EventSourceAccounting`. Made by the first start and kept, off,
    /// by a stopped runner for its next start (no source per start);
    /// released by `release()` (the driver, at detach, for its stopped
    /// runners) or deinit.
    private var flush: OpaquePointer?
    /// When the flush was armed (loop time, µs), while it is: nil when it
    /// is not. See `FlushGuard`.
    private var flushArmedAt: UInt64?
    /// Counts arms: the guard's note of an earlier one is stale.
    private var flushArm: UInt64 = 0
    /// The flush raised to the descriptors' priority (`passedOver`).
    private var flushRaised = false
    /// Started and not stopped since.
    private var running = false
    /// Made at the first failure (most watches never fail); it follows the
    /// policy of the start that failed (another policy starts its schedule
    /// from the beginning). Its cap reached: no more retries in this failure.
    private var retry: Retry?
    /// The configuration's restart policy.
    private var policy = FileWatchSource.defaultRetry
    /// The retry armed since the last flush, to announce.
    private var restartToReport: (attempt: Int, after: Duration)?
    /// What the path named when last resolved.
    private var target = Target.missing
    /// The failure reported for the current failed episode, if any.
    private var failure: SourceFailure?
    private var failureToReport: SourceFailure?
    private var pending = FileWatchChanges()
    private var needsRearm = false
    /// A looked-up name changed since the last resolution.
    private var touched = false

    /// The one inotify mask of every file watch source (and of the driver's
    /// idle watch on `/`). sd-event shares a kernel watch per inode, ORs the
    /// masks of its sources and never narrows it when one goes; in libsystemd
    /// 252 an event that no remaining source on the inode asks for is never
    /// taken out of its read buffer, and the loop spins on it for ever. So
    /// every source asks for every event any of them may cause, and filters.
    static let mask = UInt32(IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CLOSE_WRITE | IN_ATTRIB
        | IN_DELETE_SELF | IN_MOVE_SELF)
    private static let nameChangeMask = UInt32(IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE)
    private static let contentMask = UInt32(IN_CLOSE_WRITE | IN_ATTRIB)
    private static let selfGoneMask = UInt32(IN_DELETE_SELF | IN_MOVE_SELF)

    /// A stopped runner for watches on `loop`.
    init(loop: EventLoop, directories: DirectoryWatches) {
        self.loop = loop
        self.directories = directories
    }

    /// Arms the (stopped) runner for `ticket` with configuration `c`; on a
    /// throw it is stopped again.
    func start(_ ticket: SourceTicket, _ c: FileWatchSource.Configuration) throws {
        guard c.path.hasPrefix("/") else {
            throw SourceFailure(operation: "watch \(c.path)", code: EINVAL, reason: "the path must be absolute")
        }
        path = c.path
        componentBound = Self.slashes(in: c.path) + 1
        follow = c.symlinks == .follow
        target = .missing
        failure = nil
        failureToReport = nil
        restartToReport = nil
        policy = c.restart
        needsRearm = false
        touched = false
        // A reused runner: the last subscription's attempts and cap window
        // are not this one's.
        retry?.restart(c.restart)
        if flush == nil {
            var s: OpaquePointer?
            try check("sd_event_add_defer", sd_event_add_defer(loop.handle, &s, { _, ud in
                Unmanaged<FileWatchRunner>.fromOpaque(ud!).takeUnretainedValue().flushPending()
                return 0
            }, Unmanaged.passUnretained(self).toOpaque()))
            flush = s
            EventSource.account(s!)
            // Run after this iteration's inotify events have been handed out.
            sd_event_source_set_priority(s, Self.flushPriority)
            sd_event_source_set_enabled(s, Int32(SD_EVENT_OFF))
        }
        running = true
        run &+= 1
        self.ticket = ticket
        // Armed now, so that nothing after the start goes unseen.
        switch resolveAndWatch() {
        case .success(let t):
            target = t
            if c.reportExisting, t != .missing {
                record(.exists)
                scheduleFlush()
            }
        case .failure(let f):
            fail(f)
            scheduleFlush()
        }
    }

    // MARK: Resolution

    /// Resolves the path from `/`, watching each directory before a name is
    /// looked up in it, and replaces the current watches with the new ones.
    private func resolveAndWatch() -> Result<Target, SourceFailure> {
        var fresh = scratch
        scratch = []
        fresh.reserveCapacity(componentBound + 1)
        let result = resolve(into: &fresh)
        // The new watches are in place before the old ones go: a directory
        // in both keeps its shared source and inotify watch descriptor
        // (`DirectoryWatches`), so no event on it falls between the two.
        var old = watches
        watches = []
        if case .failure = result {
            recycle(&fresh)
            scratch = fresh
        } else {
            watches = fresh
        }
        recycle(&old)
        if scratch.capacity < old.capacity { scratch = old }
        return result
    }

    /// Closes `list`'s watches into `spare`, leaving it empty.
    private func recycle(_ list: inout [Watch]) {
        guard !list.isEmpty else { return }
        for i in list.indices { list[i].recycle() }
        // Taken back last first: a later resolution reuses them in the
        // order they were used (the record of the path's n-th directory
        // for the n-th directory again).
        list.reverse()
        if spare.isEmpty {
            // Moved whole (no reference counting per watch); `list` takes
            // the empty spare storage.
            swap(&spare, &list)
        } else {
            spare.append(contentsOf: list)
            list.removeAll(keepingCapacity: true)
        }
    }

    /// The I/O of a resolution: performs the steps `PathResolution` asks
    /// for (its rules are pure, in the core), watching each directory before
    /// a name is looked up in it.
    private func resolve(into fresh: inout [Watch]) -> Result<Target, SourceFailure> {
        var dir = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)
        guard dir >= 0 else { return .failure(SystemdError("open /", errno: errno).failure) }
        defer { close(dir) }
        var r = PathResolution(path: path, followsFinalLink: follow, maximumLinks: Self.maximumLinks)

        /// The watch on directory `fd` (at `p`), added once per resolution
        /// per directory inode (a path has a handful of directories: a
        /// linear search).
        /// On failure, nil and `failure` says why.
        var failure: SourceFailure?
        /// The directory's inode when already known (`dir` was entered
        /// from a name whose `fstat` gave it): no second `fstat`.
        var dirKey: DirectoryWatches.Key?
        func watch(_ fd: Int32, _ p: Substring, _ key: DirectoryWatches.Key?) -> Watch? {
            guard let entry = directories.entry(fd, path: p, key: key, failure: &failure) else { return nil }
            if let w = fresh.first(where: { $0.entry === entry }) { return w }
            let w = spare.popLast() ?? Watch(self)
            entry.add(w)
            w.entry = entry
            fresh.append(w)
            return w
        }
        func enter(_ fd: Int32, key: DirectoryWatches.Key? = nil) {
            close(dir)
            dir = fd
            dirKey = key
        }

        while true {
            let name: Substring
            let own: Bool
            switch r.next() {
            case .parent:
                let up = openat(dir, "..", O_PATH | O_DIRECTORY | O_CLOEXEC)
                guard up >= 0 else { return .failure(SystemdError("open \(r.directory)/..", errno: errno).failure) }
                enter(up)
                r.enteredParent()
                continue
            case .currentDirectory:
                var st = stat()
                guard fstat(dir, &st) == 0 else { return .failure(SystemdError("stat \(r.directory)", errno: errno).failure) }
                guard let w = watch(dir, r.directory, DirectoryWatches.Key(st)) else { return .failure(failure!) }
                w.entries = true
                return .success(.found(device: UInt64(st.st_dev), inode: UInt64(st.st_ino)))
            case .lookUp(let n, let o):
                (name, own) = (n, o)
            }
            // Watch the directory before the name is looked up in it.
            guard let here = watch(dir, r.directory, dirKey) else { return .failure(failure!) }
            here.insertName(name, own: own)
            let fd = Self.openName(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)
            if fd < 0 {
                let e = errno
                // Not there (yet): the watch on `dir` sees it appear.
                if e == ENOENT || e == ENOTDIR { return .success(.missing) }
                return .failure(SystemdError("open \(r.namePath)", errno: e).failure)
            }
            var st = stat()
            guard fstat(fd, &st) == 0 else {
                let e = errno
                close(fd)
                return .failure(SystemdError("stat \(r.namePath)", errno: e).failure)
            }
            let type = st.st_mode & S_IFMT
            let key = DirectoryWatches.Key(st)
            switch r.found(type == S_IFDIR ? .directory : type == S_IFLNK ? .symlink : .other) {
            case .enter:
                enter(fd, key: key)
            case .target:
                defer { close(fd) }
                // Writes to the file are seen on its directory, by name.
                here.setContent(name, own: own)
                if type == S_IFDIR {
                    guard let w = watch(fd, r.namePath, key) else { return .failure(failure!) }
                    w.entries = true
                }
                return .success(.found(device: UInt64(st.st_dev), inode: UInt64(st.st_ino)))
            case .readLink:
                let link = Self.readLink(fd)
                close(fd)
                // An unreadable link names nothing; the watches so far see it change.
                guard let link else { return .success(.missing) }
                if r.follow(link) {
                    let top = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)
                    guard top >= 0 else { return .failure(SystemdError("open /", errno: errno).failure) }
                    enter(top)
                }
            case .namesNothing:
                // A file where a directory is needed, or a link loop.
                close(fd)
                return .success(.missing)
            }
        }
    }

    /// `openat(2)` of `name`, copied to a NUL-terminated buffer on the stack
    /// (a slice has no terminator of its own; no heap string).
    private static func openName(_ dir: Int32, _ name: Substring, _ flags: Int32) -> Int32 {
        let utf8 = name.utf8
        let count = utf8.count
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: count + 1) { buffer in
            if utf8.withContiguousStorageIfAvailable({ buffer.baseAddress!.initialize(from: $0.baseAddress!, count: count) }) == nil {
                _ = buffer.initialize(from: utf8)
            }
            buffer[count] = 0
            return buffer.withMemoryRebound(to: CChar.self) { Glibc.openat(dir, $0.baseAddress!, flags) }
        }
    }

    /// How many `/` bytes `path` has.
    static func slashes(in path: String) -> Int {
        var n = 0
        for byte in path.utf8 where byte == UInt8(ascii: "/") { n += 1 }
        return n
    }

    private static func readLink(_ fd: Int32) -> String? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
        let n = buffer.withUnsafeMutableBytes { readlinkat(fd, "", $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
        guard n > 0 else { return nil }
        return String(decoding: buffer[..<n], as: UTF8.self)
    }

    // MARK: Events

    fileprivate func handle(_ watch: Watch, _ mask: UInt32, _ name: String?) {
        guard watch.isOpen, running else { return }
        if mask & UInt32(IN_Q_OVERFLOW) != 0 {
            // Events were lost on this loop's inotify queue: say so, then
            // resolve the path again.
            record(.rescan)
            scheduleRearm()
            return
        }
        if mask & UInt32(IN_IGNORED | IN_UNMOUNT) != 0 || (name == nil && mask & Self.selfGoneMask != 0) {
            // A watched directory went away or moved: resolve again.
            watch.close()
            scheduleRearm()
            return
        }
        // Entries of a watched directory that are not the path's are
        // filtered here, without waking the flush.
        guard let name else { return }
        if mask & Self.nameChangeMask != 0, watch.hasName(name) {
            touched = true
            scheduleRearm()
        }
        if watch.entries || (mask & Self.contentMask != 0 && watch.isContent(name)) {
            record(.modified)
            scheduleFlush()
        }
    }

    private func scheduleRearm() {
        needsRearm = true
        scheduleFlush()
    }

    /// Resolves the path again and records what changed about what it names.
    private func rearm() {
        needsRearm = false
        let wasTouched = touched
        touched = false
        let before = target
        switch resolveAndWatch() {
        case .success(let now):
            target = now
            // Armed again after a failure: say what is there now (any
            // change in between went unseen).
            let recovering = failure != nil
            if recovering {
                failure = nil
                restartToReport = nil
                retry?.recovered()
            }
            if let event = now.change(from: before, touched: wasTouched, recovering: recovering) { record(event) }
        case .failure(let f):
            fail(f)
        }
    }

    /// Enters (or stays in) the failed state: reports a new failure once,
    /// and retries after the policy's next delay (announced by
    /// `.restarting`); `.never`, or the cap reached, retries no more.
    private func fail(_ f: SourceFailure) {
        if failure != f { failureToReport = f }
        failure = f
        guard policy != .never else { return }
        if let retry { retry.follow(policy) } else {
            retry = Retry(loop: loop, policy: policy) { [unowned self] in scheduleRearm() }
        }
        switch retry!.next() {
        case .never: return
        case .restarting(let n, let after):
            restartToReport = (n, after)
        case .cannotArm(let error):
            failureToReport = SystemdError("\(error.function) (file watch retry)", errno: error.errno).failure
        case .gaveUp(let n, let window):
            restartToReport = nil
            failureToReport = RestartPolicy.capReached(operation: "watch \(path)", code: f.code, attempts: n, retries: "retries",
                                                       within: "\(window)", then: ": \(f.reason)")
        }
    }

    private func record(_ event: FileWatchSource.Event) {
        pending.record(event)
    }

    /// Below the descriptors and inotify (normal): a burst of inotify
    /// events, dispatched one by one, is one flush.
    static let flushPriority = Int64(SD_EVENT_PRIORITY_NORMAL) + 10
    /// How long (loop time) an armed flush may wait before it is raised.
    static let flushStarvationBound: UInt64 = 1_000   // µs

    private func scheduleFlush() {
        guard running, let h = flush else { return }
        if flushArmedAt == nil {
            flushArmedAt = loop.now()
            flushArm &+= 1
            directories.flushGuard.note(self, arm: flushArm)
        }
        sd_event_source_set_enabled(h, Int32(SD_EVENT_ONESHOT))
    }

    /// The guard's check of arm `arm` at loop time `now`: nil when that
    /// arm is over (flushed, stopped); true when it waited at least
    /// `flushStarvationBound` and the flush was raised to the normal
    /// priority, where it runs next (sd-event orders one priority's
    /// sources by how long they are pending, and a defer source is
    /// pending since it was made); false when it is younger.
    func passedOver(arm: UInt64, now: UInt64) -> Bool? {
        guard arm == flushArm, let at = flushArmedAt, let h = flush else { return nil }
        guard now &- at >= Self.flushStarvationBound else { return false }
        if !flushRaised {
            sd_event_source_set_priority(h, Int64(SD_EVENT_PRIORITY_NORMAL))
            flushRaised = true
        }
        return true
    }

    /// The flush disarmed (it ran, or the watch stopped): its own priority
    /// again (the guard's note goes stale).
    private func disarmFlush() {
        flushArmedAt = nil
        if flushRaised, let h = flush {
            flushRaised = false
            sd_event_source_set_priority(h, Self.flushPriority)
        }
    }

    private func flushPending() {
        disarmFlush()
        if needsRearm { rearm() }
        let events = pending.take()
        let failed = failureToReport
        failureToReport = nil
        let restart = restartToReport
        restartToReport = nil
        let current = run
        // Stopped (or stopped and started again) by an earlier event's update: no more.
        var live: Bool { running && run == current }
        for e in events {
            guard live, let ticket else { return }
            ticket.emit(e)
        }
        if let failed, live, let ticket { ticket.fail(failed) }
        if let restart, live, let ticket { ticket.emit(FileWatchSource.Event.restarting(attempt: restart.attempt, after: restart.after)) }
    }

    private func closeWatches() {
        recycle(&watches)
    }

    deinit {
        stop()
        release()
    }

    /// Stops; the flush source stays, off, for the next start.
    override func stop() {
        closeWatches()
        retry?.close()
        if running {
            running = false
            disarmFlush()
            if let h = flush { sd_event_source_set_enabled(h, Int32(SD_EVENT_OFF)) }
        }
        ticket = nil
        pending.clear()
    }

    /// Releases the kept flush source of a stopped runner (nothing of it is
    /// left on the loop); a later start makes a new one.
    func release() {
        if let h = flush {
            flush = nil
            sd_event_source_disable_unref(h)
        }
    }
}

/// The loop's inotify watches on directories, one sd-event source per
/// directory inode shared by every file watch that needs it (`/`, `/etc`...).
/// sd-event recomputes an inode's mask over all of its sources at each add,
/// so one source per watch on a shared directory would make starting n
/// watches cost n². Owned by the driver; the loop thread only.
final class DirectoryWatches {
    struct Key: Hashable {
        let device: UInt64
        let inode: UInt64
        init(device: UInt64, inode: UInt64) { (self.device, self.inode) = (device, inode) }
        /// The file `st` describes.
        init(_ st: stat) { self.init(device: UInt64(st.st_dev), inode: UInt64(st.st_ino)) }
        /// One word into the hasher (the inode spread, the device mixed in).
        func hash(into hasher: inout Hasher) { hasher.combine(inode &* 0x9E37_79B9_7F4A_7C15 ^ device) }
    }

    /// One watched directory and the runners' watches on it.
    final class Entry {
        unowned let table: DirectoryWatches
        let key: Key
        var source: EventSource?
        /// The watches on this directory, each knowing its slot (O(1) add
        /// and remove, no hashing). A removed watch leaves its slot empty
        /// for the next add (removal touches no other watch); the list goes
        /// with the last watch. Unretained: a watch is owned by its runner,
        /// which removes it here when it closes (and closes every watch
        /// when it stops or goes away).
        /// (No dynamic exclusivity checks: the loop thread only, and no
        /// access overlaps another; `dispatch` iterates over a copy.)
        @exclusivity(unchecked) var watches: [Unmanaged<FileWatchRunner.Watch>?] = []
        @exclusivity(unchecked) private var freeSlots: [Int] = []
        @exclusivity(unchecked) private var live = 0
        init(_ table: DirectoryWatches, _ key: Key) {
            self.table = table
            self.key = key
        }
        func add(_ watch: FileWatchRunner.Watch) {
            live += 1
            if let i = freeSlots.popLast() {
                watch.slot = i
                watches[i] = Unmanaged.passUnretained(watch)
            } else {
                watch.slot = watches.count
                watches.append(Unmanaged.passUnretained(watch))
            }
        }
        func remove(_ watch: FileWatchRunner.Watch) {
            let i = watch.slot
            guard i < watches.count, watches[i]?.toOpaque() == Unmanaged.passUnretained(watch).toOpaque() else { return }
            watches[i] = nil
            live -= 1
            if live == 0 {
                watches = []
                freeSlots = []
                table.drop(self)
            } else {
                freeSlots.append(i)
            }
        }
    }

    private let loop: EventLoop
    private var entries: [Key: Entry] = [:]
    /// A direct-mapped cache in front of `entries`, by inode: a path's
    /// directories are mostly the same ones as the last path's (`/`, `/etc`),
    /// found without hashing. Holds only entries that are in `entries`
    /// (`forget` clears a slot when its entry leaves).
    @exclusivity(unchecked) private var recent = [Entry?](repeating: nil, count: DirectoryWatches.recentSlots)
    private static let recentSlots = 64

    private static func slot(_ key: Key) -> Int { Int(truncatingIfNeeded: key.inode ^ (key.inode >> 6)) & (recentSlots - 1) }

    /// `e` leaves the table.
    private func forget(_ e: Entry) {
        if entries[e.key] === e { entries.removeValue(forKey: e.key) }
        let i = Self.slot(e.key)
        if recent[i] === e { recent[i] = nil }
    }

    /// The loop's check on the watches' armed flushes (the driver's).
    let flushGuard: FlushGuard

    init(loop: EventLoop, flushGuard: FlushGuard = FlushGuard()) {
        self.loop = loop
        self.flushGuard = flushGuard
    }

    /// How many directories are watched (tests).
    var count: Int { entries.count }

    /// The entry of directory `fd` (at `path`; `known`, its inode when the
    /// caller has it from an `fstat` of the same descriptor), made (its
    /// inotify source added) if it has none yet; the caller adds its watch
    /// to it at once. On failure, nil and `failure` says why.
    func entry(_ fd: Int32, path: Substring, key known: Key?, failure: inout SourceFailure?) -> Entry? {
        let key: Key
        if let known { key = known } else {
            var st = stat()
            guard fstat(fd, &st) == 0 else {
                failure = SystemdError("stat \(path)", errno: errno).failure
                return nil
            }
            key = Key(st)
        }
        let i = Self.slot(key)
        if let e = recent[i], e.key == key { return e }
        if let e = entries[key] {
            recent[i] = e
            return e
        }
        let e = Entry(self, key)
        var s: OpaquePointer?
        let r = sd_event_add_inotify_fd(loop.handle, &s, fd, FileWatchRunner.mask, { _, event, ud in
            guard let event, let ud else { return 0 }
            Unmanaged<Entry>.fromOpaque(ud).takeUnretainedValue().table.dispatch(ud, event)
            return 0
        }, Unmanaged.passUnretained(e).toOpaque())
        guard r >= 0 else {
            failure = SystemdError("inotify_add_watch \(path)", errno: -r).failure
            return nil
        }
        e.source = EventSource(s!)
        entries[key] = e
        recent[i] = e
        return e
    }

    private func dispatch(_ ud: UnsafeMutableRawPointer, _ event: UnsafePointer<inotify_event>) {
        let e = Unmanaged<Entry>.fromOpaque(ud).takeUnretainedValue()
        let mask = event.pointee.mask
        let name = CSystemd_inotify_event_name(event).map { String(cString: $0) }
        if mask & UInt32(IN_IGNORED | IN_UNMOUNT) != 0 {
            // The kernel dropped the watch: a later add must make a new one.
            forget(e)
        }
        // A handler may close watches (its own or, through a stop, others'):
        // the loop runs over a copy of the list as it was.
        // No watch is freed meanwhile (a handler closes watches, never
        // stops a runner).
        for case let u? in e.watches {
            let w = u.takeUnretainedValue()
            if w.entry === e { w.runner.handle(w, mask, name) }
        }
    }

    fileprivate func drop(_ e: Entry) {
        e.source?.close()
        e.source = nil
        forget(e)
    }
}

/// Keeps the file watches' flushes from being passed over for long.
///
/// A watch's flush runs below the descriptors' priority (one flush for a
/// burst of inotify events); while a flood keeps some descriptor ready at
/// every poll (sd-event polls before each dispatch once something is
/// pending, and dispatches the higher priority first) it would not run
/// until the flood ends. Each arm is noted here, oldest first; before each
/// loop iteration while any is noted (a prepare callback the driver sets
/// through `hook`) the oldest are asked whether they waited at least
/// `FileWatchRunner.flushStarvationBound` (by the loop's time of its last
/// wakeup), and those that did are raised.
/// One check per iteration however many watches are armed, each note
/// looked at until it is over or raised.
final class FlushGuard {
    /// Turns the per-iteration check on (true) or off; nil while no loop
    /// is attached (nothing is noted then).
    var hook: ((Bool) -> Void)? {
        didSet { if hook == nil { clear() } }
    }
    /// One arm of one runner.
    private struct Note {
        /// Weak: a note must not keep a runner alive, as a runner whose
        /// ticket goes away without a stop stops in its deinit (a runtime
        /// dropped without `shutdown()`); a runner gone is over.
        weak var runner: FileWatchRunner?
        let arm: UInt64
    }
    /// The notes, oldest first, from `head` on.
    private var notes: ContiguousArray<Note> = []
    private var head = 0
    private var hooked = false

    /// Notes `runner`'s arm `arm` (just armed). Before a loop is attached
    /// nothing is noted, and that arm is not checked (the runtime attaches
    /// before it starts anything).
    func note(_ runner: FileWatchRunner, arm: UInt64) {
        guard let hook else { return }
        notes.append(Note(runner: runner, arm: arm))
        if !hooked {
            hooked = true
            hook(true)
        }
    }

    /// The check, at loop time `now`: the notes over or raised are dropped
    /// from the front, up to the first that is still young.
    func check(now: UInt64) {
        while head < notes.count {
            if let runner = notes[head].runner, runner.passedOver(arm: notes[head].arm, now: now) == false { break }
            head += 1
        }
        if head == notes.count {
            notes.removeAll(keepingCapacity: notes.capacity <= 1024)
            head = 0
            if hooked {
                hooked = false
                hook?(false)
            }
        } else if head >= 1024, head * 2 >= notes.count {
            notes.removeFirst(head)
            head = 0
        }
    }

    /// How many notes are held (tests).
    var count: Int { notes.count - head }

    private func clear() {
        notes = []
        head = 0
        hooked = false
    }
}
