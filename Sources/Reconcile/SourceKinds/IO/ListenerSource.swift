/// A listening socket: each accepted connection is an event, and a
/// `Subscription.connection(_:_:)` of its own.
///
/// A listener holds at most `connectionLimit` connections open at once
/// (accepted and not yet closed by their subscriptions); one beyond that is
/// accepted, closed at once and counted in `.refused`. An accepted
/// connection that no subscription has taken yet is closed when the
/// listener stops.
public enum ListenerSource: Source {
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

        /// A listener on `fd` named `name`.
        public init(fd: Int32, name: String, connectionLimit: Int = ListenerSource.defaultConnectionLimit, ownsDescriptor: Bool = false) {
            self.fd = fd
            self.name = name
            self.connectionLimit = connectionLimit
            self.ownsDescriptor = ownsDescriptor
        }

        /// `web fd 3 limit 256`.
        public var description: String { "\(name) fd \(fd) limit \(connectionLimit)\(ownsDescriptor ? " owned" : "")" }
    }

    /// What a listener reports.
    public enum Event: Hashable, Sendable {
        /// A connection was accepted; subscribe to it to read and write.
        case accepted(Connection)
        /// Connections were refused because the limit was reached; `total`
        /// counts every refusal since the listener started.
        case refused(total: Int)
        /// The socket cannot be watched, or `accept` failed for good.
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }

    /// The limit retunes in place; another socket restarts.
    public static func canRetune(from old: Configuration, to new: Configuration) -> Bool {
        old.fd == new.fd && old.name == new.name && old.ownsDescriptor == new.ownsDescriptor
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
    public static func listen(_ fd: Int32, name: String, connectionLimit: Int = ListenerSource.defaultConnectionLimit,
                              owned: Bool = false, _ tag: @escaping (ListenerSource.Event) -> Message) -> Subscription {
        Subscription(ListenerSource.self, key: name,
                     configuration: .init(fd: fd, name: name, connectionLimit: max(1, connectionLimit), ownsDescriptor: owned),
                     tag: tag)
    }
}
