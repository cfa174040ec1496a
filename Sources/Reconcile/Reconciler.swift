/// The active side of one subscription: a ticket plus what the reconciler and
/// runtime need to route its events.
final class ActiveSource<Message>: SourceTicket {
    var tagger: Tagger<Message>
    /// The reconcile pass that last claimed this identity.
    var epoch: UInt64 = 0
    /// Whether this activation handed out a poster (cross-thread events).
    var hasPoster = false
    weak var owner: (any MessageSink<Message>)?

    init(_ sub: Subscription<Message>, activation: Activation, owner: (any MessageSink<Message>)?) {
        self.tagger = sub.tagger
        self.owner = owner
        super.init(activation: activation, id: sub.id, source: sub.source, configurationBox: sub.configurationBox)
    }

    override func emit(_ event: Any) {
        guard let owner else { return }
        guard isActive else { return owner.report(.eventAfterStop(id, activation)) }
        guard let message = tagger.tag(event) else {
            return owner.report(.eventTypeMismatch(id, String(describing: type(of: event))))
        }
        owner.enqueue(message, from: self)
    }

    override func fail(_ failure: SourceFailure) {
        guard let owner else { return }
        guard isActive else { return owner.report(.eventAfterStop(id, activation)) }
        hasFailed = true
        owner.report(.sourceFailed(id, activation, failure))
        owner.enqueue(tagger.fail(failure), from: self)
    }

    override func poster() -> EventPoster {
        guard let owner else { return EventPoster(activation: activation) { _ in .closed } }
        hasPoster = true
        return owner.makePoster(for: self)
    }
}

extension Source {
    static func canRetune(_ old: AnyHashable, _ new: AnyHashable) -> Bool {
        guard let a = old.base as? Configuration, let b = new.base as? Configuration else { return false }
        return canRetune(from: a, to: b)
    }
}

/// The pure reconcile state machine: the active table and the decisions that
/// move it to a desired set. It performs no driver call itself.
public final class Reconciler<Message> {
    /// What the runtime must do with the driver, in order.
    struct Actions {
        var stops: [ActiveSource<Message>] = []
        var restarts: [(old: ActiveSource<Message>, new: ActiveSource<Message>)] = []
        var retunes: [(source: ActiveSource<Message>, old: AnyHashable)] = []
        var starts: [ActiveSource<Message>] = []
    }

    private(set) var active: [SubscriptionID: SourceTicket] = [:]
    private var epoch: UInt64 = 0
    private var generation: UInt64 = 0
    weak var owner: (any MessageSink<Message>)?

    /// An empty reconciler.
    public init() {}

    /// The identities running now, in activation order.
    public var activeIDs: [SubscriptionID] {
        activeInOrder.map(\.id)
    }

    /// The number of running sources.
    public var count: Int { active.count }

    /// Moves the active table to `desired` and returns the plan (pure: tests
    /// and benchmarks use it without a driver).
    @discardableResult
    public func reconcile(_ desired: Subscriptions<Message>) -> Plan {
        reconcile(desired.items).plan
    }

    /// The plan that moves a runtime whose active set is `current` to `desired`.
    public static func plan(from current: Subscriptions<Message>, to desired: Subscriptions<Message>) -> Plan {
        let r = Reconciler()
        r.reconcile(current)
        return r.reconcile(desired)
    }

    func reconcile(_ desired: [Subscription<Message>]) -> (plan: Plan, actions: Actions) {
        epoch &+= 1
        let epoch = self.epoch
        var plan = Plan()
        var actions = Actions()
        var claimed = 0
        for sub in desired {
            if let found = active[sub.id] {
                let entry = unsafeDowncast(found, to: ActiveSource<Message>.self)
                if entry.epoch == epoch {
                    plan.duplicates.append(sub.id)
                    continue
                }
                entry.epoch = epoch
                claimed += 1
                if entry.configurationBox === sub.configurationBox || entry.configurationBox.isEqual(sub.configurationBox) {
                    entry.tagger = sub.tagger
                    plan.kept += 1
                } else if !entry.hasFailed && entry.source.canRetune(entry.configuration, sub.configuration) {
                    let old = entry.configuration
                    entry.configurationBox = sub.configurationBox
                    entry.tagger = sub.tagger
                    actions.retunes.append((entry, old))
                } else {
                    let fresh = makeEntry(sub)
                    active[sub.id] = fresh
                    actions.restarts.append((entry, fresh))
                }
            } else {
                let fresh = makeEntry(sub)
                active[sub.id] = fresh
                claimed += 1
                actions.starts.append(fresh)
            }
        }
        if claimed != active.count {
            for found in active.values {
                let entry = unsafeDowncast(found, to: ActiveSource<Message>.self)
                if entry.epoch != epoch { actions.stops.append(entry) }
            }
            for entry in actions.stops { active[entry.id] = nil }
            if actions.stops.count > 1 { actions.stops = Self.inActivationOrder(actions.stops) }
        }
        if !(actions.stops.isEmpty && actions.restarts.isEmpty && actions.retunes.isEmpty && actions.starts.isEmpty) {
            plan.steps.reserveCapacity(actions.stops.count + actions.restarts.count + actions.retunes.count + actions.starts.count)
            for s in actions.stops { plan.steps.append(.stop(s.id)) }
            for r in actions.restarts { plan.steps.append(.restart(r.new.id, from: r.old.configuration, to: r.new.configuration)) }
            for r in actions.retunes { plan.steps.append(.retune(r.source.id, from: r.old, to: r.source.configuration)) }
            for s in actions.starts { plan.steps.append(.start(s.id, s.configuration)) }
        }
        return (plan, actions)
    }

    /// Removes and returns every active source, in activation order (shutdown).
    func removeAll() -> [ActiveSource<Message>] {
        let all = activeInOrder
        active.removeAll()
        return all
    }

    /// `entries` in activation order. The sort runs over concrete
    /// `(generation, index)` pairs: a sort over the generic entry type runs
    /// unspecialised and allocates on every element access (about 42
    /// allocations a stop).
    private static func inActivationOrder(_ entries: [ActiveSource<Message>]) -> [ActiveSource<Message>] {
        var order: [(UInt64, Int)] = []
        order.reserveCapacity(entries.count)
        for i in entries.indices { order.append((entries[i].activation.generation, i)) }
        order.sort { $0.0 < $1.0 }
        var sorted: [ActiveSource<Message>] = []
        sorted.reserveCapacity(entries.count)
        for (_, i) in order { sorted.append(entries[i]) }
        return sorted
    }

    /// The active entries, in activation order.
    private var activeInOrder: [ActiveSource<Message>] {
        Self.inActivationOrder(active.values.map { unsafeDowncast($0, to: ActiveSource<Message>.self) })
    }

    private func makeEntry(_ sub: Subscription<Message>) -> ActiveSource<Message> {
        generation &+= 1
        let entry = ActiveSource(sub, activation: Activation(generation: generation), owner: owner)
        entry.epoch = epoch
        return entry
    }
}
