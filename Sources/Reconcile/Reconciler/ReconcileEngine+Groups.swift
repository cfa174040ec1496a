/// The engine's group walk: skipping an unchanged group in place, building
/// a changed one, and the group memos' bookkeeping.
extension ReconcileEngine {
    // Borrowed: the set holds the node for the walk, so the common skip
    // costs no reference counting (only `setNode` takes a reference).
    func walkGroup(_ node: borrowing GroupNode<Erased>) {
        let placement = skipInPlace(node)
        if case .skipped = placement { return }
        let parent = current
        var found: GroupMemo?
        var match = GroupMatch.otherKey
        // Positional first: groups usually come in the same order, and a
        // group in its place is compared (key and input, typed) in one call
        // without hashing its key.
        if parent.childCursor < parent.childOrder.count {
            let m = parent.childOrder[parent.childCursor].takeUnretainedValue()
            if let last = m.node, m.occurrence == 0, m.walkEpoch != epoch {
                // The same memo `skipInPlace` looked at: its comparison holds.
                if case .compared(let m) = placement { match = m } else { match = node.match(last) }
                if match != .otherKey {
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
                match = m.node.map { node.match($0) } ?? .sameKey
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
        let same = match == .same && memo.rebuildEpoch != epoch && memo.subtreeDuplicates == 0
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
        // The group's content holds its entries' taggers (see `ActiveSource`);
        // the last one goes at the end of the reconcile.
        if let previous = memo.content { releasedContents.append(previous) }
        memo.content = built
        begin(memo)
        walk(built)
        finish(memo)
        current = parent
        forwards = saved
        if same && before != changes + records.starts.count + records.restarts.count + records.retunes.count + duplicates.count {
            notPure.append(memo.key?.node.keyDescription ?? "")
        }
    }

    /// What `skipInPlace` did with a group.
    enum Placement {
        /// Not compared: verifying or mapping, no group in its place, or that
        /// one cannot be skipped whatever its input (see `skipInPlace`).
        case notCompared
        /// Compared with the group in its place, not skipped.
        case compared(GroupMatch)
        /// Unchanged and skipped in place.
        case skipped
    }

    /// The common case, without reference counting: the group in its
    /// place among its parent's, with the same key and an equal input, no
    /// message mapping and nothing that forces a build. Skips it
    /// (`.skipped`); otherwise changes nothing and says how the group
    /// compared with the one in its place, if it was compared.
    @inline(__always)
    func skipInPlace(_ node: borrowing GroupNode<Erased>) -> Placement {
        guard !verifiesGroups && !mapping else { return .notCompared }
        let epoch = self.epoch
        return Unmanaged.passUnretained(current)._withUnsafeGuaranteedRef { parent -> Placement in
            let i = parent.childCursor
            guard i < parent.childOrder.count else { return .notCompared }
            let u = parent.childOrder[i]
            let placement = u._withUnsafeGuaranteedRef { m -> Placement in
                guard m.walkEpoch != epoch, m.occurrence == 0, m.forward == nil, m.rebuildEpoch != epoch,
                      m.subtreeDuplicates == 0, let last = m.nodeRef
                else { return .notCompared }
                let match = last._withUnsafeGuaranteedRef { node.match($0) }
                guard match == .same else { return .compared(match) }
                m.walkEpoch = epoch
                m.skipEpoch = epoch
                kept += m.subtreeCount
                return .skipped
            }
            guard case .skipped = placement else { return placement }
            parent.childCursor = i + 1
            placeChild(u, in: parent)
            return placement
        }
    }

    /// Puts `child` at the next position of `parent`'s new child order;
    /// while that order equals the old one, nothing is written.
    @inline(__always)
    func placeChild(_ child: Unmanaged<GroupMemo>, in parent: GroupMemo) {
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

    func composedForward() -> ((Any) -> Any)? {
        switch forwards.count {
        case 0: return nil
        case 1: return forwards[0]
        default:
            let chain = Array(forwards.reversed())
            return { m in chain.reduce(m) { $1($0) } }
        }
    }

    func begin(_ memo: GroupMemo) {
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

    func finish(_ memo: GroupMemo) {
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

    func vanish(_ memo: GroupMemo) {
        scans.append((memo, memo.order, 0))
        vanished.append(memo)
        for child in memo.children.values { vanish(child) }
    }

    func isSkipped(_ memo: GroupMemo) -> Bool {
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
    func markTaken(from memo: GroupMemo) {
        var g: GroupMemo? = memo
        while let x = g, x.walkEpoch != epoch {
            x.rebuildEpoch = epoch
            g = x.parent
        }
    }
}
