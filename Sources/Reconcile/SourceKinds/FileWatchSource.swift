/// Watches one path (a file or a directory) for changes.
///
/// The path is watched *as named*, like a systemd path unit: every directory
/// on the way is watched, so a missing path is waited for, and a renamed,
/// replaced or re-pointed directory or symlink on the way makes the watch
/// follow what the path names now. Atomic replace by `rename` is seen.
/// Deletion and re-creation are events. A watch that cannot be armed reports
/// `.failed` once and retries by itself under its restart policy
/// (`defaultRetry` unless told otherwise: 100 ms doubling to 10 s, no cap),
/// each retry announced by `.restarting(attempt:after:)`; with `.never` it
/// stays failed until its subscription changes, and at the policy's cap it
/// reports one last failure and stops retrying.
public enum FileWatchSource: Source {
    /// `file`.
    public static let name = "file"

    /// What to do when the path's last component is a symbolic link.
    /// Symlinks among the directories on the way are always followed.
    public enum Symlinks: String, Hashable, Sendable {
        /// Watch what the link points to (the default). Re-pointing the link,
        /// or replacing anything on the way to its target, is a `.replaced`.
        case follow
        /// Watch the link itself, never its target.
        case noFollow
    }

    /// A file watch's parameters.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The absolute path watched.
        public var path: String
        /// The symlink policy for the last component.
        public var symlinks: Symlinks
        /// Whether the first event says that the path exists (`.exists`) when
        /// it does as the watch is armed, so that a program reads a file
        /// only after its watch is in place (systemd's `PathExists=`).
        public var reportExisting: Bool
        /// How a watch that cannot be armed retries (`defaultRetry`).
        public var restart: RestartPolicy

        /// A watch on the absolute `path`, following symlinks unless told otherwise.
        /// - Parameters:
        ///   - path: The absolute path.
        ///   - symlinks: The symlink policy for the last component.
        ///   - reportExisting: Whether the first event says that the path exists.
        ///   - restart: How a watch that cannot be armed retries.
        public init(path: String, symlinks: Symlinks = .follow, reportExisting: Bool = false,
                    restart: RestartPolicy = FileWatchSource.defaultRetry) {
            self.path = path
            self.symlinks = symlinks
            self.reportExisting = reportExisting
            self.restart = restart
        }

        /// Whether `a` and `b` watch the same path the same way. Asked of
        /// every kept watch on every reconcile: the path compared by its
        /// bytes first (`Equality.strings`), the rest field by field. A
        /// field added must be compared here too (the synthesized hash
        /// covers it; `IdentityTests` changes each field).
        public static func == (a: Configuration, b: Configuration) -> Bool {
            a.symlinks == b.symlinks && a.reportExisting == b.reportExisting
                && (Equality.sameBytes(a.restart, b.restart) || a.restart == b.restart)
                && Equality.strings(a.path, b.path)
        }

        /// The path, with its flags (`no-follow`, `report-existing`, a
        /// restart policy other than the default) when set.
        public var description: String {
            var flags: [String] = []
            if symlinks == .noFollow { flags.append("no-follow") }
            if reportExisting { flags.append("report-existing") }
            if restart != FileWatchSource.defaultRetry { flags.append("restart \(restart)") }
            return flags.isEmpty ? path : "\(path) (\(flags.joined(separator: ", ")))"
        }
    }

    /// What a file watch reports. Changes seen within one loop dispatch are
    /// coalesced: no event twice in a row, and no `.modified` next to an
    /// event that already says "read it again".
    public enum Event: Equatable, Sendable {
        /// The path exists as the watch is armed: the first event of a watch
        /// with `reportExisting`, and the first event after a failed watch
        /// is armed again. Read the path now.
        case exists
        /// The path appeared (created, moved in, or its directory came back).
        case created
        /// A writer closed the file after writing (`IN_CLOSE_WRITE`), its
        /// attributes changed, or a watched directory's entries changed.
        case modified
        /// The path names a different file than before: `rename` over it, or
        /// a symlink or directory on the way re-pointed or replaced.
        case replaced
        /// The path is gone (deleted, moved away, or a directory on the way removed).
        case deleted
        /// Events were lost (inotify queue overflow): re-read the path.
        case rescan
        /// The watch cannot be armed (permission denied, watch limit reached).
        /// The source retries with a bounded backoff and reports `.exists`
        /// (or `.deleted`) once it is armed again.
        case failed(SourceFailure)
        /// The watch tries to arm itself again (attempt `attempt` of this
        /// failure) after `after`, by its restart policy. Added with restart
        /// policies: an exhaustive `switch` needs this case.
        case restarting(attempt: Int, after: Duration)
    }

    /// The retry a watch gets unless told otherwise: 100 ms doubling to
    /// 10 s, no jitter, no cap (it retries as long as it is wanted).
    public static let defaultRetry = RestartPolicy.backoff(Backoff(initial: .milliseconds(100), factor: 2, maximum: .seconds(10)))

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

extension Subscription {
    /// A watch on `path`, keyed by the path unless `key` is given.
    ///
    /// - Parameters:
    ///   - path: the absolute path.
    ///   - symlinks: the symlink policy for the last component.
    ///   - reportExisting: whether the first event says that the path exists.
    ///   - restart: how a watch that cannot be armed retries (`FileWatchSource.defaultRetry`).
    ///   - tag: makes a message of each event.
    @inlinable public static func watch(
        _ path: String, symlinks: FileWatchSource.Symlinks = .follow, reportExisting: Bool = false,
        restart: RestartPolicy = FileWatchSource.defaultRetry, _ tag: @escaping (FileWatchSource.Event) -> Message
    ) -> Subscription {
        Subscription(FileWatchSource.self, key: path,
                     configuration: .init(path: path, symlinks: symlinks, reportExisting: reportExisting, restart: restart), tag: tag)
    }

    /// A watch on `path` keyed by `key` (changing the path restarts the watch).
    ///
    /// - Parameters:
    ///   - path: the absolute path.
    ///   - key: the subscription's identity.
    ///   - symlinks: the symlink policy for the last component.
    ///   - reportExisting: whether the first event says that the path exists.
    ///   - restart: how a watch that cannot be armed retries (`FileWatchSource.defaultRetry`).
    ///   - tag: makes a message of each event.
    @inlinable public static func watch<Key: Hashable & Sendable>(
        _ path: String, key: Key, symlinks: FileWatchSource.Symlinks = .follow, reportExisting: Bool = false,
        restart: RestartPolicy = FileWatchSource.defaultRetry, _ tag: @escaping (FileWatchSource.Event) -> Message
    ) -> Subscription {
        Subscription(FileWatchSource.self, key: key,
                     configuration: .init(path: path, symlinks: symlinks, reportExisting: reportExisting, restart: restart), tag: tag)
    }
}
