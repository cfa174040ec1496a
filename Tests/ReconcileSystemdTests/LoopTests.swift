import CSystemd
import Dispatch
import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// Real sd-event loops; serialized because some assertions count sd-event
/// sources process-wide and timing tests want the machine quiet.
@Suite(.serialized) struct SystemdTests {}

/// Timers keyed by name; a tick from any of them can drop the others.
struct Timers: Program {
    struct Model: Equatable {
        var names: [String]
        var interval: Duration = .milliseconds(20)
        var ticks: [String] = []
        var dropOthersOnTick = false
        var phase = Phase()
        var rejected = 0
        var threads: Set<UInt> = []
    }
    enum Message: Sendable {
        case tick(String, TimerSource.Event, Phase)
        case set([String])
        case feed(Int, Phase)
        case leavePhase
        case note
    }
    let initial: Model
    func start() -> (Model, [Never]) { (initial, []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case let .tick(name, _, phase):
            guard model.phase.isCurrent(phase) else { model.rejected += 1; return [] }
            model.ticks.append(name)
            if model.dropOthersOnTick { model.names = [name] }
        case .set(let n): model.names = n
        case .feed(_, let phase):
            if !model.phase.isCurrent(phase) { model.rejected += 1 }
        case .leavePhase:
            model.phase.advance()
            model.names = []
        case .note: break
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        let phase = model.phase
        return Subscriptions(model.names.map { name in
            name.hasPrefix("feed")
                ? Subscription(ThreadFeed.self, key: name, configuration: 0) { .feed($0, phase) }
                : Subscription.every(model.interval, key: name, leeway: .microseconds(1)) { .tick(name, $0, phase) }
        })
    }
}

/// A user-defined source whose events come from another thread; the test
/// takes its poster from `ThreadFeed.posters`.
enum ThreadFeed: SystemdSource {
    static let name = "threadfeed"
    typealias Configuration = Int
    typealias Event = Int
    static func failed(_ failure: SourceFailure) -> Int { -1 }

    nonisolated(unsafe) static var posters: [SubscriptionID: EventPoster] = [:]

    final class Running: RunningSource {
        func retune(to configuration: AnyHashable) throws {}
        func stop() {}
    }
    static func start(_ ticket: SourceTicket, _ configuration: Int, context: SourceContext) throws -> any RunningSource {
        posters[ticket.id] = ticket.poster()
        return Running()
    }
}

extension SystemdTests {
    @Suite struct Loop {
        @Test func startsOnceAndStopsOnceAtTheSdEventLevel() throws {
            let before = EventSourceAccounting.live
            let h = try Harness(Timers(initial: .init(names: ["a", "b", "c"], interval: .seconds(60))))
            // The wake-up eventfd and the three timers' one source (one
            // clock, one accuracy: one `TimerQueue`).
            #expect(EventSourceAccounting.live == before + 2)
            #expect(h.driver.runningCount == 3)
            try h.runtime.send(.set(["a", "b"]))
            #expect(h.driver.runningCount == 2)
            #expect(h.runtime.stats.starts == 3 && h.runtime.stats.stops == 1)
            try h.runtime.send(.set(["a", "b"]))
            #expect(h.driver.runningCount == 2)
            #expect(h.runtime.stats.starts == 3 && h.runtime.stats.stops == 1)
            #expect(EventSourceAccounting.live == before + 2)
            let report = h.runtime.shutdown()
            #expect(report.stopped.count == 2)
            #expect(EventSourceAccounting.live == before)
            #expect(h.runtime.stats.starts == 3 && h.runtime.stats.stops == 3)
        }

        @Test func sourceDueWithTheReconcileThatStopsItDoesNotFire() throws {
            var initial = Timers.Model(names: ["a", "b"], interval: .milliseconds(30))
            initial.dropOthersOnTick = true
            let h = try Harness(Timers(initial: initial))
            try h.run(until: { !h.runtime.model.ticks.isEmpty })
            // Both were due in the same iteration; the first tick's reconcile
            // stopped the other before it was dispatched.
            let first = h.runtime.model.ticks[0]
            try h.run(for: .milliseconds(45))
            #expect(Set(h.runtime.model.ticks) == [first])
            #expect(h.runtime.stats.stops == 1)
            #expect(h.runtime.stats.droppedEvents == 0)
        }

        @Test func messageQueuedWhenItsSourceStopsIsDeliveredAndRejectedByPhase() throws {
            let h = try Harness(Timers(initial: .init(names: ["feed1"])))
            let id = SubscriptionID(ThreadFeed.self, key: "feed1")
            let poster = try #require(ThreadFeed.posters[id])
            // Another thread produces an event; it waits in the inbox.
            DispatchQueue.global().sync { _ = poster.post(7) }
            // Before the loop wakes, the model leaves the phase and the source stops.
            try h.runtime.send(.leavePhase)
            #expect(DispatchQueue.global().sync { poster.post(8) } == .closed)
            try h.run(until: { h.runtime.stats.lateDeliveries == 1 })
            #expect(h.runtime.model.rejected == 1)
        }

        /// More than a pump takes at once (`Runtime.pumpLimit`) posted
        /// before the stop: every one is delivered (late), none dropped when
        /// the first pump after the stop has taken its share.
        @Test func everyEventPostedBeforeItsSourceStopsIsDeliveredHoweverFarBehindTheInboxIs() throws {
            let h = try Harness(Timers(initial: .init(names: ["feed2"])))
            let id = SubscriptionID(ThreadFeed.self, key: "feed2")
            let poster = try #require(ThreadFeed.posters[id])
            let posted = DispatchQueue.global().sync { (0..<1_000).filter { poster.post($0) == .accepted }.count }
            #expect(posted == 1_000)
            try h.runtime.send(.leavePhase)
            #expect(DispatchQueue.global().sync { poster.post(-2) } == .closed)
            try h.run(until: { h.runtime.stats.lateDeliveries == 1_000 })
            #expect(h.runtime.model.rejected == 1_000)
            #expect(h.runtime.stats.droppedEvents == 0)
        }

