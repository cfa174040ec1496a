/// A source built from an `AsyncSequence`: a user's own kind (a D-Bus signal,
/// a socket) without touching the driver.
///
/// Start iterates the sequence in a task on the loop's executor, so every
/// element reaches `update` on the loop thread; stop cancels the task and no
/// element is delivered after it. A thrown error is the source's failure
/// event; the end of the sequence is `.finished`.
///
/// The sequence's factory is not compared: a stream subscription is kept as
/// long as its key is wanted. Put into the key what should restart it.
///
/// The work per loop dispatch is bounded: a sequence whose `next()` does not
/// suspend (a buffered burst) yields to the loop every `yieldEvery` elements
/// or `yieldAfter` of iterating, whichever comes first, so the loop's other
/// sources (timers, signals, the watchdog) run during the burst.
public enum StreamSource<Element: Sendable>: Source, TaskBackedSource {
    /// `stream`, as subscription IDs and logs show the kind.
    public static var name: String { "stream" }

    /// The iteration, type-erased. Always equal: identity decides.
    public struct Configuration: Hashable, Sendable {
        let iterate: @Sendable (_ emit: @escaping (Element) -> Bool) async throws -> Void

        /// Always true: the factory is not compared.
        public static func == (a: Configuration, b: Configuration) -> Bool { true }
        /// Hashes nothing (all configurations are equal).
        public func hash(into hasher: inout Hasher) {}
    }

    /// What the stream reports.
    public enum Event: Sendable {
        /// The sequence produced an element.
        case element(Element)
        /// The sequence ended.
        case finished
        /// The sequence threw (or could not start).
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }

    /// The most elements delivered before the iteration yields to the loop.
    public static var yieldEvery: Int { StreamPacer.elements }
    /// The longest the iteration runs before it yields to the loop.
    public static var yieldAfter: Duration { StreamPacer.interval }

    /// Iterates the ticket's sequence in a task on `executor`.
    /// - Parameters:
    ///   - ticket: The activation the elements are emitted through.
    ///   - executor: The loop's executor (nil: the global concurrent one).
    /// - Returns: A closure that cancels the task (loop thread).
    public static func startTask(_ ticket: SourceTicket, executor: (any TaskExecutor)?) -> () -> Void {
        guard let configuration = ticket.configuration(as: Self.self) else { return {} }
        let box = LoopBound(ticket)
        let id = ticket.id
        let task = Task(executorPreference: executor) {
            do {
                try await configuration.iterate { element in
                    guard !Task.isCancelled, box.value.isActive else { return false }
                    box.value.emit(Event.element(element))
                    return true
                }
                if !Task.isCancelled, box.value.isActive { box.value.emit(Event.finished) }
            } catch {
                if !Task.isCancelled, box.value.isActive {
                    box.value.fail(SourceFailure(operation: "stream \(id)", reason: String(describing: error)))
                }
            }
        }
        return { task.cancel() }
    }
}

/// A source kind whose running is a Swift task the core can start on a
/// driver's executor (drivers call `startTask` and the returned stop).
public protocol TaskBackedSource: Source {
    /// Starts the source's task on `executor` (the loop's: events are emitted
    /// from it on the loop thread); returns what stops it (loop thread).
    static func startTask(_ ticket: SourceTicket, executor: (any TaskExecutor)?) -> () -> Void
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
    public static func stream<Key: Hashable & Sendable, S: AsyncSequence>(
        key: Key, _ make: @escaping @Sendable () -> S,
        tag: @escaping (StreamSource<S.Element>.Event) -> Message
    ) -> Subscription where S.Element: Sendable, S: SendableMetatype {
        let configuration = StreamSource<S.Element>.Configuration { emit in
            var pacer = StreamPacer()
            for try await element in make() {
                if !emit(element) { return }
                await pacer.next()
            }
        }
        return Subscription(StreamSource<S.Element>.self, key: key, configuration: configuration, tag: tag)
    }
}
