import CSystemd
import Foundation
import Reconcile
import ReconcileSystemd
import Synchronization
import Testing

/// A program whose messages are task results, recording the thread `update` ran on.
struct Work: Program {
    struct Model {
        var results: [String: Int] = [:]        // key -> deliveries
        var accepted: [String] = []
        var rejected: [String] = []
        var current: [String: Int] = [:]        // key -> the request the model waits for
        var updateThreads: Set<UInt> = []
        var taskThreads: Set<UInt> = []
    }
    enum Message: Sendable {
        case done(String, request: Int, threads: [UInt])
        case ended(String, request: Int, cancelled: Bool)
        case want(String, request: Int)
    }
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        m.updateThreads.insert(CSystemd_thread_id())
        switch message {
        case .want(let key, let request): m.current[key] = request
        case .done(let key, let request, let threads):
            m.results[key, default: 0] += 1
            m.taskThreads.formUnion(threads)
            if m.current[key] == request { m.accepted.append(key) } else { m.rejected.append(key) }
        case .ended(let key, let request, _):
            m.results[key, default: 0] += 1
            if m.current[key] == request { m.accepted.append(key) } else { m.rejected.append(key) }
        }
        return []
    }
}

/// An actor that adopts the loop's executor.
actor LoopCounter {
    let executor: LoopExecutor
    var count = 0
    var threads: Set<UInt> = []
    init(executor: LoopExecutor) { self.executor = executor }
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
    func bump() {
        count += 1
        threads.insert(CSystemd_thread_id())
    }
}

/// The order a loop executor ran work in, per producer.
final class Order: Sendable {
    let seen = Mutex<[Int: [Int]]>([:])
    let threads = Mutex<Set<UInt>>([])
    func record(_ producer: Int, _ n: Int) {
        seen.withLock { $0[producer, default: []].append(n) }
        threads.withLock { _ = $0.insert(CSystemd_thread_id()) }
    }
    var total: Int { seen.withLock { $0.values.reduce(0) { $0 + $1.count } } }
}

extension SystemdTests {
    @Suite struct Effects {
        @Test func executorRunsWorkFromAnyThreadOnTheLoopThreadInOrder() throws {
            let loop = try EventLoop()
            let executor = loop.executor
            let order = Order()
            let producers = 4, each = 2000
            let threads = (0..<producers).map { p in
                Thread {
                    for n in 0..<each { executor.execute { order.record(p, n) } }
                }
            }
            threads.forEach { $0.start() }
            #expect(try loop.run(until: { order.total == producers * each }, timeout: .seconds(10)))
            #expect(order.threads.withLock { $0 } == [loop.thread])
            for p in 0..<producers {
                #expect(order.seen.withLock { $0[p] } == Array(0..<each))
            }
        }

        /// The executor exists with the loop: threads that reach for it at
        /// once, before the loop ever ran, share one, and their work runs on
        /// the loop thread.
        @Test func threadsReachingTheExecutorBeforeTheLoopRanShareOneAndTheirWorkRuns() throws {
            let loop = try EventLoop()
            nonisolated(unsafe) let shared = loop
            let order = Order()
            let seen = Mutex<Set<ObjectIdentifier>>([])
            let go = DispatchGroup()
            go.enter()
            let threads = (0..<8).map { p in
                Thread {
                    go.wait()
                    let executor = shared.executor
                    seen.withLock { _ = $0.insert(ObjectIdentifier(executor)) }
                    for n in 0..<100 { executor.execute { order.record(p, n) } }
                }
            }
            threads.forEach { $0.start() }
            go.leave()
            #expect(try loop.run(until: { order.total == 800 }, timeout: .seconds(10)))
            #expect(seen.withLock { $0 } == [ObjectIdentifier(loop.executor)])
            #expect(order.threads.withLock { $0 } == [loop.thread])
            #expect(loop.executor.droppedJobs == 0)
        }

