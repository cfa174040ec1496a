import Synchronization

/// Items posted from any thread and taken all at once by the loop. It wakes
/// the loop only on empty -> non-empty (one wake per take) and refuses
/// everything once closed. `Extra` is state kept under the same lock (the
/// inbox's live activations), so admitting an item and changing that state
/// are atomic with respect to each other. The inbox and the task results are
/// both this queue.
final class WakingQueue<Item, Extra>: Sendable {
    private struct State: @unchecked Sendable {
        var items: [Item] = []
        var closed = false
        var waker: Waker?
        var extra: Extra
    }

    private let state: Mutex<State>

    init(_ extra: Extra) { state = Mutex(State(extra: extra)) }

    func setWaker(_ waker: Waker) { state.withLock { $0.waker = waker } }

    /// Appends `item` unless the queue is closed or `admit` (called under the
    /// lock with the extra state and the current length) refuses it.
    func post(_ item: Item, admit: (inout Extra, _ count: Int) -> PostResult) -> PostResult {
        let (result, waker): (PostResult, Waker?) = state.withLock { s in
            if s.closed { return (.closed, nil) }
            let verdict = admit(&s.extra, s.items.count)
            guard verdict == .accepted else { return (verdict, nil) }
            s.items.append(item)
            return (.accepted, s.items.count == 1 ? s.waker : nil)
        }
        waker?()
        return result
    }

    /// Changes the extra state under the lock (`count`: the items queued then).
    func withExtra<R>(_ body: (inout Extra, _ count: Int) -> R) -> R { state.withLock { body(&$0.extra, $0.items.count) } }

    func takeAll() -> [Item] {
        state.withLock { s in
            let items = s.items
            s.items = []
            return items
        }
    }

    /// Takes the oldest `limit` items at most; when more are left, the
    /// waker is called again (after the lock) so the loop comes back for
    /// them in a later iteration, after its other sources.
    func take(upTo limit: Int) -> [Item] {
        let (items, waker): ([Item], Waker?) = state.withLock { s in
            if s.items.count <= limit {
                let items = s.items
                s.items = []
                return (items, nil)
            }
            let items = Array(s.items[..<limit])
            s.items.removeFirst(limit)
            return (items, s.waker)
        }
        waker?()
        return items
    }

    /// Closes the queue (then `reset` the extra state) and returns what was
    /// still queued.
    func close(reset: (inout Extra) -> Void = { _ in }) -> [Item] {
        state.withLock { s in
            s.closed = true
            reset(&s.extra)
            let items = s.items
            s.items = []
            return items
        }
    }
}

/// The runtime's cross-thread queue: bounded, closed at shutdown. Messages
/// from `Sender`s and events from `EventPoster`s wait here until the driver's
/// loop pumps them into the mailbox. An event is admitted only while its
/// activation is live (registered, not yet retired).
final class Inbox<Message>: Sendable {
    enum Item: @unchecked Sendable {
        case message(Message)
        case event(Activation, any Sendable)
    }

    let capacity: Int
    private let queue = WakingQueue<Item, Set<Activation>>([])

    init(capacity: Int) { self.capacity = max(1, capacity) }

    func setWaker(_ waker: Waker) { queue.setWaker(waker) }

    func post(_ item: Item) -> PostResult {
        let capacity = self.capacity
        return queue.post(item) { live, count in
            if case .event(let a, _) = item, !live.contains(a) { return .closed }
            return count >= capacity ? .full : .accepted
        }
    }

    func register(_ a: Activation) { queue.withExtra { live, _ in _ = live.insert(a) } }
    /// Refuses `a`'s posts from now on; returns how many items are queued
    /// now (its last post, if any, is among them).
    func retire(_ a: Activation) -> Int { queue.withExtra { live, count in live.remove(a); return count } }

    func takeAll() -> [Item] { queue.takeAll() }

    /// The oldest `limit` items at most; the loop is woken again for the rest.
    func take(upTo limit: Int) -> [Item] { queue.take(upTo: limit) }

    /// Closes the inbox and returns what was still queued.
    func close() -> [Item] { queue.close { $0 = [] } }
}

/// Sends messages to a runtime from any thread. Bounded: when the inbox is
/// full the message is refused (`RuntimeError.inboxFull`), never blocked on
/// and never dropped silently.
public struct Sender<Message: Sendable>: Sendable {
    let inbox: Inbox<Message>

    /// Queues `message` for the runtime's loop.
    /// - Throws: `RuntimeError.inboxFull` or `RuntimeError.shutDown`.
    public func send(_ message: Message) throws(RuntimeError) {
        switch inbox.post(.message(message)) {
        case .accepted: return
        case .full: throw .inboxFull(capacity: inbox.capacity)
        case .closed: throw .shutDown
        }
    }
}
