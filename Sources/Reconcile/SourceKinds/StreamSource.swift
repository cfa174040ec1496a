import Synchronization

/// A source built from an `AsyncSequence`: a user's own kind (a D-Bus signal,
/// a socket) without touching the driver.
///
/// Start iterates the sequence in a task on the loop's executor, so every
/// element reaches `update` on the loop thread; stop cancels the task and no
/// element is delivered after it. A thrown error is the source's failure
/// event; the end of the sequence is `.finished`.
///
/// The sequence's factory is not compared: a stream subscription is kept as
/// long as its key is wanted. Put into the key what should restart it. Its
/// policies are compared: `restart` (after a throw or the end: `.failed` or
/// `.finished`, then `.restarting(attempt:after:)`, then a new call of the
/// factory) and `overflow` (what waits for `update`; drops are reported as
/// `.dropped(count)`).
///
/// The work per loop dispatch is bounded: a sequence whose `next()` does not
/// suspend (a buffered burst) yields to the loop every `yieldEvery` elements
/// or `yieldAfter` of iterating, whichever comes first, so the loop's other
/// sources (timers, signals, the watchdog) run during the burst.
public enum StreamSource<Element: Sendable>: Source, TaskBackedSource, RestartableSource {
    /// `stream`, as subscription IDs and logs show the kind.
    public static var name: String { "stream" }

    /// What happens to elements the program has not taken yet.
    public enum Overflow: Hashable, Sendable, CustomStringConvertible {
        /// No buffer of the source's own: the iteration runs on the loop and
        /// pulls the next element only after `update` has taken the last one
        /// (the sequence's own buffering decides what waits). The default.
        case unbuffered
        /// The sequence is iterated off the loop into a buffer of at most
        /// this many elements; when it is full the iteration waits (nothing
        /// is dropped).
        case buffer(Int)
        /// Off the loop; only the newest element waits, each one it replaces
        /// is dropped and counted.
        case keepLatest
        /// Off the loop into a buffer of at most this many elements; when it
        /// is full the oldest is dropped and counted.
        case dropOldest(Int)

        /// `unbuffered`, `buffer 64`, `keep-latest`, `drop-oldest 64`.
        public var description: String {
            switch self {
            case .unbuffered: "unbuffered"
            case .buffer(let n): "buffer \(n)"
            case .keepLatest: "keep-latest"
            case .dropOldest(let n): "drop-oldest \(n)"
            }
        }
    }

    /// The iteration, type-erased, with its restart and overflow policies.
    /// The iteration is not compared (identity decides); the policies are:
    /// changing one restarts the stream.
    public struct Configuration: Hashable, Sendable {
        /// Calls `emit` per element (synchronously: no suspension per
        /// element); on `.full`, awaits `room()` and offers it again.
        let iterate: @Sendable (_ emit: @escaping (Element) -> StreamOffer, _ room: @escaping () async -> Void) async throws -> Void
        /// How the stream restarts after it threw or ended.
        public var restart: RestartPolicy
        /// What happens to elements the program has not taken yet.
        public var overflow: Overflow

        /// Whether the policies are equal (the iterations are not compared).
        public static func == (a: Configuration, b: Configuration) -> Bool { a.restart == b.restart && a.overflow == b.overflow }
        /// Hashes the policies.
        public func hash(into hasher: inout Hasher) {
            hasher.combine(restart)
            hasher.combine(overflow)
        }
    }

    /// What the stream reports.
    public enum Event: Sendable {
        /// The sequence produced an element.
        case element(Element)
        /// The sequence ended.
        case finished
        /// The sequence threw (or could not start).
        case failed(SourceFailure)
        /// `count` elements were dropped by the overflow policy since the
        /// last report; delivered before the element that follows them.
        case dropped(Int)
        /// The restart policy starts attempt `attempt` after `after` (after a
        /// `.failed` or a `.finished`).
        case restarting(attempt: Int, after: Duration)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
    /// The configuration's restart policy.
    public static func restartPolicy(_ configuration: Configuration) -> RestartPolicy { configuration.restart }
    /// `.restarting(attempt:after:)`.
    public static func restarting(attempt: Int, after: Duration) -> Event { .restarting(attempt: attempt, after: after) }
    /// `.finished` ends an attempt.
    public static func isEnd(_ event: Event) -> Bool { if case .finished = event { true } else { false } }

