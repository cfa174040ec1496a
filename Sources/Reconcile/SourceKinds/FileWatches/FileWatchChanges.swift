/// What a watched path names, by identity: a resolution's result.
package enum PathTarget: Equatable, Sendable {
    /// The path names nothing (a component is missing, a file stands where a
    /// directory is needed, or a symlink loops).
    case missing
    /// The path names this file.
    case found(device: UInt64, inode: UInt64)

    /// The event for a path that named `before` and names `self` after a
    /// change of a looked-up name (`touched`: a name on the way was created,
    /// deleted or moved, so the same inode can still be a replacement, as
    /// when a symlink is re-pointed to a hard link of the same file), or nil
    /// when nothing the program reads changed. `recovering`: the watch was
    /// failed and is armed again, so changes in between went unseen: what
    /// is there now is reported (`.exists`), or that what was there is gone.
    package func change(from before: PathTarget, touched: Bool, recovering: Bool) -> FileWatchSource.Event? {
        if recovering {
            if self != .missing { return .exists }
            return before != .missing ? .deleted : nil
        }
        switch (before, self) {
        case (.missing, .found): return .created
        case (.found, .missing): return .deleted
        case (.found, .found) where before != self || touched: return .replaced
        default: return nil
        }
    }
}

/// The events a file watch has seen and not yet handed out, coalesced: no
/// event twice in a row, and no `.modified` beside an event that already
/// says "read it again" (a creation, a replacement, `.exists`, a rescan).
/// A `.modified` after a `.deleted` alone is kept (the file came back
/// between the two and was written).
package struct FileWatchChanges {
    /// The events, in order.
    package private(set) var events: [FileWatchSource.Event] = []

    /// No events.
    package init() {}

    /// Whether there is nothing to hand out.
    package var isEmpty: Bool { events.isEmpty }

    /// Adds `event`, coalesced with what is pending.
    package mutating func record(_ event: FileWatchSource.Event) {
        switch event {
        case .modified:
            if events.contains(where: { $0 != .deleted }) { return }
        case .created, .replaced, .exists, .rescan:
            events.removeAll { $0 == .modified }
        case .deleted, .failed, .restarting:
            break
        }
        if let last = events.last, last == event { return }
        events.append(event)
    }

    /// The pending events, leaving none.
    package mutating func take() -> [FileWatchSource.Event] {
        defer { events = [] }
        return events
    }

    /// Drops what is pending, keeping the storage for later events.
    package mutating func clear() {
        if !events.isEmpty { events.removeAll(keepingCapacity: true) }
    }
}
