// The unsafe trick of this file: a stopped entry that nothing else
// references is recycled as the ticket of a new activation (no allocation
// per start). "Nothing else references it" is read from the standard
// library's underscored hooks for the strong, unowned and weak counts.
//
// What it relies on: those hooks reading 1 for an object with no unowned or
// weak reference and more with one. What would break it: a runtime that
// reads them otherwise — then `countsAreReliable` (checked once on a probe
// object) is false and entries are simply not recycled, an allocation per
// start, never a ticket reused while referenced. `TicketReuseTests` fail if
// recycling turned itself off.

extension ActiveSource {
    /// Whether no weak or unowned reference to this entry exists (strong
    /// ones the caller checks with `isKnownUniquelyReferenced`): a stopped
    /// entry that passes both cannot be reached by anything that saw its
    /// old activation.
    var hasNoWeakOrUnownedReference: Bool {
        Self.countsAreReliable && _getUnownedRetainCount(self) == 1 && _getWeakRetainCount(self) == 1
    }

    /// Whether the runtime's unowned and weak counts read as recycling
    /// expects (1 with no such reference, more with one), checked once on a
    /// probe object. These are the standard library's underscored hooks; if
    /// a future runtime reads them otherwise, entries are not recycled (an
    /// allocation per start) rather than recycled while still referenced.
    static let countsAreReliable: Bool = probeCounts()

    /// The probe: an object's counts with no weak or unowned reference, then
    /// with one of each held in another object's fields (the kind of
    /// reference the check guards against). Not optimised, so neither
    /// reference can be folded away.
    @_optimize(none)
    private static func probeCounts() -> Bool {
        final class Probe {}
        final class Holder {
            unowned let strongless: Probe
            weak var weakly: Probe?
            init(_ p: Probe) { strongless = p; weakly = p }
        }
        let probe = Probe()
        guard _getUnownedRetainCount(probe) == 1, _getWeakRetainCount(probe) == 1 else { return false }
        let holder = Holder(probe)
        let seen = _getUnownedRetainCount(probe) > 1 && _getWeakRetainCount(probe) > 1
        withExtendedLifetime(holder) {}
        return seen
    }

    /// Makes this stopped entry, which nothing else references, the ticket
    /// of a new activation of `sub` (recycling: no allocation per start).
    /// With `boxRetainDeferred`, as `ActiveSource.init`'s: the entry holds
    /// the new box without a retain of its own yet.
    func reuse(_ sub: UnsafePointer<SubscriptionCore>, activation: Activation, memo: GroupMemo, epoch: UInt64, boxRetainDeferred: Bool) {
        self.activation = activation
        // The same boxes as last time (a set reused as it was) are not
        // written again: no retain and release for them.
        if !Self.same(id.keyBox, sub.pointee.id.keyBox) { id = sub.pointee.id }
        let box = sub.pointee.configurationBox
        if !Self.same(configurationBox, box) {
            configurationBox = boxRetainDeferred ? Unmanaged.passUnretained(box).takeRetainedValue() : box
        } else if boxRetainDeferred {
            // Its reference becomes the deferred one (the desired set holds
            // the box meanwhile).
            Unmanaged.passUnretained(box).release()
        }
        isActive = true
        hasFailed = false
        hasPoster = false
        position = 0
        if state != nil { state = nil }
        unpinTagger()
        taggerRef = .passUnretained(sub.pointee.tagger)
        if self.memo !== memo { self.memo = memo }
        self.epoch = epoch
    }

    /// Whether `a` and `b` are one object, compared without reference counting.
    @inline(__always)
    private static func same(_ a: AnyObject, _ b: AnyObject) -> Bool {
        Unmanaged.passUnretained(a).toOpaque() == Unmanaged.passUnretained(b).toOpaque()
    }
}
