import Synchronization

/// Where a runtime's messages go, seen from the entries (which are not
/// generic over the message type): one link per reconciler, shared by all
/// its entries.
class OwnerLink {
    func emit(_ event: Any, from source: ActiveSource) {}
    func fail(_ failure: SourceFailure, from source: ActiveSource) {}
    func poster(for source: ActiveSource) -> EventPoster { EventPoster(activation: source.activation) { _ in .closed } }
}

final class TypedOwnerLink<Message>: OwnerLink {
    weak var sink: (any MessageSink<Message>)?
    unowned(unsafe) var root: GroupMemo!

    /// The message `source`'s tagger (and its group's mapping) makes of `event`.
    func message(for event: Any, from source: ActiveSource) -> Message? {
        if source.memo === root { return unsafeDowncast(source.tagger, to: Tagger<Message>.self).tag(event) }
        guard let m = source.tagger.tagAny(event) else { return nil }
        return (source.memo.route(m) as! Message)
    }

    func message(for failure: SourceFailure, from source: ActiveSource) -> Message {
        if source.memo === root { return unsafeDowncast(source.tagger, to: Tagger<Message>.self).fail(failure) }
        return source.memo.route(source.tagger.failAny(failure)) as! Message
    }

    override func emit(_ event: Any, from source: ActiveSource) {
        guard let sink else { return }
        guard source.isActive else { return sink.report(.eventAfterStop(source.id, source.activation)) }
        guard let message = message(for: event, from: source) else {
            return sink.report(.eventTypeMismatch(source.id, String(describing: type(of: event))))
        }
        sink.enqueue(message, from: source)
    }

    override func fail(_ failure: SourceFailure, from source: ActiveSource) {
        guard let sink else { return }
        guard source.isActive else { return sink.report(.eventAfterStop(source.id, source.activation)) }
        source.hasFailed = true
        sink.report(.sourceFailed(source.id, source.activation, failure))
        sink.enqueue(message(for: failure, from: source), from: source)
    }

    override func poster(for source: ActiveSource) -> EventPoster {
        guard let sink else { return super.poster(for: source) }
        source.hasPoster = true
        return sink.makePoster(for: source)
    }
}

/// The active side of one subscription: a ticket plus what the reconciler and
/// runtime need to route its events. Not generic: the reconciler's loop works
/// on these without specialising on the message type.
final class ActiveSource: SourceTicket {
    @exclusivity(unchecked) var tagger: TaggerBase
    /// The group that last claimed this identity (the root for plain parts).
    @exclusivity(unchecked) var memo: GroupMemo
    /// The reconcile pass that last claimed this identity.
    @exclusivity(unchecked) var epoch: UInt64 = 0
    /// Where events go (one link per reconciler, held by every group).
    var link: OwnerLink { memo.link }

    init(_ sub: UnsafePointer<SubscriptionCore>, activation: Activation, memo: GroupMemo) {
        self.tagger = sub.pointee.tagger
        self.memo = memo
        super.init(activation: activation, id: sub.pointee.id, configurationBox: sub.pointee.configurationBox)
    }

    override func emit(_ event: Any) { link.emit(event, from: self) }
    override func fail(_ failure: SourceFailure) { link.fail(failure, from: self) }
    override func poster() -> EventPoster { link.poster(for: self) }

    /// Whether this entry's identity has cached hash `hash`, kind `kind` and
    /// a key equal to the one in `key` (held by the caller), compared
    /// without copying the identity (no reference counting).
    @inline(__always)
    func hasIdentity(_ hash: Int, _ kind: ObjectIdentifier, _ key: Unmanaged<HashableBox>) -> Bool {
        guard id.cachedHash == hash, id.kind.type == kind else { return false }
        return ReconcileEngine.sameBox(.passUnretained(id.keyBox), key)
    }

    /// Whether no weak or unowned reference to this entry exists (strong
    /// ones the caller checks with `isKnownUniquelyReferenced`): a stopped
    /// entry that passes both cannot be reached by anything that saw its
    /// old activation.
    var hasNoWeakOrUnownedReference: Bool {
        Self.countsAreReliable && _getUnownedRetainCount(self) == 1 && _getWeakRetainCount(self) == 1
    }

    /// Whether the runtime's unowned and weak counts read as recycling
    /// expects (1 with no such reference, more with one), checked once on a
    /// probe object. These are the standard library's underscored hooks; if
    /// a future runtime reads them otherwise, entries are not recycled (an
    /// allocation per start) rather than recycled while still referenced.
    static let countsAreReliable: Bool = probeCounts()

    /// The probe: an object's counts with no weak or unowned reference, then
    /// with one of each held in another object's fields (the kind of
    /// reference the check guards against). Not optimised, so neither
    /// reference can be folded away.
    @_optimize(none)
    private static func probeCounts() -> Bool {
        final class Probe {}
        final class Holder {
            unowned let strongless: Probe
            weak var weakly: Probe?
            init(_ p: Probe) { strongless = p; weakly = p }
        }
        let probe = Probe()
        guard _getUnownedRetainCount(probe) == 1, _getWeakRetainCount(probe) == 1 else { return false }
        let holder = Holder(probe)
        let seen = _getUnownedRetainCount(probe) > 1 && _getWeakRetainCount(probe) > 1
        withExtendedLifetime(holder) {}
        return seen
    }

    /// Makes this stopped entry, which nothing else references, the ticket
    /// of a new activation of `sub` (recycling: no allocation per start).
    func reuse(_ sub: UnsafePointer<SubscriptionCore>, activation: Activation, memo: GroupMemo, epoch: UInt64) {
        self.activation = activation
        // The same boxes as last time (a set reused as it was) are not
        // written again: no retain and release for them.
        if !Self.same(id.keyBox, sub.pointee.id.keyBox) { id = sub.pointee.id }
        if !Self.same(configurationBox, sub.pointee.configurationBox) { configurationBox = sub.pointee.configurationBox }
        isActive = true
        hasFailed = false
        hasPoster = false
        position = 0
        if state != nil { state = nil }
        if !Self.same(tagger, sub.pointee.tagger) { tagger = sub.pointee.tagger }
        if self.memo !== memo { self.memo = memo }
        self.epoch = epoch
    }

