/// Unix signals as subscriptions (the driver blocks them and reads them
/// through the loop, never in an asynchronous handler).
public enum SignalSource: Source {
    public static let name = "signal"

    /// The signals a daemon subscribes to. Raw values are Linux's numbers.
    public enum Signal: Int32, Hashable, Sendable, CaseIterable, CustomStringConvertible {
        case hangup = 1, interrupt = 2, user1 = 10, user2 = 12, terminate = 15

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

    public typealias Configuration = Signal

    /// What a signal subscription reports.
    public enum Event: Equatable, Sendable {
        /// The signal arrived, sent by process `sender` (0 when the kernel sent it).
        case received(Signal, sender: Int32)
        /// The signal cannot be read (not blocked in every thread).
        case failed(SourceFailure)
    }

    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

extension Subscription {
    /// A subscription to `signal`, keyed by the signal.
    public static func signal(_ signal: SignalSource.Signal, _ tag: @escaping (SignalSource.Event) -> Message) -> Subscription {
        Subscription(SignalSource.self, key: signal, configuration: signal, tag: tag)
    }
}
