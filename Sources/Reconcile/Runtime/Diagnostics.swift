/// Something the host should know about, raised by the runtime. None of these
/// stop the program; each is also counted in `RuntimeStats`.
public enum Diagnostic: Equatable, CustomStringConvertible {
    /// An identity appeared twice in one desired set; the first one won.
    case duplicateIdentity(SubscriptionID)
    /// A source reported a failure; the program got it through the tagger.
    case sourceFailed(SubscriptionID, Activation, SourceFailure)
    /// A message produced by an activation that has since stopped was
    /// delivered (cancellation is cooperative; `update` decides).
    case lateDelivery(SubscriptionID, Activation)
    /// A driver emitted for a stopped activation (a driver bug); dropped.
    case eventAfterStop(SubscriptionID, Activation)
    /// An event whose type is not the source's `Event` type; dropped.
    case eventTypeMismatch(SubscriptionID, String)
    /// With `verifiesGroups`: the group with this key built different
    /// subscriptions from an unchanged input (its body reads more than its
    /// input, so skipping it would be wrong).
    case groupDependsOnMoreThanInput(String)

    /// One sentence for a log line.
    public var description: String {
        switch self {
        case .duplicateIdentity(let id): "duplicate subscription \(id): the first one wins"
        case .sourceFailed(let id, let a, let f): "source \(id) \(a) failed: \(f)"
        case .lateDelivery(let id, let a): "late delivery from stopped \(id) \(a)"
        case .eventAfterStop(let id, let a): "driver emitted for stopped \(id) \(a); dropped"
        case .eventTypeMismatch(let id, let t): "event of type \(t) does not fit \(id); dropped"
        case .groupDependsOnMoreThanInput(let key): "subscription group \(key) changed although its input did not"
        }
    }
}

/// Counters a runtime keeps; cheap enough to read in tests and benchmarks.
public struct RuntimeStats: Equatable, Sendable {
    /// Messages processed by `update`.
    public var messages = 0
    /// Reconciles that called `subscriptions` and diffed.
    public var reconciles = 0
    /// Reconciles skipped because an `Equatable` model was unchanged.
    public var skippedReconciles = 0
    /// Driver calls.
    public var starts = 0, stops = 0, retunes = 0, restarts = 0
    /// Messages delivered after their activation stopped.
    public var lateDeliveries = 0
    /// Source failures reported.
    public var failures = 0
    /// Duplicate identities seen.
    public var duplicates = 0
    /// Events a driver emitted for a stopped activation, or of the wrong type (dropped).
    public var droppedEvents = 0

    /// All counters at zero.
    public init() {}
}

/// Why the runtime refused a message.
public enum RuntimeError: Error, Equatable, CustomStringConvertible {
    /// The runtime has shut down and accepts nothing more.
    case shutDown
    /// The cross-thread inbox holds `capacity` items already.
    case inboxFull(capacity: Int)

    /// One sentence for a log line.
    public var description: String {
        switch self {
        case .shutDown: "the runtime has shut down; the message was not accepted"
        case .inboxFull(let c): "the runtime's inbox is full (\(c) items); the message was not accepted"
        }
    }
}

/// What a shutdown did.
public struct ShutdownReport<Message> {
    /// The sources stopped, in activation order (each exactly once).
    public var stopped: [SubscriptionID]
    /// Messages that were queued and will never be processed.
    public var dropped: [Message]
    /// How the tasks still running when shutdown began ended (Tasks.swift).
    public var tasks = TaskShutdownCounts()
}
