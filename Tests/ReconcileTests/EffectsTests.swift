import Reconcile
import ReconcileTesting
import Synchronization
import Testing

/// A search service the interpreter calls; records which queries were requested.
final class SearchService: Sendable {
    let requests = Mutex<[String]>([])
    let clock: LoopClock
    init(clock: LoopClock) { self.clock = clock }
    func lookup(_ query: String) async throws -> [String] {
        requests.withLock { $0.append(query) }
        try await clock.sleep(for: .milliseconds(200))
        if query == "offline" { throw LookupFailure.offline }
        return ["\(query) result"]
    }
}

/// The seed's search interpreter on the task registry: `.search` runs a task
/// by request ID, `.cancel` cancels it; a failure becomes the response.
func searchInterpreter(_ service: @escaping @Sendable () -> SearchService) -> (Search.Command, Runtime<Search>) -> Void {
    { command, rt in
        switch command {
        case .search(let id, let query):
            rt.tasks.run(id: id) {
                .response(id, .success(try await service().lookup(query)))
            } failure: { error in
                .response(id, .failure(.offline))
            }
        case .cancel(let id):
            rt.tasks.cancel(id: id)
        }
    }
}

@Suite struct EffectsTests {
    /// The seed's search example on the test kit: cancel targets the right
    /// task, the old task's late response is rejected, and only the accepted
    /// query issues a request.
    @Test func cancelTargetsTheRightTaskAndTheLateResponseIsRejected() throws {
        let driver = VirtualDriver()
        let service = SearchService(clock: driver.clock)
        let rt = Runtime(Search(), driver: driver, perform: searchInterpreter { service })
        try rt.start()
        try rt.send(.queryChanged("Swift"))
        try rt.send(.submitted)
        #expect(driver.tasks.log == [.run(TaskID(1))])
        #expect(rt.tasks.inFlight == [TaskID(1)])
        try rt.send(.queryChanged("Actors"))
        try rt.send(.submitted)
        #expect(driver.tasks.log == [.run(TaskID(1)), .cancel(TaskID(1)), .run(TaskID(2))])
        #expect(driver.tasks.isCancelled(1) && !driver.tasks.isCancelled(2))
        #expect(rt.tasks.inFlight == [TaskID(2)])
        // The cancelled task's late response is still delivered, and rejected.
        #expect(driver.complete(task: 1, with: Search.Message.response(1, .success(["Obsolete"]))))
        #expect(rt.stats.messages == 5)
        #expect(rt.model.results.isEmpty && rt.model.requestID == 2)
        // Only the accepted query runs its real operation.
        #expect(driver.perform(task: 2))
        #expect(service.requests.withLock { $0 } == ["Actors"])
        #expect(rt.model.requestID == 2)              // sleeping on the virtual clock
        driver.advance(by: .milliseconds(200))
        #expect(rt.model.results == ["Actors result"] && rt.model.requestID == nil)
        #expect(rt.tasks.inFlight.isEmpty && driver.tasks.pending.isEmpty)
        #expect(rt.tasks.stats == { var s = TaskStats(); s.started = 2; s.cancelled = 1; s.delivered = 2; return s }())
    }

    @Test func runWithAnIDInFlightCancelsThePreviousByDefaultOrKeepsIt() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Search(), driver: driver) { _, _ in }
        try rt.start()
        #expect(rt.tasks.run(id: "sync") { .submitted })
        #expect(rt.tasks.run(id: "sync") { .submitted })
        #expect(driver.tasks.log == [.run(TaskID("sync")), .cancel(TaskID("sync")), .run(TaskID("sync"))])
        #expect(!rt.tasks.run(id: "sync", policy: .keepPrevious) { .submitted })
        #expect(driver.tasks.log.count == 3 && rt.tasks.stats.refused == 1)
        #expect(rt.tasks.cancel(id: "sync") && !rt.tasks.cancel(id: "sync") && !rt.tasks.cancel(id: "other"))
        #expect(rt.tasks.inFlight.isEmpty && driver.tasks.pending.count == 2)
    }

    @Test func aThrownErrorBecomesTheProgramsMessage() throws {
        let driver = VirtualDriver()
        driver.tasks.runsTasks = true
        let service = SearchService(clock: driver.clock)
        let rt = Runtime(Search(), driver: driver, perform: searchInterpreter { service })
        try rt.start()
        try rt.send(.queryChanged("offline"))
        try rt.send(.submitted)
        driver.advance(by: .milliseconds(199))
        #expect(rt.model.message == nil)
        driver.advance(by: .milliseconds(1))
        #expect(rt.model.message == "Search is unavailable." && rt.model.requestID == nil)
    }

    @Test func virtualClockSleepEndsOnAdvanceNotInRealTime() throws {
        struct Sleeper: Program {
            enum Message: Equatable { case go, woke(Duration) }
            func start() -> ([Message], [Message]) { ([], [.go]) }
            func update(_ m: inout [Message], _ message: Message) -> [Message] {
                m.append(message)
                return []
            }
        }
        let driver = VirtualDriver()
        driver.tasks.runsTasks = true
        let clock = driver.clock
        let rt = Runtime(Sleeper(), driver: driver) { _, rt in
            rt.tasks.run(id: 0) {
                let start = clock.now
                try await clock.sleep(for: .seconds(30))
                return .woke(start.duration(to: clock.now))
            } failure: { _ in .go }
        }
        let realStart = ContinuousClock.now
        try rt.start()
        driver.runUntilIdle()
        driver.advance(by: .seconds(29))
        #expect(rt.model.isEmpty)
        driver.advance(by: .seconds(1))
        #expect(rt.model == [.woke(.seconds(30))])
        #expect(ContinuousClock.now - realStart < .seconds(5))
    }

    @Test func shutdownCancelsTasksAndDeliversNothingAfter() throws {
        let driver = VirtualDriver()
        let service = SearchService(clock: driver.clock)
        let rt = Runtime(Search(), driver: driver, perform: searchInterpreter { service })
        try rt.start()
        try rt.send(.queryChanged("q"))
        try rt.send(.submitted)
        #expect(rt.beginShutdown() == 1)
        #expect(rt.isShuttingDown && driver.tasks.isCancelled(1))
        #expect(!rt.tasks.run(id: 9) { .submitted })      // refused once shutdown began
        let report = rt.shutdown()
        #expect(report.tasks == { var c = TaskShutdownCounts(); c.abandoned = 1; return c }())
        let messages = rt.stats.messages
        #expect(driver.complete(task: 1, with: Search.Message.response(1, .success(["late"]))))
        #expect(rt.stats.messages == messages)
    }

    @Test func tasksEndedDuringGraceAreCountedByHowTheyEnded() throws {
        let driver = VirtualDriver()
        let service = SearchService(clock: driver.clock)
        let rt = Runtime(Search(), driver: driver, perform: searchInterpreter { service })
        try rt.start()
        for q in ["a", "b", "c"] {
            try rt.send(.queryChanged(q))
            try rt.send(.submitted)
        }
        // Three runs, ids 1, 2, 3; 1 and 2 were cancelled by the query edits.
        var settled = false
        #expect(rt.beginShutdown() == 3)
        rt.whenTasksEnded { settled = true }
        driver.complete(task: 1, with: Search.Message.response(1, .failure(.offline)), cancelled: true)
        driver.complete(task: 2, with: Search.Message.response(2, .success([])))
        #expect(!settled)
        driver.complete(task: 3, with: Search.Message.response(3, .failure(.offline)), cancelled: true)
        #expect(settled)
        let report = rt.shutdown()
        #expect(report.tasks.cancelled == 2 && report.tasks.finished == 1 && report.tasks.abandoned == 0)
    }
}