    /// Whether `a` and `b` are one object, compared without reference counting.
    @inline(__always)
    private static func same(_ a: AnyObject, _ b: AnyObject) -> Bool {
        Unmanaged.passUnretained(a).toOpaque() == Unmanaged.passUnretained(b).toOpaque()
    }
}

/// What the reconciler remembers of one group (and, as the root, of the
/// plain parts of the whole set): the entries it claimed in order, its input,
/// its nested groups, and the message mapping applied to its entries' events.
final class GroupMemo {
    let key: GroupKey?
    let parent: GroupMemo?
    /// The reconciler's owner link (entries reach it through their group).
    let link: OwnerLink
    /// The group as last built (its key and input), and the same unretained
    /// (read on the skip path without reference counting).
    private(set) var node: GroupIdentity?
    private(set) var nodeRef: Unmanaged<GroupIdentity>?
    /// Maps the group's messages to its parent's (nil: the same type).
    var forward: ((Any) -> Any)?
    /// The entries in desired order, unretained: the active table holds
    /// them, and an entry leaves every order before it leaves the table.
    @exclusivity(unchecked) var order: ContiguousArray<Unmanaged<ActiveSource>> = []
    var children: [GroupKey: GroupMemo] = [:]
    /// The nested groups in the order last walked, for positional lookup
    /// (unretained: `children` holds them).
    @exclusivity(unchecked) var childOrder: ContiguousArray<Unmanaged<GroupMemo>> = []
    /// The new child order, built only from where it first differs.
    var newChildOrder: ContiguousArray<Unmanaged<GroupMemo>> = []
    var childBuilding = false
    var childCursor = 0
    /// Entries claimed by this group and its nested groups.
    var subtreeCount = 0
    /// Duplicates seen in this group's last build (nested groups included):
    /// such a group is always built, since whether its copies lose depends
    /// on the other groups.
    var ownDuplicates = 0
    var subtreeDuplicates = 0
    var walkEpoch: UInt64 = 0
    var skipEpoch: UInt64 = 0
    var rebuildEpoch: UInt64 = 0
    // The state of the walk in progress.
    @exclusivity(unchecked) var cursor = 0
    @exclusivity(unchecked) var placed = 0
    @exclusivity(unchecked) var building = false
    /// Where the new order first differs from the old one (entries before
    /// it keep their positions and are all claimed).
    @exclusivity(unchecked) var divergence = 0
    @exclusivity(unchecked) var newOrder: ContiguousArray<Unmanaged<ActiveSource>> = []
    var visited = 0
    /// This group's position in its parent's child order (`GroupReuse`;
    /// last, so the walk's fields keep their places in the object).
    var childIndex = 0
    /// The reuse generation (`GroupReuse.live`) whose build was handed this
    /// group's node: one node serves one group of a build.
    var reuseGeneration: UInt64 = 0

    init(key: GroupKey?, parent: GroupMemo) {
        self.key = key
        self.parent = parent
        self.link = parent.link
        self.occurrence = key?.occurrence ?? 0
    }

    /// Which occurrence of its key among its siblings this group is.
    let occurrence: Int

    /// Where `child` stood in this group's last child order, if it is
    /// there (its `childIndex`, checked).
    func lastPosition(of child: GroupMemo) -> Int? {
        let i = child.childIndex
        guard i < childOrder.count, childOrder[i].toOpaque() == Unmanaged.passUnretained(child).toOpaque() else { return nil }
        return i
    }

    func setNode(_ node: GroupIdentity) {
        self.node = node
        nodeRef = .passUnretained(node)
    }

    init(link: OwnerLink) {
        self.key = nil
        self.parent = nil
        self.link = link
        self.occurrence = 0
    }

    /// `message` (of this group's type) mapped up to the runtime's type.
    func route(_ message: Any) -> Any {
        var m = message
        var g: GroupMemo? = self
        while let x = g {
            if let f = x.forward { m = f(m) }
            g = x.parent
        }
        return m
    }
}

/// The last reconcile's groups, offered to `Subscriptions.group` while a
/// reconciler builds the set it is about to reconcile
/// (`Reconciler.reconcile(building:)`, which the runtime uses): a group
/// whose key and input equal the one in its place last time is given that
/// node back instead of a new one, so an unchanged group costs the program
/// no allocation of its own (its body's closure context, made by the caller
/// before the call, is the one left). The walk then finds the very node it
/// remembers and skips the group on a pointer compare.
///
/// Reusing a node is what skipping already assumes: a group's
/// subscriptions depend on its key and input alone. With `verifiesGroups`
/// nothing is reused (the check needs the new body).
///
/// How a group finds its place: it is compared with the next of the
/// enclosing group's last children and the one after it (a group removed
/// before it); a child with its key is its place (with an equal input, its
/// node is reused) and the next group compares from there. When neither
/// has its key, the group's key is looked up among all the last children
/// (hashed, as the walk does off its positional path), and the comparison
/// goes on from where it was found.
@usableFromInline final class GroupReuse: @unchecked Sendable {
    // Read and written only on the thread reconciling, while bound
    // (`active()` refuses everyone else before reading anything but `live`,
    // an atomic); between reconcilers a context passes through the pool's
    // lock.
    /// The group whose last children are compared (the root for the top
    /// level; the reconciler holds it), and the next of them to compare.
    @exclusivity(unchecked) var parent: Unmanaged<GroupMemo>
    @exclusivity(unchecked) var cursor = 0
    /// The generation of the binding in force (0: none). Contexts are
    /// never freed (a reconciler gives its context back to a pool), so a
    /// copy of a binding that outlived its reconcile (a task made inside
    /// `subscriptions(model)` inherits it) can always read this, and finds
    /// another generation there.
    let live = Atomic<UInt64>(0)

    private init(root: GroupMemo) { parent = .passUnretained(root) }

    /// What is bound while a set is built: plain values, so that reading the
    /// task-local copies no reference. A task made while the set is built
    /// inherits the binding and is refused: by its task, which is not the
    /// binding one, and, should it run at the address of that task once the
    /// task is gone, by the generation, which is no longer live.
    struct Binding: Sendable {
        let context: Unmanaged<GroupReuse>
        let generation: UInt64
        nonisolated(unsafe) let task: UnsafeRawPointer?
    }

    @TaskLocal static var current: Binding?

