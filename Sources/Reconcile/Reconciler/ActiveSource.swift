/// The active side of one subscription: a ticket plus what the reconciler and
/// runtime need to route its events. Not generic: the reconciler's loop works
/// on these without specialising on the message type.
///
/// The tagger is held unretained (`taggerRef`): a kept subscription's tagger
/// is refreshed with a plain store, no reference counting (the refresh was
/// half the cost of a no-op reconcile on a freshly built set). What keeps it
/// alive is the engine, not the entry: every group memo (the root for the
/// plain parts) holds the content it was last walked from (`GroupMemo.content`,
/// one retain per reconcile for the root, one per built group), and every
/// active entry's tagger was read from its memo's content in that walk (a
/// skipped group keeps its content and its entries their taggers). A stopped
/// entry can still be asked for its tagger (events its poster posted before
/// the stop are tagged when the inbox is next moved): an entry with a poster
/// takes a strong reference when it stops (`pinTagger`), before the content
/// that held its tagger can go. That reference is marked in `epoch`, which
/// a stopped entry no longer uses (it is in no table and no order; `reuse`
/// sets it again): no field of its own, so the entry stays in its
/// allocator size class.
final class ActiveSource: SourceTicket {
    /// The tagger, unretained (see above).
    @exclusivity(unchecked) var taggerRef: Unmanaged<TaggerBase>
    /// The tagger of the subscription this entry runs (or ran when it stopped).
    var tagger: TaggerBase { taggerRef.takeUnretainedValue() }
    /// The group that last claimed this identity (the root for plain parts).
    @exclusivity(unchecked) var memo: GroupMemo
    /// The reconcile pass that last claimed this identity.
    @exclusivity(unchecked) var epoch: UInt64 = 0
    /// Where events go (one link per reconciler, held by every group).
    var link: OwnerLink { memo.link }

    /// With `boxRetainDeferred`, the entry holds its configuration box
    /// without having retained it yet: the start's retain, made once the
    /// reconcile is over (`ReconcileEngine.reconcile`), is the entry's.
    init(_ sub: UnsafePointer<SubscriptionCore>, activation: Activation, memo: GroupMemo, boxRetainDeferred: Bool) {
        self.taggerRef = .passUnretained(sub.pointee.tagger)
        self.memo = memo
        let box = boxRetainDeferred
            ? Unmanaged.passUnretained(sub.pointee.configurationBox).takeRetainedValue()
            : sub.pointee.configurationBox
        super.init(activation: activation, id: sub.pointee.id, configurationBox: box)
    }

    /// Keeps the tagger alive past its content (a stopped entry whose poster
    /// may have posted events not tagged yet).
    @inline(__always)
    func pinTagger() {
        guard hasPoster && epoch != Self.pinnedEpoch else { return }
        _ = taggerRef.retain()
        epoch = Self.pinnedEpoch
    }

    /// Drops the reference `pinTagger` took, if it took one.
    @inline(__always)
    func unpinTagger() {
        guard epoch == Self.pinnedEpoch else { return }
        taggerRef.release()
        epoch = 0
    }

    /// `epoch` of a stopped entry holding a reference to its tagger (no
    /// reconcile reaches this epoch).
    static let pinnedEpoch = UInt64.max

    deinit { unpinTagger() }

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
}
