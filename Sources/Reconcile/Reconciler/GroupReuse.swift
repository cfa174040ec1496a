import Synchronization

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