    /// The most elements delivered before the iteration yields to the loop.
    public static var yieldEvery: Int { StreamPacer.elements }
    /// The longest the iteration runs before it yields to the loop.
    public static var yieldAfter: Duration { StreamPacer.interval }

    /// Iterates the ticket's sequence in a task on `executor` (an overflow
    /// policy other than `.unbuffered`: on the global executor, delivering
    /// on `executor`).
    /// - Parameters:
    ///   - ticket: The activation the elements are emitted through.
    ///   - executor: The loop's executor (nil: the global concurrent one).
    /// - Returns: A closure that cancels the task (loop thread).
    public static func startTask(_ ticket: SourceTicket, executor: (any TaskExecutor)?) -> () -> Void {
        startTask(ticket, executor: executor, producer: nil)
    }

    /// Iterates the ticket's sequence: on `executor` (`.unbuffered`), or on
    /// `producer` into the overflow policy's buffer, delivered on `executor`.
    /// - Parameters:
    ///   - ticket: The activation the elements are emitted through.
    ///   - executor: The loop's executor (nil: the global concurrent one).
    ///   - producer: Where a buffered stream's sequence is iterated (nil:
    ///     the global concurrent executor; a virtual driver passes its own).
    /// - Returns: A closure that cancels the tasks (loop thread).
    public static func startTask(_ ticket: SourceTicket, executor: (any TaskExecutor)?, producer: (any TaskExecutor)?) -> () -> Void {
        guard let configuration = ticket.configuration(as: Self.self) else { return {} }
        let box = LoopBound(ticket)
        let id = ticket.id
        if configuration.overflow != .unbuffered {
            return startBuffered(configuration, box, id, executor: executor, producer: producer)
        }
        let task = Task(executorPreference: executor) {
            do {
                try await configuration.iterate({ element in
                    guard !Task.isCancelled, box.value.isActive else { return .stopped }
                    box.value.emit(Event.element(element))
                    return .accepted
                }, {})
                if !Task.isCancelled, box.value.isActive { box.value.emit(Event.finished) }
            } catch {
                if !Task.isCancelled, box.value.isActive {
                    box.value.fail(SourceFailure(operation: "stream \(id)", reason: String(describing: error)))
                }
            }
        }
        return { task.cancel() }
    }

    private static func startBuffered(_ configuration: Configuration, _ box: LoopBound<SourceTicket>, _ id: SubscriptionID,
                                      executor: (any TaskExecutor)?, producer: (any TaskExecutor)?) -> () -> Void {
        let buffer = StreamBuffer<Element>(configuration.overflow)
        let pull = Task(executorPreference: producer) {
            do {
                try await configuration.iterate({ element in
                    switch buffer.offer(element) {
                    case true?: .accepted
                    case false?: .stopped
                    case nil: .full
                    }
                }, { await buffer.room() })
                buffer.finish(nil)
            } catch {
                buffer.finish(SourceFailure(operation: "stream \(id)", reason: String(describing: error)))
            }
        }
        let deliver = Task(executorPreference: executor) {
            var pacer = StreamPacer()
            while true {
                // Suspends only when nothing waits.
                let polled = buffer.poll()
                let next: StreamBuffer<Element>.Batch? = if let polled { polled } else { await buffer.take() }
                guard let batch = next else { return }
                guard !Task.isCancelled, box.value.isActive else { return }
                if batch.dropped > 0 { box.value.emit(Event.dropped(batch.dropped)) }
                for element in batch.elements {
                    guard !Task.isCancelled, box.value.isActive else { return }
                    box.value.emit(Event.element(element))
                    await pacer.next()
                }
                guard !Task.isCancelled, box.value.isActive else { return }
                switch batch.end {
                case nil: continue
                case .finished: return box.value.emit(Event.finished)
                case .failed(let failure): return box.value.fail(failure)
                }
            }
        }
        return {
            pull.cancel()
            deliver.cancel()
            buffer.cancel()
        }
    }
}

/// A buffered stream's elements between the iteration (any thread) and the
/// delivery (the loop), under its overflow policy.
final class StreamBuffer<Element: Sendable>: Sendable {
    struct Batch {
        var elements: [Element]
        var dropped: Int
        /// Set once the iteration ended.
        var end: End?
    }

