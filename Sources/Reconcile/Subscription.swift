/// One ongoing source a model wants: identity, configuration and tagger.
public struct Subscription<Message> {
    /// The stable identity (kind + key).
    public let id: SubscriptionID
    /// The source's configuration, type-erased (`Source.Configuration`).
    public var configuration: AnyHashable { configurationBox.hashable }
    /// The configuration in a typed box: comparing two costs no dynamic cast
    /// and no allocation (the reconcile hot path).
    @usableFromInline let configurationBox: HashableBox
    @usableFromInline let source: any Source.Type
    @usableFromInline let tagger: Tagger<Message>

    /// A subscription to `source` keyed by `key`, configured by `configuration`,
    /// whose events become messages through `tag`.
    public init<S: Source, Key: Hashable & Sendable>(
        _ source: S.Type, key: Key, configuration: S.Configuration,
        tag: @escaping (S.Event) -> Message
    ) {
        self.id = SubscriptionID(source, key: key)
        self.configurationBox = TypedHashableBox(configuration)
        self.source = source
        self.tagger = Tagger(tag, source: source)
    }

    @usableFromInline init(id: SubscriptionID, configurationBox: HashableBox, source: any Source.Type, tagger: Tagger<Message>) {
        self.id = id
        self.configurationBox = configurationBox
        self.source = source
        self.tagger = tagger
    }

    /// The same subscription with its messages mapped by `transform`, for
    /// embedding a child program's subscriptions in a parent's.
    public func map<Other>(_ transform: @escaping (Message) -> Other) -> Subscription<Other> {
        Subscription<Other>(id: id, configurationBox: configurationBox, source: source, tagger: tagger.map(transform))
    }

    /// The message this subscription's tagger makes of `event`, or `nil` when
    /// `event` is not of the source's event type.
    public func message(for event: Any) -> Message? { tagger.tag(event) }

    /// The message this subscription's tagger makes of a failure event.
    public func message(for failure: SourceFailure) -> Message { tagger.fail(failure) }
}

/// A type-erased tagger: source event (or failure) to message.
@usableFromInline struct Tagger<Message> {
    @usableFromInline let tag: (Any) -> Message?
    @usableFromInline let fail: (SourceFailure) -> Message

    init(tag: @escaping (Any) -> Message?, fail: @escaping (SourceFailure) -> Message) {
        self.tag = tag
        self.fail = fail
    }

    func map<Other>(_ transform: @escaping (Message) -> Other) -> Tagger<Other> {
        let tag = self.tag, fail = self.fail
        return Tagger<Other>(tag: { tag($0).map(transform) }, fail: { transform(fail($0)) })
    }
}

extension Tagger {
    init<S: Source>(_ tag: @escaping (S.Event) -> Message, source: S.Type = S.self) {
        self.tag = { ($0 as? S.Event).map(tag) }
        self.fail = { tag(S.failed($0)) }
    }
}

/// The set of subscriptions a model wants, in order.
///
/// Build it with the result builder (`if`, `if let`, `switch`, `for` work) or
/// from an array for bulk sets. A duplicate identity is kept here as given;
/// the reconciler reports it and lets the first one win.
public struct Subscriptions<Message> {
    /// The subscriptions, in the order they were given.
    public var items: [Subscription<Message>]

    /// A set of `items`.
    public init(_ items: [Subscription<Message>]) { self.items = items }

    /// A set built with the result builder.
    public init(@SubscriptionsBuilder<Message> _ build: () -> [Subscription<Message>]) {
        self.items = build()
    }

    /// No subscriptions.
    public static var none: Subscriptions { Subscriptions([]) }

    /// The identities, in order.
    public var ids: [SubscriptionID] { items.map(\.id) }

    /// The subscription with identity `id` (the first, if duplicated).
    public subscript(id: SubscriptionID) -> Subscription<Message>? { items.first { $0.id == id } }

    /// The set with every message mapped by `transform` (child programs).
    public func map<Other>(_ transform: @escaping (Message) -> Other) -> Subscriptions<Other> {
        Subscriptions<Other>(items.map { $0.map(transform) })
    }
}

/// Builds `[Subscription]` from statements: single subscriptions, nested sets,
/// arrays, `if`/`else`, optionals and `for` loops.
@resultBuilder
public enum SubscriptionsBuilder<Message> {
    /// One subscription.
    public static func buildExpression(_ s: Subscription<Message>) -> [Subscription<Message>] { [s] }
    /// An optional subscription (nothing when nil).
    public static func buildExpression(_ s: Subscription<Message>?) -> [Subscription<Message>] { s.map { [$0] } ?? [] }
    /// A nested set, in order.
    public static func buildExpression(_ s: Subscriptions<Message>) -> [Subscription<Message>] { s.items }
    /// An array of subscriptions, in order.
    public static func buildExpression(_ s: [Subscription<Message>]) -> [Subscription<Message>] { s }
    /// The statements' subscriptions, in order.
    public static func buildBlock(_ parts: [Subscription<Message>]...) -> [Subscription<Message>] { parts.flatMap { $0 } }
    /// An `if` without `else`.
    public static func buildOptional(_ part: [Subscription<Message>]?) -> [Subscription<Message>] { part ?? [] }
    /// The first branch of an `if`/`else` or `switch`.
    public static func buildEither(first: [Subscription<Message>]) -> [Subscription<Message>] { first }
    /// The second branch of an `if`/`else` or `switch`.
    public static func buildEither(second: [Subscription<Message>]) -> [Subscription<Message>] { second }
    /// A `for` loop's subscriptions, in order.
    public static func buildArray(_ parts: [[Subscription<Message>]]) -> [Subscription<Message>] { parts.flatMap { $0 } }
    /// An `if #available` branch.
    public static func buildLimitedAvailability(_ part: [Subscription<Message>]) -> [Subscription<Message>] { part }
}
