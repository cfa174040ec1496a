import Reconcile
import ReconcileTesting
import Testing

@Suite struct SearchTests {
    @Test func queryEditCancelsInFlightRequest() {
        var t = ProgramTester(Search())
        t.send(.queryChanged("Swift"))
        t.send(.submitted)
        #expect(t.commands == [.search(id: 1, query: "Swift")])
        t.send(.queryChanged("Swif"))
        #expect(t.commands == [.cancel(id: 1)])
        #expect(t.model.requestID == nil && t.model.results.isEmpty)
    }

    @Test func repeatedSubmitReplacesRequest() {
        var t = ProgramTester(Search())
        t.send(.queryChanged("Swift"))
        t.send(.submitted)
        t.send(.submitted)
        #expect(t.commands == [.cancel(id: 1), .search(id: 2, query: "Swift")])
        #expect(t.model.requestID == 2)
    }

    @Test func emptySubmitDoesNothing() {
        var t = ProgramTester(Search())
        let before = t.model
        t.send(.submitted, expect: before, commands: [], subscriptions: [])
    }

    @Test func lateResponseForOldRequestChangesNothing() {
        var t = ProgramTester(Search())
        t.send(.queryChanged("Swift"))
        t.send(.submitted)
        t.send(.submitted)
        let model = t.model
        t.send(.response(1, .success(["Obsolete"])), expect: model, commands: [])
        t.send(.response(1, .failure(.offline)), expect: model, commands: [])
    }

    /// The seed's runtime test, on our runtime: state committed before commands,
    /// the fake never erases old responders, and stale responses are rejected.
    @Test func runtimeCommitsModelBeforeCommandsAndRejectsStaleResponses() throws {
        var commands: [Search.Command] = []
        var responders: [Int: (Search.Message) -> Void] = [:]
        var modelSeenByPerform: [Search.Model] = []
        let runtime = Runtime(Search(), driver: VirtualDriver()) { command, rt in
            commands.append(command)
            modelSeenByPerform.append(rt.model)
            if case let .search(id, _) = command { responders[id] = { try? rt.send($0) } }
        }
        try runtime.start()
        try runtime.send(.queryChanged("Swift"))
        try runtime.send(.submitted)
        #expect(commands == [.search(id: 1, query: "Swift")])
        #expect(modelSeenByPerform.last?.requestID == 1)
        try runtime.send(.queryChanged("Actors"))
        try runtime.send(.submitted)
        #expect(commands.suffix(2) == [.cancel(id: 1), .search(id: 2, query: "Actors")])
        responders[1]?(.response(1, .success(["Obsolete"])))
        #expect(runtime.model.results.isEmpty && runtime.model.requestID == 2)
        responders[2]?(.response(2, .success(["Current"])))
        #expect(runtime.model.results == ["Current"] && runtime.model.requestID == nil)
        var unchanged = runtime.model
        #expect(Search().update(&unchanged, .response(1, .failure(.offline))).isEmpty)
        #expect(unchanged == runtime.model)
    }

    @Test func messagesSentWhileDrainingRunAfterTheCurrentOne() throws {
        var order: [String] = []
        let runtime = Runtime(Search(), driver: VirtualDriver()) { command, rt in
            order.append("perform \(command)")
            // A synchronous completion: processed after this transition's
            // remaining commands.
            if case let .search(id, _) = command { try? rt.send(.response(id, .success(["r"]))) }
        }
        runtime.didCommit = { order.append("commit \($0.requestID.map(String.init) ?? "-")") }
        try runtime.start()
        try runtime.send(.queryChanged("q"))
        try runtime.send(.submitted)
        try runtime.send(.submitted)
        #expect(order == [
            "commit -", "commit -",
            "commit 1", "perform search(id: 1, query: \"q\")", "commit -",
            "commit 2", "perform search(id: 2, query: \"q\")", "commit -",
        ])
        #expect(runtime.model.results == ["r"])
    }
}

@Suite struct CounterTests {
    @Test func startsAtZero() {
        #expect(Counter().start().0 == 0)
    }

    @Test(arguments: [(1, 2), (2, 3)])
    func incrementAddsOne(from: Int, to: Int) {
        var m = from
        _ = Counter().update(&m, .userDidTapIncrementButton)
        #expect(m == to)
    }

    @Test(arguments: [(-1, -2), (-2, -3)])
    func decrementSubtractsOne(from: Int, to: Int) {
        var m = from
        _ = Counter().update(&m, .userDidTapDecrementButton)
        #expect(m == to)
    }

    @Test func viewShowsTheCount() {
        #expect(Counter().view(1) == "1")
        #expect(Counter().view(2) == "2")
    }

    @Test func buttonViewCarriesItsMessages() throws {
        var t = ProgramTester(ButtonCounter())
        t.send(t.view.incrementButton.callback)
        t.send(t.view.incrementButton.callback)
        t.send(t.view.decrementButton.callback)
        #expect(t.view == ButtonCounter.View(count: "1"))
        #expect(t.view.title == "Counter")
        // The same program under the runtime renders through didCommit.
        var rendered: [String] = []
        let rt = Runtime(ButtonCounter(), driver: VirtualDriver())
        rt.didCommit = { rendered.append(rt.program.view($0).count) }
        try rt.start()
        try rt.send(.userDidTapIncrementButton)
        try rt.send(.userDidTapDecrementButton)
        #expect(rendered == ["0", "1", "0"])
    }
}
