// The unsafe trick of this file: a plan's start records hold their entries
// and configuration boxes unretained, in a buffer the engine reuses from one
// reconcile to the next, so that a start costs no reference counting for its
// record (a retained record was a retain at the reconcile and a release when
// the plan went, on each of two objects).
//
// What keeps them alive: the entry is in the engine's table from its start
// until a later reconcile stops it; a stopped entry is freed (or recycled as
// another activation, `EntryRecycling.swift`) only by the reconcile after
// that one, at the earliest. The box is held by the entry until a retune
// replaces it, which also happens only in a later reconcile. So a plan's
// records are valid until the engine's next reconcile, its `removeAll` or
// its deinit. At each of those the engine looks at its last store: if a plan
// still holds it (it is not uniquely referenced), the store is *pinned*
// first: it retains every entry and box it lists (what retained records
// cost before, now only for plans kept past their reconcile), releases
// them when it goes, and is never reused. The runtime drops its last plan
// before it reconciles again, so it never pays for a pin.
//
// What would break it: anything freeing or recycling an entry, or replacing
// an entry's box, outside a reconcile, `removeAll` or the engine's deinit.
// `PlanRecordsTests` hold plans across later reconciles, a shutdown and the
// reconciler's end, and read every step.

/// One start: the new entry and its configuration box, both unretained.
struct StartRecord {
    let source: Unmanaged<ActiveSource>
    let configuration: Unmanaged<HashableBox>
}

/// The start records of one plan, owned by the engine while no plan
/// outlives its reconcile (see above).
final class StartRecordStore {
    @exclusivity(unchecked) var records: ContiguousArray<StartRecord> = []
    /// Whether this store holds a reference to each entry and box it lists.
    private(set) var pinned = false

    /// Takes a reference to every entry and box listed (a plan holding this
    /// store outlives the reconcile that made it).
    func pin() {
        guard !pinned else { return }
        pinned = true
        for r in records {
            _ = r.source.retain()
            _ = r.configuration.retain()
        }
    }

    deinit {
        guard pinned else { return }
        for r in records {
            r.source.release()
            r.configuration.release()
        }
    }
}

/// A plan's start records, in the desired set's order: a collection of
/// `(source, configuration)`, read unretained by `PlanRecords.forEachStart`.
struct StartRecords: RandomAccessCollection {
    /// Nil while empty (a reconcile that starts nothing allocates nothing).
    var store: StartRecordStore?

    var startIndex: Int { 0 }
    var endIndex: Int { store?.records.count ?? 0 }

    subscript(i: Int) -> (source: ActiveSource, configuration: HashableBox) {
        let r = store!.records[i]
        return (r.source.takeUnretainedValue(), r.configuration.takeUnretainedValue())
    }
}

extension ReconcileEngine {
    /// Appends a start record to this reconcile's store, taking the last
    /// reconcile's store back when no plan holds it any more.
    @inline(__always)
    func recordStart(_ entry: ActiveSource, _ box: HashableBox) {
        if records.starts.store == nil { records.starts.store = takeStartStore() }
        records.starts.store.unsafelyUnwrapped.records.append(
            StartRecord(source: .passUnretained(entry), configuration: .passUnretained(box)))
    }

    /// The store for this reconcile's starts: the last one, emptied, or a
    /// new one when a plan still holds it (`releaseStartStore` pinned it).
    private func takeStartStore() -> StartRecordStore {
        let store: StartRecordStore
        if let last = lastStartStore {
            store = last
            store.records.removeAll(keepingCapacity: true)
        } else {
            store = StartRecordStore()
            lastStartStore = store
        }
        store.records.reserveCapacity(max(16, lastStarts))
        return store
    }

    /// Called before anything could free or recycle an entry (each
    /// reconcile's start, `removeAll`, deinit): a store that a plan still
    /// holds is pinned and given up.
    func releaseStartStore() {
        guard lastStartStore != nil else { return }
        if !isKnownUniquelyReferenced(&lastStartStore!) {
            lastStartStore!.pin()
            lastStartStore = nil
        }
    }
}
