import Reconcile
import ReconcileTesting
import Synchronization
import Testing
import TestSupport

/// A user's own kind that restarts: events only when a test injects them.
enum Flaky: RestartableSource {
    static let name = "flaky"
    enum Event: Equatable { case value(Int), failed(SourceFailure), restarting(attempt: Int, after: Duration) }
    static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
    typealias Configuration = RestartPolicy
    static func restartPolicy(_ configuration: RestartPolicy) -> RestartPolicy { configuration }
    static func restarting(attempt: Int, after: Duration) -> Event { .restarting(attempt: attempt, after: after) }
}

/// Records every event of one restarting subscription.
struct Restarter<S: Source>: Program where S.Event: Sendable {
    struct Model { var on = true; var events: [S.Event] = [] }
    enum Message { case off, event(S.Event) }
    let subscription: (@escaping (S.Event) -> Message) -> Subscription<Message>
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .off: m.on = false
        case .event(let e): m.events.append(e)
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions { if m.on { subscription { .event($0) } } }
    }
}

@Suite struct RestartsOnVirtualTime {
    let boom = SourceFailure(operation: "connect", reason: "refused")

    @Test func aFailingStreamRestartsOnTheExactJitteredScheduleUntilTheCap() throws {
        let backoff = Backoff(initial: .milliseconds(100), factor: 2, maximum: .seconds(1), jitter: 0.3, attempts: 4, window: .seconds(60))
        let made = Atomic<Int>(0)
        let program = Restarter<StreamSource<Int>> { tag in
            Subscription.stream(key: "s", restart: .backoff(backoff), {
                made.add(1, ordering: .relaxed)
                return AsyncThrowingStream<Int, any Error> { $0.finish(throwing: SourceFailure(operation: "read", reason: "gone")) }
            }, tag: tag)
        }
        let driver = VirtualDriver()
        var random = SplitMix64(seed: 11)
        var expected = SplitMix64(seed: 11)
        driver.restartRandomness = { random.next() }
        let rt = Runtime(program, driver: driver)
        try rt.start()
        driver.runUntilIdle()
        let id = rt.activeIDs[0]
        var seen = 0
        for attempt in 1...4 {
            #expect(driver.attempts(of: id) == attempt && made.load(ordering: .relaxed) == attempt)
            let events = rt.model.events[seen...]
            seen = rt.model.events.count
            guard events.count == 2, case .failed = events.first, case .restarting(let n, let after) = events.last else {
                Issue.record("attempt \(attempt): \(events)")
                return
            }
            // The same draw the schedule made: the exact delay, within its bounds.
            let unit = Double(expected.next() >> 11) / Double(1 << 53)
            #expect(n == attempt && after == backoff.delay(forAttempt: attempt, unit: unit))
            #expect(backoff.bounds(forAttempt: attempt).contains(after))
            driver.advance(by: after - .microseconds(1))
            #expect(driver.attempts(of: id) == attempt, "attempt \(attempt + 1) came early")
            driver.advance(by: .microseconds(1))
        }
        // The fifth attempt fails: four restarts in the window, no more.
        #expect(driver.attempts(of: id) == 5)
        guard case .failed(let last) = rt.model.events.last else { Issue.record("\(rt.model.events)"); return }
        #expect(last.reason.contains("gave up after 4 restarts within 1m"))
        driver.advance(by: .seconds(600))
        #expect(driver.attempts(of: id) == 5 && made.load(ordering: .relaxed) == 5)
        #expect(rt.isRunning && rt.activeIDs == [id])
    }

    @Test func anyKindRestartsAndADeadAttemptsPosterIsRefused() throws {
        let policy = RestartPolicy.backoff(initial: .seconds(1), factor: 2, maximum: .seconds(8), jitter: 0, attempts: 100)
        let program = Restarter<Flaky> { tag in Subscription(Flaky.self, key: "f", configuration: policy, tag: tag) }
        let driver = VirtualDriver()
        let rt = Runtime(program, driver: driver)
        try rt.start()
        driver.runUntilIdle()
        let id = rt.activeIDs[0]
        let first = try #require(driver.poster(for: id))
        #expect(first.post(Flaky.Event.value(1)) == .accepted)
        driver.runUntilIdle()
        driver.fail(id, boom)
        driver.runUntilIdle()
        // Between attempts nothing runs; the dead attempt's poster is closed.
        #expect(driver.poster(for: id) == nil && !driver.emit(Flaky.Event.value(9), to: id))
        #expect(first.post(Flaky.Event.value(2)) == .closed)
        driver.advance(by: .seconds(1))
        #expect(driver.emit(Flaky.Event.value(3), to: id))
        driver.runUntilIdle()
        #expect(rt.model.events == [.value(1), .failed(boom), .restarting(attempt: 1, after: .seconds(1)), .value(3)])
        // An event after the restart is a recovery: the next delay is `initial` again.
        driver.fail(id, boom)
        driver.runUntilIdle()
        #expect(rt.model.events.last == .restarting(attempt: 1, after: .seconds(1)))
        driver.advance(by: .seconds(1))
        driver.fail(id, boom)                         // no event in between: the delay doubles
        driver.runUntilIdle()
        #expect(rt.model.events.last == .restarting(attempt: 2, after: .seconds(2)))
        // Dropping the subscription cancels the waiting restart.
        try rt.send(.off)
        driver.advance(by: .seconds(60))
        #expect(driver.attempts(of: id) == 3 && rt.activeIDs.isEmpty && driver.contractViolations.isEmpty)
    }

