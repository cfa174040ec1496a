import Reconcile
import ReconcileTesting
import Testing

@Suite struct DebounceTests {
    @Test func onlyTheLastQueryIsSearched() throws {
        let driver = VirtualDriver()
        var commands: [Debounce.Command] = []
        let rt = Runtime(Debounce(), driver: driver) { c, _ in commands.append(c) }
        try rt.start()
        for q in ["s", "sw", "swi", "swift"] {
            try rt.send(.typed(q))
            driver.advance(by: .milliseconds(100))
        }
        #expect(commands.isEmpty)
        driver.advance(by: .milliseconds(200))
        #expect(commands == [.search("swift")])
        // One timer per phase: each edit stopped the previous one.
        #expect(rt.stats.starts == 4 && rt.stats.stops == 4)
        #expect(driver.runningIDs.isEmpty)
        driver.advance(by: .seconds(10))
        #expect(commands == [.search("swift")])
    }

    @Test func oldTimerFiringAfterQueryChangeIsRejected() throws {
        let driver = VirtualDriver()
        var commands: [Debounce.Command] = []
        let rt = Runtime(Debounce(), driver: driver) { c, _ in commands.append(c) }
        try rt.start()
        try rt.send(.typed("old"))
        let oldTimer = SubscriptionID(TimerSource.self, key: rt.model.phase)
        // The old timer's tick is already on its way when the query changes.
        let poster = try #require(driver.poster(for: oldTimer))
        poster.post(TimerSource.Event.tick(.init(sequence: 1, missed: 0)))
        try rt.send(.typed("new"))
        driver.runUntilIdle()
        #expect(rt.stats.lateDeliveries == 1)
        #expect(commands.isEmpty)
        driver.advance(by: Debounce.delay)
        #expect(commands == [.search("new")])
    }

    @Test func testerShowsTheDesiredTimerAndRejectsAStalePhase() {
        var t = ProgramTester(Debounce())
        #expect(t.subscriptionIDs.isEmpty)
        t.send(.typed("a"))
        let first = t.model.phase
        #expect(t.subscriptionIDs == [SubscriptionID(TimerSource.self, key: first)])
        t.send(.typed("ab"))
        #expect(t.lastPlan.steps.map(\.description) == [
            "stop timer:phase 1", "start timer:phase 2: after 300ms",
        ])
        t.send(.quiet(first), expect: t.model, commands: [])
        t.event(TimerSource.Event.tick(.init(sequence: 1, missed: 0)), from: SubscriptionID(TimerSource.self, key: t.model.phase))
        #expect(t.commands == [.search("ab")])
        #expect(t.subscriptionIDs.isEmpty)
    }
}
