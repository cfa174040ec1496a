/// One ongoing source a model wants: identity, configuration and tagger.
public struct Subscription<Message> {
    // The only stored property: `Subscription<M>` has the layout of
    // `SubscriptionCore` whatever `M` is, so the reconciler reads a desired
    // set as `SubscriptionCore` values without specialising on `Message`.
    @usableFromInline let core: SubscriptionCore

    /// The stable identity (kind + key).
    public var id: SubscriptionID { core.id }
    /// The source's configuration, type-erased (`Source.Configuration`).
    public var configuration: AnyHashable { core.configurationBox.hashable }
    @usableFromInline var configurationBox: HashableBox { core.configurationBox }
    @usableFromInline var source: any Source.Type { core.id.kind.source }
    @usableFromInline var tagger: Tagger<Message> { unsafeDowncast(core.tagger, to: Tagger<Message>.self) }

    /// A subscription to `source` keyed by `key`, configured by `configuration`,
    /// whose events become messages through `tag`.
    public init<S: Source, Key: Hashable & Sendable>(
        _ source: S.Type, key: Key, configuration: S.Configuration,
        tag: @escaping (S.Event) -> Message
    ) {
        core = SubscriptionCore(id: SubscriptionID(source, key: key),
                                configurationBox: TypedHashableBox(configuration),
                                tagger: SourceTagger<S, Message>(tag))
    }

    @usableFromInline init(id: SubscriptionID, configurationBox: HashableBox, tagger: Tagger<Message>) {
        core = SubscriptionCore(id: id, configurationBox: configurationBox, tagger: tagger)
    }

    /// The same subscription with its messages mapped by `transform`, for
    /// embedding a child program's subscriptions in a parent's.
    public func map<Other>(_ transform: @escaping (Message) -> Other) -> Subscription<Other> {
        Subscription<Other>(id: id, configurationBox: configurationBox, tagger: MappedTagger(tagger, transform))
    }

    /// The message this subscription's tagger makes of `event`, or `nil` when
    /// `event` is not of the source's event type.
    public func message(for event: Any) -> Message? { tagger.tag(event) }

    /// The message this subscription's tagger makes of a failure event.
    public func message(for failure: SourceFailure) -> Message { tagger.fail(failure) }
}

/// A subscription without its message type: what the reconciler works on.
@usableFromInline struct SubscriptionCore {
    @usableFromInline let id: SubscriptionID
    @usableFromInline let configurationBox: HashableBox
    @usableFromInline let tagger: TaggerBase

    @usableFromInline init(id: SubscriptionID, configurationBox: HashableBox, tagger: TaggerBase) {
        self.id = id
        self.configurationBox = configurationBox
        self.tagger = tagger
    }
}

/// A tagger of any message type: one object per subscription, so refreshing
/// it on a kept subscription is one reference store.
@usableFromInline class TaggerBase {
    /// The message for `event`, as `Any` (used on routes through groups).
    func tagAny(_ event: Any) -> Any? { fatalError("TaggerBase.tagAny: abstract") }
    /// The message for `failure`, as `Any`.
    func failAny(_ failure: SourceFailure) -> Any { fatalError("TaggerBase.failAny: abstract") }
}

/// Source event (or failure) to `Message`.
@usableFromInline class Tagger<Message>: TaggerBase {
    func tag(_ event: Any) -> Message? { fatalError("Tagger.tag: abstract") }
    func fail(_ failure: SourceFailure) -> Message { fatalError("Tagger.fail: abstract") }
    override func tagAny(_ event: Any) -> Any? { tag(event).map { $0 as Any } }
    override func failAny(_ failure: SourceFailure) -> Any { fail(failure) }
}

/// The tagger a subscription is made with: the program's closure.
final class SourceTagger<S: Source, Message>: Tagger<Message> {
    let body: (S.Event) -> Message
    init(_ body: @escaping (S.Event) -> Message) { self.body = body }
    override func tag(_ event: Any) -> Message? { (event as? S.Event).map(body) }
    override func fail(_ failure: SourceFailure) -> Message { body(S.failed(failure)) }
}

/// A tagger whose messages are mapped (`Subscription.map`).
final class MappedTagger<Inner, Message>: Tagger<Message> {
    let inner: Tagger<Inner>
    let transform: (Inner) -> Message
    init(_ inner: Tagger<Inner>, _ transform: @escaping (Inner) -> Message) {
        self.inner = inner
        self.transform = transform
    }
    override func tag(_ event: Any) -> Message? { inner.tag(event).map(transform) }
    override func fail(_ failure: SourceFailure) -> Message { transform(inner.fail(failure)) }
}

