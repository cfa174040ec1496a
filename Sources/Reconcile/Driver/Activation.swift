/// One run of a source, stamped by the runtime on every start.
///
/// A restart gives the same identity a new activation. The driver guarantees
/// that a stopped activation produces no new event; a message it produced
/// before the stop may still be queued and is delivered, counted as late.
public struct Activation: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Increasing per runtime: a later start has a larger generation.
    public let generation: UInt64

    /// An activation with `generation`. Runtimes stamp these; tests may build them.
    public init(generation: UInt64) { self.generation = generation }

    /// Whether `a` was started before `b`.
    public static func < (a: Activation, b: Activation) -> Bool { a.generation < b.generation }
    /// `#` and the generation (`#12`), as plans and logs show it.
    public var description: String { "#\(generation)" }
}

/// A token a model owns to tell its current phase from earlier ones.
///
/// Taggers capture the model's phase; a message queued before the model moved
/// on carries the old phase, and `update` rejects it by comparing.
/// `Subscription.debounce(_:phase:after:_:)` makes a one-shot timer whose
/// identity is a name plus the phase: a debounce. A bare phase is not a timer
/// key (two debouncers would collide when their counters are equal).
public struct Phase: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    /// The phase's number; the initial phase is 0.
    public private(set) var value: UInt64

    /// The initial phase.
    public init() { value = 0 }

    /// Moves to a new phase, leaving every earlier token stale.
    public mutating func advance() { value &+= 1 }

    /// Whether `token` was issued in this phase.
    public func isCurrent(_ token: Phase) -> Bool { token == self }

    /// Whether `a` is an earlier phase than `b`.
    public static func < (a: Phase, b: Phase) -> Bool { a.value < b.value }
    /// `phase` and the number (`phase 3`).
    public var description: String { "phase \(value)" }
}
