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
    @exclusivity(unchecked) var epoch: UInt64 = 0
    @exclusivity(unchecked) var generation: UInt64 = 0
    // Per reconcile.
    @exclusivity(unchecked) var records = PlanRecords()
    @exclusivity(unchecked) var kept = 0
    @exclusivity(unchecked) var duplicates: [SubscriptionID] = []
    /// The group being walked: the root or a memo its parent's `children`
    /// holds for the walk, so it is held unretained (no reference counting
    /// per group begun, the root's included; between reconciles it is the
    /// root).
    @exclusivity(unchecked) unowned(unsafe) var current: GroupMemo
    var forwards: [(Any) -> Any] = [] { didSet { mapping = !forwards.isEmpty } }
    /// `!forwards.isEmpty`, read on the skip path (a plain load).
    var mapping = false
    @exclusivity(unchecked) var scans: [(memo: GroupMemo, order: ContiguousArray<Unmanaged<ActiveSource>>, from: Int)] = []
    /// Entries a new entry took the place of in their group's order
    /// (stopped unless claimed elsewhere in this reconcile).
    @exclusivity(unchecked) var displaced: [(memo: Unmanaged<GroupMemo>, entry: Unmanaged<ActiveSource>)] = []
    @exclusivity(unchecked) var vanished: [GroupMemo] = []
    /// The contents of groups rebuilt in this reconcile, released at its end
    /// (after the stops pinned the taggers they hold).
    @exclusivity(unchecked) var releasedContents: [Subscriptions<Erased>] = []
    @exclusivity(unchecked) var changes = 0
    /// Starts in the last reconcile that had any: the first start of a
    /// reconcile reserves that many (one allocation for the list, not a
    /// growth series; nothing when nothing starts).
    var lastStarts = 0
    @exclusivity(unchecked) var notPure: [String] = []
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
    @exclusivity(unchecked) var retired: [ActiveSource?] = []
    @exclusivity(unchecked) var nextRetired = 0
    /// The storage of the last plan's stop list when not everything
    /// stopped (shared with that plan): emptied at the next reconcile's
    /// start, before any entry is reused, and that reconcile's stop list is
    /// built in it (no allocation per churned reconcile once the plan is
    /// dropped; a plan still held makes the emptying allocate instead).
    @exclusivity(unchecked) var spareStops: [ActiveSource?] = []

    init(root: GroupMemo, link: OwnerLink) {
        self.root = root
        self.link = link
        self.current = root
        reuse = GroupReuse.take(root: root)
    }

    /// The store of the last plan's start records, reused while no plan
    /// holds it (`StartRecords.swift`).
    var lastStartStore: StartRecordStore?

    deinit {
        releaseStartStore()
        GroupReuse.give(reuse)
    }

    /// Offered to `group` while a set is built (`reconcile(building:)`).
    let reuse: GroupReuse
    /// Whether `reuse` is bound: nested groups built by the walk are
    /// offered their own last children.
    var reusing: Bool { reuse.live.load(ordering: .relaxed) != 0 }

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

    /// A started entry holds its configuration box as a strong reference
    /// whose retain has not happened yet (its start record holds the box
    /// unretained, `StartRecords.swift`): during the reconcile the desired
    /// set holds the box. With `deferringBoxRetains` the runtime retains
    /// each box for its entry as it starts the source, when the driver reads
    /// the box anyway (one cache miss per start instead of two). Otherwise
    /// the boxes are retained here, before the plan is returned.
    func reconcile<M>(_ desired: Subscriptions<M>, deferringBoxRetains: Bool = false) -> Plan {
        // Before anything can free or recycle an entry a kept plan lists.
        releaseStartStore()
        if !spareStops.isEmpty { spareStops.removeAll(keepingCapacity: true) }
        epoch &+= 1
        // `records` and `duplicates` were emptied when the last plan was
        // made (a plain check here, not a release of empty storage).
        kept = 0
        if !notPure.isEmpty { notPure = [] }
        begin(root)
        // The root's content holds the plain parts' taggers (see
        // `ActiveSource`); the last one is released only after the stops
        // have pinned theirs.
        let erased = Self.erase(desired)
        let previous = root.content
        root.content = erased
        walk(erased)
        finish(root)
        collectStops()
        withExtendedLifetime(previous) {}
        if !releasedContents.isEmpty { releasedContents.removeAll(keepingCapacity: true) }
        if !records.starts.isEmpty {
            lastStarts = records.starts.count
            if !deferringBoxRetains { PlanRecords.forEachStart(records.starts) { _, box in _ = box.retain() } }
        }
        #if RECONCILE_CHECK_INVARIANTS
        _checkInvariants()
        #endif
        // Moved into the plan (no reference counting on the lists).
        var taken = PlanRecords()
        swap(&taken, &records)
        var takenDuplicates: [SubscriptionID] = []
        if !duplicates.isEmpty { swap(&takenDuplicates, &duplicates) }
        var plan = Plan(records: taken, kept: kept, duplicates: takenDuplicates)
        if !notPure.isEmpty { plan.groupsNotPure = notPure }
        return plan
    }

    // MARK: Walking the desired set


    func walk(_ set: Subscriptions<Erased>) {
        switch set.storage {
        case nil: return
        case .one(let part)?: walk(part)
        case .many(let parts)?: walk(parts)
        }
    }

    func walk(_ parts: [SubscriptionsPart<Erased>]) {
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

    func walk(_ part: SubscriptionsPart<Erased>) {
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
        walk(Self.erase(parts))
        forwards.removeLast()
    }

    func walkItems(_ items: UnsafeBufferPointer<SubscriptionCore>) {
        let memo = current
        guard let base = items.baseAddress else { return }
        for i in items.indices {
            // Entries are read unretained (the table holds them) and the
            // desired subscription is borrowed in place: a kept subscription
            // costs no reference counting.
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
                // A plain store: the memo's content holds the tagger (see
                // `ActiveSource`), no reference counting.
                e.taggerRef = .passUnretained(d.pointee.tagger)
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
    static func sameBox(_ a: HashableBox, _ b: HashableBox) -> Bool { sameBox(.passUnretained(a), .passUnretained(b)) }

    /// Box equality on unretained references (both are held by their
    /// owners for the duration): no reference counting around the call.
    /// Callers pass references made where the box was read, so nothing is
    /// retained to keep it alive across the call.
    @inline(__always)
    static func sameBox(_ ua: Unmanaged<HashableBox>, _ ub: Unmanaged<HashableBox>) -> Bool {
        if ua.toOpaque() == ub.toOpaque() { return true }
        return ua._withUnsafeGuaranteedRef { a in ub._withUnsafeGuaranteedRef { b in a.isEqual(b) } }
    }

    func start(_ d: UnsafePointer<SubscriptionCore>, in memo: GroupMemo) {
        // The entry's retain of its box is deferred (see `reconcile`); the
        // record holds both unretained.
        let fresh = makeEntry(d, memo, boxRetainDeferred: true)
        recordStart(fresh, d.pointee.configurationBox)
        placeFresh(.passUnretained(fresh), in: memo)
        table.insert(fresh)    // the last use: the table takes this reference
    }

    /// Puts a new entry (in no order yet) at the next position of `memo`'s
    /// order. While the order is not being rebuilt, it takes the place of
    /// the entry there, which is remembered as displaced (churn rewrites
    /// nothing else).
    @inline(never)
    func placeFresh(_ entry: Unmanaged<ActiveSource>, in memo: GroupMemo) {
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
    func claim(_ e: ActiveSource, _ d: UnsafePointer<SubscriptionCore>, in memo: GroupMemo) {
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
            e.taggerRef = .passUnretained(d.pointee.tagger)
            kept += 1
            place(.passUnretained(e), replacing: nil, in: memo)
        } else if !e.hasFailed && e.source.canRetune(e.configurationBox, d.pointee.configurationBox) {
            records.retunes.append((e, e.configurationBox, d.pointee.configurationBox))
            e.configurationBox = d.pointee.configurationBox
            e.taggerRef = .passUnretained(d.pointee.tagger)
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
    func place(_ entry: Unmanaged<ActiveSource>, replacing old: ActiveSource?, in memo: GroupMemo) {
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
        if memo.newOrder.count == memo.newOrder.capacity {
            // One allocation for the old order's size, then doubling.
            memo.newOrder.reserveCapacity(max(memo.order.count, 2 * memo.newOrder.count, 16))
        }
        memo.newOrder.append(entry)
    }

    /// Starts `memo`'s new order with the first `count` entries of the old
    /// one. Its storage is the memo's spare one when it has one (the storage
    /// of an order that emptied, see `collectStops`): after everything
    /// stopped, starting it all again allocates no order.
    func startBuilding(_ memo: GroupMemo, upTo count: Int) {
        memo.building = true
        memo.divergence = count
        changes += 1
        memo.newOrder.removeAll(keepingCapacity: true)
        if count > 0 {
            memo.newOrder.reserveCapacity(max(memo.order.count, count + 1))
            memo.order.withUnsafeBufferPointer { memo.newOrder.append(contentsOf: $0[0..<count]) }
        }
    }
}
