import CSystemd
import Glibc
import Reconcile

/// The service manager's file descriptor store (`FileDescriptorStoreMax=`
/// in the unit): descriptors handed to systemd survive a restart of the
/// service and come back to the next instance through `LISTEN_FDS` /
/// `LISTEN_FDNAMES`, under the name they were stored with (where
/// `SocketActivation.adopted()` and `Daemon.socket(named:orBind:)` find
/// them, beside the socket units' sockets).
public enum FileDescriptorStore {
    /// Why a descriptor could not be stored or removed.
    public enum StoreError: Error, Equatable, CustomStringConvertible {
        /// A name systemd refuses: empty, longer than 255 bytes, or with a
        /// `:` or a character that is not printable ASCII.
        case invalidName(String)
        /// No service manager listens (`NOTIFY_SOCKET` unset).
        case noManager
        /// Sending failed: the errno.
        case notSent(Int32)

        /// One sentence.
        public var description: String {
            switch self {
            case .invalidName(let n): "\"\(n)\" is not a descriptor name systemd accepts (1-255 printable ASCII characters, no ':')"
            case .noManager: "no service manager listens (NOTIFY_SOCKET is not set): nothing is stored"
            case .notSent(let e): "the fd store message was not sent: \(String(cString: strerror(e))) (errno \(e))"
            }
        }
    }

    /// Whether systemd accepts `name` as an `FDNAME=` (its `fdname_is_valid`).
    public static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        return !bytes.isEmpty && bytes.count <= 255 && bytes.allSatisfy { $0 >= 0x20 && $0 < 0x7F && $0 != UInt8(ascii: ":") }
    }

    /// Hands `fd` to the manager's store under `name` (`FDSTORE=1`,
    /// `FDNAME=`). The descriptor stays open here too. Storing the same open
    /// file again is ignored by systemd; a unit without
    /// `FileDescriptorStoreMax=` drops it (systemd logs that).
    /// The corresponding C function is `sd_pid_notify_with_fds`.
    ///
    /// - Parameters:
    ///   - fd: the descriptor.
    ///   - name: its name in the store (what `LISTEN_FDNAMES` says after a restart).
    ///   - poll: whether systemd drops it on `EPOLLHUP`/`EPOLLERR`
    ///     (`FDPOLL=0` when false: for a descriptor that reports hang-ups
    ///     while it is still wanted).
    /// - Throws: `StoreError`.
    public static func store(_ fd: Int32, name: String, poll: Bool = true) throws(StoreError) {
        guard isValidName(name) else { throw .invalidName(name) }
        guard ServiceManager.isListening else { throw .noManager }
        let message = "FDSTORE=1\nFDNAME=\(name)" + (poll ? "" : "\nFDPOLL=0")
        let r = [fd].withUnsafeBufferPointer { sd_pid_notify_with_fds(0, 0, message, $0.baseAddress, 1) }
        if r < 0 { throw .notSent(-r) }
        if r == 0 { throw .noManager }
    }

    /// Removes every descriptor stored under `name` (`FDSTOREREMOVE=1`).
    /// The corresponding C function is `sd_notify`.
    /// - Parameter name: the name they were stored with.
    /// - Throws: `StoreError`.
    public static func remove(named name: String) throws(StoreError) {
        guard isValidName(name) else { throw .invalidName(name) }
        guard ServiceManager.isListening else { throw .noManager }
        let r = sd_notify(0, "FDSTOREREMOVE=1\nFDNAME=\(name)")
        if r < 0 { throw .notSent(-r) }
        if r == 0 { throw .noManager }
    }

    /// The descriptors passed to this process under `name`: from the store
    /// after a restart, or from a socket unit (`SocketActivation.adopted()`).
    /// - Parameter name: the name they were stored with.
    /// - Returns: them, in the order systemd passed them.
    public static func restored(named name: String) -> [ActivatedSocket] {
        SocketActivation.adopted().filter { $0.name == name }
    }

    /// The socket named `name` that survives restarts: the one systemd
    /// passed back (the fd store, or a socket unit), else one bound to
    /// `address` now and handed to the store under `name`, so the instance
    /// after `systemctl restart` gets the same socket (connections wait in
    /// its backlog in between instead of being refused).
    ///
    /// - Parameters:
    ///   - name: the descriptor's name (`FDNAME=`, `LISTEN_FDNAMES`).
    ///   - address: what to bind when systemd passed none (`SocketActivation.bind(_:datagram:)`).
    ///   - datagram: whether a bound socket is a datagram one.
    /// - Returns: the socket, and whether it was passed back (`restored`)
    ///   or bound now and stored (`stored`; false when no manager listens:
    ///   it works, it just does not survive).
    /// - Throws: `StoreError.invalidName`, `.notSent`; `SystemdError` when binding fails.
    public static func socket(named name: String, orBind address: String, datagram: Bool = false) throws -> (socket: ActivatedSocket, restored: Bool, stored: Bool) {
        guard isValidName(name) else { throw StoreError.invalidName(name) }
        if let passed = restored(named: name).first { return (passed, true, false) }
        let fd = try SocketActivation.bind(address, datagram: datagram)
        let socket = ActivatedSocket(fd: fd, name: name, kind: datagram ? .datagram : .listening)
        do {
            try store(fd, name: name)
        } catch .noManager {
            return (socket, false, false)
        } catch {
            close(fd)
            throw error
        }
        return (socket, false, true)
    }
}

extension Daemon {
    /// `FileDescriptorStore.socket(named:orBind:datagram:)`, logged: the
    /// socket passed back after a restart, or bound now and stored.
    ///
    /// - Parameters:
    ///   - name: the descriptor's name (`FDNAME=`, `LISTEN_FDNAMES`).
    ///   - address: what to bind when systemd passed none.
    ///   - datagram: whether a bound socket is a datagram one.
    /// - Returns: the socket.
    /// - Throws: what `FileDescriptorStore.socket(named:orBind:datagram:)` throws.
    public func storedSocket(named name: String, orBind address: String, datagram: Bool = false) throws -> ActivatedSocket {
        let (socket, restored, stored) = try FileDescriptorStore.socket(named: name, orBind: address, datagram: datagram)
        if restored {
            logger.info("socket \(name): fd \(socket.fd) passed back by the service manager")
        } else if !stored {
            logger.info("socket \(name) on \(address): no service manager to store it with; it does not survive a restart")
        }
        return socket
    }
}
