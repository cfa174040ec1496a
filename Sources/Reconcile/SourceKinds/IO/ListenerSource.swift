/// A listening socket: each accepted connection is an event, and a
/// `Subscription.connection(_:_:)` of its own.
///
/// A listener holds at most `connectionLimit` connections open at once
/// (accepted and not yet closed by their subscriptions); one beyond that is
/// accepted, closed at once and counted in `.refused`. An accepted
/// connection that no subscription has taken yet is closed when the
/// listener stops.
///
/// A listener on a socket the caller gave (`listen(_:name:)`) cannot come
/// back by itself: the socket is the caller's, so it has no restart policy.
/// One that binds its address itself (`listen(address:name:restart:)`)
/// can: a bind that fails (`EADDRINUSE`: another process has the address)
/// or an `accept` that fails for good is `.failed`, then
/// `.restarting(attempt:after:)`, then a new socket bound to the address.
public enum ListenerSource: RestartableSource {
    /// `listener`.
    public static let name = "listener"

    /// The connection limit a listener gets unless told otherwise: 256.
    public static let defaultConnectionLimit = 256

    /// A listener's parameters.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The listening socket (`SOCK_STREAM`, `listen` already called:
        /// one systemd passed, or `SocketActivation.bind`'s).
        public var fd: Int32
        /// The listener's name (the socket's `FileDescriptorName=`), carried
        /// by its connections.
        public var name: String
        /// The most connections open at once.
        public var connectionLimit: Int
        /// Whether stopping the subscription closes `fd`.
        public var ownsDescriptor: Bool
        /// The address the driver binds itself (`fd` is then unused and the
        /// socket is the subscription's): `/path`, `@abstract`, `1.2.3.4:80`,
        /// `[::1]:80` or a bare port, as `SocketActivation.bind` reads it.
        public var address: String?
        /// How a listener on `address` binds again after a failure (a
        /// listener on a given `fd` never restarts).
        public var restart: RestartPolicy

        /// A listener on `fd` named `name`.
        /// - Parameters:
        ///   - fd: A listening stream socket.
        ///   - name: The listener's name.
        ///   - connectionLimit: The most connections open at once.
        ///   - ownsDescriptor: Whether stopping the subscription closes `fd`.
        public init(fd: Int32, name: String, connectionLimit: Int = ListenerSource.defaultConnectionLimit, ownsDescriptor: Bool = false) {
            self.fd = fd
            self.name = name
            self.connectionLimit = connectionLimit
            self.ownsDescriptor = ownsDescriptor
            self.address = nil
            self.restart = .never
        }

        /// A listener that binds `address` itself, named `name`.
        /// - Parameters:
        ///   - address: What to bind (see `address`).
        ///   - name: The listener's name.
        ///   - connectionLimit: The most connections open at once.
        ///   - restart: How it binds again after a failure.
        public init(address: String, name: String, connectionLimit: Int = ListenerSource.defaultConnectionLimit,
                    restart: RestartPolicy = .never) {
            self.fd = -1
            self.name = name
            self.connectionLimit = connectionLimit
            self.ownsDescriptor = true
            self.address = address
            self.restart = restart
        }

        /// `web fd 3 limit 256`, `web 127.0.0.1:8080 limit 256 restart backoff ...`.
        public var description: String {
            if let address {
                return "\(name) \(address) limit \(connectionLimit)" + (restart == .never ? "" : " restart \(restart)")
            }
            return "\(name) fd \(fd) limit \(connectionLimit)\(ownsDescriptor ? " owned" : "")"
        }
    }

    /// What a listener reports.
    public enum Event: Hashable, Sendable {
        /// A connection was accepted; subscribe to it to read and write.
        case accepted(Connection)
        /// Connections were refused because the limit was reached; `total`
        /// counts every refusal since the listener started.
        case refused(total: Int)
        /// The socket cannot be bound or watched, or `accept` failed for good.
        case failed(SourceFailure)
        /// A listener on an address binds again (attempt `attempt`) after
        /// `after`, by its restart policy. Added with restart policies: an
        /// exhaustive `switch` needs this case.
        case restarting(attempt: Int, after: Duration)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
    /// The restart policy of a listener on an address; `.never` for one on a given socket.
    public static func restartPolicy(_ configuration: Configuration) -> RestartPolicy {
        configuration.address == nil ? .never : configuration.restart
    }
    /// `.restarting(attempt:after:)`.
    public static func restarting(attempt: Int, after: Duration) -> Event { .restarting(attempt: attempt, after: after) }

    /// The limit retunes in place; another socket, address or policy restarts.
    public static func canRetune(from old: Configuration, to new: Configuration) -> Bool {
        old.fd == new.fd && old.name == new.name && old.ownsDescriptor == new.ownsDescriptor
            && old.address == new.address && old.restart == new.restart
    }
}

extension Subscription {
    /// The connections accepted on listening socket `fd`, keyed by `name`.
    ///
    /// - Parameters:
    ///   - fd: a listening stream socket.
    ///   - name: the listener's name, carried by each `Connection`.
    ///   - connectionLimit: the most connections open at once; more are refused and counted.
    ///   - owned: whether stopping the subscription closes `fd`.
    ///   - tag: makes a message of each event.
    @inlinable
    public static func listen(_ fd: Int32, name: String, connectionLimit: Int = ListenerSource.defaultConnectionLimit,
                              owned: Bool = false, _ tag: @escaping (ListenerSource.Event) -> Message) -> Subscription {
        Subscription(ListenerSource.self, key: name,
                     configuration: .init(fd: fd, name: name, connectionLimit: max(1, connectionLimit), ownsDescriptor: owned),
                     tag: tag)
    }

    /// The connections accepted on a socket the driver binds to `address`
    /// itself (and closes when the subscription stops), keyed by `name`.
    ///
    /// - Parameters:
    ///   - address: `/path`, `@abstract`, `1.2.3.4:80`, `[::1]:80` or a bare port.
    ///   - name: the listener's name, carried by each `Connection`.
    ///   - connectionLimit: the most connections open at once; more are refused and counted.
    ///   - restart: how it binds again after a failed bind (`EADDRINUSE`) or
    ///     accept (default `.never`: it stays failed until its subscription changes).
    ///   - tag: makes a message of each event.
    @inlinable
    public static func listen(address: String, name: String, connectionLimit: Int = ListenerSource.defaultConnectionLimit,
                              restart: RestartPolicy = .never, _ tag: @escaping (ListenerSource.Event) -> Message) -> Subscription {
        Subscription(ListenerSource.self, key: name,
                     configuration: .init(address: address, name: name, connectionLimit: max(1, connectionLimit), restart: restart),
                     tag: tag)
    }
}
