/// Where a runtime's messages go, seen from the entries (which are not
/// generic over the message type): one link per reconciler, shared by all
/// its entries.
class OwnerLink {
    func emit(_ event: Any, from source: ActiveSource) {}
    func fail(_ failure: SourceFailure, from source: ActiveSource) {}
    func poster(for source: ActiveSource) -> EventPoster { EventPoster(activation: source.activation) { _ in .closed } }
    /// An event of a stopped restart attempt of `source` (RestartSupervisor).
    func rejectAfterStop(from source: ActiveSource) {}
}

final class TypedOwnerLink<Message>: OwnerLink {
    weak var sink: (any MessageSink<Message>)?
    unowned(unsafe) var root: GroupMemo!

    /// The message `source`'s tagger (and its group's mapping) makes of `event`.
    func message(for event: Any, from source: ActiveSource) -> Message? {
        if source.memo === root { return unsafeDowncast(source.tagger, to: Tagger<Message>.self).tag(event) }
        guard let m = source.tagger.tagAny(event) else { return nil }
        return (source.memo.route(m) as! Message)
    }

    func message(for failure: SourceFailure, from source: ActiveSource) -> Message {
        if source.memo === root { return unsafeDowncast(source.tagger, to: Tagger<Message>.self).fail(failure) }
        return source.memo.route(source.tagger.failAny(failure)) as! Message
    }

    override func emit(_ event: Any, from source: ActiveSource) {
        guard let sink else { return }
        guard source.isActive else { return sink.report(.eventAfterStop(source.id, source.activation)) }
        guard let message = message(for: event, from: source) else {
            return sink.report(.eventTypeMismatch(source.id, String(describing: type(of: event))))
        }
        sink.enqueue(message, from: source)
    }

    override func fail(_ failure: SourceFailure, from source: ActiveSource) {
        guard let sink else { return }
        guard source.isActive else { return sink.report(.eventAfterStop(source.id, source.activation)) }
        source.hasFailed = true
        sink.report(.sourceFailed(source.id, source.activation, failure))
        sink.enqueue(message(for: failure, from: source), from: source)
    }

    override func rejectAfterStop(from source: ActiveSource) {
        sink?.report(.eventAfterStop(source.id, source.activation))
    }

    override func poster(for source: ActiveSource) -> EventPoster {
        guard let sink else { return super.poster(for: source) }
        source.hasPoster = true
        return sink.makePoster(for: source)
    }
}
