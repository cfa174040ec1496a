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
        let oldTimer = try #require(driver.debounce("query"))
        // The old timer's tick is already on its way when the query changes.
        let poster = try #require(driver.poster(for: oldTimer))
        poster.post(.tick(.init(sequence: 1, missed: 0)))
        try rt.send(.typed("new"))
        driver.runUntilIdle()
        #expect(rt.stats.lateDeliveries == 1)
        #expect(commands.isEmpty)
        driver.advance(by: Debounce.delay)
        #expect(commands == [.search("new")])
    }

    @Test func testerShowsTheDesiredTimerAndRejectsAStalePhase() throws {
        var t = ProgramTester(Debounce())
        #expect(t.subscriptionIDs.isEmpty)
        t.send(.typed("a"))
        let first = t.model.phase
        #expect(t.subscriptionIDs == [SubscriptionID(TimerSource.self, key: DebounceKey("query", phase: first))])
        t.send(.typed("ab"))
        #expect(t.lastPlan.steps.map(\.description) == [
            "stop timer:query phase 1", "start timer:query phase 2: after 300ms",
        ])
        t.send(.quiet(first), expect: t.model, commands: [])
        t.event(.tick(.init(sequence: 1, missed: 0)), from: try #require(t.debounce("query")))
        #expect(t.commands == [.search("ab")])
        #expect(t.subscriptionIDs.isEmpty)
    }
}

/// Two debouncers in one program: a config file and an editor buffer, each
/// with its own phase. Their counters are often equal.
struct TwoDebouncers: Program {
    struct Model: Equatable {
        var configPhase = Phase(), editPhase = Phase()
        var configPending = false, editPending = false
    }
    enum Message { case configChanged, edited, configQuiet(Phase), editQuiet(Phase) }
    enum Command: Equatable { case readConfig, save }

    func start() -> (Model, [Command]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .configChanged:
            model.configPhase.advance()
            model.configPending = true
        case .edited:
            model.editPhase.advance()
            model.editPending = true
        case .configQuiet(let p):
            guard model.configPhase.isCurrent(p), model.configPending else { return [] }
            model.configPending = false
            return [.readConfig]
        case .editQuiet(let p):
            guard model.editPhase.isCurrent(p), model.editPending else { return [] }
            model.editPending = false
            return [.save]
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            if model.configPending {
                let phase = model.configPhase
                Subscription.debounce("config", phase: phase, after: .milliseconds(100)) { _ in .configQuiet(phase) }
            }
            if model.editPending {
                let phase = model.editPhase
                Subscription.debounce("edits", phase: phase, after: .milliseconds(300)) { _ in .editQuiet(phase) }
            }
        }
    }
}

@Suite struct DebouncersInOneProgramTests {
    @Test func twoDebouncersWithEqualCountersBothRunWithoutDuplicates() throws {
        let driver = VirtualDriver()
        var commands: [TwoDebouncers.Command] = []
        var diagnostics: [Diagnostic] = []
        let rt = Runtime(TwoDebouncers(), driver: driver) { c, _ in commands.append(c) }
        rt.diagnostics = { diagnostics.append($0) }
        try rt.start()
        try rt.send(.configChanged)
        try rt.send(.edited)
        #expect(rt.model.configPhase == rt.model.editPhase)
        #expect(driver.runningIDs.count == 2)
        driver.advance(by: .milliseconds(100))
        #expect(commands == [.readConfig])
        driver.advance(by: .milliseconds(200))
        #expect(commands == [.readConfig, .save])
        #expect(diagnostics.isEmpty && rt.stats.duplicates == 0)
        #expect(driver.runningIDs.isEmpty)
    }

    @Test func eachDebouncerRestartsOnlyItsOwnTimer() throws {
        var t = ProgramTester(TwoDebouncers())
        t.send(.configChanged)
        t.send(.edited)
        t.send(.edited)
        #expect(t.lastPlan.steps.map(\.description) == ["stop timer:edits phase 1", "start timer:edits phase 2: after 300ms"])
        #expect(t.lastPlan.kept == 1 && t.lastPlan.duplicates.isEmpty)
        t.event(.tick(.init(sequence: 1, missed: 0)), from: try #require(t.debounce("config")))
        #expect(t.commands == [.readConfig])
    }
}