    private static let pool = Mutex<[GroupReuse]>([])
    private static let generations = Atomic<UInt64>(0)

    /// A context for a reconciler whose root is `root` (from the pool).
    static func take(root: GroupMemo) -> GroupReuse {
        if let c = pool.withLock({ $0.popLast() }) {
            c.parent = .passUnretained(root)
            return c
        }
        return GroupReuse(root: root)
    }

    /// Gives a reconciler's context back (never freed: see `live`).
    static func give(_ c: GroupReuse) {
        c.live.store(0, ordering: .releasing)
        pool.withLock { $0.append(c) }
    }

    /// A generation no binding has had.
    static func nextGeneration() -> UInt64 { generations.wrappingAdd(1, ordering: .relaxed).newValue }

    /// The running task, as an address (nil: none).
    static var currentTask: UnsafeRawPointer? {
        withUnsafeCurrentTask { $0.map { unsafeBitCast($0, to: UnsafeRawPointer.self) } }
    }

    /// The context bound to this task, if any.
    @usableFromInline static func active() -> Unmanaged<GroupReuse>? {
        guard let b = current, accepts(b) else { return nil }
        return b.context
    }

    /// Whether `b` is the binding in force, in the task that made it.
    static func accepts(_ b: Binding) -> Bool {
        b.task == currentTask && b.context._withUnsafeGuaranteedRef { $0.live.load(ordering: .acquiring) } == b.generation
    }

    /// The node last built at `offset` past the cursor, unretained (the
    /// parent's memo holds it), and whether it may serve again (not when
    /// its subtree had duplicates: such a group is always built anew, as
    /// without reuse; nor when this build was handed it already: one node
    /// serves one group); nil past the last one.
    ///
    /// Only a first occurrence this build has not taken is in its place
    /// (`inPlace`), as in the walk: the first group with a key takes it,
    /// and later ones with that key are found by `relocate`, by occurrence.
    @usableFromInline func candidate(_ offset: Int) -> (node: Unmanaged<GroupIdentity>, reusable: Bool, inPlace: Bool)? {
        let i = cursor + offset
        let generation = live.load(ordering: .relaxed)
        return parent._withUnsafeGuaranteedRef { p in
            guard i < p.childOrder.count else { return nil }
            return p.childOrder[i]._withUnsafeGuaranteedRef { m in
                m.nodeRef.map { ($0, m.subtreeDuplicates == 0, m.occurrence == 0 && m.reuseGeneration != generation) }
            }
        }
    }

    /// The candidate at `offset` has the group's key: it is this build's
    /// (its node serves no other group), and the next group compares with
    /// the one after it.
    @usableFromInline func took(_ offset: Int) {
        let i = cursor + offset
        let generation = live.load(ordering: .relaxed)
        parent._withUnsafeGuaranteedRef { p in p.childOrder[i]._withUnsafeGuaranteedRef { $0.reuseGeneration = generation } }
        cursor = i + 1
    }

    /// The last children's group with `key` at the first occurrence this
    /// build has not taken (as the walk counts occurrences), if any; it is
    /// taken, and the comparison goes on after it.
    func relocate(_ key: GroupKey) -> GroupMemo? {
        let generation = live.load(ordering: .relaxed)
        return parent._withUnsafeGuaranteedRef { p -> GroupMemo? in
            var key = key
            var found = p.children[key]
            while let m = found, m.reuseGeneration == generation {
                key.occurrence += 1
                found = p.children[key]
            }
            guard let m = found else { return nil }
            m.reuseGeneration = generation
            guard let i = p.lastPosition(of: m) else { return nil }
            cursor = i + 1
            return m
        }
    }

    /// Runs `body` with the comparison among `memo`'s last children from
    /// the first, then goes back to where it was.
    func comparing<R>(childrenOf memo: GroupMemo, _ body: () -> R) -> R {
        let (outer, at) = (parent, cursor)
        parent = .passUnretained(memo)
        cursor = 0
        defer {
            parent = outer
            cursor = at
        }
        return body()
    }
}

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

    /// The same for a runtime that executes the plan at once: the start
    /// records' configuration boxes are not retained yet, and the caller
    /// must retain each one (`PlanRecords.forEachStart`) before anything
    /// can release the plan (see `ReconcileEngine.reconcile`).
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

/// The reconciler's machinery, not generic over the message type.
///
/// Its hot stored properties (and the entries' and groups') opt out of
/// dynamic exclusivity checks (`@exclusivity(unchecked)`): everything runs
/// on the loop thread, and no access to one of them spans code that could
/// access it again (the checks cost about a tenth of a churned reconcile).
///
/// Each group (the root for the plain parts) keeps its entries in the order
/// they were last desired. A desired subscription is first compared with the
/// entry at the group's cursor (cached hash, kind, key box, then typed `==`);
/// a match moves the cursor on, so unchanged and shifted runs need no table
/// lookup. Only misses go to the table, which is keyed by the identity's
/// cached hash. When a group's entries come out in the same order, it is not
/// rewritten and nothing in it can have stopped.
final class ReconcileEngine {
    let table = EntryTable()
    let root: GroupMemo
    let link: OwnerLink
    var verifiesGroups = false
    @exclusivity(unchecked) private var epoch: UInt64 = 0
    @exclusivity(unchecked) private var generation: UInt64 = 0
    // Per reconcile.
    @exclusivity(unchecked) private var records = PlanRecords()
    @exclusivity(unchecked) private var kept = 0
    private var duplicates: [SubscriptionID] = []
    private var current: GroupMemo
    private var forwards: [(Any) -> Any] = [] { didSet { mapping = !forwards.isEmpty } }
    /// `!forwards.isEmpty`, read on the skip path (a plain load).
    private var mapping = false
    private var scans: [(memo: GroupMemo, order: ContiguousArray<Unmanaged<ActiveSource>>, from: Int)] = []
    /// Entries a new entry took the place of in their group's order
    /// (stopped unless claimed elsewhere in this reconcile).
    @exclusivity(unchecked) private var displaced: [(memo: Unmanaged<GroupMemo>, entry: Unmanaged<ActiveSource>)] = []
    private var vanished: [GroupMemo] = []
    @exclusivity(unchecked) private var changes = 0
    /// Starts in the last reconcile that had any: the first start of a
    /// reconcile reserves that many (one allocation for the list, not a
    /// growth series; nothing when nothing starts).
    private var lastStarts = 0
    private var notPure: [String] = []
    /// Entries the last reconcile stopped (its stops and restarted
    /// entries), oldest activation first, and the next one to try: a start
    /// reuses one that nothing else references any more (not the runtime's
    /// last plan, the driver, the mailbox or the program) instead of
    /// allocating. Those not reused are released at the end of the next
    /// reconcile, as the last plan would have released them.
    /// When everything stopped, this shares its storage with the plan's
    /// stop list (one reference per entry for both: the plan is dropped
    /// before the next reconcile reuses them; a plan still held makes the
    /// first reuse copy the list, and its entries stay unreused).
    @exclusivity(unchecked) private var retired: [ActiveSource?] = []
    @exclusivity(unchecked) private var nextRetired = 0