    @Test func aStreamThatEndsRestartsAndNeverByDefault() throws {
        let made = Atomic<Int>(0)
        func program(_ restart: RestartPolicy) -> Restarter<StreamSource<Int>> {
            Restarter { tag in
                Subscription.stream(key: "s", restart: restart, {
                    let n = made.add(1, ordering: .relaxed).newValue
                    return AsyncStream<Int> { c in c.yield(n); c.finish() }
                }, tag: tag)
            }
        }
        let driver = VirtualDriver()
        let rt = Runtime(program(.backoff(initial: .milliseconds(10), jitter: 0)), driver: driver)
        try rt.start()
        driver.advance(by: .milliseconds(10))
        let shown = rt.model.events.map { e -> String in
            switch e {
            case .element(let n): "\(n)"
            case .finished: "end"
            case .restarting(let a, let d): "restart \(a) \(d)"
            default: "\(e)"
            }
        }
        // The element was a recovery: each end waits `initial` again.
        #expect(shown == ["1", "end", "restart 1 0.01 seconds", "2", "end", "restart 1 0.01 seconds"])
        _ = rt.shutdown()
        made.store(0, ordering: .relaxed)
        let plainDriver = VirtualDriver()
        let plain = Runtime(program(.never), driver: plainDriver)
        try plain.start()
        plainDriver.advance(by: .seconds(10))
        #expect(plain.model.events.count == 2 && made.load(ordering: .relaxed) == 1)
    }

    @Test func overflowPoliciesDeliverTheLastValueInOrderAndCountWhatTheyDrop() throws {
        let n = 20_000
        for overflow in [StreamSource<Int>.Overflow.keepLatest, .dropOldest(8), .buffer(16)] {
            let driver = VirtualDriver()
            let rt = Runtime(FloodCounter(overflow: overflow) { Counter(limit: n) }, driver: driver)
            try rt.start()
            driver.runUntilIdle()
            let m = rt.model
            #expect(m.finished && m.last == n && m.delivered + m.dropped == n && m.inOrder, "\(overflow): \(m)")
            // One executor runs both sides here, so how much is dropped depends
            // on its interleaving; a bounded buffer never drops.
            if overflow == .buffer(16) { #expect(m.dropped == 0) }
        }
    }
}

/// Counts a stream's elements and drops (constant work per message).
struct FloodCounter<S: AsyncSequence & Sendable>: Program where S.Element == Int, S: SendableMetatype {
    struct Model: CustomStringConvertible {
        var delivered = 0, dropped = 0, last = 0, finished = false, inOrder = true, failure: SourceFailure?
        var description: String { "\(delivered) delivered, \(dropped) dropped, last \(last), finished \(finished)" }
    }
    enum Message { case event(StreamSource<Int>.Event) }
    let overflow: StreamSource<Int>.Overflow
    let make: @Sendable () -> S
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .event(.element(let v)):
            if v <= m.last { m.inOrder = false }
            m.delivered += 1
            m.last = v
        case .event(.dropped(let d)): m.dropped += d
        case .event(.finished): m.finished = true
        case .event(.failed(let f)): m.failure = f
        case .event(.restarting): break
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions { Subscription.stream(key: "flood", overflow: overflow, make) { .event($0) } }
    }
}

/// 1...limit, never suspending.
struct Counter: AsyncSequence, Sendable {
    let limit: Int
    struct AsyncIterator: AsyncIteratorProtocol {
        var next = 0
        let limit: Int
        mutating func next() async -> Int? {
            guard next < limit else { return nil }
            next += 1
            return next
        }
    }
    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(limit: limit) }
}
