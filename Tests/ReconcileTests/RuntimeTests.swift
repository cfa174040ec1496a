import Reconcile
import ReconcileTesting
import Testing

/// A program whose subscriptions are keyed feeds and timers; its taggers
/// capture the model's generation and phase.
struct Keyed: Program {
    struct Model: Equatable {
        var keys: [String] = ["a", "b", "c"]
        var generation = 0
        var phase = Phase()
        var topic = "t"
        var received: [Received] = []
        var failures: [String] = []
        var rejected = 0
    }
    struct Received: Equatable { let key: String; let item: Int; let generation: Int }
    enum Message {
        case bump
        case nothing
        case setKeys([String])
        case setTopic(String)
        case nextPhase
        case leavePhase(keeping: [String])
        case feed(String, Feed.Event, generation: Int, phase: Phase)
    }

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .bump: model.generation += 1
        case .nothing: break
        case .setKeys(let k): model.keys = k
        case .setTopic(let t): model.topic = t
        case .nextPhase: model.phase.advance()
        case .leavePhase(let keys):
            model.phase.advance()
            model.keys = keys
        case let .feed(key, event, generation, phase):
            guard model.phase.isCurrent(phase) else {
                model.rejected += 1
                return []
            }
            switch event {
            case .item(let i): model.received.append(Received(key: key, item: i, generation: generation))
            case .failed(let f): model.failures.append("\(key): \(f.reason)")
            }
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        let generation = model.generation, phase = model.phase
        return Subscriptions(model.keys.map { key in
            Subscription.feed(key, topic: model.topic) { .feed(key, $0, generation: generation, phase: phase) }
        })
    }
}

func feedID(_ key: String) -> SubscriptionID { SubscriptionID(Feed.self, key: key) }

