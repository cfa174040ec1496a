// The unsafe trick of this file: executing a plan reads each record's
// entries in place, as unretained references loaded at byte offsets of the
// record tuples, so that a plan of N steps costs no reference counting per
// step (a copied-out tuple would retain and release each field).
//
// What it relies on: the records hold every entry for the duration of the
// call (the plan is alive), and the offsets of the fields read, which come
// from `MemoryLayout.offset(of:)` on the tuple types (never from a computed
// stride). Start records are unretained already (`StartRecords.swift`). What would break it: a record type changed so that a field read
// here is no longer a single class reference. `Tests/ReconcileTests/LayoutTests.swift`
// reads every field through these functions and compares with the tuples'.

extension PlanRecords {
    /// The byte offset of a record's first entry (`stops`' element, a
    /// restart's `old`).
    static let entryOffset = 0
    /// The byte offset of a restart's `new` entry.
    static let restartNewOffset = MemoryLayout<Restart>.offset(of: \Restart.new)!

    /// Calls `body` with the entry at byte `offset` of each element of
    /// `list`, in order, unretained: the records hold every entry for the
    /// duration, so executing a plan costs no reference counting per step.
    @inline(__always)
    static func forEach<Element>(_ list: [Element], offset: Int = entryOffset, _ body: (ActiveSource) -> Void) {
        list.withUnsafeBufferPointer { buffer in
            guard let base = buffer.baseAddress else { return }
            let raw = UnsafeRawPointer(base)
            for i in 0..<buffer.count {
                raw.load(fromByteOffset: i &* MemoryLayout<Element>.stride &+ offset, as: Unmanaged<ActiveSource>.self)
                    ._withUnsafeGuaranteedRef(body)
            }
        }
    }

    /// Calls `body` with each start record's entry and configuration box,
    /// in order, unretained (the records are: see `StartRecords.swift`).
    @inline(__always)
    static func forEachStart(_ starts: StartRecords, _ body: (ActiveSource, Unmanaged<HashableBox>) -> Void) {
        guard let store = starts.store else { return }
        store.records.withUnsafeBufferPointer { buffer in
            for r in buffer { r.source._withUnsafeGuaranteedRef { body($0, r.configuration) } }
        }
    }
}
