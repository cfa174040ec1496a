/// The rules by which a watched path is resolved, one component at a time,
/// the way the kernel resolves it: `.` stays, `..` goes to the parent of the
/// directory *reached* (not of the path's text), a symbolic link's target is
/// resolved in place of the link (from `/` when absolute), at most
/// `maximumLinks` links are followed before the path is taken to name
/// nothing (`ELOOP`), and a file where a directory is needed names nothing.
///
/// A value with no I/O: the file watch's shell (`FileWatchRunner` in
/// ReconcileSystemd) asks for the next ``Step``, performs it (`openat`,
/// `fstat`, `readlink`) and reports what it found; the rules are tested
/// against a file system made of values (`PathResolutionTests`). Nothing is
/// allocated per component for a path with no symlinks: names are slices of
/// the path, and the directory's name for messages is a prefix of it while
/// the resolution follows the path as written.
package struct PathResolution {
    /// The path resolved (absolute).
    package let path: String
    private let followsFinalLink: Bool
    private let maximumLinks: Int
    /// The components still to resolve: the pushed ones (a link's target),
    /// last first, then the path's own from `rest` on.
    private var rest: PathComponents
    private var pushed: [Substring] = []
    /// Symlinks followed so far.
    package private(set) var links = 0
    /// `/`, as a slice of `path`.
    private let root: Substring
    /// The directory the resolution is in, for messages (and for `..`
    /// in them): a prefix of `path` while `directoryIsPrefix`.
    package private(set) var directory: Substring
    private var directoryIsPrefix = true
    /// The name being looked up, set by `next()`'s `.lookUp`.
    private var name: Substring = ""
    private var own = false
    private var last = false

    /// One thing the shell does next.
    package enum Step: Equatable {
        /// Watch the current directory, then look `name` up in it without
        /// following it (`O_PATH | O_NOFOLLOW`), and report what it is with
        /// ``PathResolution/found(_:)`` (or stop: the path names nothing
        /// when it is not there). `own`: the name is a component of the path
        /// as written, not of a link's target.
        case lookUp(name: Substring, own: Bool)
        /// Go to the current directory's parent (a `..` component), then
        /// call ``PathResolution/enteredParent()``.
        case parent
        /// Nothing is left: the target is the current directory (the path
        /// is `/`, or ends in `..`), watched for its entries.
        case currentDirectory
    }

    /// What a looked-up name is.
    package enum Kind: Equatable {
        case directory, symlink, other
    }

    /// What the shell does with a looked-up name.
    package enum Verdict: Equatable {
        /// A directory on the way: it becomes the current directory.
        case enter
        /// The name is what the path names (the last component).
        case target
        /// A link to follow: read it and pass its text to ``PathResolution/follow(_:)``.
        case readLink
        /// The path names nothing from here: a file where a directory is
        /// needed, or more than `maximumLinks` links (a loop). The watches
        /// armed so far see that change.
        case namesNothing
    }

    /// The resolution of the absolute `path`; `followsFinalLink` says
    /// whether a symlink as the last component is followed (links on the way
    /// always are).
    package init(path: String, followsFinalLink: Bool, maximumLinks: Int = 40) {
        self.path = path
        self.followsFinalLink = followsFinalLink
        self.maximumLinks = maximumLinks
        rest = PathComponents(path)
        let utf8 = path.utf8
        root = Substring(utf8[utf8.startIndex..<(utf8.isEmpty ? utf8.startIndex : utf8.index(after: utf8.startIndex))])
        directory = root
    }

    /// The next step; `.lookUp` until the path ends.
    package mutating func next() -> Step {
        while true {
            let own: Bool
            let name: Substring
            if let n = pushed.popLast() {
                (name, own) = (n, false)
            } else if let n = rest.next() {
                (name, own) = (n, true)
            } else {
                return .currentDirectory
            }
            if Self.isDot(name) { continue }
            if Self.isDotDot(name) { return .parent }
            self.name = name
            self.own = own
            last = pushed.allSatisfy(Self.isDot) && rest.onlyDotsLeft
            return .lookUp(name: name, own: own)
        }
    }

    /// The shell is in the parent of the directory it was in.
    package mutating func enteredParent() {
        directory = Substring(Self.parent(of: directory))
        directoryIsPrefix = false
    }

    /// The name being looked up, with its directory: for messages, and the
    /// name of the directory entered. A prefix of `path` (no new string)
    /// when the name is the path's own and directly follows a directory
    /// that is a prefix.
    package var namePath: Substring {
        isPrefix ? Substring(path.utf8[..<name.endIndex]) : Substring(Self.join(directory, name))
    }

    private var isPrefix: Bool {
        directoryIsPrefix && own
            && name.startIndex == (directory.endIndex == root.endIndex ? root.endIndex : path.utf8.index(after: directory.endIndex))
    }

    /// What the looked-up name is; says what to do with it.
    package mutating func found(_ kind: Kind) -> Verdict {
        switch kind {
        case .symlink where !last || followsFinalLink:
            links += 1
            return links <= maximumLinks ? .readLink : .namesNothing
        case _ where last:
            return .target
        case .directory:
            let prefix = isPrefix
            directory = namePath
            directoryIsPrefix = prefix
            return .enter
        case .symlink, .other:
            return .namesNothing
        }
    }

    /// Resolves the link's text `target` in place of the link: true when it
    /// is absolute, and the shell goes to `/` first.
    package mutating func follow(_ target: String) -> Bool {
        // Pushed on top of the components not resolved yet.
        pushed.append(contentsOf: Array(rest).reversed())
        rest.finish()
        pushed.append(contentsOf: Array(PathComponents(target)).reversed())
        guard target.utf8.first == UInt8(ascii: "/") else { return false }
        directory = "/"
        directoryIsPrefix = false
        return true
    }

    private static func isDot(_ name: Substring) -> Bool {
        name.utf8.count == 1 && name.utf8.first == UInt8(ascii: ".")
    }

    private static func isDotDot(_ name: Substring) -> Bool {
        name.utf8.count == 2 && name.utf8.first == UInt8(ascii: ".") && name.utf8.last == UInt8(ascii: ".")
    }

    private static func join(_ directory: Substring, _ name: Substring) -> String {
        directory == "/" ? "/" + name : directory + "/" + name
    }

    private static func parent(of p: Substring) -> String {
        guard let slash = p.utf8.lastIndex(of: UInt8(ascii: "/")), slash != p.startIndex else { return "/" }
        return String(p[..<slash])
    }
}

