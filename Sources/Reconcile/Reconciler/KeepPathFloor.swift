/// The keep path's own comparisons and nothing else: the floor the
/// benchmark (`reconcile-bench`, implementation `floor`) holds a no-op
/// reconcile against.
///
/// For each desired subscription it does what the reconciler's keep path
/// must do for a subscription kept in its place: compare the identity with
/// the running one's (cached hash, kind, key box by identity then by value)
/// and the configuration box (by identity, then by value). It keeps no
/// table, no order, no tagger and plans nothing; it cannot reconcile.
@_spi(Benchmarks)
public final class KeepPathFloor<Message> {
    private struct Running {
        let hash: Int
        let kind: ObjectIdentifier
        let key: Unmanaged<HashableBox>
        let configuration: Unmanaged<HashableBox>
    }

    /// The running side, in order (its boxes held by `held`).
    private var running: ContiguousArray<Running> = []
    private let held: [Subscription<Message>]

    /// A floor whose running subscriptions are `set`'s (a flat set).
    /// - Parameter set: the set the running side stands for.
    public init(_ set: Subscriptions<Message>) {
        held = set.items
        running.reserveCapacity(held.count)
        for s in held {
            running.append(Running(hash: s.core.id.cachedHash, kind: s.core.id.kind.type,
                                   key: .passUnretained(s.core.id.keyBox),
                                   configuration: .passUnretained(s.core.configurationBox)))
        }
    }

    /// Compares `desired` (a flat set of the same length) with the running
    /// side in position.
    /// - Parameter desired: the set to compare.
    /// - Returns: how many compared equal.
    public func compare(_ desired: Subscriptions<Message>) -> Int {
        guard case .one(.items(let items))? = desired.storage else { return 0 }
        var equal = 0
        items.withUnsafeBufferPointer { items in
            guard let base = items.baseAddress else { return }
            // Read in place, as the engine's walk reads them.
            let cores = UnsafeRawPointer(base).assumingMemoryBound(to: SubscriptionCore.self)
            running.withUnsafeBufferPointer { running in
                for i in 0..<min(items.count, running.count) {
                    let d = cores + i
                    let r = running[i]
                    guard d.pointee.id.cachedHash == r.hash, d.pointee.id.kind.type == r.kind,
                          ReconcileEngine.sameBox(.passUnretained(d.pointee.id.keyBox), r.key),
                          ReconcileEngine.sameBox(.passUnretained(d.pointee.configurationBox), r.configuration)
                    else { continue }
                    equal &+= 1
                }
            }
        }
        return equal
    }
}
