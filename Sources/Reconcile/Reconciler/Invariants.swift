// The engine's invariants, checked after every reconcile when the package is
// built with RECONCILE_CHECK_INVARIANTS=1 in the environment (`make
// check-invariants` runs the differential, property and group suites so).
// Compiled out otherwise: the checks walk every entry and group.

extension ReconcileEngine {
    /// Traps with a description when the table and the group memos disagree.
    func _checkInvariants() {
        table._checkInvariants()
        var seen = Set<ObjectIdentifier>()
        let total = check(root, seen: &seen)
        precondition(total == table.count, "the groups claim \(total) entries, the table holds \(table.count)")
        precondition(root.subtreeCount == total, "root.subtreeCount \(root.subtreeCount), entries \(total)")
    }

    /// The taggers of `content`'s plain parts; nil when it has mapped parts.
    private func heldTaggers(_ content: Subscriptions<Erased>?) -> Set<ObjectIdentifier>? {
        var held = Set<ObjectIdentifier>()
        var parts: [SubscriptionsPart<Erased>] = []
        switch content?.storage {
        case nil: return held
        case .one(let p)?: parts = [p]
        case .many(let ps)?: parts = ps
        }
        for p in parts {
            switch p {
            case .items(let items): for s in items { held.insert(ObjectIdentifier(s.core.tagger)) }
            case .group: break
            case .mapped: return nil
            }
        }
        return held
    }

    /// Checks `memo` and its nested groups; returns the entries they claim.
    private func check(_ memo: GroupMemo, seen: inout Set<ObjectIdentifier>) -> Int {
        var count = 0
        // Every entry's tagger is held by its group's content (entries hold
        // taggers unretained: see `ActiveSource`). Contents with mapped parts
        // are not looked into.
        let held = heldTaggers(memo.content)
        for u in memo.order {
            let e = u.takeUnretainedValue()
            if let held {
                precondition(held.contains(ObjectIdentifier(e.taggerRef.takeUnretainedValue())),
                             "\(e.id)'s tagger is not held by its group's content")
            }
            precondition(seen.insert(ObjectIdentifier(e)).inserted, "\(e.id) is claimed twice")
            precondition(e.memo === memo, "\(e.id) is in a group's order but names another group")
            precondition(table.find(e.id) === e, "\(e.id) is in a group's order but not in the table")
            count += 1
        }
        precondition(memo.childOrder.count == Set(memo.childOrder.map { ObjectIdentifier($0.takeUnretainedValue()) }).count,
                     "a group appears twice in its parent's child order")
        for u in memo.childOrder {
            let child = u.takeUnretainedValue()
            precondition(child.parent === memo, "a child group names another parent")
            precondition(child.key.map { memo.children[$0] === child } ?? false, "a child group is not found by its key")
            count += check(child, seen: &seen)
        }
        precondition(memo.subtreeCount == count, "a group's subtreeCount is \(memo.subtreeCount), its entries \(count)")
        return count
    }
}

extension ReconcileEngine {
    /// Whether this build checks the invariants after every reconcile.
    #if RECONCILE_CHECK_INVARIANTS
    static let checksInvariants = true
    #else
    static let checksInvariants = false
    #endif
}