        @Test func anActorAdoptsTheLoopExecutorAndAssumeIsolatedWorksOnTheLoop() throws {
            let loop = try EventLoop()
            let counter = LoopCounter(executor: loop.executor)
            let done = Atomic<Bool>(false)
            Task.detached {
                for _ in 0..<100 { await counter.bump() }
                done.store(true, ordering: .releasing)
            }
            #expect(try loop.run(until: { done.load(ordering: .acquiring) }, timeout: .seconds(10)))
            // On the loop thread, outside any job: checkIsolated says yes.
            let (count, threads) = counter.assumeIsolated { ($0.count, $0.threads) }
            #expect(count == 100 && threads == [loop.thread])
            #expect(loop.executor.isIsolatingCurrentContext() == true)
            let elsewhere = Atomic<Int>(-1)
            let executor = loop.executor
            let t = Thread { elsewhere.store(executor.isIsolatingCurrentContext() == true ? 1 : 0, ordering: .releasing) }
            t.start()
            #expect(try loop.run(until: { elsewhere.load(ordering: .acquiring) >= 0 }, timeout: .seconds(5)))
            #expect(elsewhere.load(ordering: .acquiring) == 0)
        }

        @Test(arguments: [EventLoop.Ownership.owned, .borrowed])
        func everyJobContinuationAndDeliveryOfATaskRunsOnTheLoopThread(_ ownership: EventLoop.Ownership) throws {
            let owner = try EventLoop()
            let loop = ownership == .owned ? owner : try EventLoop(borrowing: owner.handle)
            let h = try Harness(Work(), loop: loop)
            let clock = h.runtime.clock
            for i in 0..<20 {
                let key = "k\(i)"
                try h.runtime.send(.want(key, request: 1))
                h.runtime.tasks.run(id: key) {
                    var threads = [CSystemd_thread_id()]
                    await Task.yield()
                    threads.append(CSystemd_thread_id())
                    try await clock.sleep(for: .milliseconds(5))
                    threads.append(CSystemd_thread_id())
                    return .done(key, request: 1, threads: threads)
                } failure: { _ in .ended(key, request: 1, cancelled: true) }
            }
            try h.run(until: { h.runtime.model.accepted.count == 20 })
            #expect(h.runtime.model.taskThreads == [loop.thread])
            #expect(h.runtime.model.updateThreads == [loop.thread])
            #expect(h.runtime.tasks.inFlight.isEmpty)
        }

