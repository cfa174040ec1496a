/// Where a runtime's messages go, seen from the entries (which are not
/// generic over the message type): one link per reconciler, shared by all
/// its entries.
class OwnerLink {
    func emit(_ event: Any, from source: ActiveSource) {}
    func fail(_ failure: SourceFailure, from source: ActiveSource) {}
    func poster(for source: ActiveSource) -> EventPoster { EventPoster(activation: source.activation) { _ in .closed } }
    /// An event of a stopped restart attempt of `source` (RestartSupervisor).
    func rejectAfterStop(from source: ActiveSource) {}
    /// Hands `events` (of source kind `S`) to the program as one batch.
    func emit<S: Source>(batch events: [S.Event], of kind: S.Type, from source: ActiveSource) {}
    /// Hands the events `produce` makes (of source kind `S`) to the program
    /// as one batch, each as it is made (see `SourceTicket.stream`).
    func stream<S: Source>(of kind: S.Type, from source: ActiveSource, rest: () -> [S.Event],
                           _ produce: (_ deliver: (consuming S.Event) -> Bool) -> Void) { produce { _ in false } }
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

    /// The batch is tagged with the subscription's own closure when it is
    /// in no group (no `Any` box or cast per event), each event as it is
    /// delivered; in a group, at once through its mapping. `update` runs
    /// for each in order and one reconcile follows.
    override func emit<S: Source>(batch events: [S.Event], of kind: S.Type, from source: ActiveSource) {
        guard let sink, !events.isEmpty else { return }
        guard source.isActive else {
            for _ in events { sink.report(.eventAfterStop(source.id, source.activation)) }
            return
        }
        if source.memo === root {
            // Tagged as delivered: no reconcile runs within a batch, so
            // the tagger is the one it had when the batch was emitted.
            let tagger = unsafeDowncast(source.tagger, to: Tagger<Message>.self)
            if let body = tagger.body(of: kind) {
                return sink.enqueue(batch: events.count, from: source) { body(events[$0]) }
            }
            if let body = tagger.consumingBody(of: kind) {
                return sink.enqueue(batch: events.count, from: source) { body(events[$0]) }
            }
        }
        var messages: [Message] = []
        messages.reserveCapacity(events.count)
        for e in events {
            guard let m = message(for: e, from: source) else {
                sink.report(.eventTypeMismatch(source.id, String(describing: S.Event.self)))
                continue
            }
            messages.append(m)
        }
        sink.enqueue(batch: messages.count, from: source) { messages[$0] }
    }

    /// As `emit(batch:)`, the events tagged as they come: `update` runs for
    /// each before the next is made.
    override func stream<S: Source>(of kind: S.Type, from source: ActiveSource, rest: () -> [S.Event],
                                    _ produce: (_ deliver: (consuming S.Event) -> Bool) -> Void) {
        guard let sink else { return produce { _ in false } }
        guard source.isActive else {
            return produce { _ in
                sink.report(.eventAfterStop(source.id, source.activation))
                return true
            }
        }
        if source.memo === root {
            let tagger = unsafeDowncast(source.tagger, to: Tagger<Message>.self)
            if let body = tagger.consumingBody(of: kind) {
                return sink.enqueue(stream: source, rest: { rest().map(body) }) { deliver in
                    withoutActuallyEscaping(deliver) { deliver in produce { event in deliver(body(consume event)) } }
                }
            }
            if let body = tagger.body(of: kind) {
                return sink.enqueue(stream: source, rest: { rest().map(body) }) { deliver in
                    withoutActuallyEscaping(deliver) { deliver in produce { event in deliver(body(event)) } }
                }
            }
        }
        // The tagger and the group's route, held for the batch: a shutdown
        // during it releases what holds the entry's tagger (the set), and
        // the rest is still tagged then.
        let tagger = source.tagger
        let memo = source.memo
        let route = { (e: S.Event) -> Message? in tagger.tagAny(e).map { memo.route($0) as! Message } }
        sink.enqueue(stream: source, rest: { rest().compactMap(route) }) { deliver in
            withoutActuallyEscaping(deliver) { deliver in
                produce { e in
                    guard let m = route(e) else {
                        sink.report(.eventTypeMismatch(source.id, String(describing: S.Event.self)))
                        return true
                    }
                    return deliver(m)
                }
            }
        }
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

extension SourceTicket {
    /// Hands `events` of source kind `S` to the program as one batch, on
    /// the loop thread: each is tagged now, `update` runs for each in order,
    /// and one reconcile follows the last (not one per event, as `emit`
    /// does when nothing is draining). A driver's dispatch that produced
    /// many events (the lines of one read) uses this.
    ///
    /// - Parameters:
    ///   - events: the events, in order; their number is the dispatch's
    ///     (bounded) work.
    ///   - kind: the source kind whose `Event` they are.
    ///   A restart attempt's ticket takes a batch too: its supervisor hands
    ///   the events up to an end on as one batch, and ends the attempt at
    ///   the end (`RestartSupervisor`).
    /// - Returns: false when this ticket cannot take a batch (one that is
    ///   neither the runtime's nor an attempt's): then emit or post the
    ///   events one by one.
    package func emit<S: Source>(batch events: [S.Event], of kind: S.Type) -> Bool {
        if let source = self as? ActiveSource {
            source.link.emit(batch: events, of: kind, from: source)
            return true
        }
        guard let attempt = self as? AttemptTicket else { return false }
        attempt.deliver(batch: events, of: kind)
        return true
    }

    /// Whether `stream(of:rest:_:)` takes events (the runtime's own ticket).
    package var streams: Bool { self is ActiveSource }

    /// Hands the events `produce` makes to the program as one batch, each
    /// as it is made: `update` runs for an event (and its commands are
    /// performed) before `produce` makes the next; one reconcile follows
    /// the last. No array of the dispatch's events is built: a line is
    /// decoded, delivered and freed before the next.
    ///
    /// - Parameters:
    ///   - kind: the source kind whose `Event` they are.
    ///   - rest: the events `produce` has the input for but has not made
    ///     yet, in order (what a shutdown during the batch reports as
    ///     dropped); called at most once, from within a `deliver`.
    ///   - produce: makes the events, calling `deliver` with each in order;
    ///     `deliver` returns false when nothing more is taken (the runtime
    ///     shut down): `produce` stops then, and must not touch what the
    ///     source's stop released.
    /// - Returns: false when this ticket cannot stream (`streams`); then
    ///   `produce` was not called.
    package func stream<S: Source>(of kind: S.Type, rest: () -> [S.Event], _ produce: (_ deliver: (consuming S.Event) -> Bool) -> Void) -> Bool {
        guard let source = self as? ActiveSource else { return false }
        source.link.stream(of: kind, from: source, rest: rest, produce)
        return true
    }
}
