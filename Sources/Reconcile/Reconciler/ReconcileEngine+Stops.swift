/// The engine's end of a pass: collecting the stops, retiring entries,
/// and taking the table apart.
extension ReconcileEngine {
    func collectStops() {
        guard !scans.isEmpty || !displaced.isEmpty else {
            PlanRecords.forEach(records.restarts) { $0.pinTagger() }
            return retire([])
        }
        var stops: [ActiveSource?] = []
        var bound = displaced.count
        for scan in scans { bound += scan.order.count - scan.from }
        // Nothing claimed and every active entry scanned: everything stops,
        // and the stop list takes the table's references as they are.
        let everything = kept == 0 && records.starts.isEmpty && records.retunes.isEmpty && records.restarts.isEmpty
            && displaced.isEmpty && bound == table.count
        if !everything { swap(&stops, &spareStops) }
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
        // A group whose order emptied keeps the old order's storage as its
        // next new order's (no per-running-subscription memory: nothing in
        // it runs; a whole set stopped and started again allocates none).
        for k in scans.indices where scans[k].memo.order.isEmpty {
            var storage = ContiguousArray<Unmanaged<ActiveSource>>()
            swap(&storage, &scans[k].order)
            let memo = scans[k].memo
            if memo.newOrder.capacity < storage.capacity {
                storage.removeAll(keepingCapacity: true)
                memo.newOrder = storage
            }
        }
        scans.removeAll(keepingCapacity: true)
        // Stopped entries with a poster keep their taggers (see
        // `ActiveSource`) before any content that holds them goes.
        PlanRecords.forEach(stops) { $0.pinTagger() }
        PlanRecords.forEach(records.restarts) { $0.pinTagger() }
        for memo in vanished {
            memo.content = nil
            memo.order = []
            memo.newOrder = []
            memo.children = [:]
            memo.childOrder = []
            memo.newChildOrder = []
        }
        vanished.removeAll()
        guard !stops.isEmpty else {
            spareStops = stops
            return retire([])
        }
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
        spareStops = records.stops
    }

    /// A new entry for `sub` (a recycled one when one is free); with
    /// `boxRetainDeferred` (a start's), it holds its box unretained until
    /// the end of the reconcile (see `ActiveSource.init`).
    func makeEntry(_ sub: UnsafePointer<SubscriptionCore>, _ memo: GroupMemo, boxRetainDeferred: Bool = false) -> ActiveSource {
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
                entry.reuse(sub, activation: activation, memo: memo, epoch: epoch, boxRetainDeferred: boxRetainDeferred)
                return entry
            }
        }
        let entry = ActiveSource(sub, activation: activation, memo: memo, boxRetainDeferred: boxRetainDeferred)
        entry.epoch = epoch
        return entry
    }

    /// Releases the entries the last reconcile retired and not reused;
    /// removes `stops` from the table and retires them (the table's
    /// reference moves to `retired`), and this reconcile's restarted ones.
    func retire(_ stops: [ActiveSource?]) {
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
        releaseStartStore()
        let all = activeInOrder
        for e in all { e.pinTagger() }
        table.removeAll()
        dismantle()
        return all
    }

    /// Forgets every group (breaks the memo/entry reference cycles).
    func dismantle() {
        retired = []
        nextRetired = 0
        spareStops = []
        func clear(_ memo: GroupMemo) {
            for child in memo.children.values { clear(child) }
            memo.content = nil
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
