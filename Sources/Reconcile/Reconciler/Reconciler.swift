/// The pure reconcile state machine: the active table and the decisions that
/// move it to a desired set. It performs no driver call itself.
public final class Reconciler<Message> {
    let engine: ReconcileEngine
    let link: TypedOwnerLink<Message>

    /// An empty reconciler.
    public init() {
        link = TypedOwnerLink()
        let root = GroupMemo(link: link)
        link.root = root
        engine = ReconcileEngine(root: root, link: link)
    }

    deinit { engine.dismantle() }

    var owner: (any MessageSink<Message>)? {
        get { link.sink }
        set { link.sink = newValue }
    }

    /// Debugging: build and diff groups whose input is unchanged too, and
    /// report (`Plan.groupsNotPure`, `Diagnostic.groupDependsOnMoreThanInput`)
    /// a group whose subscriptions changed although its input did not.
    public var verifiesGroups: Bool {
        get { engine.verifiesGroups }
        set { engine.verifiesGroups = newValue }
    }

    /// The identities running now, in activation order.
    public var activeIDs: [SubscriptionID] { engine.activeInOrder.map(\.id) }

    /// The number of running sources.
    public var count: Int { engine.table.count }

    /// Moves the active table to `desired` and returns the plan (pure: tests
    /// and benchmarks use it without a driver).
    @discardableResult
    public func reconcile(_ desired: Subscriptions<Message>) -> Plan {
        engine.reconcile(desired)
    }

    /// The same for a runtime that executes the plan at once: the started
    /// entries have not retained their configuration boxes yet, and the
    /// caller must retain each one for its entry (`PlanRecords.forEachStart`)
    /// before anything can release the desired set (see
    /// `ReconcileEngine.reconcile`).
    func reconcileDeferringBoxRetains(_ desired: Subscriptions<Message>) -> Plan {
        engine.reconcile(desired, deferringBoxRetains: true)
    }

    /// Builds the desired set with `build` and moves the active table to it,
    /// as `reconcile(_:)` does; while `build` runs (and while groups it left
    /// unbuilt are built), a group whose key and input equal last time's is
    /// given the node it had, so an unchanged group costs the program one
    /// allocation fewer. The runtime reconciles this way; use it for sets
    /// with groups.
    @discardableResult
    public func reconcile(building build: () -> Subscriptions<Message>) -> Plan {
        engine.reconcile(building: build)
    }

    /// `reconcile(building:)` for the runtime (see `reconcileDeferringBoxRetains`).
    func reconcileDeferringBoxRetains(building build: () -> Subscriptions<Message>) -> Plan {
        engine.reconcile(building: build, deferringBoxRetains: true)
    }

    /// The plan that moves a runtime whose active set is `current` to `desired`.
    public static func plan(from current: Subscriptions<Message>, to desired: Subscriptions<Message>) -> Plan {
        let r = Reconciler()
        r.reconcile(current)
        return r.reconcile(desired)
    }

    /// The message `source` makes of `event` (poster events).
    func message(for event: Any, from source: ActiveSource) -> Message? { link.message(for: event, from: source) }

    /// The running source with identity `id`, if any.
    func active(_ id: SubscriptionID) -> ActiveSource? { engine.table.find(id) }

    /// Removes and returns every active source, in activation order (shutdown).
    func removeAll() -> [ActiveSource] { engine.removeAll() }
}
