// The unsafe trick of this file: the engine reads a `Subscriptions<M>` of any
// message type as a `Subscriptions<Never>`, by `unsafeBitCast`, so the walk
// is compiled once, not specialised per program.
//
// What it relies on: a set's storage holds only references (arrays of
// `Subscription<M>`, group and map nodes), and `Subscription<M>`'s only
// stored property is a `SubscriptionCore` (no field depends on `M`), so the
// layouts match for every `M`. The walk calls nodes only through their class
// methods, whose calling convention does not depend on the type argument.
//
// What would break it: a stored property of `Subscription` or of a storage
// case whose layout depends on `Message` (a `Message` value, a closure typed
// on it stored inline). `erase` checks the element layout on every call (one
// compare of constants, folded away when `M` is known), and
// `Tests/ReconcileTests/LayoutTests.swift` checks it over several message
// types, including large, generic and non-copyable-payload ones.

extension ReconcileEngine {
    /// The message type the walk sees. A set's parts hold only references
    /// (arrays, nodes) whatever the message type, so `Subscriptions<M>` has
    /// the layout of `Subscriptions<Erased>`; the walk reads them so, without
    /// value witnesses, and calls nodes only through their class methods
    /// (whose convention does not depend on the type argument).
    typealias Erased = Never

    /// Whether `Subscription<M>` is laid out as the walk reads it.
    @inline(__always)
    static func layoutMatches<M>(_: M.Type) -> Bool {
        MemoryLayout<Subscription<M>>.size == MemoryLayout<SubscriptionCore>.size
            && MemoryLayout<Subscription<M>>.stride == MemoryLayout<SubscriptionCore>.stride
            && MemoryLayout<Subscription<M>>.alignment == MemoryLayout<SubscriptionCore>.alignment
            && MemoryLayout<Subscriptions<M>>.size == MemoryLayout<Subscriptions<Erased>>.size
            && MemoryLayout<SubscriptionsPart<M>>.stride == MemoryLayout<SubscriptionsPart<Erased>>.stride
    }

    /// `desired` as the walk reads it.
    @inline(__always)
    static func erase<M>(_ desired: Subscriptions<M>) -> Subscriptions<Erased> {
        precondition(layoutMatches(M.self), "Subscription<\(M.self)> is not laid out as the reconciler reads it")
        return unsafeBitCast(desired, to: Subscriptions<Erased>.self)
    }

    /// `parts` (a mapped group's) as the walk reads them.
    @inline(__always)
    static func erase<M>(_ parts: [SubscriptionsPart<M>]) -> [SubscriptionsPart<Erased>] {
        precondition(layoutMatches(M.self), "Subscription<\(M.self)> is not laid out as the reconciler reads it")
        return unsafeBitCast(parts, to: [SubscriptionsPart<Erased>].self)
    }
}
