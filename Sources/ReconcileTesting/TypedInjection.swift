import Reconcile
import Testing

/// A subscription identity that knows its source type, so an event injected
/// through it must be the source's `Event` (a wrong type does not compile).
///
/// Get one from the subscriptions a model wants (`ProgramTester.subscription`,
/// `VirtualDriver.subscription`) instead of rebuilding a `SubscriptionID` by
/// hand: a program's private key types stay private.
public struct TypedSubscriptionID<S: Source>: Hashable, Sendable, CustomStringConvertible {
    /// The untyped identity.
    public let id: SubscriptionID

    /// The identity of source `kind` keyed by `key`.
    public init<Key: Hashable & Sendable>(_ kind: S.Type, key: Key) {
        id = SubscriptionID(kind, key: key)
    }

    /// `id` typed as `S`, or nil when `id` is of another kind.
    public init?(_ id: SubscriptionID) {
        guard id.kind == SourceKind(S.self) else { return nil }
        self.id = id
    }

    /// The key within the kind.
    public var key: AnyHashable { id.key }

    /// The untyped identity's description (`timer:t`).
    public var description: String { id.description }
}

/// Finds one identity of kind `S` among `ids`, recording an issue (and
/// returning nil) when none or several match.
func find<S: Source>(
    _ kind: S.Type, in ids: [SubscriptionID], where match: (AnyHashable) -> Bool, what: String,
    sourceLocation: SourceLocation
) -> TypedSubscriptionID<S>? {
    let found = ids.compactMap { TypedSubscriptionID<S>($0) }.filter { match($0.key) }
    guard found.count == 1 else {
        Issue.record("\(found.isEmpty ? "no" : "\(found.count)") \(S.name) subscription(s) match among the \(what): \(ids)",
                     sourceLocation: sourceLocation)
        return nil
    }
    return found[0]
}

/// How many identities of kind `S` among `ids` have a key satisfying `match`.
func count<S: Source>(_ kind: S.Type, in ids: some Sequence<SubscriptionID>, where match: (AnyHashable) -> Bool) -> Int {
    ids.reduce(0) { n, id in TypedSubscriptionID<S>(id).map { match($0.key) ? n + 1 : n } ?? n }
}

func isDebounce(_ name: String) -> (AnyHashable) -> Bool {
    { ($0.base as? DebounceKey)?.name == name }
}

extension ProgramTester {
    /// Whether the model wants a subscription of kind `S` whose key satisfies
    /// `match` (any key by default). Records nothing either way, so a test can
    /// assert absence: `#expect(!t.hasSubscription(TimerSource.self))`.
    public func hasSubscription<S: Source>(_ kind: S.Type, where match: (AnyHashable) -> Bool = { _ in true }) -> Bool {
        count(kind, in: subscriptions.ids, where: match) > 0
    }

    /// Whether the model wants the timer of debouncer `name`
    /// (`Subscription.debounce`), whatever its phase; records nothing, so
    /// `#expect(!t.hasDebounce("query"))` asserts that no debounce is pending.
    public func hasDebounce(_ name: String) -> Bool {
        hasSubscription(TimerSource.self, where: isDebounce(name))
    }

    /// The desired subscription of kind `S` keyed by `key`, or nil (with a
    /// recorded issue) when the model does not want it.
    public func subscription<S: Source, Key: Hashable & Sendable>(
        _ kind: S.Type, key: Key, sourceLocation: SourceLocation = #_sourceLocation
    ) -> TypedSubscriptionID<S>? {
        find(kind, in: subscriptions.ids, where: { $0 == AnyHashable(key) }, what: "desired subscriptions",
             sourceLocation: sourceLocation)
    }

