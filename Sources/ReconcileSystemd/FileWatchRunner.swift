import CSystemd
import Glibc
import Reconcile

extension FileWatchSource: SystemdSource {
    /// Arms inotify watches for `configuration` on the context's loop.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        context.driver.keepInotifyOpen()
        return try FileWatchRunner(ticket: ticket, configuration: configuration, loop: context.loop)
    }
}

/// Watches one path through inotify on the loop.
///
/// The parent directory is watched and filtered by name (so atomic replace
/// and re-creation are seen); a directory path is also watched itself for its
/// entries; a followed symlink also gets a watch on its target. A missing
/// directory is waited for by watching the nearest existing ancestor. Changes
/// seen within one loop dispatch are coalesced and emitted by a lower-priority
/// deferred source.
final class FileWatchRunner: RunningSource {
    /// Which inotify watch an event came from.
    enum Role { case parent, target, ancestor }

    /// One inotify source and its role; the sd-event userdata.
    final class Watch {
        unowned let runner: FileWatchRunner
        let role: Role
        var source: EventSource?
        init(_ runner: FileWatchRunner, _ role: Role) {
            self.runner = runner
            self.role = role
        }
        func close() {
            source?.close()
            source = nil
        }
    }

    private let ticket: SourceTicket
    private let loop: EventLoop
    private let path: String
    private let parent: String
    private let name: String
    private let follow: Bool

    private var parentWatch: Watch?
    private var targetWatch: Watch?
    private var ancestorWatch: Watch?
    private var flush: EventSource?
    private var exists = false
    private var pending: [FileWatchSource.Event] = []
    private var needsRearm = false
    private var armed = false