    init(root: GroupMemo, link: OwnerLink) {
        self.root = root
        self.link = link
        self.current = root
        reuse = GroupReuse.take(root: root)
    }

    deinit { GroupReuse.give(reuse) }

    /// Offered to `group` while a set is built (`reconcile(building:)`).
    private let reuse: GroupReuse
    /// Whether `reuse` is bound: nested groups built by the walk are
    /// offered their own last children.
    private var reusing: Bool { reuse.live.load(ordering: .relaxed) != 0 }

    func reconcile<M>(building build: () -> Subscriptions<M>, deferringBoxRetains: Bool = false) -> Plan {
        // Nothing to offer without groups last time (and binding a
        // task-local outside a task allocates: not on the no-op path).
        guard !root.children.isEmpty && !verifiesGroups else {
            // A reconciler building inside another's build: that one's
            // binding must not offer its nodes here.
            if GroupReuse.current == nil { return reconcile(build(), deferringBoxRetains: deferringBoxRetains) }
            return GroupReuse.$current.withValue(nil) { reconcile(build(), deferringBoxRetains: deferringBoxRetains) }
        }
        // Restored, not reset: this may run inside a build of this
        // reconciler's own (a program's `subscriptions` reconciling another
        // way), whose binding then stays in force.
        let outer = reuse.live.load(ordering: .relaxed)
        let generation = GroupReuse.nextGeneration()
        reuse.live.store(generation, ordering: .relaxed)
        defer { reuse.live.store(outer, ordering: .releasing) }
        let binding = GroupReuse.Binding(context: .passUnretained(reuse), generation: generation, task: GroupReuse.currentTask)
        return reuse.comparing(childrenOf: root) {
            GroupReuse.$current.withValue(binding) { reconcile(build(), deferringBoxRetains: deferringBoxRetains) }
        }
    }

    /// With `deferringBoxRetains`, a start record holds its configuration
    /// box as a strong reference whose retain has not happened yet: during
    /// the reconcile the desired set holds the box, and after it the new
    /// entry does (its box changes only in a later reconcile). The runtime
    /// retains each box as it starts the source, when the driver reads the
    /// box anyway (one cache miss per start instead of two). Otherwise the
    /// boxes are retained here, before the plan is returned.
    func reconcile<M>(_ desired: Subscriptions<M>, deferringBoxRetains: Bool = false) -> Plan {
        precondition(MemoryLayout<Subscription<M>>.stride == MemoryLayout<SubscriptionCore>.stride)
        epoch &+= 1
        records = PlanRecords()
        kept = 0
        duplicates = []
        notPure = []
        begin(root)
        walk(unsafeBitCast(desired, to: Subscriptions<Erased>.self))
        finish(root)
        collectStops()
        if !records.starts.isEmpty {
            lastStarts = records.starts.count
            if !deferringBoxRetains { PlanRecords.forEachStart(records.starts) { _, box in _ = box.retain() } }
        }
        var plan = Plan(records: records, kept: kept, duplicates: duplicates)
        plan.groupsNotPure = notPure
        records = PlanRecords()
        duplicates = []
        return plan
    }

    // MARK: Walking the desired set

    /// The message type the walk sees. A set's parts hold only references
    /// (arrays, nodes) whatever the message type, so `Subscriptions<M>` has
    /// the layout of `Subscriptions<Erased>`; the walk reads them so, without
    /// value witnesses, and calls nodes only through their class methods
    /// (whose convention does not depend on the type argument).
    typealias Erased = Never

    private func walk(_ set: Subscriptions<Erased>) {
        switch set.storage {
        case nil: return
        case .one(let part)?: walk(part)
        case .many(let parts)?: walk(parts)
        }
    }

    private func walk(_ parts: [SubscriptionsPart<Erased>]) {
        for i in parts.indices {
            // A part read out of the array would be copied (retained) for
            // the call; its node is taken unretained instead (the set holds
            // it for the walk).
            if let node = parts[i].unretainedGroup {
                node._withUnsafeGuaranteedRef { walkGroup($0) }
            } else {
                walk(parts[i])
            }
        }
    }

    private func walk(_ part: SubscriptionsPart<Erased>) {
        switch part {
        case .items(let items):
            items.withUnsafeBufferPointer { buffer in
                guard let base = buffer.baseAddress else { return }
                let cores = UnsafeRawPointer(base).assumingMemoryBound(to: SubscriptionCore.self)
                walkItems(UnsafeBufferPointer(start: cores, count: buffer.count))
            }
        case .group(let node):
            // The set holds the node for the walk: no reference counting.
            Unmanaged.passUnretained(node)._withUnsafeGuaranteedRef { walkGroup($0) }
        case .mapped(let node):
            node.walk(self)
        }
    }

    func walk<M>(_ parts: [SubscriptionsPart<M>], forward: @escaping (Any) -> Any) {
        forwards.append(forward)
        walk(unsafeBitCast(parts, to: [SubscriptionsPart<Erased>].self))
        forwards.removeLast()
    }

