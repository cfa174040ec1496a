import CSystemd
import Glibc
import Reconcile
import Synchronization

/// A socket this process was handed by systemd (socket activation) or
/// bound itself.
public struct ActivatedSocket: Hashable, Sendable, CustomStringConvertible {
    /// What kind of socket it is.
    public enum Kind: String, Hashable, Sendable {
        /// A listening stream socket (`Accept=no`): subscribe with `listen`.
        case listening
        /// A connected stream socket (`Accept=yes`, `--accept`): one connection.
        case connected
        /// A datagram socket: subscribe with `datagrams`.
        case datagram
        /// Something else (a FIFO, a netlink socket...).
        case other
    }

    /// The descriptor.
    public var fd: Int32
    /// Its name: `FileDescriptorName=` (`--fdname`), or `unknown` when systemd
    /// gave none; for a bound socket, the name asked for.
    public var name: String
    /// What kind of socket it is.
    public var kind: Kind

    /// A socket `fd` named `name` of `kind`.
    public init(fd: Int32, name: String, kind: Kind) {
        self.fd = fd
        self.name = name
        self.kind = kind
    }

    /// `web: fd 3 listening`.
    public var description: String { "\(name): fd \(fd) \(kind.rawValue)" }
}

/// Socket activation: the sockets systemd passes (`LISTEN_FDS`,
/// `LISTEN_PID`, `LISTEN_FDNAMES`), and binding an address by hand when
/// there are none.
public enum SocketActivation {
    private static let taken = Mutex<[ActivatedSocket]?>(nil)

    /// The sockets systemd passed to this process, read once
    /// (`sd_listen_fds_with_names`) and the `LISTEN_*` variables unset so
    /// children do not inherit them; later calls return the same list.
    /// Empty when `LISTEN_PID` names another process (nothing is adopted).
    public static func adopted() -> [ActivatedSocket] {
        taken.withLock { taken in
            if let taken { return taken }
            var names: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
            let n = sd_listen_fds_with_names(1, &names)
            var sockets: [ActivatedSocket] = []
            if n > 0 {
                for i in 0..<Int(n) {
                    let fd = SD_LISTEN_FDS_START + Int32(i)
                    let name = names?[i].map { String(cString: $0) } ?? "unknown"
                    sockets.append(ActivatedSocket(fd: fd, name: name, kind: kind(of: fd)))
                }
            }
            if let names {
                for i in 0..<Int(max(n, 0)) { free(names[i]) }
                free(names)
            }
            taken = sockets
            return sockets
        }
    }