        @Test func aTaskRunsUnderAHostPollLoop() throws {
            let h = try Harness(Work())
            try h.runtime.send(.want("p", request: 1))
            let clock = h.runtime.clock
            h.runtime.tasks.run(id: "p") {
                try await clock.sleep(for: .milliseconds(10))
                return .done("p", request: 1, threads: [CSystemd_thread_id()])
            } failure: { _ in .ended("p", request: 1, cancelled: true) }
            let e = h.loop.handle
            let deadline = ContinuousClock.now + .seconds(5)
            while h.runtime.model.accepted.isEmpty && ContinuousClock.now < deadline {
                var r = sd_event_prepare(e)
                if r == 0 {
                    var p = pollfd(fd: sd_event_get_fd(e), events: Int16(POLLIN), revents: 0)
                    _ = poll(&p, 1, 100)
                    r = sd_event_wait(e, 0)
                }
                if r > 0 { #expect(sd_event_dispatch(e) >= 0) }
            }
            #expect(h.runtime.model.accepted == ["p"] && h.runtime.model.taskThreads == [h.loop.thread])
        }

        @Test func cancelByIDCancelsExactlyThatTaskAndALateResultIsRejected() throws {
            let h = try Harness(Work())
            let clock = h.runtime.clock
            func start(_ key: String, _ request: Int) {
                try? h.runtime.send(.want(key, request: request))
                h.runtime.tasks.run(id: key) {
                    try await clock.sleep(for: .seconds(60))
                    return .done(key, request: request, threads: [])
                } failure: { error in .ended(key, request: request, cancelled: error is CancellationError) }
            }
            start("a", 1)
            start("b", 1)
            #expect(h.runtime.tasks.cancel(id: "a"))
            try h.run(until: { h.runtime.model.results["a"] == 1 })
            #expect(h.runtime.tasks.inFlight == [TaskID("b")])
            // A new run of "b" cancels the previous one, whose result still
            // arrives and is rejected by request number.
            start("b", 2)
            try h.run(until: { h.runtime.model.results["b"] == 1 })
            #expect(h.runtime.model.rejected == ["b"])
            #expect(h.runtime.tasks.inFlight == [TaskID("b")])
            try h.run(for: .milliseconds(50))
            #expect(h.runtime.model.results["b"] == 1)     // the new "b" still sleeps
        }

        @Test func tenThousandResultsThroughASixteenSlotInboxAreAllDeliveredOnce() throws {
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            let runtime = Runtime(Work(), driver: driver, inboxCapacity: 16)
            defer { runtime.shutdown() }
            try runtime.start()
            let n = 10_000
            for i in 0..<n {
                let key = "t\(i)"
                // Half on the loop, half offloaded: results from many threads at once.
                runtime.tasks.run(id: key, placement: i % 2 == 0 ? .loop : .offload) {
                    .done(key, request: 0, threads: [])
                }
            }
            #expect(try loop.run(until: { runtime.tasks.stats.delivered == n }, timeout: .seconds(30)))
            try loop.run(until: { false }, timeout: .milliseconds(20))
            let results = runtime.model.results
            #expect(results.count == n)
            #expect(results.values.allSatisfy { $0 == 1 })
            #expect(runtime.stats.messages == n && runtime.tasks.runningCount == 0)
            #expect(runtime.model.updateThreads == [loop.thread])
        }

        @Test func offloadedWorkHopsBackToTheLoop() throws {
            let h = try Harness(Work())
            try h.runtime.send(.want("off", request: 1))
            h.runtime.tasks.run(id: "off", placement: .offload) {
                .done("off", request: 1, threads: [CSystemd_thread_id()])
            }
            try h.run(until: { !h.runtime.model.accepted.isEmpty }, timeout: .seconds(10))
            #expect(!h.runtime.model.taskThreads.contains(h.loop.thread))
            #expect(h.runtime.model.updateThreads == [h.loop.thread])
        }

        @Test func theLoopClockSleepsOnTheLoopAndACancelledSleepEndsAtOnce() throws {
            let loop = try EventLoop()
            let clock = loop.clock
            let outcome = Mutex<(Duration, Bool)?>(nil)
            let start = clock.now
            let executor = loop.taskExecutor
            Task(executorPreference: executor) {
                try? await clock.sleep(for: .milliseconds(50))
                let elapsed = start.duration(to: clock.now)
                outcome.withLock { $0 = (elapsed, executor.isOnLoopThread) }
            }
            #expect(try loop.run(until: { outcome.withLock { $0 != nil } }, timeout: .seconds(5)))
            let (elapsed, onLoop) = outcome.withLock { $0! }
            #expect(elapsed >= .milliseconds(50) && onLoop)

            let cancelled = Mutex<Bool?>(nil)
            let t = Task(executorPreference: loop.taskExecutor) {
                do {
                    try await clock.sleep(for: .seconds(3600))
                    cancelled.withLock { $0 = false }
                } catch {
                    cancelled.withLock { $0 = error is CancellationError }
                }
            }
            try loop.run(until: { false }, timeout: .milliseconds(10))
            t.cancel()
            #expect(try loop.run(until: { cancelled.withLock { $0 != nil } }, timeout: .seconds(5)))
            #expect(cancelled.withLock { $0 } == true)
        }
    }

    /// Issue 19, items 8, 9 and 12: the loop clock after its loop is gone,
    /// and tasks run before the start.
    @Suite struct LoopClockLifetime {
        /// A sleep from another thread on a gone loop's clock fails with
        /// `LoopError.gone` (it used to never resume).
        @Test func aSleepFromAnotherThreadOnAGoneLoopFails() throws {
            var clock: LoopClock?
            do {
                let loop = try EventLoop()
                clock = loop.clock
            }
            let outcome = Mutex<String?>(nil)
            Task.detached { [clock] in
                do {
                    try await clock!.sleep(for: .milliseconds(10))
                    outcome.withLock { $0 = "slept" }
                } catch {
                    outcome.withLock { $0 = "\(error)" }
                }
            }
            let deadline = ContinuousClock.now + .seconds(5)
            while outcome.withLock({ $0 == nil }) && ContinuousClock.now < deadline { usleep(1_000) }
            #expect(outcome.withLock { $0 } == "\(LoopError.gone)")
        }

