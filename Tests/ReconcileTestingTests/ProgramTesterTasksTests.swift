import Reconcile
import ReconcileTesting
import Synchronization
import Testing

/// The seed's search box with a debounce: typing starts a quiet period (a
/// debouncer keyed by phase); when it ends the query is searched by request
/// ID; typing again cancels the request in flight.
struct TypeAhead: Program {
    struct Model: Equatable {
        var query = ""
        var phase = Phase()
        var waiting = false
        var requestID: Int?
        var nextID = 0
        var results: [String] = []
        var message: String?
    }
    enum Message: Sendable {
        case typed(String)
        case quiet(Phase)
        case response(Int, Result<[String], LookupError>)
    }
    enum Command: Equatable, Sendable {
        case search(id: Int, query: String)
        case cancel(id: Int)
    }

    static let delay: Duration = .milliseconds(300)
    /// Searched at start, when set.
    var initialQuery: String?

    func start() -> (Model, [Command]) {
        guard let q = initialQuery else { return (Model(), []) }
        return (Model(query: q, requestID: 1, nextID: 1), [.search(id: 1, query: q)])
    }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .typed(let q):
            var commands: [Command] = []
            if let id = model.requestID { commands.append(.cancel(id: id)) }
            model.query = q
            model.phase.advance()
            model.waiting = !q.isEmpty
            model.requestID = nil
            model.results = []
            model.message = nil
            return commands
        case .quiet(let token):
            guard model.phase.isCurrent(token), model.waiting else { return [] }
            model.waiting = false
            model.nextID += 1
            model.requestID = model.nextID
            return [.search(id: model.nextID, query: model.query)]
        case .response(let id, let result):
            guard model.requestID == id else { return [] }      // stale: rejected
            model.requestID = nil
            switch result {
            case .success(let values): model.results = values
            case .failure: model.message = "Search is unavailable."
            }
            return []
        }
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            if model.waiting {
                let phase = model.phase
                Subscription.debounce("query", phase: phase, after: Self.delay) { _ in .quiet(phase) }
            }
        }
    }
}

enum LookupError: Error, Equatable { case offline, cancelled }

/// The search backend: records every request; a lookup takes 200 ms on the clock.
final class LookupService: Sendable {
    let requests = Mutex<[String]>([])
    func lookup(_ query: String, clock: LoopClock) async throws -> [String] {
        requests.withLock { $0.append(query) }
        try await clock.sleep(for: .milliseconds(200))
        if query == "offline" { throw LookupError.offline }
        return ["\(query) result"]
    }
    var requested: [String] { requests.withLock { $0 } }
}

/// The interpreter, written once against `CommandContext`: what a daemon
/// passes to `Daemon` / `Runtime` and a test to `ProgramTester`.
func interpretTypeAhead(_ command: TypeAhead.Command, _ context: some CommandContext<TypeAhead.Message>, service: LookupService) {
    switch command {
    case .search(let id, let query):
        let clock = context.clock
        context.tasks.run(id: id) {
            .response(id, .success(try await service.lookup(query, clock: clock)))
        } failure: { error in
            .response(id, .failure(error is CancellationError ? .cancelled : .offline))
        }
    case .cancel(let id):
        context.tasks.cancel(id: id)
    }
}

extension ProgramTester where P == TypeAhead {
    /// Types `query` and lets the debounce's quiet period end.
    mutating func typeAndWait(_ query: String) throws {
        send(.typed(query))
        let timer = try #require(debounce("query"))
        event(.tick(.init(sequence: 1, missed: 0)), from: timer)
    }
}

@Suite struct ProgramTesterTasksTests {
    let service = LookupService()

    func tester(_ program: TypeAhead = TypeAhead()) -> ProgramTester<TypeAhead> {
        ProgramTester(program) { [service] in interpretTypeAhead($0, $1, service: service) }
    }

    @Test func aDebouncedQueryStartsOneTaskWhoseResultReachesUpdate() throws {
        var t = tester()
        t.send(.typed("s"))
        t.send(.typed("sw"))
        #expect(t.tasks.log.isEmpty)
        try t.typeAndWait("swift")
        #expect(t.commands == [.search(id: 1, query: "swift")])
        #expect(t.tasks.log == [.run(TaskID(1))])
        #expect(t.inFlight == [TaskID(1)] && t.tasks.pending == [TaskID(1)])
        #expect(service.requested.isEmpty)             // recorded, not run
        let done = t.complete(task: 1, with: .response(1, .success(["Swift"])))
        #expect(done)
        #expect(t.model.results == ["Swift"] && t.model.requestID == nil)
        #expect(t.inFlight.isEmpty && t.tasks.pending.isEmpty)
        #expect(t.effects.tasks.stats.started == 1 && t.effects.tasks.stats.delivered == 1)
    }