    private func walkItems(_ items: UnsafeBufferPointer<SubscriptionCore>) {
        let memo = current
        guard let base = items.baseAddress else { return }
        for i in items.indices {
            // Entries are read unretained (the table holds them) and the
            // desired subscription is borrowed in place: a kept subscription
            // costs no reference counting unless its tagger changed.
            let d = base + i
            var found: Unmanaged<ActiveSource>?
            if memo.cursor < memo.order.count {
                let e = memo.order[memo.cursor]
                let key = Unmanaged.passUnretained(items[i].id.keyBox)
                if e._withUnsafeGuaranteedRef({ $0.hasIdentity(items[i].id.cachedHash, items[i].id.kind.type, key) }) {
                    found = e
                    memo.cursor += 1
                }
            }
            if found == nil, let u = table.find(items[i].id.cachedHash, items[i].id.kind.type, .passUnretained(items[i].id.keyBox)) {
                found = u
                u._withUnsafeGuaranteedRef { e in
                    if e.memo === memo && e.epoch != epoch { memo.cursor = Int(e.position) + 1 }
                }
            }
            guard let u = found else {
                start(d, in: memo)
                continue
            }
            let kept = u._withUnsafeGuaranteedRef { e -> Bool in
                guard e.epoch != epoch else { return false }
                guard e.memo === memo else { return false }
                guard Self.sameBox(.passUnretained(e.configurationBox), .passUnretained(items[i].configurationBox)) else { return false }
                e.epoch = epoch
                if Unmanaged.passUnretained(e.tagger).toOpaque() != Unmanaged.passUnretained(items[i].tagger).toOpaque() {
                    e.tagger = items[i].tagger
                }
                return true
            }
            if kept {
                self.kept += 1
                place(u, replacing: nil, in: memo)
            } else {
                claim(u.takeUnretainedValue(), d, in: memo)
            }
        }
    }

    @inline(__always)
    private static func sameBox(_ a: HashableBox, _ b: HashableBox) -> Bool { sameBox(.passUnretained(a), .passUnretained(b)) }

    /// Box equality on unretained references (both are held by their
    /// owners for the duration): no reference counting around the call.
    /// Callers pass references made where the box was read, so nothing is
    /// retained to keep it alive across the call.
    @inline(__always)
    fileprivate static func sameBox(_ ua: Unmanaged<HashableBox>, _ ub: Unmanaged<HashableBox>) -> Bool {
        if ua.toOpaque() == ub.toOpaque() { return true }
        return ua._withUnsafeGuaranteedRef { a in ub._withUnsafeGuaranteedRef { b in a.isEqual(b) } }
    }

    private func start(_ d: UnsafePointer<SubscriptionCore>, in memo: GroupMemo) {
        let fresh = makeEntry(d, memo)
        if records.starts.isEmpty { records.starts.reserveCapacity(max(16, lastStarts)) }
        // The box's retain is deferred (see `reconcile`).
        records.starts.append((fresh, Unmanaged.passUnretained(d.pointee.configurationBox).takeRetainedValue()))
        placeFresh(.passUnretained(fresh), in: memo)
        table.insert(fresh)    // the last use: the table takes this reference
    }

    /// Puts a new entry (in no order yet) at the next position of `memo`'s
    /// order. While the order is not being rebuilt, it takes the place of
    /// the entry there, which is remembered as displaced (churn rewrites
    /// nothing else).
    @inline(never)
    private func placeFresh(_ entry: Unmanaged<ActiveSource>, in memo: GroupMemo) {
        let i = memo.placed
        if !memo.building && i < memo.order.count {
            memo.placed = i + 1
            displaced.append((.passUnretained(memo), memo.order[i]))
            memo.order[i] = entry
            if memo.cursor == i { memo.cursor = i + 1 }
            changes += 1
            entry._withUnsafeGuaranteedRef { $0.position = UInt32(truncatingIfNeeded: i) }
            return
        }
        place(entry, replacing: nil, in: memo)
    }

    /// The slow path of a found entry: duplicate, taken from another group,
    /// changed configuration.
    private func claim(_ e: ActiveSource, _ d: UnsafePointer<SubscriptionCore>, in memo: GroupMemo) {
        if e.epoch == epoch || (e.memo !== memo && isSkipped(e.memo)) {
            duplicates.append(d.pointee.id)
            memo.ownDuplicates += 1
            return
        }
        e.epoch = epoch
        if e.memo !== memo {
            markTaken(from: e.memo)
            e.memo = memo
        }
        if Self.sameBox(e.configurationBox, d.pointee.configurationBox) {
            if e.tagger !== d.pointee.tagger { e.tagger = d.pointee.tagger }
            kept += 1
            place(.passUnretained(e), replacing: nil, in: memo)
        } else if !e.hasFailed && e.source.canRetune(e.configurationBox, d.pointee.configurationBox) {
            records.retunes.append((e, e.configurationBox, d.pointee.configurationBox))
            e.configurationBox = d.pointee.configurationBox
            e.tagger = d.pointee.tagger
            place(.passUnretained(e), replacing: nil, in: memo)
        } else {
            let fresh = makeEntry(d, memo)
            table.replace(e, with: fresh)
            records.restarts.append((e, fresh, d.pointee.configurationBox))
            place(.passUnretained(fresh), replacing: e, in: memo)
        }
    }

    /// Puts `entry` at the next position of `memo`'s new order; while that
    /// order equals the old one, nothing is written.
    @inline(__always)
    private func place(_ entry: Unmanaged<ActiveSource>, replacing old: ActiveSource?, in memo: GroupMemo) {
        let i = memo.placed
        memo.placed = i + 1
        if !memo.building {
            if i < memo.order.count {
                let there = memo.order[i].toOpaque()
                if let old {
                    if there == Unmanaged.passUnretained(old).toOpaque() {
                        memo.order[i] = entry
                        entry._withUnsafeGuaranteedRef { $0.position = UInt32(truncatingIfNeeded: i) }
                        return
                    }
                } else if there == entry.toOpaque() {
                    return
                }
            }
            startBuilding(memo, upTo: i)
        }
        memo.newOrder.append(entry)
    }

    private func startBuilding(_ memo: GroupMemo, upTo count: Int) {
        memo.building = true
        memo.divergence = count
        changes += 1
        memo.newOrder = ContiguousArray(memo.order[0..<count])
        memo.newOrder.reserveCapacity(max(memo.order.count, count + 1))
    }

