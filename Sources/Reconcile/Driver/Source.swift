/// A kind of ongoing source: timers, file watches, connectivity, signals, or a
/// user's own (a D-Bus signal, a socket).
///
/// A source type describes a source; it does not run one. Drivers run them:
/// `ReconcileSystemd` on sd-event, `ReconcileTesting.VirtualDriver` in tests.
public protocol Source {
    /// The source's parameters. Two subscriptions with the same identity and an
    /// equal configuration are the same running source (a *keep*).
    associatedtype Configuration: Hashable & Sendable
    /// What the source reports; the subscription's tagger maps it to a message.
    associatedtype Event

    /// The kind's name as shown in identities, plans and logs (`timer`).
    static var name: String { get }

    /// Whether a running source can move from `old` to `new` without a stop and
    /// a start (a *retune*). The default is `false`: every change restarts.
    static func canRetune(from old: Configuration, to new: Configuration) -> Bool

    /// The event that reports `failure` through the subscription's tagger.
    static func failed(_ failure: SourceFailure) -> Event
}

extension Source {
    /// `false`: by default every configuration change restarts the source.
    public static func canRetune(from old: Configuration, to new: Configuration) -> Bool { false }
}

/// The kind of a source: its type, shown by its name.
public struct SourceKind: Hashable, @unchecked Sendable, CustomStringConvertible {
    /// The source type.
    @usableFromInline let source: any Source.Type

    /// The kind's name (`Source.name`).
    public var name: String { source.name }
    @usableFromInline var type: ObjectIdentifier { ObjectIdentifier(source) }

    /// The kind of source type `source`.
    @inlinable public init<S: Source>(_ source: S.Type) {
        self.source = source
    }

    /// Whether `a` and `b` are the same source type.
    public static func == (a: SourceKind, b: SourceKind) -> Bool { a.type == b.type }
    /// Hashes the source type.
    public func hash(into hasher: inout Hasher) { hasher.combine(type) }
    /// The kind's name.
    public var description: String { name }
}

extension Source {
    /// Whether a running source can move between the configurations in
    /// `old` and `new` (boxes of `Configuration`) in place.
    static func canRetune(_ old: HashableBox, _ new: HashableBox) -> Bool {
        guard let a = old as? TypedHashableBox<Configuration>, let b = new as? TypedHashableBox<Configuration> else { return false }
        return canRetune(from: a.value, to: b.value)
    }
}

/// The stable identity of a subscription: its source kind plus a user key.
///
/// Identity decides keep versus start: it must not change while the model
/// wants "the same" source. Put into the key whatever should *restart* the
/// source when it changes (a phase, for a debounce); put into the
/// configuration whatever may be retuned.
public struct SubscriptionID: Hashable, @unchecked Sendable, CustomStringConvertible {
    /// The source kind.
    public let kind: SourceKind
    /// The user's key within that kind. Keys must be `Sendable` values.
    public var key: AnyHashable { keyBox.hashable }
    @usableFromInline let keyBox: HashableBox
    @usableFromInline let cachedHash: Int

    /// An identity of `kind` keyed by `key`.
    @inlinable public init<S: Source, Key: Hashable & Sendable>(_ kind: S.Type, key: Key) {
        self.kind = SourceKind(kind)
        self.keyBox = TypedHashableBox(key)
        var h = Hasher()
        h.combine(ObjectIdentifier(kind))
        h.combine(ObjectIdentifier(Key.self))   // keys of two empty types hash apart
        h.combine(key)
        cachedHash = h.finalize()
    }

    /// Whether `a` and `b` have the same kind and equal keys.
    public static func == (a: SubscriptionID, b: SubscriptionID) -> Bool {
        a.cachedHash == b.cachedHash && a.kind == b.kind && (a.keyBox === b.keyBox || a.keyBox.isEqual(b.keyBox))
    }
    /// Hashes kind, the key's type and the key (computed once, at creation).
    public func hash(into hasher: inout Hasher) { hasher.combine(cachedHash) }

    /// `kind:key` (`timer:autosave`).
    public var description: String { "\(kind.name):\(key)" }
}

/// A hashable value in a class box whose equality needs no dynamic cast.
///
/// Its one stored property, `layout`, says where the value lies in the
/// object and how long it is, so that `sameBytes` compares two boxes'
/// values without a call (see `Equality`).
@usableFromInline class HashableBox: @unchecked Sendable {
    /// The value's offset in the object (high 32 bits) and its size in
    /// bytes (low 32 bits), set by `TypedHashableBox.init`.
    @usableFromInline let layout: UInt64