    /// The seed's search test on the tester: cancel targets the right task,
    /// the old task's late response is still delivered and rejected, and
    /// only the accepted query issues a request.
    @Test func cancelTargetsTheRightTaskAndTheLateResponseIsRejected() throws {
        var t = tester()
        try t.typeAndWait("Swift")
        try t.typeAndWait("Actors")
        #expect(t.allCommands == [.search(id: 1, query: "Swift"), .cancel(id: 1), .search(id: 2, query: "Actors")])
        #expect(t.tasks.log == [.run(TaskID(1)), .cancel(TaskID(1)), .run(TaskID(2))])
        #expect(t.tasks.isCancelled(1) && !t.tasks.isCancelled(2))
        #expect(t.inFlight == [TaskID(2)])
        #expect(t.tasks.pending == [TaskID(1), TaskID(2)])     // the cancelled one may still answer
        let before = t.model
        let done = t.complete(task: 1, with: .response(1, .success(["Obsolete"])))
        #expect(done)
        #expect(t.model == before && t.commands.isEmpty)         // delivered, rejected
        #expect(t.effects.tasks.stats.delivered == 1)
        let performed = t.perform(task: 2)                              // the real operation
        #expect(performed)
        #expect(service.requested == ["Actors"])
        #expect(t.model.requestID == 2)                          // sleeping on the virtual clock
        t.advance(by: .milliseconds(199))
        #expect(t.model.requestID == 2)
        t.advance(by: .milliseconds(1))
        #expect(t.model.results == ["Actors result"] && t.model.requestID == nil)
        #expect(t.now == .milliseconds(200))
        #expect(t.inFlight.isEmpty && t.tasks.pending.isEmpty)
        #expect(t.effects.tasks.stats == { var s = TaskStats(); s.started = 2; s.cancelled = 1; s.delivered = 2; return s }())
    }

    @Test func aCancelledRunningTaskStillDeliversItsResultAndUpdateRejectsIt() throws {
        var t = tester()
        try t.typeAndWait("Swift")
        let done = t.perform(task: 1)
        #expect(done)
        #expect(service.requested == ["Swift"])
        t.send(.typed("Swi"))                            // cancels task 1: its sleep throws
        #expect(t.tasks.log == [.run(TaskID(1)), .cancel(TaskID(1))])
        #expect(t.effects.tasks.stats.delivered == 0)   // nothing runs until the test says
        t.runUntilIdle()
        #expect(t.effects.tasks.stats.delivered == 1)
        #expect(t.model.message == nil && t.model.requestID == nil && t.model.results.isEmpty)
        #expect(t.tasks.pending.isEmpty && t.inFlight.isEmpty)
    }

    @Test func runWithAnIDInFlightCancelsThePreviousOrKeepsItAsTheRuntimeDoes() {
        let t = tester()
        let tasks = t.effects.tasks
        #expect(tasks.run(id: "sync") { .typed("a") })
        #expect(tasks.run(id: "sync") { .typed("b") })
        #expect(t.tasks.log == [.run(TaskID("sync")), .cancel(TaskID("sync")), .run(TaskID("sync"))])
        #expect(!tasks.run(id: "sync", policy: .keepPrevious) { .typed("c") })
        #expect(t.tasks.log.count == 3 && tasks.stats.refused == 1)
        #expect(tasks.cancel(id: "sync") && !tasks.cancel(id: "sync") && !tasks.cancel(id: "other"))
        #expect(tasks.inFlight.isEmpty && t.tasks.pending.count == 2)
    }

    @Test func runsTasksRunsEveryOperationAndAFailureBecomesTheProgramsMessage() throws {
        var t = tester()
        t.tasks.runsTasks = true
        try t.typeAndWait("offline")
        t.runUntilIdle()
        #expect(service.requested == ["offline"])
        t.advance(by: .milliseconds(200))
        #expect(t.model.message == "Search is unavailable." && t.model.requestID == nil)
        #expect(t.inFlight.isEmpty)
    }

