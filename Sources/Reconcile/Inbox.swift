import Synchronization

/// The runtime's cross-thread queue: bounded, closed at shutdown. Messages
/// from `Sender`s and events from `EventPoster`s wait here until the driver's
/// loop pumps them into the mailbox.
final class Inbox<Message>: Sendable {
    enum Item: @unchecked Sendable {
        case message(Message)
        case event(Activation, any Sendable)
    }

    private struct State: @unchecked Sendable {
        var items: [Item] = []
        var closed = false
        var live: Set<Activation> = []
        var waker: Waker?
    }

    let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) { self.capacity = max(1, capacity) }

    func setWaker(_ waker: Waker) { state.withLock { $0.waker = waker } }

    func post(_ item: Item) -> PostResult {
        let (result, waker): (PostResult, Waker?) = state.withLock { s in
            if s.closed { return (.closed, nil) }
            if case .event(let a, _) = item, !s.live.contains(a) { return (.closed, nil) }
            if s.items.count >= capacity { return (.full, nil) }
            s.items.append(item)
            // Wake only on empty -> non-empty: one wake per pump.
            return (.accepted, s.items.count == 1 ? s.waker : nil)
        }
        waker?()
        return result
    }

    func register(_ a: Activation) { state.withLock { _ = $0.live.insert(a) } }
    func retire(_ a: Activation) { state.withLock { _ = $0.live.remove(a) } }

    func takeAll() -> [Item] {
        state.withLock { s in
            let items = s.items
            s.items = []
            return items
        }
    }

    /// Closes the inbox and returns what was still queued.
    func close() -> [Item] {
        state.withLock { s in
            s.closed = true
            s.live = []
            let items = s.items
            s.items = []
            return items
        }
    }
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