        /// A sleep from the loop's thread on a gone loop's clock fails too,
        /// and is not served by a new loop on that thread (it used to arm a
        /// timer through the freed `sd_event *`).
        @Test func aSleepFromTheLoopThreadOnAGoneLoopFailsAndANewLoopIsUntouched() throws {
            var old: LoopClock?
            do {
                let loop = try EventLoop()
                old = loop.clock
            }
            let loop = try EventLoop()
            let outcome = Mutex<String?>(nil)
            let executor = loop.taskExecutor
            Task(executorPreference: executor) { [old] in
                do {
                    try await old!.sleep(for: .milliseconds(10))
                    outcome.withLock { $0 = "slept" }
                } catch {
                    outcome.withLock { $0 = "\(error) on loop \(executor.isOnLoopThread)" }
                }
            }
            #expect(try loop.run(until: { outcome.withLock { $0 != nil } }, timeout: .seconds(5)))
            #expect(outcome.withLock { $0 } == "\(LoopError.gone) on loop true")
            // The new loop's own clock works.
            let slept = Mutex(false)
            let clock = loop.clock
            Task(executorPreference: executor) {
                try? await clock.sleep(for: .milliseconds(10))
                slept.withLock { $0 = true }
            }
            #expect(try loop.run(until: { slept.withLock { $0 } }, timeout: .seconds(5)))
        }

        /// A `.loop` task run before `start()` runs on the loop once it
        /// starts (it used to run on the global executor).
        @Test func aTaskRunBeforeTheStartRunsOnTheLoop() throws {
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            let runtime = Runtime(Work(), driver: driver)
            defer { runtime.shutdown() }
            try runtime.send(.want("early", request: 1))
            for i in 0..<5 {
                runtime.tasks.run(id: "early \(i)") {
                    var threads: [UInt] = []
                    for _ in 0..<8 {
                        threads.append(CSystemd_thread_id())
                        await Task.yield()
                    }
                    return .done("early", request: i == 0 ? 1 : 0, threads: threads)
                }
            }
            try runtime.start()
            #expect(try loop.run(until: { runtime.model.results["early"] == 5 }, timeout: .seconds(5)))
            #expect(runtime.model.taskThreads == [loop.thread])
            #expect(runtime.model.accepted == ["early"])
        }
    }

    @Suite struct EffectsLeaks {
        @Test func aLoopGoingAwayWithASleepPendingLeavesNoDescriptor() throws {
            let before = openDescriptors()
            do {
                let loop = try EventLoop()
                let clock = loop.clock
                let armed = Atomic<Bool>(false)
                Task(executorPreference: loop.taskExecutor) {
                    armed.store(true, ordering: .releasing)
                    try? await clock.sleep(for: .seconds(3600))
                }
                #expect(try loop.run(until: { armed.load(ordering: .acquiring) }, timeout: .seconds(5)))
                try loop.run(until: { false }, timeout: .milliseconds(5))
                #expect(openDescriptors().count > before.count)
            }
            #expect(openDescriptors() == before)
        }
    }

    /// An `AsyncStream` as a subscription on the real loop.
    @Suite struct StreamSubscription {
        /// A stream whose elements are all buffered (its `next()` never
        /// suspends) beside a 5 ms timer.
        struct Burst: Program {
            struct Model { var got = 0; var ended = false; var ticksDuringBurst = 0 }
            enum Message { case element, ended, tick }
            let total: Int
            let make: @Sendable () -> AsyncStream<Int>
            func start() -> (Model, [Never]) { (Model(), []) }
            func update(_ m: inout Model, _ message: Message) -> [Never] {
                switch message {
                case .element: m.got += 1
                case .ended: m.ended = true
                case .tick: if m.got > 0 && m.got < total { m.ticksDuringBurst += 1 }
                }
                return []
            }
            func subscriptions(_ m: Model) -> Subscriptions<Message> {
                Subscriptions {
                    Subscription.stream(key: "burst", make) { event in
                        if case .element = event { return .element }
                        return .ended
                    }
                    Subscription.every(.milliseconds(5), key: "tick") { _ in .tick }
                }
            }
        }