    // Borrowed: the set holds the node for the walk, so the common skip
    // costs no reference counting (only `setNode` takes a reference).
    private func walkGroup(_ node: borrowing GroupNode<Erased>) {
        let compared = skipInPlace(node)
        if compared == Self.skipped { return }
        let parent = current
        var found: GroupMemo?
        var match = 0
        // Positional first: groups usually come in the same order, and a
        // group in its place is compared (key and input, typed) in one call
        // without hashing its key.
        if parent.childCursor < parent.childOrder.count {
            let m = parent.childOrder[parent.childCursor].takeUnretainedValue()
            if let last = m.node, m.occurrence == 0, m.walkEpoch != epoch {
                // The same memo `skipInPlace` looked at: its comparison holds.
                match = compared >= 0 ? compared : node.match(last)
                if match != 0 {
                    found = m
                    parent.childCursor += 1
                }
            }
        }
        if found == nil {
            var key = node.key
            found = parent.children[key]
            while let m = found, m.walkEpoch == epoch {
                key.occurrence += 1
                found = parent.children[key]
            }
            if let m = found {
                match = m.node.map { node.match($0) } ?? 1
                // The groups after it are compared from its place on (as
                // the entries' cursor does), not from the one it moved from.
                if let i = parent.lastPosition(of: m) { parent.childCursor = i + 1 }
            } else {
                let m = GroupMemo(key: key, parent: parent)
                parent.children[key] = m
                found = m
            }
        }
        let memo = found!
        placeChild(.passUnretained(memo), in: parent)
        if memo.forward != nil || !forwards.isEmpty { memo.forward = composedForward() }
        let same = match == 2 && memo.rebuildEpoch != epoch && memo.subtreeDuplicates == 0
        memo.walkEpoch = epoch
        if same && !verifiesGroups {
            memo.skipEpoch = epoch
            kept += memo.subtreeCount
            return
        }
        memo.setNode(copy node)
        let saved = forwards
        forwards = []
        let before = changes + records.starts.count + records.restarts.count + records.retunes.count + duplicates.count
        // While reusing, groups nested in this one are offered its last children.
        let built = reusing ? reuse.comparing(childrenOf: memo) { node.build() } : node.build()
        begin(memo)
        walk(built)
        finish(memo)
        current = parent
        forwards = saved
        if same && before != changes + records.starts.count + records.restarts.count + records.retunes.count + duplicates.count {
            notPure.append(memo.key?.node.keyDescription ?? "")
        }
    }

    /// `skipInPlace`'s answer when it skipped the group.
    private static let skipped = 3

    /// The common case, without reference counting: the group in its
    /// place among its parent's, with the same key and an equal input, no
    /// message mapping and nothing that forces a build. Skips it and
    /// returns `skipped`; otherwise changes nothing and returns how the
    /// group compared with the one in its place (`GroupNode.match`), or -1
    /// when it was not compared.
    @inline(__always)
    private func skipInPlace(_ node: borrowing GroupNode<Erased>) -> Int {
        guard !verifiesGroups && !mapping else { return -1 }
        let epoch = self.epoch
        return Unmanaged.passUnretained(current)._withUnsafeGuaranteedRef { parent -> Int in
            let i = parent.childCursor
            guard i < parent.childOrder.count else { return -1 }
            let u = parent.childOrder[i]
            let match = u._withUnsafeGuaranteedRef { m -> Int in
                guard m.walkEpoch != epoch, m.occurrence == 0, m.forward == nil, m.rebuildEpoch != epoch,
                      m.subtreeDuplicates == 0, let last = m.nodeRef
                else { return -1 }
                let match = last._withUnsafeGuaranteedRef { node.match($0) }
                guard match == 2 else { return match }
                m.walkEpoch = epoch
                m.skipEpoch = epoch
                kept += m.subtreeCount
                return Self.skipped
            }
            guard match == Self.skipped else { return match }
            parent.childCursor = i + 1
            placeChild(u, in: parent)
            return match
        }
    }

    /// Puts `child` at the next position of `parent`'s new child order;
    /// while that order equals the old one, nothing is written.
    @inline(__always)
    private func placeChild(_ child: Unmanaged<GroupMemo>, in parent: GroupMemo) {
        let i = parent.visited
        parent.visited = i + 1
        if !parent.childBuilding {
            if i < parent.childOrder.count && parent.childOrder[i].toOpaque() == child.toOpaque() { return }
            parent.childBuilding = true
            parent.newChildOrder.removeAll(keepingCapacity: true)
            parent.newChildOrder.append(contentsOf: parent.childOrder[0..<i])
        }
        parent.newChildOrder.append(child)
    }

    private func composedForward() -> ((Any) -> Any)? {
        switch forwards.count {
        case 0: return nil
        case 1: return forwards[0]
        default:
            let chain = Array(forwards.reversed())
            return { m in chain.reduce(m) { $1($0) } }
        }
    }

    private func begin(_ memo: GroupMemo) {
        memo.walkEpoch = epoch
        memo.cursor = 0
        memo.placed = 0
        memo.building = false
        memo.visited = 0
        memo.ownDuplicates = 0
        memo.childCursor = 0
        memo.childBuilding = false
        current = memo
    }

    private func finish(_ memo: GroupMemo) {
        if !memo.building && memo.placed != memo.order.count { startBuilding(memo, upTo: memo.placed) }
        if memo.building {
            // Before the divergence the old and new orders hold the same
            // claimed entries at the same positions: neither is read again.
            let from = memo.divergence
            scans.append((memo, memo.order, from))
            memo.order = memo.newOrder
            memo.newOrder = []
            memo.building = false
            memo.order.withUnsafeBufferPointer { order in
                for i in from..<order.count { order[i]._withUnsafeGuaranteedRef { $0.position = UInt32(truncatingIfNeeded: i) } }
            }
        }
        if memo.childBuilding {
            swap(&memo.childOrder, &memo.newChildOrder)
            memo.newChildOrder.removeAll(keepingCapacity: true)
            memo.childBuilding = false
            for i in memo.childOrder.indices { memo.childOrder[i]._withUnsafeGuaranteedRef { $0.childIndex = i } }
        } else if memo.visited < memo.childOrder.count {
            // The same order, only shorter: the groups after the last one
            // walked went (`placeChild` starts building on any other change).
            memo.childOrder.removeLast(memo.childOrder.count - memo.visited)
        }
        var count = memo.order.count
        if memo.visited != memo.children.count {
            changes += 1
            for (key, child) in memo.children where child.walkEpoch != epoch {
                memo.children[key] = nil
                vanish(child)
            }
        }
        var duplicates = memo.ownDuplicates
        // The children walked this time (the others have just vanished).
        for child in memo.childOrder {
            child._withUnsafeGuaranteedRef {
                count += $0.subtreeCount
                duplicates += $0.subtreeDuplicates
            }
        }
        memo.subtreeCount = count
        memo.subtreeDuplicates = duplicates
    }

