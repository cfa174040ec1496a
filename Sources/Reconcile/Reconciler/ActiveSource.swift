/// The active side of one subscription: a ticket plus what the reconciler and
/// runtime need to route its events. Not generic: the reconciler's loop works
/// on these without specialising on the message type.
final class ActiveSource: SourceTicket {
    @exclusivity(unchecked) var tagger: TaggerBase
    /// The group that last claimed this identity (the root for plain parts).
    @exclusivity(unchecked) var memo: GroupMemo
    /// The reconcile pass that last claimed this identity.
    @exclusivity(unchecked) var epoch: UInt64 = 0
    /// Where events go (one link per reconciler, held by every group).
    var link: OwnerLink { memo.link }

    init(_ sub: UnsafePointer<SubscriptionCore>, activation: Activation, memo: GroupMemo) {
        self.tagger = sub.pointee.tagger
        self.memo = memo
        super.init(activation: activation, id: sub.pointee.id, configurationBox: sub.pointee.configurationBox)
    }

    override func emit(_ event: Any) { link.emit(event, from: self) }
    override func fail(_ failure: SourceFailure) { link.fail(failure, from: self) }
    override func poster() -> EventPoster { link.poster(for: self) }

    /// Whether this entry's identity has cached hash `hash`, kind `kind` and
    /// a key equal to the one in `key` (held by the caller), compared
    /// without copying the identity (no reference counting).
    @inline(__always)
    func hasIdentity(_ hash: Int, _ kind: ObjectIdentifier, _ key: Unmanaged<HashableBox>) -> Bool {
        guard id.cachedHash == hash, id.kind.type == kind else { return false }
        return ReconcileEngine.sameBox(.passUnretained(id.keyBox), key)
    }

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
    func reuse(_ sub: UnsafePointer<SubscriptionCore>, activation: Activation, memo: GroupMemo, epoch: UInt64) {
        self.activation = activation
        // The same boxes as last time (a set reused as it was) are not
        // written again: no retain and release for them.
        if !Self.same(id.keyBox, sub.pointee.id.keyBox) { id = sub.pointee.id }
        if !Self.same(configurationBox, sub.pointee.configurationBox) { configurationBox = sub.pointee.configurationBox }
        isActive = true
        hasFailed = false
        hasPoster = false
        position = 0
        if state != nil { state = nil }
        if !Self.same(tagger, sub.pointee.tagger) { tagger = sub.pointee.tagger }
        if self.memo !== memo { self.memo = memo }
        self.epoch = epoch
    }

    /// Whether `a` and `b` are one object, compared without reference counting.
    @inline(__always)
    private static func same(_ a: AnyObject, _ b: AnyObject) -> Bool {
        Unmanaged.passUnretained(a).toOpaque() == Unmanaged.passUnretained(b).toOpaque()
    }
}