        /// A non-suspending burst of 300,000 elements does not starve a
        /// 5 ms timer: the stream yields to the loop every `yieldEvery`
        /// elements or `yieldAfter` (issue 19, item 7; it held the loop for
        /// seconds with no tick).
        @Test func aNonSuspendingBurstDoesNotStarveATimer() throws {
            let total = 300_000
            let (stream, continuation) = AsyncStream<Int>.makeStream(bufferingPolicy: .unbounded)
            for i in 0..<total { continuation.yield(i) }
            continuation.finish()
            let h = try Harness(Burst(total: total, make: { stream }))
            let started = ContinuousClock.now
            try h.run(until: { h.runtime.model.ended }, timeout: .seconds(60))
            let took = ContinuousClock.now - started
            #expect(h.runtime.model.got == total)
            #expect(h.runtime.model.ticksDuringBurst > 0, "\(h.runtime.model.ticksDuringBurst) ticks in \(took)")
        }

        struct Streamer: Program {
            struct Model { var on = true; var generation = 0; var got: [String] = []; var threads: Set<UInt> = [] }
            enum Message { case toggle, bump, event(StreamSource<String>.Event) }
            let make: @Sendable () -> AsyncThrowingStream<String, any Error>
            func start() -> (Model, [Never]) { (Model(), []) }
            func update(_ m: inout Model, _ message: Message) -> [Never] {
                m.threads.insert(CSystemd_thread_id())
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
                Subscriptions { if m.on { Subscription.stream(key: "s", make) { .event($0) } } }
            }
        }

        @Test func startedOnceKeptCancelledOnStopAndNothingAfter() throws {
            let (stream, continuation) = AsyncThrowingStream<String, any Error>.makeStream()
            let made = Atomic<Int>(0)
            let terminated = Atomic<Bool>(false)
            continuation.onTermination = { _ in terminated.store(true, ordering: .releasing) }
            let h = try Harness(Streamer(make: { made.add(1, ordering: .relaxed); return stream }))
            // Elements come from another thread.
            let feeder = Thread { for i in 0..<3 { continuation.yield("e\(i)") } }
            feeder.start()
            try h.run(until: { h.runtime.model.got.count == 3 })
            try h.runtime.send(.bump)
            try h.runtime.send(.bump)
            continuation.yield("e3")
            try h.run(until: { h.runtime.model.got.count == 4 })
            #expect(h.runtime.model.got == ["e0", "e1", "e2", "e3"])
            #expect(made.load(ordering: .relaxed) == 1 && h.runtime.stats.starts == 1)
            try h.runtime.send(.toggle)
            try h.run(until: { terminated.load(ordering: .acquiring) })
            continuation.yield("late")
            try h.run(for: .milliseconds(50))
            #expect(h.runtime.model.got.count == 4 && h.runtime.stats.stops == 1)
            #expect(h.runtime.stats.droppedEvents == 0)
            #expect(h.runtime.model.threads == [h.loop.thread])
        }

        @Test func anErrorBecomesTheFailureMessage() throws {
            struct Broken: Error, CustomStringConvertible { var description: String { "socket closed" } }
            let (stream, continuation) = AsyncThrowingStream<String, any Error>.makeStream()
            let h = try Harness(Streamer(make: { stream }))
            continuation.yield("x")
            continuation.finish(throwing: Broken())
            try h.run(until: { h.runtime.model.got.count == 2 })
            #expect(h.runtime.model.got == ["x", "<failed socket closed>"])
            #expect(h.runtime.stats.failures == 1)
        }
    }

    /// Tasks under `Daemon`, process-wide: run `reconcile-probe` as a child.
    @Suite struct EffectsProcess {
        let probe = builtExecutable("reconcile-probe")

        @Test func aTaskStartedInAMainSwiftPerformClosureRunsAndResumesOnTheLoop() throws {
            let child = try Child(probe, ["maintask"])
            #expect(child.line() == "running")
            #expect(child.line() == "task ran loop=true")
            #expect(child.line() == "resumed loop=true")
            #expect(child.wait() == 7)
        }