    @usableFromInline init(layout: UInt64) { self.layout = layout }

    /// Whether `other` holds an equal value: `sameBytes`, then `valueEquals`
    /// (inlined: the keep path's comparison, `ReconcileEngine.sameBox`).
    @inline(__always) final func isEqual(_ other: HashableBox) -> Bool {
        Self.sameBytes(.passUnretained(self), .passUnretained(other)) || valueEquals(other)
    }

    /// Whether `other` holds an equal value, by the value's type (asked
    /// when `sameBytes` did not show it).
    func valueEquals(_ other: HashableBox) -> Bool { fatalError() }
    var hashable: AnyHashable { fatalError() }

    /// Whether `a` and `b` are boxes of one type holding values with the
    /// same bytes: equal values (see `Equality`). No call, no type
    /// metadata: the class word, then the value a word at a time.
    @inline(__always)
    static func sameBytes(_ a: Unmanaged<HashableBox>, _ b: Unmanaged<HashableBox>) -> Bool {
        let pa = UnsafeRawPointer(a.toOpaque()), pb = UnsafeRawPointer(b.toOpaque())
        // The class of a `TypedHashableBox<T>` is one per `T`.
        guard pa.load(as: UInt.self) == pb.load(as: UInt.self) else { return false }
        let layout = a._withUnsafeGuaranteedRef { $0.layout }
        let offset = Int(truncatingIfNeeded: layout &>> 32)
        return Equality.bytesEqual(pa + offset, pb + offset, Int(truncatingIfNeeded: layout & 0xFFFF_FFFF))
    }

    /// Where this box keeps its value (`layout`'s offset).
    @inline(__always) final var valueAddress: UnsafeRawPointer {
        UnsafeRawPointer(Unmanaged.passUnretained(self).toOpaque()) + Int(truncatingIfNeeded: layout &>> 32)
    }

    /// The value when it is a `T`: one compare of the box's class, no
    /// dynamic cast (and no generic metadata lookup where `T` is known).
    @inlinable final func value<T: Hashable>(as: T.Type) -> T? {
        guard ObjectIdentifier(type(of: self)) == ObjectIdentifier(TypedHashableBox<T>.self) else { return nil }
        return unsafeDowncast(self, to: TypedHashableBox<T>.self).value
    }
}

@usableFromInline final class TypedHashableBox<T: Hashable>: HashableBox, @unchecked Sendable {
    @usableFromInline let value: T
    @usableFromInline init(_ value: T) {
        self.value = value
        super.init(layout: UInt64(Self.valueOffset) &<< 32 | UInt64(MemoryLayout<T>.size))
    }

    /// Where a box keeps its value: a class's stored properties follow the
    /// two-word object header, each aligned, the base class's first
    /// (`layout`, one word). `Tests/ReconcileTests/LayoutTests` checks it
    /// against the value for types of each alignment.
    @usableFromInline static var valueOffset: Int {
        let align = MemoryLayout<T>.alignment
        return (3 &* MemoryLayout<Int>.size &+ align &- 1) & ~(align &- 1)
    }

    override func valueEquals(_ other: HashableBox) -> Bool {
        guard ObjectIdentifier(type(of: other)) == ObjectIdentifier(type(of: self)) else { return false }
        // This method is never specialised (a generic class's vtable entry):
        // `==` goes through the witness table. Strings, the common key
        // whose equal values differ in bytes (each in its own buffer), are
        // compared by their UTF-8 bytes first.
        if T.self == String.self {
            return Equality.strings(valueAddress.assumingMemoryBound(to: String.self),
                                    other.valueAddress.assumingMemoryBound(to: String.self))
        }
        return value == unsafeDowncast(other, to: TypedHashableBox<T>.self).value
    }

    override var hashable: AnyHashable { AnyHashable(value) }
}

/// Why a source could not run: delivered to the program as an event through the
/// subscription's tagger, and logged by the host.
public struct SourceFailure: Error, Hashable, Sendable, CustomStringConvertible {
    /// What was attempted (`sd_event_add_inotify`, `open /etc/x`).
    public var operation: String
    /// The `errno` value when the failure came from the system.
    public var code: Int32?
    /// A human sentence saying what went wrong.
    public var reason: String

    /// A failure of `operation`, with an optional errno `code` and a `reason`.
    public init(operation: String, code: Int32? = nil, reason: String) {
        self.operation = operation
        self.code = code
        self.reason = reason
    }

    /// `operation: reason (errno N)`.
    public var description: String {
        if let code { return "\(operation): \(reason) (errno \(code))" }
        return "\(operation): \(reason)"
    }
}