    private func vanish(_ memo: GroupMemo) {
        scans.append((memo, memo.order, 0))
        vanished.append(memo)
        for child in memo.children.values { vanish(child) }
    }

    private func isSkipped(_ memo: GroupMemo) -> Bool {
        var g: GroupMemo? = memo
        while let x = g {
            if x.skipEpoch == epoch { return true }
            g = x.parent
        }
        return false
    }

    /// An entry of `memo` was claimed elsewhere: `memo` and the groups
    /// around it not walked yet must be built this time (their skip would
    /// count it as theirs).
    private func markTaken(from memo: GroupMemo) {
        var g: GroupMemo? = memo
        while let x = g, x.walkEpoch != epoch {
            x.rebuildEpoch = epoch
            g = x.parent
        }
    }

    private func collectStops() {
        guard !scans.isEmpty || !displaced.isEmpty else { return retire([]) }
        var stops: [ActiveSource?] = []
        var bound = displaced.count
        for scan in scans { bound += scan.order.count - scan.from }
        // Nothing claimed and every active entry scanned: everything stops,
        // and the stop list takes the table's references as they are.
        let everything = kept == 0 && records.starts.isEmpty && records.retunes.isEmpty && records.restarts.isEmpty
            && displaced.isEmpty && bound == table.count
        stops.reserveCapacity(bound)
        displaced.withUnsafeBufferPointer { displaced in
            for (memo, u) in displaced {
                let stopped = u._withUnsafeGuaranteedRef { e in
                    Unmanaged.passUnretained(e.memo).toOpaque() == memo.toOpaque() && e.epoch != epoch
                }
                if stopped { stops.append(u.takeUnretainedValue()) }
            }
        }
        displaced.removeAll(keepingCapacity: true)
        for (memo, order, from) in scans {
            for i in from..<order.count {
                let stopped = order[i]._withUnsafeGuaranteedRef { $0.memo === memo && $0.epoch != epoch }
                assert(stopped || !everything)
                if stopped { stops.append(everything ? order[i].takeRetainedValue() : order[i].takeUnretainedValue()) }
            }
        }
        scans.removeAll(keepingCapacity: true)
        for memo in vanished {
            memo.order = []
            memo.children = [:]
            memo.childOrder = []
            memo.newChildOrder = []
        }
        vanished.removeAll()
        guard !stops.isEmpty else { return retire([]) }
        records.stops = Self.inActivationOrder(stops)
        if everything {
            // The table's references are the stop list's now; the retired
            // list shares it (no reference counting per entry).
            table.abandonAll()
            retire([])
            retired = records.stops
            return
        }
        retire(records.stops)
    }

    private func makeEntry(_ sub: UnsafePointer<SubscriptionCore>, _ memo: GroupMemo) -> ActiveSource {
        generation &+= 1
        let activation = Activation(generation: generation)
        while nextRetired < retired.count {
            var candidate: ActiveSource?
            swap(&candidate, &retired[nextRetired])
            nextRetired += 1
            // Only this reference left (the strong count), and no weak or
            // unowned one: nothing can reach the old activation through it.
            // Moved out of the optional (no retain and release).
            if isKnownUniquelyReferenced(&candidate), let entry = candidate.take(), entry.hasNoWeakOrUnownedReference {
                entry.reuse(sub, activation: activation, memo: memo, epoch: epoch)
                return entry
            }
        }
        let entry = ActiveSource(sub, activation: activation, memo: memo)
        entry.epoch = epoch
        return entry
    }

    /// Releases the entries the last reconcile retired and not reused;
    /// removes `stops` from the table and retires them (the table's
    /// reference moves to `retired`), and this reconcile's restarted ones.
    private func retire(_ stops: [ActiveSource?]) {
        if !retired.isEmpty {
            retired.removeAll(keepingCapacity: true)
            nextRetired = 0
        }
        let restarts = records.restarts.count
        guard !stops.isEmpty || restarts > 0 else { return }
        retired.reserveCapacity(stops.count + restarts)
        PlanRecords.forEach(stops) { retired.append(table.take($0)) }
        for r in records.restarts { retired.append(r.old) }
    }

    // MARK: Whole-table operations

    /// The active entries, in activation order.
    var activeInOrder: [ActiveSource] { Self.inActivationOrder(table.all.map { Optional($0) }).map { $0! } }

    /// Removes and returns every active source, in activation order (shutdown).
    func removeAll() -> [ActiveSource] {
        let all = activeInOrder
        table.removeAll()
        dismantle()
        return all
    }

    /// Forgets every group (breaks the memo/entry reference cycles).
    func dismantle() {
        retired = []
        nextRetired = 0
        func clear(_ memo: GroupMemo) {
            for child in memo.children.values { clear(child) }
            memo.children = [:]
            memo.childOrder = []
            memo.newChildOrder = []
            memo.order = []
            memo.newOrder = []
            memo.subtreeCount = 0
        }
        clear(root)
    }

    /// `entries` in activation order; no sort when they already are (the
    /// common case: stops come from the desired order, which is usually the
    /// order they were started in).
    static func inActivationOrder(_ entries: [ActiveSource?]) -> [ActiveSource?] {
        var sorted = true
        var last: UInt64 = 0
        PlanRecords.forEach(entries) { e in
            guard sorted else { return }
            if e.activation.generation < last { sorted = false }
            last = e.activation.generation
        }
        if sorted { return entries }
        var order: [(UInt64, Int)] = []
        order.reserveCapacity(entries.count)
        for i in entries.indices { order.append((entries[i]!.activation.generation, i)) }
        order.sort { $0.0 < $1.0 }
        var result: [ActiveSource?] = []
        result.reserveCapacity(entries.count)
        for (_, i) in order { result.append(entries[i]) }
        return result
    }
}