    private static let parentMask = UInt32(IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CLOSE_WRITE
        | IN_MODIFY | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
    private static let directoryMask = UInt32(IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CLOSE_WRITE
        | IN_ATTRIB | IN_ONLYDIR)
    private static let targetMask = UInt32(IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB)
    private static let ancestorMask = UInt32(IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
    private static let goneMask = UInt32(IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT)

    init(ticket: SourceTicket, configuration c: FileWatchSource.Configuration, loop: EventLoop) throws {
        self.ticket = ticket
        self.loop = loop
        guard c.path.hasPrefix("/") else {
            throw SourceFailure(operation: "watch \(c.path)", code: EINVAL, reason: "the path must be absolute")
        }
        var p = c.path
        while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
        path = p
        let slash = p.lastIndex(of: "/")!
        parent = slash == p.startIndex ? "/" : String(p[..<slash])
        name = String(p[p.index(after: slash)...])
        follow = c.symlinks == .follow
        var s: OpaquePointer?
        try check("sd_event_add_defer", sd_event_add_defer(loop.handle, &s, { _, ud in
            Unmanaged<FileWatchRunner>.fromOpaque(ud!).takeUnretainedValue().flushPending()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque()))
        flush = EventSource(s!)
        // Run after this iteration's inotify events have been handed out.
        sd_event_source_set_priority(s, Int64(SD_EVENT_PRIORITY_NORMAL) + 10)
        sd_event_source_set_enabled(s, Int32(SD_EVENT_OFF))
        do {
            try arm()
        } catch {
            stop()
            throw error
        }
    }

    // MARK: Arming

    /// Sets up the watches for the file system as it is now and records what
    /// changed about the path's existence. Throws only what the program must
    /// hear about (permission denied, watch limits).
    private func arm() throws(SystemdError) {
        closeWatches()
        needsRearm = false
        let existed = exists
        do {
            parentWatch = try addWatch(parent, Self.parentMask, .parent)
        } catch where error.errno == ENOENT || error.errno == ENOTDIR {
            exists = false
            if existed { record(.deleted) }
            armed = true
            try waitForAncestor()
            return
        }
        exists = pathExists()
        armTarget()
        if armed && exists != existed { record(exists ? .created : .deleted) }
        armed = true
    }

    /// A directory path is watched for its entries; a followed symlink for its
    /// target's changes. Best effort: the parent watch still sees the name.
    private func armTarget() {
        targetWatch?.close(); targetWatch = nil
        guard exists else { return }
        var st = stat()
        guard lstat(path, &st) == 0 else { return }
        let type = st.st_mode & S_IFMT
        if type == S_IFDIR {
            targetWatch = try? addWatch(path, Self.directoryMask, .target)
        } else if type == S_IFLNK && follow {
            targetWatch = try? addWatch(path, isDirectory(path) ? Self.directoryMask : Self.targetMask, .target)
        }
    }

    private func waitForAncestor() throws(SystemdError) {
        var dir = parent
        while dir != "/" {
            let slash = dir.lastIndex(of: "/")!
            dir = slash == dir.startIndex ? "/" : String(dir[..<slash])
            do {
                ancestorWatch = try addWatch(dir, Self.ancestorMask, .ancestor)
                break
            } catch where (error.errno == ENOENT || error.errno == ENOTDIR) && dir != "/" {
                continue
            }
        }
        // The directories may have appeared before the watch was in place.
        if isDirectory(parent) { scheduleRearm() }
    }

    private func addWatch(_ path: String, _ mask: UInt32, _ role: Role) throws(SystemdError) -> Watch {
        let watch = Watch(self, role)
        var s: OpaquePointer?
        let m = follow || role != .parent ? mask : mask | UInt32(IN_DONT_FOLLOW)
        try check("sd_event_add_inotify \(path)", sd_event_add_inotify(loop.handle, &s, path, m, { _, event, ud in
            guard let event, let ud else { return 0 }
            let watch = Unmanaged<Watch>.fromOpaque(ud).takeUnretainedValue()
            watch.runner.handle(watch, event.pointee.mask, CSystemd_inotify_event_name(event).map { String(cString: $0) })
            return 0
        }, Unmanaged.passUnretained(watch).toOpaque()))
        watch.source = EventSource(s!)
        return watch
    }

    // MARK: Events

    private func handle(_ watch: Watch, _ mask: UInt32, _ entry: String?) {
        guard watch.source != nil else { return }
        defer { scheduleFlush() }
        if mask & UInt32(IN_Q_OVERFLOW) != 0 {
            // Events were lost on this loop's inotify queue: say so, then
            // look at the file system again.
            record(.rescan)
            scheduleRearm()
            return
        }
        switch watch.role {
        case .parent:
            if entry == nil, mask & Self.goneMask != 0 {
                // The parent directory itself went away.
                watch.close()
                scheduleRearm()
                return
            }
            guard entry == name else { return }
            if mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0 {
                record(exists ? .replaced : .created)
                exists = true
                armTarget()
            } else if mask & UInt32(IN_DELETE | IN_MOVED_FROM) != 0 {
                if exists { record(.deleted) }
                exists = false
                targetWatch?.close(); targetWatch = nil
            } else if mask & UInt32(IN_CLOSE_WRITE | IN_MODIFY | IN_ATTRIB) != 0 {
                record(.modified)
            }
        case .target:
            if mask & Self.goneMask != 0 {
                watch.close()
                return
            }
            record(.modified)
        case .ancestor:
            scheduleRearm()
        }
    }

    private func record(_ event: FileWatchSource.Event) {
        // Coalesce: one of each kind per flush; a creation or replacement
        // already says "read it again", so a modification adds nothing.
        if event == .modified, pending.contains(where: { $0 == .created || $0 == .replaced || $0 == .modified }) { return }
        if let last = pending.last, last == event { return }
        pending.append(event)
    }

    private func scheduleRearm() {
        needsRearm = true
        scheduleFlush()
    }

    private func scheduleFlush() {
        if let h = flush?.handle { sd_event_source_set_enabled(h, Int32(SD_EVENT_ONESHOT)) }
    }

    private func flushPending() {
        if needsRearm {
            do {
                try arm()
            } catch {
                emit(pending)
                pending = []
                ticket.fail(error.failure)
                return
            }
        }
        let events = pending
        pending = []
        emit(events)
    }

    private func emit(_ events: [FileWatchSource.Event]) {
        for e in events {
            guard flush != nil else { return }   // stopped by an earlier event's update
            ticket.emit(e)
        }
    }

    private func pathExists() -> Bool {
        var st = stat()
        return follow ? stat(path, &st) == 0 : lstat(path, &st) == 0
    }

    private func isDirectory(_ p: String) -> Bool {
        var st = stat()
        return stat(p, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR
    }

    func retune(to configuration: AnyHashable) throws {}

    private func closeWatches() {
        parentWatch?.close(); parentWatch = nil
        targetWatch?.close(); targetWatch = nil
        ancestorWatch?.close(); ancestorWatch = nil
    }

    func stop() {
        closeWatches()
        flush?.close(); flush = nil
        pending = []
    }
}
