/// What one reconcile decided: an Equatable value tests and logs can show.
///
/// Steps are ordered: stops, then restarts, then retunes, then starts; within
/// each group stops follow activation order and the rest follow the desired
/// set's order. Kept subscriptions are only counted: keeping costs no driver
/// call and no allocation.
public struct Plan: Equatable, CustomStringConvertible {
    /// One decision about one identity.
    public enum Step: Equatable, CustomStringConvertible {
        /// A new identity: start a source with this configuration.
        case start(SubscriptionID, AnyHashable)
        /// Same identity, changed configuration, changed in place.
        case retune(SubscriptionID, from: AnyHashable, to: AnyHashable)
        /// Same identity, changed configuration that cannot change in place (or
        /// the source had failed): stop, then start.
        case restart(SubscriptionID, from: AnyHashable, to: AnyHashable)
        /// The identity is no longer wanted.
        case stop(SubscriptionID)

        /// The identity the step is about.
        public var id: SubscriptionID {
            switch self {
            case .start(let id, _), .retune(let id, _, _), .restart(let id, _, _), .stop(let id): id
            }
        }

        /// `start timer:t: every 5s`, `retune …: a -> b`, `stop …`: the form tests compare and logs show.
        public var description: String {
            switch self {
            case .start(let id, let c): "start \(id): \(c.base)"
            case .retune(let id, let a, let b): "retune \(id): \(a.base) -> \(b.base)"
            case .restart(let id, let a, let b): "restart \(id): \(a.base) -> \(b.base)"
            case .stop(let id): "stop \(id)"
            }
        }
    }

    /// The driver work, in execution order.
    public var steps: [Step] = []
    /// How many subscriptions were kept (no driver call).
    public var kept: Int = 0
    /// Identities given more than once in the desired set; the first won.
    public var duplicates: [SubscriptionID] = []

    /// A plan with `steps`, `kept` kept subscriptions and `duplicates` (tests build expected plans this way).
    public init(steps: [Step] = [], kept: Int = 0, duplicates: [SubscriptionID] = []) {
        self.steps = steps
        self.kept = kept
        self.duplicates = duplicates
    }

    /// True when the reconcile asked the driver for nothing.
    public var isEmpty: Bool { steps.isEmpty }

    /// The steps, the kept count and the duplicates, one per line.
    public var description: String {
        var lines = steps.map(\.description)
        lines.append("keep \(kept)")
        for d in duplicates { lines.append("duplicate \(d) (first wins)") }
        return lines.joined(separator: "\n")
    }
}