    /// The kind of socket `fd` is.
    public static func kind(of fd: Int32) -> ActivatedSocket.Kind {
        var type: Int32 = 0, listening: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) == 0 else { return .other }
        if type == Int32(SOCK_DGRAM.rawValue) { return .datagram }
        guard type == Int32(SOCK_STREAM.rawValue) || type == Int32(SOCK_SEQPACKET.rawValue) else { return .other }
        length = socklen_t(MemoryLayout<Int32>.size)
        _ = getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length)
        return listening != 0 ? .listening : .connected
    }

    /// The passed socket named `name`, or one bound to `address` when
    /// systemd passed none of that name (run by hand).
    ///
    /// - Parameters:
    ///   - name: the `FileDescriptorName=` to look for.
    ///   - address: what to bind otherwise (see `bind(_:datagram:)`); nil: none.
    ///   - datagram: whether a bound socket is a datagram one.
    /// - Returns: the socket, or nil when neither was possible without an address.
    /// - Throws: `SystemdError` when binding fails.
    public static func socket(named name: String, orBind address: String?, datagram: Bool = false) throws(SystemdError) -> ActivatedSocket? {
        if let found = adopted().first(where: { $0.name == name }) { return found }
        guard let address else { return nil }
        let fd = try bind(address, datagram: datagram)
        return ActivatedSocket(fd: fd, name: name, kind: datagram ? .datagram : .listening)
    }

    /// Whether a socket is bound at the unix `address`: a non-blocking
    /// connect of the same type is refused (`ECONNREFUSED`) only when nothing
    /// is. A live stream listener sees the probe as one connection that ends
    /// at once.
    private static func isLive(_ address: inout sockaddr_storage, _ length: socklen_t, type: Int32) -> Bool {
        let probe = Glibc.socket(AF_UNIX, type | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard probe >= 0 else { return false }
        defer { close(probe) }
        let r = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(probe, $0, length) } }
        if r == 0 { return true }
        let e = errno
        return e != ECONNREFUSED && e != ENOENT
    }

    /// A socket bound to `address` (and listening, for a stream socket),
    /// close-on-exec, as systemd's `ListenStream=` / `ListenDatagram=`
    /// would: `/path` (a stale socket file there is replaced; one a live socket
    /// is bound to is `EADDRINUSE`), `@abstract`,
    /// `1.2.3.4:80`, `[::1]:80`, or a bare port (all addresses, IPv6 and IPv4).
    ///
    /// - Parameters:
    ///   - address: the address.
    ///   - datagram: a datagram socket instead of a listening stream socket.
    /// - Returns: the descriptor.
    /// - Throws: `SystemdError` naming the failed call.
    public static func bind(_ address: String, datagram: Bool = false) throws(SystemdError) -> Int32 {
        let type = (datagram ? Int32(SOCK_DGRAM.rawValue) : Int32(SOCK_STREAM.rawValue)) | Int32(SOCK_CLOEXEC.rawValue)
        var storage = sockaddr_storage()
        var length: socklen_t
        let family: Int32
        if address.hasPrefix("/") || address.hasPrefix("@") {
            family = AF_UNIX
            var un = sockaddr_un()
            un.sun_family = sa_family_t(AF_UNIX)
            var path = Array(address.utf8)
            guard path.count < MemoryLayout.size(ofValue: un.sun_path) else {
                throw SystemdError("bind \(address)", errno: ENAMETOOLONG)
            }
            if path.first == UInt8(ascii: "@") { path[0] = 0 }
            withUnsafeMutableBytes(of: &un.sun_path) { $0.copyBytes(from: path) }
            length = socklen_t(MemoryLayout<sa_family_t>.size + path.count + (path.first == 0 ? 0 : 1))
            withUnsafeMutableBytes(of: &storage) { s in withUnsafeBytes(of: un) { s.copyMemory(from: $0) } }
            if path.first != 0 {
                var st = stat()
                if lstat(address, &st) == 0, st.st_mode & 0o170000 == 0o140000 {
                    // Replace a stale socket file only: one a live socket is
                    // bound to (a second instance run by hand) is in use.
                    if isLive(&storage, length, type: type) {
                        throw SystemdError("bind \(address): a live socket is bound there", errno: EADDRINUSE)
                    }
                    unlink(address)
                }
            }
        } else {
            var host = "", portText = address
            if address.hasPrefix("["), let close = address.firstIndex(of: "]") {
                host = String(address[address.index(after: address.startIndex)..<close])
                portText = String(address[address.index(after: close)...].drop { $0 == ":" })
            } else if let colon = address.lastIndex(of: ":") {
                host = String(address[..<colon])
                portText = String(address[address.index(after: colon)...])
            }
            guard let port = UInt16(portText) else { throw SystemdError("bind \(address): not an address", errno: EINVAL) }
            if host.isEmpty || host.contains(":") {
                family = AF_INET6
                var in6 = sockaddr_in6()
                in6.sin6_family = sa_family_t(AF_INET6)
                in6.sin6_port = port.bigEndian
                if !host.isEmpty, inet_pton(AF_INET6, host, &in6.sin6_addr) != 1 {
                    throw SystemdError("bind \(address): not an IPv6 address", errno: EINVAL)
                }
                length = socklen_t(MemoryLayout<sockaddr_in6>.size)
                withUnsafeMutableBytes(of: &storage) { s in withUnsafeBytes(of: in6) { s.copyMemory(from: $0) } }
            } else {
                family = AF_INET
                var in4 = sockaddr_in()
                in4.sin_family = sa_family_t(AF_INET)
                in4.sin_port = port.bigEndian
                guard inet_pton(AF_INET, host, &in4.sin_addr) == 1 else {
                    throw SystemdError("bind \(address): not an IPv4 address", errno: EINVAL)
                }
                length = socklen_t(MemoryLayout<sockaddr_in>.size)
                withUnsafeMutableBytes(of: &storage) { s in withUnsafeBytes(of: in4) { s.copyMemory(from: $0) } }
            }
        }
        let fd = Glibc.socket(family, type, 0)
        guard fd >= 0 else { throw SystemdError("socket", errno: errno) }
        var one: Int32 = 1, zero: Int32 = 0
        if family != AF_UNIX { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size)) }
        if family == AF_INET6 { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &zero, socklen_t(MemoryLayout<Int32>.size)) }
        let r = withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(fd, $0, length) } }
        if r != 0 {
            let e = errno
            close(fd)
            throw SystemdError("bind \(address)", errno: e)
        }
        if !datagram, listen(fd, SOMAXCONN) != 0 {
            let e = errno
            close(fd)
            throw SystemdError("listen \(address)", errno: e)
        }
        return fd
    }

    /// A connected socket handed over whole (`Accept=yes`, `--accept`) as a
    /// `Connection` a `Subscription.connection` can read and the driver
    /// write to. Its id is derived from the descriptor (from the top of the
    /// id space, apart from a listener's).
    ///
    /// - Parameter socket: a `.connected` socket.
    /// - Returns: the connection, with its peer's address and, on `AF_UNIX`, credentials.
    public static func connection(_ socket: ActivatedSocket) -> Connection {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(socket.fd, $0, &length) } }
        return Connection(id: UInt64.max - UInt64(UInt32(bitPattern: socket.fd)), fd: socket.fd, listener: socket.name,
                          peer: peerAddress(storage, length), credentials: peerCredentials(socket.fd))
    }
}

/// `SO_PEERCRED` of a unix socket; nil for another family.
func peerCredentials(_ fd: Int32) -> PeerCredentials? {
    var pid: Int32 = 0, uid: UInt32 = 0, gid: UInt32 = 0
    guard CSystemd_peer_credentials(fd, &pid, &uid, &gid) == 0, pid > 0 else { return nil }
    return PeerCredentials(pid: pid, uid: uid, gid: gid)
}
