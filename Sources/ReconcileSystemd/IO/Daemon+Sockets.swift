import Reconcile

extension Daemon {
    /// The sockets systemd passed to this daemon (`SocketActivation.adopted()`):
    /// empty when run by hand or when `LISTEN_PID` is another process's.
    public var activatedSockets: [ActivatedSocket] { SocketActivation.adopted() }

    /// The socket systemd passed under `name`, or one bound to `address`
    /// when it passed none of that name (run by hand).
    ///
    /// - Parameters:
    ///   - name: the `FileDescriptorName=` (`--fdname`) to look for.
    ///   - address: what to bind otherwise (`SocketActivation.bind(_:datagram:)`); nil: nothing.
    ///   - datagram: whether a bound socket is a datagram one.
    /// - Returns: the socket, or nil when there is none and no address.
    /// - Throws: `SystemdError` when binding fails.
    public func socket(named name: String, orBind address: String?, datagram: Bool = false) throws(SystemdError) -> ActivatedSocket? {
        try SocketActivation.socket(named: name, orBind: address, datagram: datagram)
    }
}
