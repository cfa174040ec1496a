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
