//// How a group compares with a group node of the last reconcile.
@usableFromInline enum GroupMatch: UInt8 {
    /// Another key: not this group.
    case otherKey
    /// The same key and another input: this group, to be built again.
    case sameKey
    /// The same key and an equal input: this group, which may be skipped.
    case same
}

// A group's key as the reconciler looks it up: the node that carries it
/// (typed comparison, no boxing), its cached hash, and which occurrence of
/// that key among its siblings it is.
struct GroupKey: Hashable {
    let node: GroupIdentity
    let cachedHash: Int
    var occurrence = 0

    static func == (a: GroupKey, b: GroupKey) -> Bool {
        a.cachedHash == b.cachedHash && a.occurrence == b.occurrence && (a.node === b.node || a.node.keyEquals(b.node))
    }
    func hash(into hasher: inout Hasher) { hasher.combine(cachedHash) }
}

/// A group as given, without its message type: key and input, compared typed.
@usableFromInline class GroupIdentity {
    @usableFromInline init() {}
    func keyEquals(_ other: GroupIdentity) -> Bool { fatalError("GroupIdentity.keyEquals: abstract") }
    func inputEquals(_ other: GroupIdentity) -> Bool { fatalError("GroupIdentity.inputEquals: abstract") }
    var keyDescription: String { fatalError("GroupIdentity.keyDescription: abstract") }
}

/// A memoized group as given: its key, its input, and how to build it (one
/// object per group and reconcile; with the body's closure context, the only
/// allocations a group costs the program).
@usableFromInline class GroupNode<Message>: GroupIdentity {
    @usableFromInline override init() {}
    /// The key with its hash (set by the typed subclass; hashed only when
    /// asked: a group found in its place needs no hash).
    var key: GroupKey { fatalError("GroupNode.key: abstract") }
    /// How `last` (a node of the last reconcile) compares with this one.
    /// One call on the positional path.
    func match(_ last: GroupIdentity) -> GroupMatch { fatalError("GroupNode.match: abstract") }
    /// The group's subscriptions, built now.
    func build() -> Subscriptions<Message> { fatalError("GroupNode.build: abstract") }

    /// For a group `lookUp` found no place for among the two it compared:
    /// the last reconcile's node with this key (looked up) if its input is
    /// equal, else this new node; either way the comparison of the next
    /// group goes on after the one with this key.
    @usableFromInline func relocated(in context: Unmanaged<GroupReuse>) -> GroupNode<Message> {
        context._withUnsafeGuaranteedRef { c -> GroupNode<Message> in
            guard let m = c.relocate(key), m.subtreeDuplicates == 0, let last = m.node,
                  ObjectIdentifier(type(of: last)) == ObjectIdentifier(type(of: self)), match(last) == .same
            else { return self }
            return unsafeDowncast(last, to: GroupNode<Message>.self)
        }
    }
}

@usableFromInline
final class TypedGroupNode<Message, Key: Hashable & Sendable, Input: Equatable>: GroupNode<Message> {
    @usableFromInline let keyValue: Key
    @usableFromInline let value: Input
    // The body, given its input or its key and input (one is set).
    // Function types have one layout whatever their types: destroying a
    // node needs no metadata for them, as it would for an enum of the two.
    @usableFromInline let body: ((Input) -> Subscriptions<Message>)?
    @usableFromInline let keyedBody: ((Key, Input) -> Subscriptions<Message>)?

    @inlinable init(key: Key, input: Input, body: @escaping (Input) -> Subscriptions<Message>) {
        self.keyValue = key
        self.value = input
        self.body = body
        self.keyedBody = nil
    }

    @inlinable init(key: Key, input: Input, keyedBody: @escaping (Key, Input) -> Subscriptions<Message>) {
        self.keyValue = key
        self.value = input
        self.body = nil
        self.keyedBody = keyedBody
    }

    /// The node for a group: the last reconcile's when `lookUp` or
    /// `relocated(in:)` finds one for this key and an equal input, else
    /// one `make` makes.
    @inlinable static func node(_ key: Key, _ input: Input, _ make: () -> TypedGroupNode) -> GroupNode<Message> {
        switch lookUp(key, input) {
        case .reused(let last): return last
        case .new: return make()
        case .lost(let context): return make().relocated(in: context)
        }
    }

    /// What `lookUp` found for a group while a set is built.
    @usableFromInline enum Found {
        /// The last reconcile's node, for this key and an equal input.
        case reused(TypedGroupNode)
        /// Nothing to reuse: no context bound, or the group's place was
        /// found with another input or with duplicates.
        case new
        /// The group's key is in neither place compared: `relocated(in:)`
        /// looks it up.
        case lost(Unmanaged<GroupReuse>)
    }