/// The components of a path, read one at a time: the slices between its `/`
/// bytes, empty ones left out, as the kernel reads a path (no string per
/// component, no grapheme breaking).
package struct PathComponents: Sequence, IteratorProtocol {
    private let path: String
    private var index: String.Index

    /// The components of `path`.
    package init(_ path: String) {
        self.path = path
        index = path.utf8.startIndex
    }

    /// The next component, if any.
    package mutating func next() -> Substring? {
        let utf8 = path.utf8
        let slash = UInt8(ascii: "/")
        while index != utf8.endIndex && utf8[index] == slash { index = utf8.index(after: index) }
        guard index != utf8.endIndex else { return nil }
        let start = index
        while index != utf8.endIndex && utf8[index] != slash { index = utf8.index(after: index) }
        return Substring(utf8[start..<index])
    }

    /// Reads nothing more.
    package mutating func finish() { index = path.utf8.endIndex }

    /// Whether every component left is `.` (read on the bytes, no slice).
    package var onlyDotsLeft: Bool {
        let utf8 = path.utf8
        var i = index
        var length = 0
        while i != utf8.endIndex {
            let byte = utf8[i]
            if byte == UInt8(ascii: "/") {
                length = 0
            } else {
                length += 1
                if byte != UInt8(ascii: ".") || length > 1 { return false }
            }
            i = utf8.index(after: i)
        }
        return true
    }
}