        @Test func everyCallbackAndMessageRunsOnTheLoopThread() throws {
            var threads: Set<UInt> = []
            let h = try Harness(Timers(initial: .init(names: ["a"], interval: .milliseconds(5))))
            h.runtime.didCommit = { _ in threads.insert(CSystemd_thread_id()) }
            let sender = h.runtime.sender()
            DispatchQueue.concurrentPerform(iterations: 4) { _ in
                for _ in 0..<25 { try? sender.send(.note) }
            }
            try h.run(until: { h.runtime.stats.messages >= 100 && h.runtime.model.ticks.count >= 5 })
            #expect(threads == [h.loop.thread])
            #expect(threads.count == 1)
        }

        @Test func borrowedLoopIsStillUsableAfterShutdown() throws {
            let owner = try EventLoop()
            let borrowed = try EventLoop(borrowing: owner.handle)
            #expect(throws: LoopError.borrowed) { try borrowed.run() }
            let h = try Harness(Timers(initial: .init(names: ["a"], interval: .milliseconds(5))), loop: borrowed)
            try h.run(until: { !h.runtime.model.ticks.isEmpty })
            h.runtime.shutdown()
            // The daemon's own source on the same loop still works.
            final class Flag { var fired = false }
            let flag = Flag()
            var s: OpaquePointer?
            let r = sd_event_add_time_relative(owner.handle, &s, CLOCK_MONOTONIC, 1000, 1, { _, _, ud in
                Unmanaged<Flag>.fromOpaque(ud!).takeUnretainedValue().fired = true
                return 0
            }, Unmanaged.passUnretained(flag).toOpaque())
            #expect(r >= 0)
            #expect(try owner.run(until: { flag.fired }, timeout: .seconds(5)))
            sd_event_source_unref(s)
        }

        @Test func misuseThrowsCatchableErrors() throws {
            let h = try Harness(Timers(initial: .init(names: [])))
            h.runtime.shutdown()
            #expect(throws: RuntimeError.shutDown) { try h.runtime.start() }
            #expect(throws: RuntimeError.shutDown) { try h.runtime.send(.note) }
            h.runtime.shutdown()   // idempotent
        }

        @Test func hostPollLoopDrivesTheEventLoop() throws {
            let h = try Harness(Timers(initial: .init(names: ["a"], interval: .milliseconds(5))))
            let e = h.loop.handle
            let deadline = ContinuousClock.now + .seconds(5)
            // A host's own poll() loop, as in Docs/Embedding.md.
            while h.runtime.model.ticks.count < 3 && ContinuousClock.now < deadline {
                var r = sd_event_prepare(e)
                if r == 0 {
                    var p = pollfd(fd: sd_event_get_fd(e), events: Int16(POLLIN), revents: 0)
                    _ = poll(&p, 1, 100)
                    r = sd_event_wait(e, 0)
                }
                if r > 0 { #expect(sd_event_dispatch(e) >= 0) }
            }
            #expect(h.runtime.model.ticks.count >= 3)
        }

        @Test func signalSubscriptionWithoutBlockedSignalIsAFailureEvent() throws {
            struct P: Program {
                func start() -> ([String], [Never]) { ([], []) }
                func update(_ m: inout [String], _ e: SignalSource.Event) -> [Never] {
                    if case .failed(let f) = e { m.append(f.reason) }
                    return []
                }
                func subscriptions(_ m: [String]) -> Subscriptions<SignalSource.Event> {
                    Subscriptions { Subscription.signal(.user2) { $0 } }
                }
            }
            // The test process's main thread does not block SIGUSR2.
            #expect(Signals.notBlockedEverywhere([.user2]) == [.user2])
            let h = try Harness(P())
            #expect(h.runtime.model.count == 1)
            #expect(h.runtime.model.first?.contains("not blocked in every thread") == true)
        }

        @Test func daemonRefusesToRunWhenShutdownSignalsCannotBeBlocked() throws {
            struct P: Program {
                func start() -> (Int, [Never]) { (0, []) }
                func update(_ m: inout Int, _ e: Int) -> [Never] { [] }
            }
            let d = try Daemon(P())
            #expect(throws: DaemonError.self) { try d.run() }
        }

        @Test func daemonStopsOnRequestAndCannotRunTwice() throws {
            struct P: Program {
                enum Command { case quit }
                func start() -> (Int, [Command]) { (0, []) }
                func update(_ m: inout Int, _ e: TimerSource.Event) -> [Command] {
                    m += 1
                    return m == 3 ? [.quit] : []
                }
                func subscriptions(_ m: Int) -> Subscriptions<TimerSource.Event> {
                    Subscriptions { Subscription.every(.milliseconds(5), key: "t") { $0 } }
                }
            }
            var options = Daemon<P>.Options()
            options.shutdownSignals = []
            options.notify = false
            options.logger = DaemonLogger(level: .error)
            let d = try Daemon(P(), options: options) { command, daemon in daemon.stop(exitCode: 4) }
            #expect(try d.run() == 4)
            #expect(d.runtime.model == 3)
            #expect(d.runtime.stats.stops == 1)
            #expect(throws: LoopError.shutDown) { try d.run() }
        }
    }
}
