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
}
