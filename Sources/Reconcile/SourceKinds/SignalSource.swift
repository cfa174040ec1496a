/// Unix signals as subscriptions (the driver blocks them and reads them
/// through the loop, never in an asynchronous handler).
public enum SignalSource: Source {
    /// `signal`.
    public static let name = "signal"

    /// The signals a daemon subscribes to. Raw values are Linux's numbers.
    public enum Signal: Int32, Hashable, Sendable, CaseIterable, CustomStringConvertible {
        /// SIGHUP (1): by convention, reload the configuration.
        case hangup = 1
        /// SIGINT (2): Ctrl-C.
        case interrupt = 2
        /// SIGUSR1 (10).
        case user1 = 10
        /// SIGUSR2 (12).
        case user2 = 12
        /// SIGTERM (15): the service manager's stop.
        case terminate = 15

        /// The signal's name (`SIGHUP`).
        public var description: String {
            switch self {
            case .hangup: "SIGHUP"
            case .interrupt: "SIGINT"
            case .user1: "SIGUSR1"
            case .user2: "SIGUSR2"
            case .terminate: "SIGTERM"
            }
        }
    }

    /// A signal source is configured by its signal.
    public typealias Configuration = Signal

    /// What a signal subscription reports.
    public enum Event: Equatable, Sendable {
        /// The signal arrived, sent by process `sender` (0 when the kernel sent it).
        case received(Signal, sender: Int32)
        /// The signal cannot be read (not blocked in every thread).
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

extension Subscription {
    /// A subscription to `signal`, keyed by the signal.
    @inlinable
    public static func signal(_ signal: SignalSource.Signal, _ tag: @escaping (SignalSource.Event) -> Message) -> Subscription {
        Subscription(SignalSource.self, key: signal, configuration: signal, tag: tag)
    }
}
