import Reconcile
import ReconcileTesting
import Testing

/// Restart policies of process, listener and bus sources on virtual time:
/// the schedule, the cap, the conditions, and a dead attempt's events refused.
@Suite struct SourceRestartsOnVirtualTime {
    let id = TypedSubscriptionID(ProcessSource.self, key: "p")

    func program(_ restart: RestartPolicy, on condition: ProcessSource.RestartCondition = .onFailure) -> Restarter<ProcessSource> {
        Restarter { tag in Subscription.process(["/bin/sh", "-c", "echo x; exit 3"], key: "p", restart: restart, restartOn: condition, tag) }
    }

    @Test func aFailingChildIsRespawnedOnTheExactScheduleUntilTheCapAndOutputIsNoRecovery() throws {
        let backoff = Backoff(initial: .seconds(1), factor: 2, maximum: .seconds(3), jitter: 0, attempts: 3, window: .seconds(60))
        let driver = VirtualDriver()
        let rt = Runtime(program(.backoff(backoff)), driver: driver)
        try rt.start()
        driver.runUntilIdle()
        for attempt in 1...3 {
            #expect(driver.attempts(of: id.id) == attempt)
            // Started and printing is no recovery: the delays grow 1 s, 2 s, 3 s (the maximum).
            #expect(driver.exit(3, pid: Int32(100 + attempt), output: ["x"], from: id))
            driver.runUntilIdle()
            let delay = Duration.seconds(min(3, 1 << (attempt - 1)))
            #expect(Array(rt.model.events.suffix(4)) == [.started(pid: Int32(100 + attempt)), .output(.stdout, "x"), .exited(status: 3),
                                                          .restarting(attempt: attempt, after: delay)])
            // Between attempts nothing runs: an event for the dead child is refused.
            #expect(!driver.emit(ProcessSource.Event.output(.stdout, "late"), to: id.id))
            driver.advance(by: delay - .microseconds(1))
            #expect(driver.attempts(of: id.id) == attempt, "attempt \(attempt + 1) came early")
            driver.advance(by: .microseconds(1))
        }
        // The fourth child fails: three restarts in the window, no more.
        #expect(driver.attempts(of: id.id) == 4)
        #expect(driver.exit(3, pid: 104, from: id))
        driver.runUntilIdle()
        guard case .failed(let last) = rt.model.events.last else { Issue.record("\(rt.model.events)"); return }
        #expect(last.reason.contains("gave up after 3 restarts within 1m"))
        driver.advance(by: .seconds(600))
        #expect(driver.attempts(of: id.id) == 4 && rt.isRunning && driver.contractViolations.isEmpty)
        #expect(rt.model.events.filter { if case .restarting = $0 { true } else { false } }.count == 3)
    }

    @Test func aBatchOnARestartingSourceIsDeliveredUpToItsEndWhichRestartsAndTheRestIsRefused() throws {
        let driver = VirtualDriver()
        let rt = Runtime(program(.backoff(initial: .seconds(1), jitter: 0)), driver: driver)
        try rt.start()
        driver.runUntilIdle()
        let dropped = rt.stats.droppedEvents
        // One dispatch's events on the attempt's ticket: taken as a batch.
        #expect(driver.emit(batch: [ProcessSource.Event.started(pid: 7), .output(.stdout, "x"), .exited(status: 3), .output(.stdout, "late")],
                            of: ProcessSource.self, to: id.id))
        driver.runUntilIdle()
        #expect(rt.model.events == [.started(pid: 7), .output(.stdout, "x"), .exited(status: 3), .restarting(attempt: 1, after: .seconds(1))])
        // What followed the end belongs to a stopped attempt.
        #expect(rt.stats.droppedEvents == dropped + 1)
        driver.advance(by: .seconds(1))
        #expect(driver.attempts(of: id.id) == 2)
        // Output is no recovery, in a batch too: the next delay doubles.
        #expect(driver.emit(batch: [ProcessSource.Event.started(pid: 8), .output(.stdout, "y"), .exited(status: 3)], of: ProcessSource.self, to: id.id))
        driver.runUntilIdle()
        #expect(rt.model.events.last == .restarting(attempt: 2, after: .seconds(2)))
        // Between attempts nothing takes a batch.
        #expect(!driver.emit(batch: [ProcessSource.Event.output(.stdout, "z")], of: ProcessSource.self, to: id.id))
        #expect(driver.contractViolations.isEmpty)
    }

    @Test func aDeadChildsPosterIsClosedAndItsLateLinesNeverReachTheProgram() throws {
        let driver = VirtualDriver()
        let rt = Runtime(program(.backoff(initial: .seconds(1), jitter: 0)), driver: driver)
        try rt.start()
        driver.runUntilIdle()
        // A poster held by the first child's reader (another thread's view of it).
        let first = try #require(driver.poster(for: id.id))
        #expect(first.post(ProcessSource.Event.started(pid: 1)) == .accepted)
        driver.runUntilIdle()
        #expect(driver.emit(ProcessSource.Event.killed(signal: 9), to: id.id))
        driver.runUntilIdle()
        #expect(first.post(ProcessSource.Event.output(.stdout, "from the dead child")) == .closed)
        driver.advance(by: .seconds(1))
        #expect(driver.attempts(of: id.id) == 2)
        #expect(driver.emit(ProcessSource.Event.started(pid: 2), to: id.id))
        driver.runUntilIdle()
        #expect(rt.model.events == [.started(pid: 1), .killed(signal: 9), .restarting(attempt: 1, after: .seconds(1)), .started(pid: 2)])
    }

    @Test(arguments: [
        (ProcessSource.RestartCondition.onFailure, ProcessSource.Event.exited(status: 0), false),
        (.onFailure, .exited(status: 1), true),
        (.onFailure, .killed(signal: 15), false),
        (.onFailure, .killed(signal: 9), true),
        (.always, .exited(status: 0), true),
        (.always, .killed(signal: 15), true),
    ])
    func theConditionDecidesWhichEndsRestartLikeSystemdsRestartSetting(condition: ProcessSource.RestartCondition,
                                                                       end: ProcessSource.Event, restarts: Bool) throws {
        let driver = VirtualDriver()
        let rt = Runtime(program(.backoff(initial: .seconds(1), jitter: 0), on: condition), driver: driver)
        try rt.start()
        driver.runUntilIdle()
        #expect(driver.emit(end, to: id.id))
        driver.runUntilIdle()
        driver.advance(by: .seconds(5))
        #expect(driver.attempts(of: id.id) == (restarts ? 2 : 1))
        #expect(rt.model.events.contains(.restarting(attempt: 1, after: .seconds(1))) == restarts)
        // A clean end stays ended: the child's events are delivered, nothing more runs.
        #expect(rt.model.events.first == end)
    }

    @Test func aSpawnFailureRestartsAndNeverIsTodaysBehaviour() throws {
        let driver = VirtualDriver()
        let boom = SourceFailure(operation: "posix_spawn /nonexistent", code: 2, reason: "No such file or directory")
        driver.failOnStart[id.id] = boom
        let rt = Runtime(program(.backoff(initial: .milliseconds(10), jitter: 0)), driver: driver)
        try rt.start()
        driver.runUntilIdle()
        #expect(rt.model.events == [.failed(boom), .restarting(attempt: 1, after: .milliseconds(10))])
        driver.failOnStart[id.id] = nil
        driver.advance(by: .milliseconds(10))
        #expect(driver.attempts(of: id.id) == 2)

        let plainDriver = VirtualDriver()
        let plain = Runtime(program(.never), driver: plainDriver)
        try plain.start()
        plainDriver.runUntilIdle()
        #expect(plainDriver.exit(3, from: id))
        plainDriver.advance(by: .seconds(60))
        #expect(plainDriver.attempts(of: id.id) == 0 && plainDriver.starts(of: id.id) == 1)
        #expect(plain.model.events == [.started(pid: 1000), .exited(status: 3)])
    }

    @Test func aChildThatRanAWholeWindowStartsFromTheFirstDelayAgain() throws {
        let backoff = Backoff(initial: .seconds(1), factor: 2, maximum: .seconds(30), jitter: 0, attempts: 10, window: .seconds(60))
        let driver = VirtualDriver()
        let rt = Runtime(program(.backoff(backoff)), driver: driver)
        try rt.start()
        driver.runUntilIdle()
        #expect(driver.exit(3, from: id))
        driver.advance(by: .seconds(1))
        #expect(driver.exit(3, from: id))
        driver.runUntilIdle()
        #expect(rt.model.events.last == .restarting(attempt: 2, after: .seconds(2)))
        driver.advance(by: .seconds(2))
        // The third child runs for a minute, then fails: a recovery.
        driver.advance(by: .seconds(60))
        #expect(driver.exit(3, from: id))
        driver.runUntilIdle()
        #expect(rt.model.events.last == .restarting(attempt: 1, after: .seconds(1)))
    }

    @Test func onlyAListenerThatBindsItsAddressRestarts() throws {
        let policy = RestartPolicy.backoff(initial: .milliseconds(50), jitter: 0)
        let given = ListenerSource.Configuration(fd: 3, name: "web")
        var bound = ListenerSource.Configuration(address: "127.0.0.1:8080", name: "web", restart: policy)
        #expect(ListenerSource.restartPolicy(given) == .never)
        #expect(ListenerSource.restartPolicy(bound) == policy)
        #expect(bound.ownsDescriptor && bound.description == "web 127.0.0.1:8080 limit 256 restart \(policy)")
        var other = bound
        other.connectionLimit = 8
        #expect(ListenerSource.canRetune(from: bound, to: other))
        bound.restart = .never
        #expect(!ListenerSource.canRetune(from: bound, to: other))

        let driver = VirtualDriver()
        let rt = Runtime(Restarter<ListenerSource> { tag in Subscription.listen(address: "127.0.0.1:8080", name: "web", restart: policy, tag) },
                         driver: driver)
        try rt.start()
        driver.runUntilIdle()
        let web = TypedSubscriptionID(ListenerSource.self, key: "web")
        let inUse = SourceFailure(operation: "bind 127.0.0.1:8080", code: 98, reason: "cannot listen on 127.0.0.1:8080: Address in use")
        #expect(driver.fail(web, inUse))
        driver.runUntilIdle()
        #expect(rt.model.events == [.failed(inUse), .restarting(attempt: 1, after: .milliseconds(50))])
        driver.advance(by: .milliseconds(50))
        #expect(driver.attempts(of: web.id) == 2)
    }

    @Test func busSourcesCarryTheirReconnectPolicyInTheirIdentity() {
        let fast = RestartPolicy.backoff(initial: .milliseconds(10), jitter: 0)
        let a = BusNameSource.Configuration(bus: .system, name: "org.freedesktop.login1")
        let b = BusNameSource.Configuration(bus: .system, name: "org.freedesktop.login1", restart: fast)
        #expect(a.restart == BusAddress.defaultReconnect && a.description == "system org.freedesktop.login1")
        #expect(a != b && b.description.hasSuffix("restart \(fast)"))
        let s = BusSignalSource.Configuration(bus: .system, member: "X")
        var t = s
        t.restart = .never
        #expect(!BusSignalSource.canRetune(from: s, to: t))
    }
}
