import Reconcile
import ReconcileTesting
import Testing

/// A program that records every tick of a repeating timer it can retune.
struct Ticks: Program {
    struct Model: Equatable {
        var interval: Duration = .milliseconds(10)
        var running = true
        var ticks: [TimerSource.Tick] = []
    }
    enum Message { case interval(Duration), running(Bool), tick(TimerSource.Tick) }
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .interval(let d): model.interval = d
        case .running(let r): model.running = r
        case .tick(let t): model.ticks.append(t)
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            if model.running {
                Subscription.every(model.interval, key: "t") { event in
                    if case .tick(let t) = event { .tick(t) } else { .running(false) }
                }
            }
        }
    }
}

@Suite struct VirtualDriverTests {
    @Test func repeatingTimerTicksOnTheVirtualClock() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Ticks(), driver: driver)
        try rt.start()
        driver.advance(by: .milliseconds(35))
        #expect(rt.model.ticks.map(\.sequence) == [1, 2, 3])
        #expect(rt.model.ticks.allSatisfy { $0.missed == 0 })
        #expect(driver.now == .milliseconds(35))
    }

    @Test func stalledLoopReportsMissedTicksInOneTick() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Ticks(), driver: driver)
        try rt.start()
        driver.stall(for: .milliseconds(55))
        #expect(rt.model.ticks == [.init(sequence: 5, missed: 4)])
        driver.advance(by: .milliseconds(5))
        #expect(rt.model.ticks.last == .init(sequence: 6, missed: 0))
    }

    @Test func retuneChangesIntervalWithoutStopOrStart() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Ticks(), driver: driver)
        try rt.start()
        driver.advance(by: .milliseconds(20))
        try rt.send(.interval(.milliseconds(100)))
        driver.advance(by: .milliseconds(100))
        #expect(rt.model.ticks.count == 3)
        #expect(driver.log.map(\.description) == ["start timer:t #1", "retune timer:t #1"])
    }

    @Test func stopIsLoggedOnceAndStopsTicks() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Ticks(), driver: driver)
        try rt.start()
        try rt.send(.running(false))
        driver.advance(by: .seconds(1))
        #expect(rt.model.ticks.isEmpty)
        #expect(driver.log.map(\.description) == ["start timer:t #1", "stop timer:t #1"])
    }

    @Test func injectedEventsReachOnlyRunningSources() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Ticks(), driver: driver)
        try rt.start()
        let id = SubscriptionID(TimerSource.self, key: "t")
        #expect(driver.emit(TimerSource.Event.tick(.init(sequence: 9, missed: 0)), to: id))
        #expect(rt.model.ticks.map(\.sequence) == [9])
        #expect(!driver.emit(TimerSource.Event.tick(.init(sequence: 1, missed: 0)), to: SubscriptionID(TimerSource.self, key: "nope")))
        // The wrong event type is a diagnostic, not a crash.
        var diagnostics: [Diagnostic] = []
        rt.diagnostics = { diagnostics.append($0) }
        #expect(!driver.emit("garbage", to: id))
        #expect(diagnostics == [.eventTypeMismatch(id, "String")])
    }
}

@Suite struct ProgramTesterTests {
    @Test func testerReportsPlanOfTheLastStep() {
        var t = ProgramTester(Ticks())
        #expect(t.lastPlan.steps.map(\.description) == ["start timer:t: every 10ms"])
        t.send(.interval(.milliseconds(20)))
        #expect(t.lastPlan.steps.map(\.description) == ["retune timer:t: every 10ms -> every 20ms"])
        t.send(.tick(.init(sequence: 1, missed: 0)))
        #expect(t.lastPlan == Plan(kept: 1))
        t.send(.running(false), expect: t.model.with { $0.running = false }, commands: [], subscriptions: [])
    }

    @Test func eventGoesThroughTheCurrentTagger() {
        var t = ProgramTester(Ticks())
        t.event(TimerSource.Event.tick(.init(sequence: 3, missed: 1)), from: SubscriptionID(TimerSource.self, key: "t"))
        #expect(t.model.ticks == [.init(sequence: 3, missed: 1)])
    }
}

extension Ticks.Model {
    func with(_ change: (inout Self) -> Void) -> Self {
        var copy = self
        change(&copy)
        return copy
    }
}