        /// The same probe without the main-queue drain: the task never runs
        /// (the silent hang the drain fixes); SIGTERM still ends the daemon.
        @Test func aLoopWhoseExecutorCannotBeCreatedIsAThrownErrorNotATrap() throws {
            let child = try Child(probe, ["loop-fd-limit"])
            #expect(child.line() == "owned: eventfd: Too many open files (errno 24)")
            #expect(child.line() == "borrowed: eventfd: Too many open files (errno 24)")
            #expect(child.line() == "recovered")
            #expect(child.wait() == 0)
        }

        /// The same probe without the main-queue drain: the task never runs
        /// (the silent hang the drain fixes); SIGTERM still ends the daemon.
        @Test func withoutTheMainQueueDrainTheTaskNeverRuns() throws {
            let child = try Child(probe, ["maintask", "nodrain"])
            #expect(child.line() == "running")
            #expect(child.line(timeout: .seconds(1)) == nil)
            child.signal(SIGTERM)
            #expect(child.wait() == 0)
        }

        @Test func sigtermCancelsEveryTaskAndReportsThem() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let notify = try NotifySocket(directory: dir)
            let child = try Child(probe, ["tasks", "3", "0", "5000"], environment: ["NOTIFY_SOCKET": notify.path])
            #expect(child.line() == "running")
            #expect(child.line(matching: { $0 == "started" }) == "started")
            let sent = ContinuousClock.now
            child.signal(SIGTERM)
            #expect(child.line(matching: { $0 == "shutdown began" }) == "shutdown began")
            var ended: Set<String> = []
            for _ in 0..<3 {
                if let l = child.line(matching: { $0.hasPrefix("ended") }) { ended.insert(l) }
            }
            #expect(ended == ["ended 0 cancelled=true", "ended 1 cancelled=true", "ended 2 cancelled=true"])
            #expect(child.line(matching: { $0.hasPrefix("exit") }) == "exit 0 tasks: 3 cancelled, 0 finished, 0 abandoned")
            #expect(child.wait() == 0)
            #expect(ContinuousClock.now - sent < .seconds(5))
            let notes = notify.receive(until: { $0 == "STOPPING=1" }, timeout: .seconds(2))
            #expect(notes.last == "STOPPING=1")
        }

        /// A grace of `Int64.max` seconds saturates to "no deadline": the
        /// tasks are waited for, not abandoned at once (issue 19, item 11).
        @Test func anEndlessGraceWaitsForTheTasks() throws {
            let child = try Child(probe, ["tasks", "3", "0", "max"])
            #expect(child.line() == "running")
            #expect(child.line(matching: { $0 == "started" }) == "started")
            child.signal(SIGTERM)
            #expect(child.line(matching: { $0.hasPrefix("exit") }) == "exit 0 tasks: 3 cancelled, 0 finished, 0 abandoned")
            #expect(child.wait() == 0)
        }

        /// A cancelled task retrying its sleep in a loop does not hold the
        /// loop: the grace ends on time and it is abandoned (issue 19, item 10).
        @Test func aTaskRetryingACancelledSleepIsAbandonedAtTheDeadline() throws {
            let child = try Child(probe, ["tasks", "2", "0", "300", "1"])
            #expect(child.line() == "running")
            #expect(child.line(matching: { $0 == "started" }) == "started")
            let sent = ContinuousClock.now
            child.signal(SIGTERM)
            #expect(child.line(matching: { $0.hasPrefix("exit") }) == "exit 0 tasks: 2 cancelled, 0 finished, 1 abandoned")
            #expect(child.wait() == 0)
            let took = ContinuousClock.now - sent
            #expect(took >= .milliseconds(300) && took < .seconds(5))
        }

        @Test func aTaskIgnoringCancellationIsAbandonedAtTheDeadline() throws {
            let child = try Child(probe, ["tasks", "2", "1", "300"])
            #expect(child.line() == "running")
            #expect(child.line(matching: { $0 == "started" }) == "started")
            let sent = ContinuousClock.now
            child.signal(SIGTERM)
            #expect(child.line(matching: { $0.hasPrefix("exit") }) == "exit 0 tasks: 2 cancelled, 0 finished, 1 abandoned")
            #expect(child.wait() == 0)
            let took = ContinuousClock.now - sent
            #expect(took >= .milliseconds(300) && took < .seconds(5))
        }
    }
}
