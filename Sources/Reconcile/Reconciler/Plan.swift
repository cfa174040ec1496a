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

        /// `start`, `retune`, `restart` or `stop`: the outcome as logs
        /// (`OUTCOME=`) and transcripts (`op`) name it.
        public var outcome: String {
            switch self {
            case .start: "start"
            case .retune: "retune"
            case .restart: "restart"
            case .stop: "stop"
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

    /// The driver work, in execution order. Built when read: a reconcile
    /// records its decisions compactly (entries and configuration boxes) and
    /// allocates nothing per step.
    public var steps: [Step] {
        get { explicitSteps ?? records.steps }
        set {
            explicitSteps = newValue
            records = PlanRecords()
        }
    }
    /// How many subscriptions were kept (no driver call).
    public var kept: Int = 0
    /// Identities given more than once in the desired set; the first won.
    public var duplicates: [SubscriptionID] = []

    /// Groups that were built although their input was unchanged and whose
    /// subscriptions differed from last time (only with
    /// `Reconciler.verifiesGroups`): their output depends on more than their
    /// input. Not part of equality.
    public internal(set) var groupsNotPure: [String] = []

    /// What the reconciler decided, in the form the runtime executes.
    var records = PlanRecords()
    private var explicitSteps: [Step]?

    /// A plan with `steps`, `kept` kept subscriptions and `duplicates` (tests build expected plans this way).
    public init(steps: [Step] = [], kept: Int = 0, duplicates: [SubscriptionID] = []) {
        self.explicitSteps = steps.isEmpty ? nil : steps
        self.kept = kept
        self.duplicates = duplicates
    }

    init(records: PlanRecords, kept: Int, duplicates: [SubscriptionID]) {
        self.records = records
        self.kept = kept
        self.duplicates = duplicates
    }

    /// True when the reconcile asked the driver for nothing.
    public var isEmpty: Bool { explicitSteps?.isEmpty ?? records.isEmpty }

    /// Whether `a` and `b` have the same steps in order, kept count and duplicates.
    public static func == (a: Plan, b: Plan) -> Bool {
        a.kept == b.kept && a.duplicates == b.duplicates && a.steps == b.steps
    }

    /// The steps, the kept count and the duplicates, one per line.
    public var description: String {
        var lines = steps.map(\.description)
        lines.append("keep \(kept)")
        for d in duplicates { lines.append("duplicate \(d) (first wins)") }
        return lines.joined(separator: "\n")
    }
}

/// A plan as the reconciler records it: the entries concerned and the
/// configuration boxes at the time (an entry's box changes on a later retune).
///
/// The runtime reads the entries in place (`PlanRecords+Layout.swift`).
struct PlanRecords {
    /// Never nil (optional so the reconciler's retired list can share it).
    var stops: [ActiveSource?] = []
    var restarts: [Restart] = []
    var retunes: [(source: ActiveSource, from: HashableBox, to: HashableBox)] = []
    /// Held unretained in a store the engine reuses (`StartRecords.swift`).
    var starts = StartRecords()

    typealias Restart = (old: ActiveSource, new: ActiveSource, to: HashableBox)

    var isEmpty: Bool { stops.isEmpty && restarts.isEmpty && retunes.isEmpty && starts.isEmpty }

    var steps: [Plan.Step] {
        var steps: [Plan.Step] = []
        steps.reserveCapacity(stops.count + restarts.count + retunes.count + starts.count)
        for s in stops { steps.append(.stop(s!.id)) }
        for r in restarts { steps.append(.restart(r.new.id, from: r.old.configurationBox.hashable, to: r.to.hashable)) }
        for r in retunes { steps.append(.retune(r.source.id, from: r.from.hashable, to: r.to.hashable)) }
        for s in starts { steps.append(.start(s.source.id, s.configuration.hashable)) }
        return steps
    }
}