/// The set of subscriptions a model wants, in order.
///
/// Build it with the result builder (`if`, `if let`, `switch`, `for` work) or
/// from an array for bulk sets. A duplicate identity is kept here as given;
/// the reconciler reports it and lets the first one win. Parts of a large set
/// can be memoized with `group(_:_:_:)`.
public struct Subscriptions<Message> {
    // One reference whatever the set: a set of one part (one group, one
    // array of subscriptions) holds it inline, with no array of parts; so
    // copying a set (as the builder does) costs one retain.
    @usableFromInline var storage: SubscriptionsStorage<Message>?

    /// The subscriptions, in the order they were given (groups are built).
    public var items: [Subscription<Message>] {
        get {
            switch storage {
            case nil: return []
            case .one(.items(let a))?: return a
            case .one(let p)?:
                var all: [Subscription<Message>] = []
                p.appendItems(to: &all)
                return all
            case .many(let parts)?:
                var all: [Subscription<Message>] = []
                for p in parts { p.appendItems(to: &all) }
                return all
            }
        }
        set { storage = newValue.isEmpty ? nil : .one(.items(newValue)) }
    }

    /// A set of `items`.
    @inlinable public init(_ items: [Subscription<Message>]) {
        storage = items.isEmpty ? nil : .one(.items(items))
    }

    /// A set built with the result builder.
    public init(@SubscriptionsBuilder<Message> _ build: () -> Subscriptions<Message>) {
        self = build()
    }

    /// A set of one part.
    @inlinable init(part: SubscriptionsPart<Message>) { storage = .one(part) }

    @inlinable init() { storage = nil }

    /// No subscriptions.
    @inlinable public static var none: Subscriptions { Subscriptions() }

    /// The parts in order (an array: for the paths that are not hot).
    var parts: [SubscriptionsPart<Message>] {
        switch storage {
        case nil: return []
        case .one(let p)?: return [p]
        case .many(let parts)?: return parts
        }
    }

    /// The identities, in order.
    public var ids: [SubscriptionID] { items.map(\.id) }

    /// The subscription with identity `id` (the first, if duplicated).
    public subscript(id: SubscriptionID) -> Subscription<Message>? { items.first { $0.id == id } }

    /// The set with every message mapped by `transform` (child programs).
    /// Groups stay memoized: the mapping is applied to their messages on
    /// delivery and refreshed on every reconcile.
    public func map<Other>(_ transform: @escaping (Message) -> Other) -> Subscriptions<Other> {
        var out = Subscriptions<Other>()
        var pending: [SubscriptionsPart<Message>] = []
        for p in parts {
            switch p {
            case .items(let a):
                if !pending.isEmpty {
                    out.append(.mapped(TypedMapNode(pending, transform)))
                    pending = []
                }
                out.append(.items(a.map { $0.map(transform) }))
            case .group, .mapped:
                pending.append(p)
            }
        }
        if !pending.isEmpty { out.append(.mapped(TypedMapNode(pending, transform))) }
        return out
    }

    /// Appends `other`'s parts (adjacent plain parts are merged).
    @inlinable mutating func append(_ other: consuming Subscriptions<Message>) {
        guard storage != nil else {
            self = other
            return
        }
        switch other.storage {
        case nil: return
        case .one(let p)?: append(p)
        case .many(let parts)?: for p in parts { append(p) }
        }
    }

    @inlinable mutating func append(_ part: consuming SubscriptionsPart<Message>) {
        if case .items(let b) = part, b.isEmpty { return }
        switch storage {
        case nil:
            storage = .one(part)
        case .one(let first)?:
            if case .items(var a) = first, case .items(let b) = part {
                storage = nil
                a.append(contentsOf: b)
                storage = .one(.items(a))
            } else {
                storage = .many([first, part])
            }
        case .many(var parts)?:
            storage = nil
            if case .items(let b) = part, case .items(var a)? = parts.last {
                parts[parts.count - 1] = .items([])
                a.append(contentsOf: b)
                parts[parts.count - 1] = .items(a)
            } else {
                parts.append(part)
            }
            storage = .many(parts)
        }
    }

