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
    ///
    /// (Inlinable, as the constructors of the library's sources that call
    /// it: built in a program, the boxes' and the tagger's types are known
    /// there; built in this module's generic code, each of the three was a
    /// run-time metadata lookup, about 1,200 instructions a subscription.)
    @inlinable
    public init<S: Source, Key: Hashable & Sendable>(
        _ source: S.Type, key: Key, configuration: S.Configuration,
        tag: @escaping (S.Event) -> Message
    ) {
        core = SubscriptionCore(id: SubscriptionID(source, key: key),
                                configurationBox: TypedHashableBox(configuration),
                                tagger: SourceTagger<S, Message>(tag))
    }

    /// As the public initializer, the event handed to `tag` owned (moved
    /// into the message it makes, no copy): for sources whose events carry
    /// storage, one per event (`Subscription.lines`).
    /// (A factory, not an initializer: a trailing closure would make the
    /// two ambiguous.)
    @inlinable static func consumingEvents<S: Source, Key: Hashable & Sendable>(
        _ source: S.Type, key: Key, configuration: S.Configuration,
        tag: @escaping (consuming S.Event) -> Message
    ) -> Subscription {
        Subscription(id: SubscriptionID(source, key: key), configurationBox: TypedHashableBox(configuration),
                     tagger: ConsumingSourceTagger<S, Message>(tag))
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
    /// The program's closure, when this tagger was made with one for the
    /// events of `kind` (borrowed, as `Subscription.init` makes it); nil
    /// otherwise. (Methods, not casts: a cast to the generic tagger class
    /// looks its type up at run time, about 330 instructions a batch.)
    func body<S: Source>(of kind: S.Type) -> ((S.Event) -> Message)? { nil }
    /// As `body(of:)`, for a tagger that takes its events owned
    /// (`consumingEvents`).
    func consumingBody<S: Source>(of kind: S.Type) -> ((consuming S.Event) -> Message)? { nil }
    override func tagAny(_ event: Any) -> Any? { tag(event).map { $0 as Any } }
    override func failAny(_ failure: SourceFailure) -> Any { fail(failure) }
}

/// A tagger's closure that takes its event owned (named, so an expression
/// can name its type).
typealias OwnedEventTag<S: Source, Message> = (consuming S.Event) -> Message

/// The tagger a subscription is made with: the program's closure.
@usableFromInline final class SourceTagger<S: Source, Message>: Tagger<Message> {
    let body: (S.Event) -> Message
    @usableFromInline init(_ body: @escaping (S.Event) -> Message) { self.body = body }
    override func tag(_ event: Any) -> Message? { (event as? S.Event).map(body) }
    override func fail(_ failure: SourceFailure) -> Message { body(S.failed(failure)) }
    override func body<K: Source>(of kind: K.Type) -> ((K.Event) -> Message)? {
        K.self == S.self ? unsafeBitCast(body, to: ((K.Event) -> Message).self) : nil
    }
}

/// A tagger whose closure takes the event owned (`consumingEvents`): a
/// closure written for it moves the event into the message. (A class of its
/// own: converting a closure between the two conventions allocates a thunk,
/// which every subscription built would pay.)
@usableFromInline final class ConsumingSourceTagger<S: Source, Message>: Tagger<Message> {
    let body: (consuming S.Event) -> Message
    @usableFromInline init(_ body: @escaping (consuming S.Event) -> Message) { self.body = body }
    override func tag(_ event: Any) -> Message? {
        guard let e = event as? S.Event else { return nil }
        return body(e)
    }
    override func fail(_ failure: SourceFailure) -> Message { body(S.failed(failure)) }
    override func consumingBody<K: Source>(of kind: K.Type) -> ((consuming K.Event) -> Message)? {
        K.self == S.self ? unsafeBitCast(body, to: OwnedEventTag<K, Message>.self) : nil
    }
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