    /// The last reconcile's node for this key and an equal input, when the
    /// set is built for a reconciler that offers them (`GroupReuse`): the
    /// one in the next place among the enclosing group's last children, or
    /// the one after it (a group removed before it).
    @inlinable static func lookUp(_ key: Key, _ input: Input) -> Found {
        guard let context = GroupReuse.active() else { return .new }
        return context._withUnsafeGuaranteedRef { c -> Found in
            for offset in 0..<2 {
                guard let last = c.candidate(offset) else { break }
                let match = last.node._withUnsafeGuaranteedRef { l -> GroupMatch in
                    guard ObjectIdentifier(type(of: l)) == ObjectIdentifier(TypedGroupNode.self) else { return .otherKey }
                    let o = unsafeDowncast(l, to: TypedGroupNode.self)
                    guard o.keyValue == key else { return .otherKey }
                    return o.value == input ? .same : .sameKey
                }
                // Another occurrence of this key, or one this build took:
                // not this group's place (`relocate` finds it by occurrence).
                guard match != .otherKey && last.inPlace else { continue }
                // Its place: the next group compares from here on.
                c.took(offset)
                guard match == .same && last.reusable else { return .new }
                return .reused(unsafeDowncast(last.node.takeUnretainedValue(), to: TypedGroupNode.self))
            }
            return .lost(context)
        }
    }

    override var key: GroupKey {
        var h = Hasher()
        h.combine(ObjectIdentifier(Key.self))
        h.combine(keyValue)
        return GroupKey(node: self, cachedHash: h.finalize())
    }

    override func keyEquals(_ other: GroupIdentity) -> Bool {
        if ObjectIdentifier(type(of: other)) == ObjectIdentifier(TypedGroupNode.self) {
            return unsafeDowncast(other, to: TypedGroupNode.self).keyValue == keyValue
        }
        guard let o = other as? any TypedKeyed<Key> else { return false }
        return o.keyValue == keyValue
    }

    override func inputEquals(_ other: GroupIdentity) -> Bool {
        if ObjectIdentifier(type(of: other)) == ObjectIdentifier(TypedGroupNode.self) {
            return unsafeDowncast(other, to: TypedGroupNode.self).value == value
        }
        guard let o = other as? any TypedInput<Input> else { return false }
        return o.value == value
    }

    override func match(_ last: GroupIdentity) -> GroupMatch {
        if last === self { return .same }    // the node was reused (`lookUp`)
        if ObjectIdentifier(type(of: last)) == ObjectIdentifier(TypedGroupNode.self) {
            let o = unsafeDowncast(last, to: TypedGroupNode.self)
            guard o.keyValue == keyValue else { return .otherKey }
            return o.value == value ? .same : .sameKey
        }
        guard keyEquals(last) else { return .otherKey }
        return inputEquals(last) ? .same : .sameKey
    }

    override var keyDescription: String { "\(keyValue)" }
    override func build() -> Subscriptions<Message> {
        if let body { return body(value) }
        return keyedBody!(keyValue, value)
    }
}

/// Lets groups of different message types compare keys and inputs.
protocol TypedKeyed<Key>: AnyObject {
    associatedtype Key: Hashable
    var keyValue: Key { get }
}

protocol TypedInput<Input>: AnyObject {
    associatedtype Input: Equatable
    var value: Input { get }
}

extension TypedGroupNode: TypedKeyed, TypedInput {}

/// Groups of one message type seen as another (`Subscriptions.map`).
@usableFromInline class MapNode<Message> {
    /// The transform, erased: applied to a group's messages on delivery.
    let forward: (Any) -> Any
    init(forward: @escaping (Any) -> Any) { self.forward = forward }
    func appendItems(to all: inout [Subscription<Message>]) { fatalError("MapNode.appendItems: abstract") }
    func walk(_ engine: ReconcileEngine) { fatalError("MapNode.walk: abstract") }
}

final class TypedMapNode<Inner, Message>: MapNode<Message> {
    let inner: [SubscriptionsPart<Inner>]
    let transform: (Inner) -> Message

    init(_ inner: [SubscriptionsPart<Inner>], _ transform: @escaping (Inner) -> Message) {
        self.inner = inner
        self.transform = transform
        super.init(forward: { transform($0 as! Inner) })
    }

    override func appendItems(to all: inout [Subscription<Message>]) {
        var mine: [Subscription<Inner>] = []
        for p in inner { p.appendItems(to: &mine) }
        for s in mine { all.append(s.map(transform)) }
    }

    override func walk(_ engine: ReconcileEngine) { engine.walk(inner, forward: forward) }
}