    /// Makes room for `count` more parts (one allocation for a `for` loop's).
    @inlinable mutating func reserveParts(_ count: Int) {
        guard count > 0 else { return }
        switch storage {
        case nil: return
        case .one(let first)?:
            var parts: [SubscriptionsPart<Message>] = []
            parts.reserveCapacity(count + 1)
            parts.append(first)
            storage = .many(parts)
        case .many(var parts)?:
            storage = nil
            parts.reserveCapacity(parts.count + count)
            storage = .many(parts)
        }
    }
}

/// A set's parts: one inline, or several.
@usableFromInline enum SubscriptionsStorage<Message> {
    case one(SubscriptionsPart<Message>)
    case many([SubscriptionsPart<Message>])
}

extension Subscriptions {
    /// A memoized part of a set: `body(input)` is built and diffed only when
    /// `key` is new or `input` differs from the last reconcile's.
    ///
    /// When the key and an equal input were seen last time, the group is
    /// neither built nor diffed: its subscriptions count as kept. The body
    /// must depend on `input` alone (the reconciler's `verifiesGroups`
    /// option checks this). Identities stay global: a subscription moving
    /// between groups is kept, retuned or restarted, never stopped and
    /// started; a duplicate across groups is reported and the first one in
    /// document order wins. Mapping a set with groups (`map`) is applied on
    /// delivery and refreshed on every reconcile, also for skipped groups.
    /// Groups nest; keys are scoped to the enclosing group.
    @inlinable
    public static func group<Key: Hashable & Sendable, Input: Equatable>(
        _ key: Key, _ input: Input,
        @SubscriptionsBuilder<Message> _ body: @escaping (Input) -> Subscriptions<Message>
    ) -> Subscriptions<Message> {
        Subscriptions(part: .group(TypedGroupNode<Message, Key, Input>.node(key, input) { .init(key: key, input: input, body: body) }))
    }

    /// A memoized part whose body is given its key and input: the same as
    /// `group(_:_:_:)`, for a body that captures nothing.
    ///
    /// A closure that captures a value (the key, a model field) is
    /// allocated every time the set is built, skipped or not; one that
    /// captures nothing is not. With the key passed in, a body that follows
    /// the rule (it depends on its key and input alone) needs no capture, so
    /// an unchanged group costs the program one allocation instead of two.
    @inlinable
    public static func group<Key: Hashable & Sendable, Input: Equatable>(
        _ key: Key, _ input: Input,
        @SubscriptionsBuilder<Message> _ body: @escaping (Key, Input) -> Subscriptions<Message>
    ) -> Subscriptions<Message> {
        Subscriptions(part: .group(TypedGroupNode<Message, Key, Input>.node(key, input) { .init(key: key, input: input, keyedBody: body) }))
    }
}

/// One part of a set: plain subscriptions, a memoized group, or groups under
/// a message mapping.
@usableFromInline enum SubscriptionsPart<Message> {
    case items([Subscription<Message>])
    case group(GroupNode<Message>)
    case mapped(MapNode<Message>)

    /// The group node, unretained (the part holds it), or nil.
    @inline(__always) var unretainedGroup: Unmanaged<GroupNode<Message>>? {
        if case .group(let node) = self { return .passUnretained(node) }
        return nil
    }

    func appendItems(to all: inout [Subscription<Message>]) {
        switch self {
        case .items(let a): all.append(contentsOf: a)
        case .group(let g): all.append(contentsOf: g.build().items)
        case .mapped(let m): m.appendItems(to: &all)
        }
    }
}