    /// How the iteration ended.
    enum End {
        case finished
        case failed(SourceFailure)
    }

    private struct State: @unchecked Sendable {
        var elements: [Element] = []
        var head = 0
        var dropped = 0
        var end: End?
        var cancelled = false
        var taker: CheckedContinuation<Void, Never>?
        var pusher: CheckedContinuation<Void, Never>?
        var count: Int { elements.count - head }
        var ready: Bool { count > 0 || dropped > 0 || end != nil || cancelled }
    }

    private let overflow: StreamSource<Element>.Overflow
    private let state = Mutex(State())

    init(_ overflow: StreamSource<Element>.Overflow) { self.overflow = overflow }

    /// Waits until a full `.buffer` was taken from (or cancelled).
    func room() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let go = state.withLock { s in
                if s.cancelled || s.count == 0 { return true }
                s.pusher = c
                return false
            }
            if go { c.resume() }
        }
    }

    /// Adds `element` under the policy unless a `.buffer` is full (nil);
    /// false once cancelled.
    func offer(_ element: Element) -> Bool? {
        let (accepted, wake): (Bool?, CheckedContinuation<Void, Never>?) = state.withLock { s in
            if s.cancelled { return (false, nil) }
            switch overflow {
            case .unbuffered, .buffer:
                let bound = if case .buffer(let n) = overflow { max(1, n) } else { Int.max }
                if s.count >= bound { return (nil, nil) }
            case .keepLatest:
                if s.count > 0 {
                    s.dropped += s.count
                    s.elements.removeAll(keepingCapacity: true)
                    s.head = 0
                }
            case .dropOldest(let n):
                if s.count >= max(1, n) {
                    s.head += 1
                    s.dropped += 1
                    if s.head >= 1024, s.head * 2 >= s.elements.count {
                        s.elements.removeFirst(s.head)
                        s.head = 0
                    }
                }
            }
            s.elements.append(element)
            let t = s.taker
            s.taker = nil
            return (true, t)
        }
        wake?.resume()
        return accepted
    }

    /// The iteration ended (`failure` nil: the sequence finished).
    func finish(_ failure: SourceFailure?) {
        let t: CheckedContinuation<Void, Never>? = state.withLock { s in
            if s.end == nil { s.end = failure.map { .failed($0) } ?? .finished }
            let t = s.taker
            s.taker = nil
            return t
        }
        t?.resume()
    }

    /// Everything waiting, without waiting: nil when nothing is, `.some(nil)`
    /// once cancelled.
    func poll() -> Batch?? {
        let (batch, pusher): (Batch??, CheckedContinuation<Void, Never>?) = state.withLock { s in
            if s.cancelled { return (.some(nil), nil) }
            guard s.ready else { return (nil, nil) }
            let b = Batch(elements: Array(s.elements[s.head...]), dropped: s.dropped, end: s.end)
            s.elements.removeAll(keepingCapacity: true)
            s.head = 0
            s.dropped = 0
            let p = s.pusher
            s.pusher = nil
            return (.some(b), p)
        }
        pusher?.resume()
        return batch
    }

    /// Everything waiting (nil once cancelled), waiting for something to come.
    func take() async -> Batch? {
        while true {
            if let batch = poll() { return batch }
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let go = state.withLock { s in
                    if s.ready { return true }
                    s.taker = c
                    return false
                }
                if go { c.resume() }
            }
        }
    }

    /// Ends both sides: waiting calls return, later ones refuse.
    func cancel() {
        let (t, p) = state.withLock { s in
            s.cancelled = true
            let both = (s.taker, s.pusher)
            s.taker = nil
            s.pusher = nil
            return both
        }
        t?.resume()
        p?.resume()
    }
}