@Suite struct RuntimeTests {
    @Test func keepsSubscriptionsAcrossAThousandUpdatesAndRefreshesTaggers() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver)
        try rt.start()
        for _ in 0..<1000 { try rt.send(.bump) }
        for key in ["a", "b", "c"] {
            #expect(driver.starts(of: feedID(key)) == 1)
            #expect(driver.stops(of: feedID(key)) == 0)
        }
        #expect(rt.stats.reconciles == 1001)
        #expect(driver.log.count == 3)
        driver.emit(Feed.Event.item(42), to: feedID("b"))
        #expect(rt.model.received == [.init(key: "b", item: 42, generation: 1000)])
    }

    @Test func unchangedEquatableModelSkipsSubscriptionsAndDiff() throws {
        let rt = Runtime(Keyed(), driver: VirtualDriver())
        try rt.start()
        for _ in 0..<100 { try rt.send(.nothing) }
        #expect(rt.stats.reconciles == 1)
        #expect(rt.stats.skippedReconciles == 100)
        #expect(rt.stats.messages == 100)
    }

    @Test func reconcilesOnceAfterTheMailboxDrains() throws {
        var plans: [Plan] = []
        let rt = Runtime(Keyed(), driver: VirtualDriver()) { _, _ in }
        rt.didReconcile = { plans.append($0) }
        try rt.start()
        plans = []
        // Messages queued from a tagger run within one drain: an intermediate
        // key set ["x"] is never realised.
        let sender = rt.sender()
        try sender.send(.setKeys(["x"]))
        try sender.send(.setKeys(["a", "y"]))
        rt.pumpInbox()
        #expect(plans.map { $0.steps.map(\.description) } == [["stop feed:b", "stop feed:c", "start feed:y: t"]])
    }

    @Test func retuneRestartAndStopReachTheDriver() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver)
        try rt.start()
        try rt.send(.setTopic("u"))
        #expect(driver.log.suffix(6).map(\.description) == [
            "stop feed:a #1", "stop feed:b #2", "stop feed:c #3",
            "start feed:a #4", "start feed:b #5", "start feed:c #6",
        ])
        try rt.send(.setKeys(["c"]))
        #expect(driver.log.suffix(2).map(\.description) == ["stop feed:a #4", "stop feed:b #5"])
        #expect(rt.stats.restarts == 3)
        #expect(driver.contractViolations.isEmpty)
    }

    @Test func duplicateIdentityRaisesDiagnosticAndStartsOnce() throws {
        let driver = VirtualDriver()
        var diagnostics: [Diagnostic] = []
        let rt = Runtime(Keyed(), driver: driver)
        rt.diagnostics = { diagnostics.append($0) }
        try rt.start()
        try rt.send(.setKeys(["d", "d", "e"]))
        #expect(diagnostics == [.duplicateIdentity(feedID("d"))])
        #expect(driver.starts(of: feedID("d")) == 1)
        #expect(driver.runningIDs == [feedID("d"), feedID("e")])
        #expect(rt.stats.duplicates == 1)
    }

    @Test func lateDeliveryIsDeliveredCountedAndRejectedByPhase() throws {
        let driver = VirtualDriver()
        var diagnostics: [Diagnostic] = []
        let rt = Runtime(Keyed(), driver: driver)
        rt.diagnostics = { diagnostics.append($0) }
        try rt.start()
        // A source thread produced an event: it waits in the inbox.
        let poster = try #require(driver.poster(for: feedID("a")))
        #expect(poster.post(Feed.Event.item(1)) == .accepted)
        // Before the loop pumps, the model moves on and the source stops.
        try rt.send(.leavePhase(keeping: ["b", "c"]))
        #expect(!driver.runningIDs.contains(feedID("a")))
        // A stopped activation's poster refuses new events.
        #expect(poster.post(Feed.Event.item(2)) == .closed)
        driver.runUntilIdle()
        #expect(rt.stats.lateDeliveries == 1)
        #expect(rt.model.rejected == 1)
        #expect(rt.model.received.isEmpty)
        #expect(diagnostics == [.lateDelivery(feedID("a"), Activation(generation: 1))])
    }

    @Test func failureArrivesAsEventAndIsNotRetriedByEveryReconcile() throws {
        let driver = VirtualDriver()
        let failure = SourceFailure(operation: "open feed", code: 13, reason: "permission denied")
        driver.failOnStart[feedID("a")] = failure
        let rt = Runtime(Keyed(), driver: driver)
        try rt.start()
        #expect(rt.model.failures == ["a: permission denied"])
        let reconciles = rt.stats.reconciles
        for _ in 0..<1000 { try rt.send(.bump) }
        #expect(rt.stats.reconciles == reconciles + 1000)
        #expect(driver.starts(of: feedID("a")) == 1)
        #expect(rt.stats.failures == 1)
        // A configuration change retries it.
        driver.failOnStart = [:]
        try rt.send(.setTopic("other"))
        #expect(driver.starts(of: feedID("a")) == 2)
        #expect(driver.running[feedID("a")]?.hasFailed == false)
    }

    @Test func failedSourceIsRestartedNotRetunedOnConfigChange() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Ticker(), driver: driver)
        try rt.start()
        try rt.send(.setInterval(.seconds(2)))
        #expect(driver.log.map(\.description) == ["start timer:tick #1", "retune timer:tick #1"])
        driver.fail(Ticker.id, SourceFailure(operation: "timerfd_create", code: 95, reason: "clock not supported"))
        #expect(rt.model.failed)
        try rt.send(.setInterval(.seconds(3)))
        #expect(driver.log.suffix(2).map(\.description) == ["stop timer:tick #1", "start timer:tick #2"])
    }

    @Test func shutdownStopsEveryActiveSourceOnceAndRefusesLaterMessages() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver)
        try rt.start()
        let sender = rt.sender()
        try sender.send(.bump)   // queued, never pumped
        let report = rt.shutdown()
        #expect(report.stopped == [feedID("a"), feedID("b"), feedID("c")])
        #expect(report.dropped.count == 1)
        for key in ["a", "b", "c"] { #expect(driver.stops(of: feedID(key)) == 1) }
        #expect(driver.runningIDs.isEmpty)
        #expect(throws: RuntimeError.shutDown) { try rt.send(.bump) }
        #expect(throws: RuntimeError.shutDown) { try sender.send(.bump) }
        #expect(throws: RuntimeError.shutDown) { try rt.start() }
        // Idempotent: nothing stopped twice.
        #expect(rt.shutdown().stopped.isEmpty)
        #expect(driver.log.filter { if case .stop = $0 { true } else { false } }.count == 3)
        #expect(driver.contractViolations.isEmpty)
    }

    @Test func senderIsBoundedWithADefinedAnswerWhenFull() throws {
        let rt = Runtime(Keyed(), driver: VirtualDriver(), inboxCapacity: 2)
        try rt.start()
        let sender = rt.sender()
        try sender.send(.bump)
        try sender.send(.bump)
        #expect(throws: RuntimeError.inboxFull(capacity: 2)) { try sender.send(.bump) }
        rt.pumpInbox()
        #expect(rt.model.generation == 2)
        try sender.send(.bump)
    }

    @Test func senderWorksFromOtherThreads() async throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver, inboxCapacity: 10_000)
        try rt.start()
        let sender = rt.sender()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<4 {
                group.addTask { for _ in 0..<250 { try? sender.send(.bump) } }
            }
        }
        driver.runUntilIdle()
        #expect(rt.model.generation == 1000)
    }

    @Test func messagesSentBeforeStartWaitForIt() throws {
        let rt = Runtime(Keyed(), driver: VirtualDriver())
        try rt.send(.bump)
        #expect(rt.model.generation == 0)
        try rt.start()
        #expect(rt.model.generation == 1)
        try rt.start()   // idempotent
        #expect(rt.stats.reconciles == 1)
    }
}

/// One repeating timer whose interval the model sets.
struct Ticker: Program {
    static let id = SubscriptionID(TimerSource.self, key: "tick")
    struct Model: Equatable {
        var interval: Duration = .seconds(1)
        var ticks: [TimerSource.Tick] = []
        var failed = false
    }
    enum Message: Sendable { case setInterval(Duration), tick(TimerSource.Tick), failed }
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .setInterval(let d): model.interval = d
        case .tick(let t): model.ticks.append(t)
        case .failed: model.failed = true
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.every(model.interval, key: "tick") { event in
                switch event {
                case .tick(let t): .tick(t)
                case .failed: .failed
                }
            }
        }
    }
}