/// A group's key as the reconciler looks it up: the node that carries it
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
    /// How `last` (a node of the last reconcile) compares with this one:
    /// 0 another key, 1 the same key, 2 the same key and an equal input
    /// (the group may be skipped). One call on the positional path.
    func match(_ last: GroupIdentity) -> Int { fatalError("GroupNode.match: abstract") }
    /// The group's subscriptions, built now.
    func build() -> Subscriptions<Message> { fatalError("GroupNode.build: abstract") }

    /// For a group `lookUp` found no place for among the two it compared:
    /// the last reconcile's node with this key (looked up) if its input is
    /// equal, else this new node; either way the comparison of the next
    /// group goes on after the one with this key.
    @usableFromInline func relocated(in context: Unmanaged<GroupReuse>) -> GroupNode<Message> {
        context._withUnsafeGuaranteedRef { c -> GroupNode<Message> in
            guard let m = c.relocate(key), m.subtreeDuplicates == 0, let last = m.node,
                  ObjectIdentifier(type(of: last)) == ObjectIdentifier(type(of: self)), match(last) == 2
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
                // 0 another group, 1 this key, 2 this key and an equal input.
                let match = last.node._withUnsafeGuaranteedRef { l -> Int in
                    guard ObjectIdentifier(type(of: l)) == ObjectIdentifier(TypedGroupNode.self) else { return 0 }
                    let o = unsafeDowncast(l, to: TypedGroupNode.self)
                    guard o.keyValue == key else { return 0 }
                    return o.value == input ? 2 : 1
                }
                // Another occurrence of this key, or one this build took:
                // not this group's place (`relocate` finds it by occurrence).
                guard match != 0 && last.inPlace else { continue }
                // Its place: the next group compares from here on.
                c.took(offset)
                guard match == 2 && last.reusable else { return .new }
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

    override func match(_ last: GroupIdentity) -> Int {
        if last === self { return 2 }    // the node was reused (`lookUp`)
        if ObjectIdentifier(type(of: last)) == ObjectIdentifier(TypedGroupNode.self) {
            let o = unsafeDowncast(last, to: TypedGroupNode.self)
            guard o.keyValue == keyValue else { return 0 }
            return o.value == value ? 2 : 1
        }
        guard keyEquals(last) else { return 0 }
        return inputEquals(last) ? 2 : 1
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

/// Builds `Subscriptions` from statements: single subscriptions, nested sets,
/// groups, arrays, `if`/`else`, optionals and `for` loops.
@resultBuilder
public enum SubscriptionsBuilder<Message> {
    /// One subscription.
    @inlinable public static func buildExpression(_ s: Subscription<Message>) -> Subscriptions<Message> { Subscriptions([s]) }
    /// An optional subscription (nothing when nil).
    @inlinable public static func buildExpression(_ s: Subscription<Message>?) -> Subscriptions<Message> { Subscriptions(s.map { [$0] } ?? []) }
    /// A nested set, in order.
    @inlinable public static func buildExpression(_ s: Subscriptions<Message>) -> Subscriptions<Message> { s }
    /// An array of subscriptions, in order.
    @inlinable public static func buildExpression(_ s: [Subscription<Message>]) -> Subscriptions<Message> { Subscriptions(s) }
    /// The statements' subscriptions, in order.
    @inlinable public static func buildBlock(_ parts: Subscriptions<Message>...) -> Subscriptions<Message> { concatenate(parts) }
    /// One statement's subscriptions (a `for` body: no array of one).
    @inlinable public static func buildBlock(_ part: Subscriptions<Message>) -> Subscriptions<Message> { part }
    /// An `if` without `else`.
    @inlinable public static func buildOptional(_ part: Subscriptions<Message>?) -> Subscriptions<Message> { part ?? .none }
    /// The first branch of an `if`/`else` or `switch`.
    @inlinable public static func buildEither(first: Subscriptions<Message>) -> Subscriptions<Message> { first }
    /// The second branch of an `if`/`else` or `switch`.
    @inlinable public static func buildEither(second: Subscriptions<Message>) -> Subscriptions<Message> { second }
    /// A `for` loop's subscriptions, in order.
    @inlinable public static func buildArray(_ parts: consuming [Subscriptions<Message>]) -> Subscriptions<Message> { concatenate(parts) }
    /// An `if #available` branch.
    @inlinable public static func buildLimitedAvailability(_ part: Subscriptions<Message>) -> Subscriptions<Message> { part }

    @inlinable static func concatenate(_ parts: consuming [Subscriptions<Message>]) -> Subscriptions<Message> {
        if parts.count == 1 { return parts[0] }
        var all = Subscriptions<Message>()
        // The sets are moved out of the array (it is the builder's, given
        // up): their parts change owner without reference counting. The
        // first non-empty set is taken as is; room for the others' parts
        // is reserved once.
        parts.withUnsafeMutableBufferPointer { sets in
            guard let base = sets.baseAddress else { return }
            var i = 0
            while i < sets.count && sets[i].storage == nil { i += 1 }
            guard i < sets.count else { return }
            all = (base + i).move()
            (base + i).initialize(to: Subscriptions())
            all.reserveParts(sets.count - i - 1)
            i += 1
            while i < sets.count {
                let next = (base + i).move()
                (base + i).initialize(to: Subscriptions())
                all.append(next)
                i += 1
            }
        }
        return all
    }
}
