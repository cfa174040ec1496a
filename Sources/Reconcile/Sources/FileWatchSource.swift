/// Watches one path (a file or a directory) for changes.
///
/// A missing path is waited for, through missing parent directories, as
/// systemd path units do. Atomic replace by `rename` is seen. Deletion and
/// re-creation are events; the watch re-arms when the path returns.
public enum FileWatchSource: Source {
    /// `file`.
    public static let name = "file"

    /// What to do when the path is a symbolic link.
    public enum Symlinks: String, Hashable, Sendable {
        /// Watch what the link points to, as it is when the watch is armed
        /// (the default). Re-pointing the link itself is seen as a replace.
        case follow
        /// Watch the link itself, never its target.
        case noFollow
    }

    /// A file watch's parameters.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The absolute path watched.
        public var path: String
        /// The symlink policy.
        public var symlinks: Symlinks

        /// A watch on the absolute `path`, following symlinks unless told otherwise.
        public init(path: String, symlinks: Symlinks = .follow) {
            self.path = path
            self.symlinks = symlinks
        }

        /// The path, with `(no-follow)` when symlinks are not followed.
        public var description: String { symlinks == .follow ? path : "\(path) (no-follow)" }
    }

    /// What a file watch reports. Changes within one loop dispatch are
    /// coalesced into one event.
    public enum Event: Equatable, Sendable {
        /// The path appeared (created, moved in, or its directory came back).
        case created
        /// The file's contents or a directory's entries changed.
        case modified
        /// The path was atomically replaced (`rename` over it).
        case replaced
        /// The path is gone (deleted, moved away, or its directory removed).
        case deleted
        /// Events were lost (inotify queue overflow): re-read the path.
        case rescan
        /// The watch cannot be armed (permission denied, watch limit reached).
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

extension Subscription {
    /// A watch on `path`, keyed by the path unless `key` is given.
    public static func watch(
        _ path: String, symlinks: FileWatchSource.Symlinks = .follow,
        _ tag: @escaping (FileWatchSource.Event) -> Message
    ) -> Subscription {
        Subscription(FileWatchSource.self, key: path, configuration: .init(path: path, symlinks: symlinks), tag: tag)
    }

    /// A watch on `path` keyed by `key` (changing the path restarts the watch).
    public static func watch<Key: Hashable & Sendable>(
        _ path: String, key: Key, symlinks: FileWatchSource.Symlinks = .follow,
        _ tag: @escaping (FileWatchSource.Event) -> Message
    ) -> Subscription {
        Subscription(FileWatchSource.self, key: key, configuration: .init(path: path, symlinks: symlinks), tag: tag)
    }
}
