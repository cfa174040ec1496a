import Glibc

/// Reading a small file named by a user (a config file, a credential)
/// without ever waiting on a writer and without reading without bound: only
/// a regular file is read (a FIFO, a device or a directory is refused before
/// it is opened, and again after, by `fstat`, in case it was swapped in
/// between), the open is non-blocking, and at most `limit` bytes are read.
///
/// A path on a hung network mount can still block in `stat` or `read`:
/// call it from an offloaded task (`tasks.run(id:placement: .offload)`),
/// never on the loop thread.
public enum BoundedFile {
    /// Why a file was not read: one phrase (`No such file or directory`,
    /// `not a regular file (a FIFO)`, `too large (...)`).
    public struct Unreadable: Error, Equatable, Sendable, CustomStringConvertible {
        /// The phrase.
        public var reason: String
        /// The errno behind it, when there is one.
        public var errno: Int32?

        /// A failure for `reason` (with `errno` when a call failed).
        public init(reason: String, errno: Int32? = nil) {
            self.reason = reason
            self.errno = errno
        }

        /// The phrase.
        public var description: String { reason }
    }

    /// The bytes of the regular file at `path`.
    /// - Parameters:
    ///   - path: the file.
    ///   - limit: the most bytes accepted; a larger file is refused.
    /// - Returns: its bytes, or why not.
    public static func read(_ path: String, limit: Int) -> Result<[UInt8], Unreadable> {
        func refuse(_ reason: String, _ code: Int32? = nil) -> Result<[UInt8], Unreadable> {
            .failure(Unreadable(reason: reason, errno: code))
        }
        func failed() -> Result<[UInt8], Unreadable> {
            let e = Glibc.errno
            return refuse(String(cString: strerror(e)), e)
        }
        func kind(_ mode: mode_t) -> String? {
            switch mode & S_IFMT {
            case S_IFREG: nil
            case S_IFIFO: "a FIFO"
            case S_IFCHR: "a character device"
            case S_IFBLK: "a block device"
            case S_IFDIR: "a directory"
            case S_IFSOCK: "a socket"
            default: "not a regular file"
            }
        }
        var st = stat()
        guard stat(path, &st) == 0 else { return failed() }
        if let k = kind(st.st_mode) { return refuse("not a regular file (\(k))", EINVAL) }
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        guard fd >= 0 else { return failed() }
        defer { close(fd) }
        guard fstat(fd, &st) == 0 else { return failed() }
        if let k = kind(st.st_mode) { return refuse("not a regular file (\(k))", EINVAL) }
        if st.st_size > limit { return refuse("too large (\(st.st_size) bytes, at most \(limit))", EFBIG) }
        var data: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while data.count <= limit {
            let n = Glibc.read(fd, &chunk, chunk.count)
            if n < 0 {
                if Glibc.errno == EINTR { continue }
                return failed()
            }
            if n == 0 { break }
            data += chunk[..<n]
        }
        // The file grew while being read.
        if data.count > limit { return refuse("too large (more than \(limit) bytes)", EFBIG) }
        return .success(data)
    }

    /// The regular file at `path` as text (invalid UTF-8 repaired).
    /// - Parameters:
    ///   - path: the file.
    ///   - limit: the most bytes accepted; a larger file is refused.
    /// - Returns: its text, or why not.
    public static func readText(_ path: String, limit: Int) -> Result<String, Unreadable> {
        read(path, limit: limit).map { String(decoding: $0, as: UTF8.self) }
    }
}