/// Stream subscriptions on the virtual driver: start once, keep, stop cancels.
@Suite struct StreamSubscriptionTests {
    struct Streamer: Program {
        struct Model: Equatable { var on = true; var generation = 0; var got: [String] = [] }
        enum Message { case toggle, bump, event(StreamSource<String>.Event) }
        let make: @Sendable () -> AsyncThrowingStream<String, any Error>
        func start() -> (Model, [Never]) { (Model(), []) }
        func update(_ m: inout Model, _ message: Message) -> [Never] {
            switch message {
            case .toggle: m.on.toggle()
            case .bump: m.generation += 1
            case .event(.element(let s)): m.got.append(s)
            case .event(.finished): m.got.append("<end>")
            case .event(.failed(let f)): m.got.append("<failed \(f.reason)>")
            case .event(.dropped(let n)): m.got.append("<dropped \(n)>")
            case .event(.restarting(let n, _)): m.got.append("<restarting \(n)>")
            }
            return []
        }
        func subscriptions(_ m: Model) -> Subscriptions<Message> {
            Subscriptions {
                if m.on { Subscription.stream(key: "s", make) { .event($0) } }
            }
        }
    }

    @Test func startedOnceKeptAcrossReconcilesAndSilentAfterStop() throws {
        let (stream, continuation) = AsyncThrowingStream<String, any Error>.makeStream()
        let made = Atomic<Int>(0)
        let driver = VirtualDriver()
        let rt = Runtime(Streamer(make: { made.add(1, ordering: .relaxed); return stream }), driver: driver)
        try rt.start()
        driver.runUntilIdle()
        continuation.yield("a")
        driver.runUntilIdle()
        try rt.send(.bump)                     // a reconcile: the stream is kept
        continuation.yield("b")
        driver.runUntilIdle()
        #expect(rt.model.got == ["a", "b"])
        #expect(made.load(ordering: .relaxed) == 1 && rt.stats.starts == 1)
        try rt.send(.toggle)                   // stop: the task is cancelled
        continuation.yield("after")
        driver.runUntilIdle()
        #expect(rt.model.got == ["a", "b"] && rt.stats.stops == 1)
        #expect(rt.stats.droppedEvents == 0 && rt.stats.lateDeliveries == 0)
    }

    @Test func anErrorIsTheFailureEventAndTheEndIsAnEvent() throws {
        struct Boom: Error, CustomStringConvertible { var description: String { "boom" } }
        let (s1, c1) = AsyncThrowingStream<String, any Error>.makeStream()
        let driver = VirtualDriver()
        let rt = Runtime(Streamer(make: { s1 }), driver: driver)
        try rt.start()
        driver.runUntilIdle()
        c1.yield("x")
        c1.finish(throwing: Boom())
        driver.runUntilIdle()
        #expect(rt.model.got == ["x", "<failed boom>"] && rt.stats.failures == 1)

        let (s2, c2) = AsyncThrowingStream<String, any Error>.makeStream()
        let d2 = VirtualDriver()
        let rt2 = Runtime(Streamer(make: { s2 }), driver: d2)
        try rt2.start()
        c2.finish()
        d2.runUntilIdle()
        #expect(rt2.model.got == ["<end>"])
    }
}