/// The active entries by identity: open addressing on the identity's cached
/// hash (no re-hashing), linear probing, backward-shift deletion.
///
/// Beside each slot, one byte: 0 when the slot is empty, else `0x80` and 7
/// bits of the hash that do not choose the slot. A lookup reads these bytes
/// (64 slots a cache line) and reads an entry only when its byte matches, so
/// a miss (every new identity) touches about no entry; 1 byte a slot, under
/// 2 bytes a running subscription at the table's load.
///
/// The slots and bytes are allocated by the table itself (not arrays), so a
/// lookup or a removal does no reference counting on storage; the table owns
/// one reference to each entry in a slot.
final class EntryTable {
    @exclusivity(unchecked) private var slots: UnsafeMutablePointer<ActiveSource?>
    @exclusivity(unchecked) private var tags: UnsafeMutablePointer<UInt8>
    @exclusivity(unchecked) private var capacity: Int
    @exclusivity(unchecked) private var mask: Int
    @exclusivity(unchecked) private(set) var count = 0

    private static let initialCapacity = 16

    init() {
        (slots, tags) = Self.allocate(Self.initialCapacity)
        capacity = Self.initialCapacity
        mask = capacity - 1
    }

    deinit { Self.deallocate(slots, tags, capacity) }

    private static func allocate(_ capacity: Int) -> (UnsafeMutablePointer<ActiveSource?>, UnsafeMutablePointer<UInt8>) {
        let slots = UnsafeMutablePointer<ActiveSource?>.allocate(capacity: capacity)
        slots.initialize(repeating: nil, count: capacity)
        let tags = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
        tags.initialize(repeating: 0, count: capacity)
        return (slots, tags)
    }

    private static func deallocate(_ slots: UnsafeMutablePointer<ActiveSource?>, _ tags: UnsafeMutablePointer<UInt8>, _ capacity: Int) {
        slots.deinitialize(count: capacity)
        slots.deallocate()
        tags.deallocate()
    }

    @inline(__always)
    private static func tag(_ hash: Int) -> UInt8 { 0x80 | UInt8(truncatingIfNeeded: UInt(bitPattern: hash) &>> 57) }

    /// The entry in slot `i` (occupied), unretained: the slot holds it.
    @inline(__always)
    private func unretained(at i: Int) -> Unmanaged<ActiveSource> {
        UnsafeRawPointer(slots + i).load(as: Unmanaged<ActiveSource>.self)
    }

    func find(_ id: borrowing SubscriptionID) -> ActiveSource? {
        find(id.cachedHash, id.kind.type, .passUnretained(id.keyBox))?.takeUnretainedValue()
    }

    /// The entry whose identity has cached hash `hash`, kind `kind` and a
    /// key equal to the one in `key` (held by the caller), unretained.
    func find(_ hash: Int, _ kind: ObjectIdentifier, _ key: Unmanaged<HashableBox>) -> Unmanaged<ActiveSource>? {
        let t = Self.tag(hash)
        var i = hash & mask
        while true {
            let x = tags[i]
            if x == 0 { return nil }
            if x == t {
                let u = unretained(at: i)
                if u._withUnsafeGuaranteedRef({ $0.hasIdentity(hash, kind, key) }) { return u }
            }
            i = (i &+ 1) & mask
        }
    }

    func insert(_ entry: __owned ActiveSource) {
        if (count + 1) * 4 > capacity * 3 { grow() }
        count += 1
        place(entry)
    }

    private func place(_ entry: __owned ActiveSource) {
        let hash = entry.id.cachedHash
        var i = hash & mask
        while tags[i] != 0 { i = (i &+ 1) & mask }
        tags[i] = Self.tag(hash)
        slots[i] = entry
    }

    private func slot(of entry: ActiveSource) -> Int? {
        let hash = entry.id.cachedHash
        let t = Self.tag(hash)
        let target = Unmanaged.passUnretained(entry).toOpaque()
        var i = hash & mask
        while true {
            let x = tags[i]
            if x == 0 { return nil }
            if x == t, unretained(at: i).toOpaque() == target { return i }
            i = (i &+ 1) & mask
        }
    }

    func replace(_ old: ActiveSource, with new: ActiveSource) {
        guard let i = slot(of: old) else { return insert(new) }
        slots[i] = new
    }

    /// Removes `entry` and returns the table's reference to it (moved out:
    /// no reference counting).
    func take(_ entry: ActiveSource) -> ActiveSource? {
        guard var i = slot(of: entry) else { return nil }
        count -= 1
        let mask = self.mask
        var taken: ActiveSource?
        swap(&taken, &slots[i])
        tags[i] = 0
        var j = i
        while true {
            j = (j &+ 1) & mask
            guard tags[j] != 0 else { break }
            let k = unretained(at: j)._withUnsafeGuaranteedRef { $0.id.cachedHash } & mask
            // The entry at j stays if its home k lies cyclically in (i, j].
            let stays = i <= j ? (i < k && k <= j) : (i < k || k <= j)
            if stays { continue }
            swap(&slots[i], &slots[j])
            tags[i] = tags[j]
            tags[j] = 0
            i = j
        }
        return taken
    }

    private func grow() {
        let (oldSlots, oldTags, oldCapacity) = (slots, tags, capacity)
        capacity = oldCapacity * 2
        mask = capacity - 1
        (slots, tags) = Self.allocate(capacity)
        for k in 0..<oldCapacity where oldTags[k] != 0 {
            var e: ActiveSource?
            swap(&e, &oldSlots[k])
            if let e { place(e) }
        }
        Self.deallocate(oldSlots, oldTags, oldCapacity)
    }

    var all: [ActiveSource] {
        var all: [ActiveSource] = []
        all.reserveCapacity(count)
        for k in 0..<capacity { if let e = slots[k] { all.append(e) } }
        return all
    }

    /// Empties the table without releasing its entries: the caller has
    /// taken over the table's reference to every one of them.
    func abandonAll() {
        for k in 0..<capacity where tags[k] != 0 { (slots + k).initialize(to: nil) }
        tags.update(repeating: 0, count: capacity)
        count = 0
    }

    func removeAll() {
        Self.deallocate(slots, tags, capacity)
        capacity = Self.initialCapacity
        mask = capacity - 1
        (slots, tags) = Self.allocate(capacity)
        count = 0
    }
}