    /// The one desired subscription of kind `S` whose key satisfies `match`
    /// (any key by default); nil, with a recorded issue, when none or several do.
    public func subscription<S: Source>(
        _ kind: S.Type, where match: (AnyHashable) -> Bool = { _ in true },
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> TypedSubscriptionID<S>? {
        find(kind, in: subscriptions.ids, where: match, what: "desired subscriptions", sourceLocation: sourceLocation)
    }

    /// The desired timer of debouncer `name` (`Subscription.debounce`), whatever its phase.
    /// Records an issue (and returns nil) when there is none: use
    /// `hasDebounce(_:)` to assert that there is none.
    public func debounce(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) -> TypedSubscriptionID<TimerSource>? {
        subscription(TimerSource.self, where: isDebounce(name), sourceLocation: sourceLocation)
    }

    /// The message the desired subscription `id` makes of `event`, or nil when
    /// the model does not want `id`.
    public func message<S: Source>(for event: S.Event, from id: TypedSubscriptionID<S>) -> P.Message? {
        subscriptions[id.id]?.message(for: event)
    }

    /// Sends what the desired subscription `id` makes of `event`; records an
    /// issue and returns nil when the model does not want `id`.
    @discardableResult
    public mutating func event<S: Source>(
        _ event: S.Event, from id: TypedSubscriptionID<S>, sourceLocation: SourceLocation = #_sourceLocation
    ) -> [P.Command]? {
        self.event(event as Any, from: id.id, sourceLocation: sourceLocation)
    }

    /// Sends what the desired subscription of kind `S` keyed by `key` makes of
    /// `event` (`t.event(.modified, from: FileWatchSource.self, key: path)`).
    @discardableResult
    public mutating func event<S: Source, Key: Hashable & Sendable>(
        _ event: S.Event, from kind: S.Type, key: Key, sourceLocation: SourceLocation = #_sourceLocation
    ) -> [P.Command]? {
        self.event(event as Any, from: SubscriptionID(kind, key: key), sourceLocation: sourceLocation)
    }
}

extension VirtualDriver {
    /// Whether a source of kind `S` whose key satisfies `match` (any key by
    /// default) is running. Records nothing either way, so a test can assert
    /// absence: `#expect(!driver.hasSubscription(TimerSource.self))`.
    public func hasSubscription<S: Source>(_ kind: S.Type, where match: (AnyHashable) -> Bool = { _ in true }) -> Bool {
        count(kind, in: running.keys, where: match) > 0
    }

    /// Whether the timer of debouncer `name` is running, whatever its phase;
    /// records nothing (`#expect(!driver.hasDebounce("query"))`).
    public func hasDebounce(_ name: String) -> Bool {
        hasSubscription(TimerSource.self, where: isDebounce(name))
    }

    /// The running source of kind `S` keyed by `key`, or nil (with a recorded
    /// issue) when none runs.
    public func subscription<S: Source, Key: Hashable & Sendable>(
        _ kind: S.Type, key: Key, sourceLocation: SourceLocation = #_sourceLocation
    ) -> TypedSubscriptionID<S>? {
        find(kind, in: Array(running.keys), where: { $0 == AnyHashable(key) }, what: "running sources",
             sourceLocation: sourceLocation)
    }

    /// The one running source of kind `S` whose key satisfies `match` (any
    /// key by default); nil, with a recorded issue, when none or several do.
    public func subscription<S: Source>(
        _ kind: S.Type, where match: (AnyHashable) -> Bool = { _ in true },
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> TypedSubscriptionID<S>? {
        find(kind, in: Array(running.keys), where: match, what: "running sources", sourceLocation: sourceLocation)
    }

    /// The running timer of debouncer `name` (`Subscription.debounce`), whatever its phase.
    /// Records an issue (and returns nil) when there is none: use
    /// `hasDebounce(_:)` to assert that there is none.
    public func debounce(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) -> TypedSubscriptionID<TimerSource>? {
        subscription(TimerSource.self, where: isDebounce(name), sourceLocation: sourceLocation)
    }

    /// Delivers `event` from the running source `id` on the loop, as the
    /// source would; records an issue and returns false when `id` is not running.
    @discardableResult
    public func emit<S: Source>(
        _ event: S.Event, to id: TypedSubscriptionID<S>, sourceLocation: SourceLocation = #_sourceLocation
    ) -> Bool {
        guard emit(event as Any, to: id.id) else {
            Issue.record("\(id) is not running; running: \(Array(running.keys))", sourceLocation: sourceLocation)
            return false
        }
        return true
    }

    /// Delivers `event` from the running source of kind `S` keyed by `key`
    /// (`driver.emit(.modified, to: FileWatchSource.self, key: path)`).
    @discardableResult
    public func emit<S: Source, Key: Hashable & Sendable>(
        _ event: S.Event, to kind: S.Type, key: Key, sourceLocation: SourceLocation = #_sourceLocation
    ) -> Bool {
        emit(event, to: TypedSubscriptionID(kind, key: key), sourceLocation: sourceLocation)
    }

    /// Reports a failure of the running source `id`.
    @discardableResult
    public func fail<S: Source>(_ id: TypedSubscriptionID<S>, _ failure: SourceFailure) -> Bool {
        fail(id.id, failure)
    }

    /// A poster for the running source `id` that takes only `S.Event`.
    public func poster<S: Source>(for id: TypedSubscriptionID<S>) -> TypedPoster<S>? where S.Event: Sendable {
        poster(for: id.id).map { TypedPoster($0) }
    }
}

/// An `EventPoster` that takes only its source's events.
public struct TypedPoster<S: Source>: Sendable where S.Event: Sendable {
    /// The untyped poster.
    public let poster: EventPoster

    init(_ poster: EventPoster) { self.poster = poster }

    /// Queues `event` and wakes the loop.
    @discardableResult
    public func post(_ event: S.Event) -> PostResult { poster.post(event) }
}