    @Test func advanceResumesSleepsInDeadlineOrderOnTheVirtualClock() {
        var t = tester()
        t.tasks.runsTasks = true
        let clock = t.effects.clock
        t.effects.tasks.run(id: "slow") { try? await clock.sleep(for: .milliseconds(300)); return .typed("slow") }
        t.effects.tasks.run(id: "fast") { try? await clock.sleep(for: .milliseconds(100)); return .typed("fast") }
        t.runUntilIdle()
        #expect(t.inFlight == [TaskID("slow"), TaskID("fast")] && t.effects.sleepers == 2)
        t.advance(by: .milliseconds(99))
        #expect(t.model.query == "" && t.inFlight.count == 2)
        t.advance(by: .milliseconds(401))                 // both due: fast first, then slow
        #expect(t.model.query == "slow" && t.effects.tasks.stats.delivered == 2)
        #expect(t.inFlight.isEmpty && t.now == .milliseconds(500))
    }

    @Test func startCommandsAreInterpreted() {
        var t = tester(TypeAhead(initialQuery: "boot"))
        #expect(t.tasks.log == [.run(TaskID(1))])
        let done = t.complete(task: 1, with: .response(1, .success(["up"])))
        #expect(done)
        #expect(t.model.results == ["up"])
    }

    @Test func withoutAnInterpreterCommandsAreOnlyRecorded() throws {
        var t = ProgramTester(TypeAhead())
        try t.typeAndWait("Swift")
        #expect(t.commands == [.search(id: 1, query: "Swift")])
        #expect(t.tasks.log.isEmpty && t.inFlight.isEmpty)
    }

    @Test func completingATaskThatIsNotPendingIsAnIssueAtTheCallSite() throws {
        var t = tester()
        try t.typeAndWait("Swift")
        let line1 = #line + 2
        withKnownIssue {
            let refused = t.complete(task: 7, with: .response(7, .success([])))
            #expect(!refused)
        } matching: { issue in
            issue.sourceLocation?.line == line1 && "\(issue)".contains("task 7: it was never started; pending: [1]")
        }
        let done = t.complete(task: 1, with: .response(1, .success(["Swift"])))
        #expect(done)
        let line2 = #line + 2
        withKnownIssue {
            let refused = t.complete(task: 1, with: .response(1, .success(["again"])))
            #expect(!refused)
        } matching: { issue in
            issue.sourceLocation?.line == line2 && "\(issue)".contains("task 1: it already has a result")
        }
        let line3 = #line + 2
        withKnownIssue {
            let refused = t.perform(task: 1)
            #expect(!refused)
        } matching: { issue in
            issue.sourceLocation?.line == line3 && "\(issue)".contains("cannot perform task 1")
        }
        #expect(t.model.results == ["Swift"])
    }

    @Test func performingATaskTwiceIsAnIssue() throws {
        var t = tester()
        try t.typeAndWait("Swift")
        let done = t.perform(task: 1)
        #expect(done)
        withKnownIssue {
            let refused = t.perform(task: 1)
            #expect(!refused)
        } matching: { "\($0)".contains("task 1: already runs its operation") }
    }

    /// One interpreter function, written against `CommandContext`, under the
    /// runtime (virtual driver) and under the tester: same task calls, same model.
    @Test func theRuntimesInterpreterRunsUnchangedInTheTester() throws {
        let driver = VirtualDriver()
        let runtimeService = LookupService()
        let rt = Runtime(TypeAhead(), driver: driver) { interpretTypeAhead($0, $1, service: runtimeService) }
        try rt.start()
        var t = tester()
        for q in ["Swift", "Actors"] {
            try rt.send(.typed(q))
            driver.advance(by: TypeAhead.delay)
            try t.typeAndWait(q)
        }
        #expect(driver.tasks.log == t.tasks.log)
        let performed = t.perform(task: 2)
        #expect(driver.perform(task: 2) && performed)
        driver.advance(by: .milliseconds(200))
        t.advance(by: .milliseconds(200))
        #expect(runtimeService.requested == service.requested)
        #expect(rt.model.results == ["Actors result"])
        #expect(t.model == rt.model)
        #expect(rt.tasks.stats == t.effects.tasks.stats)
    }
}
