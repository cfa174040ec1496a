import Glibc
import Reconcile

/// Service credentials (`LoadCredential=`, `SetCredential=`,
/// `LoadCredentialEncrypted=` in the unit): files in
/// `$CREDENTIALS_DIRECTORY`, one per name, read-only for the service.
public enum Credentials {
    /// Why a credential was not read.
    public enum ReadError: Error, Equatable, Sendable, CustomStringConvertible {
        /// `CREDENTIALS_DIRECTORY` is not set (the unit passes no credentials).
        case noDirectory
        /// Not a credential name: empty, `.`, `..`, or containing `/`.
        case invalidName(String)
        /// The file could not be read (missing, not a regular file, too large...).
        case unreadable(String, BoundedFile.Unreadable)

        /// One sentence.
        public var description: String {
            switch self {
            case .noDirectory: "no credentials: CREDENTIALS_DIRECTORY is not set (LoadCredential= or SetCredential= in the unit)"
            case .invalidName(let n): "\"\(n)\" is not a credential name"
            case .unreadable(let n, let why): "credential \(n): \(why.reason)"
            }
        }
    }

    /// The directory systemd put the credentials in, if any.
    public static var directory: String? {
        guard let p = getenv("CREDENTIALS_DIRECTORY") else { return nil }
        let s = String(cString: p)
        return s.isEmpty ? nil : s
    }

    /// Whether `name` can name a credential (no `/`, not `.` or `..`, not empty).
    public static func isValidName(_ name: String) -> Bool {
        !name.isEmpty && name != "." && name != ".." && !name.contains("/") && !name.utf8.contains(0)
    }

    /// The path of credential `name`.
    /// - Parameter name: the credential's name.
    /// - Returns: the path, or why there is none.
    public static func path(of name: String) -> Result<String, ReadError> {
        guard isValidName(name) else { return .failure(.invalidName(name)) }
        guard let directory else { return .failure(.noDirectory) }
        return .success(directory + "/" + name)
    }

    /// Reads credential `name` as bytes, with the bounded, non-blocking read
    /// the indicator's config file uses (`BoundedFile`): only a regular
    /// file, opened `O_NONBLOCK`, at most `limit` bytes. Credentials live
    /// on a local ramfs, but call it from an offloaded task all the same
    /// when the directory could be elsewhere.
    /// - Parameters:
    ///   - name: the credential's name.
    ///   - limit: the most bytes accepted (default 1 MiB; systemd's own cap is 1 MiB).
    /// - Returns: the bytes, or why not.
    public static func bytes(_ name: String, limit: Int = 1 << 20) -> Result<[UInt8], ReadError> {
        path(of: name).flatMap { path in
            BoundedFile.read(path, limit: limit).mapError { .unreadable(name, $0) }
        }
    }

    /// Reads credential `name` as text; one trailing newline is dropped (a
    /// `SetCredential=` value or a file written with `echo` has one).
    /// - Parameters:
    ///   - name: the credential's name.
    ///   - limit: the most bytes accepted.
    /// - Returns: the text, or why not.
    public static func read(_ name: String, limit: Int = 1 << 20) -> Result<String, ReadError> {
        bytes(name, limit: limit).map { bytes in
            var text = String(decoding: bytes, as: UTF8.self)
            if text.hasSuffix("\n") { text.removeLast() }
            return text
        }
    }
}

extension Subscription {
    /// Watches credential `name` in `directory` where it can change (a
    /// credentials directory a tool or test rewrites): the file watch on its
    /// path with `.exists` first (`reportExisting`), so the program reads
    /// it at start and again after each change (`.modified`, `.replaced`).
    /// Systemd's own credentials directory stays the same for the whole run:
    /// there the watch reports `.exists` and nothing more. `directory` is
    /// configuration (`Credentials.directory`, read once in `main`), so
    /// `subscriptions(_:)` stays pure.
    ///
    /// - Parameters:
    ///   - name: the credential's name (`Credentials.isValidName`; a name
    ///     with `/` would watch another path).
    ///   - directory: the credentials directory.
    ///   - tag: makes a message of each file event.
    /// - Returns: the subscription, keyed by the credential's name.
    public static func credential(_ name: String, in directory: String,
                                  _ tag: @escaping (FileWatchSource.Event) -> Message) -> Subscription {
        .watch(directory + "/" + name, key: "credential:" + name, reportExisting: true, tag)
    }
}