/// What became of an element a stream's iteration offered.
enum StreamOffer {
    /// Delivered, or buffered.
    case accepted
    /// The buffer is full: wait for room, then offer it again.
    case full
    /// The stream stopped: end the iteration.
    case stopped
}

/// A source kind whose running is a Swift task the core can start on a
/// driver's executor (drivers call `startTask` and the returned stop).
public protocol TaskBackedSource: Source {
    /// Starts the source's task on `executor` (the loop's: events are emitted
    /// from it on the loop thread); returns what stops it (loop thread).
    static func startTask(_ ticket: SourceTicket, executor: (any TaskExecutor)?) -> () -> Void
    /// The same, with work that may run off the loop on `producer` (a
    /// virtual driver passes its own executor there, to stay deterministic).
    static func startTask(_ ticket: SourceTicket, executor: (any TaskExecutor)?, producer: (any TaskExecutor)?) -> () -> Void
}

extension TaskBackedSource {
    /// `startTask(_:executor:)`: no work off the loop.
    public static func startTask(_ ticket: SourceTicket, executor: (any TaskExecutor)?, producer: (any TaskExecutor)?) -> () -> Void {
        startTask(ticket, executor: executor)
    }
}

/// Bounds a stream's work per loop dispatch: `next()` after each element;
/// it suspends (`Task.yield`) every `elements` elements or `interval` of
/// iterating, so a sequence that never suspends cannot hold the loop.
struct StreamPacer {
    static let elements = 64
    static let interval: Duration = .milliseconds(1)
    private var count = 0
    private var since = ContinuousClock.now

    mutating func next() async {
        count += 1
        // The clock is read every 8 elements (a burst's elements are cheap).
        guard count >= Self.elements || (count & 7 == 0 && ContinuousClock.now - since >= Self.interval) else { return }
        await Task.yield()
        count = 0
        since = ContinuousClock.now
    }
}

/// A loop-thread value carried by a task that runs on the loop's executor.
/// Only touched from jobs of that executor (the loop thread).
struct LoopBound<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

extension Subscription {
    /// A subscription to the sequence `make()` returns, keyed by `key`:
    /// elements, the end and a thrown error become messages through `tag`.
    /// - Parameters:
    ///   - key: The identity's key (what restarts the stream when it changes).
    ///   - restart: How the stream restarts after it threw or ended (each
    ///     attempt calls `make()` again); `.never` by default.
    ///   - overflow: What happens to elements `update` has not taken yet;
    ///     `.unbuffered` by default.
    ///   - make: Makes the sequence (once per attempt).
    ///   - tag: Makes a message of each event.
    public static func stream<Key: Hashable & Sendable, S: AsyncSequence>(
        key: Key, restart: RestartPolicy = .never, overflow: StreamSource<S.Element>.Overflow = .unbuffered,
        _ make: @escaping @Sendable () -> S,
        tag: @escaping (StreamSource<S.Element>.Event) -> Message
    ) -> Subscription where S.Element: Sendable, S: SendableMetatype {
        let configuration = StreamSource<S.Element>.Configuration(iterate: { emit, room in
            var pacer = StreamPacer()
            for try await element in make() {
                while true {
                    switch emit(element) {
                    case .accepted: break
                    case .stopped: return
                    case .full:
                        await room()
                        continue
                    }
                    break
                }
                await pacer.next()
            }
        }, restart: restart, overflow: overflow)
        return Subscription(StreamSource<S.Element>.self, key: key, configuration: configuration, tag: tag)
    }
}
