import CSystemd
import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// One repeating timer; records each tick with the loop's time.
struct Clocked: Program {
    struct Model: Equatable {
        var interval: Duration
        var clock: TimerSource.Clock = .monotonic
        var ticks: [TimerSource.Tick] = []
        var blockOnTick: UInt64? = nil
    }
    enum Message { case tick(TimerSource.Event), interval(Duration) }
    enum Command { case block(Duration) }
    let initial: Model
    func start() -> (Model, [Command]) { (initial, []) }
    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .tick(.tick(let t)):
            model.ticks.append(t)
            if t.sequence == model.blockOnTick { return [.block(model.interval * 5)] }
        case .tick(.failed): break
        case .interval(let d): model.interval = d
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.every(model.interval, key: "t", clock: model.clock, leeway: .microseconds(1)) { .tick($0) }
        }
    }
}

func monotonicMicros(_ clock: clockid_t = CLOCK_MONOTONIC) -> Int64 {
    var ts = timespec()
    clock_gettime(clock, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}

extension SystemdTests {
    @Suite struct Timer {
        @Test func hundredTicksAtTenMillisecondsDoNotDrift() throws {
            var times: [UInt64: Int64] = [:]
            var start: Int64 = 0
            let h = try Harness(Clocked(initial: .init(interval: .milliseconds(10))))
            start = monotonicMicros()
            h.runtime.didCommit = { m in if let t = m.ticks.last { times[t.sequence] = monotonicMicros() } }
            try h.run(until: { (h.runtime.model.ticks.last?.sequence ?? 0) >= 100 }, timeout: .seconds(10))
            let ticks = h.runtime.model.ticks
            // Every due time is accounted for: delivered or reported missed.
            #expect(ticks.reduce(0) { $0 + 1 + $1.missed } == ticks.last!.sequence)
            // Tick k is due at start + k·10 ms. Drift would accumulate, so the
            // last ten ticks would all be late; without drift the best of
            // them arrives within a couple of milliseconds of its due time,
            // however late a tick in between was (a loaded machine).
            let lateness = ticks.suffix(10).map { times[$0.sequence]! - (start + Int64($0.sequence) * 10_000) }
            #expect(lateness.min()! > -2_000 && lateness.min()! < 3_000, "lateness of the last ten ticks: \(lateness) µs")
            let lates = ticks.map { times[$0.sequence]! - (start + Int64($0.sequence) * 10_000) }.sorted()
            print("timer drift: 100 ticks at 10 ms, median lateness \(lates[lates.count / 2]) µs, max \(lates.last!) µs, missed \(ticks.reduce(0) { $0 + $1.missed })")
        }

        @Test func blockedLoopYieldsOneTickWithMissedCount() throws {
            // 50 ms intervals: the loop may wake up to 45 ms late after the
            // block without changing the outcome.
            var initial = Clocked.Model(interval: .milliseconds(50))
            initial.blockOnTick = 1
            let h = try Harness(Clocked(initial: initial)) { command, _ in
                // The loop thread is stuck for five intervals.
                if case .block(let d) = command { usleep(UInt32(d.saturatingMicroseconds) + 5_000) }
            }
            try h.run(until: { h.runtime.model.ticks.count >= 2 })
            let ticks = h.runtime.model.ticks
            #expect(ticks[0] == .init(sequence: 1, missed: 0))
            // Five due times passed while blocked: one tick stands for the
            // last of them and reports the four before it as missed.
            #expect(ticks[1].sequence == 6)
            #expect(ticks[1].missed == 4)
            try h.run(until: { h.runtime.model.ticks.count >= 3 })
            #expect(h.runtime.model.ticks[2] == .init(sequence: 7, missed: 0))
        }

        @Test func intervalChangeIsARetuneInPlace() throws {
            let h = try Harness(Clocked(initial: .init(interval: .seconds(30))))
            let created = EventSourceAccounting.created
            try h.runtime.send(.interval(.milliseconds(10)))
            try h.run(until: { h.runtime.model.ticks.count >= 3 })
            #expect(h.runtime.stats.retunes == 1)
            #expect(h.runtime.stats.starts == 1 && h.runtime.stats.stops == 0)
            #expect(EventSourceAccounting.created == created)
        }

        @Test(arguments: [TimerSource.Clock.monotonic, .boottime, .realtime])
        func everyClockTicks(clock: TimerSource.Clock) throws {
            var initial = Clocked.Model(interval: .milliseconds(10))
            initial.clock = clock
            let h = try Harness(Clocked(initial: initial))
            try h.run(until: { h.runtime.model.ticks.count >= 2 })
        }

        @Test func oneShotFiresOnce() throws {
            struct P: Program {
                func start() -> (Int, [Never]) { (0, []) }
                func update(_ m: inout Int, _ e: TimerSource.Event) -> [Never] { m += 1; return [] }
                func subscriptions(_ m: Int) -> Subscriptions<TimerSource.Event> {
                    Subscriptions { Subscription.after(.milliseconds(10), key: "once", leeway: .microseconds(1)) { $0 } }
                }
            }
            let h = try Harness(P())
            try h.run(until: { h.runtime.model == 1 })
            try h.run(for: .milliseconds(50))
            #expect(h.runtime.model == 1)
        }

        @Test func timersStartedAfterOthersStoppedTickOnTheirOwnSchedule() throws {
            // The driver arms stopped timers' runners again for new timers:
            // nothing of the old timer (its sequence, a one-shot having
            // fired, its clock or interval) may leak into the new one.
            struct P: Program {
                struct Model: Equatable { var phase = 0; var ticks: [String: [TimerSource.Tick]] = [:] }
                enum Message { case tick(String, TimerSource.Event), next }
                func start() -> (Model, [Never]) { (Model(), []) }
                func update(_ m: inout Model, _ message: Message) -> [Never] {
                    switch message {
                    case .tick(let key, .tick(let t)): m.ticks[key, default: []].append(t)
                    case .tick(_, .failed): break
                    case .next: m.phase += 1
                    }
                    return []
                }
                func subscriptions(_ m: Model) -> Subscriptions<Message> {
                    if m.phase == 0 {
                        return Subscriptions {
                            Subscription.every(.milliseconds(2), key: "a", clock: .boottime, leeway: .microseconds(1)) { .tick("a", $0) }
                            Subscription.after(.milliseconds(1), key: "once", leeway: .microseconds(1)) { .tick("once", $0) }
                        }
                    }
                    return Subscriptions {
                        Subscription.every(.milliseconds(20), key: "c", leeway: .microseconds(1)) { .tick("c", $0) }
                        Subscription.after(.milliseconds(10), key: "b", leeway: .microseconds(1)) { .tick("b", $0) }
                    }
                }
            }
            let h = try Harness(P())
            try h.run(until: { (h.runtime.model.ticks["a"]?.count ?? 0) >= 5 && h.runtime.model.ticks["once"] != nil })
            let switched = monotonicMicros()
            try h.runtime.send(.next)
            #expect(h.driver.runningCount == 2)
            try h.run(until: { (h.runtime.model.ticks["c"]?.count ?? 0) >= 3 })
            let elapsed = monotonicMicros() - switched
            try h.run(for: .milliseconds(15))
            let m = h.runtime.model
            #expect(m.ticks["b"] == [.init(sequence: 1, missed: 0)])
            // c counts its own intervals from its start, not a's.
            let c = m.ticks["c"]!
            #expect(c.first!.sequence == 1 + c.first!.missed)
            #expect(c.last!.sequence >= 3 && c.last!.sequence <= UInt64(elapsed / 20_000) + 1, "c: \(c), \(elapsed) µs")
        }

        @Test func aRecycledSourceFiresWithTheNewTimersConfigurationOnly() throws {
            // One timer at a time: each start takes the runner the last stop
            // left, with its sd-event source parked at USEC_INFINITY. "a" is
            // due (not yet dispatched) when it stops; "b" (another leeway, a
            // minute) gets its source and must neither fire early nor hand
            // "a" its due tick; "c" gets it next and ticks on its own schedule.
            struct P: Program {
                struct Model: Equatable { var phase = 0; var ticks: [String: [TimerSource.Tick]] = [:] }
                enum Message { case tick(String, TimerSource.Event), next }
                func start() -> (Model, [Never]) { (Model(), []) }
                func update(_ m: inout Model, _ message: Message) -> [Never] {
                    switch message {
                    case .tick(let key, .tick(let t)): m.ticks[key, default: []].append(t)
                    case .tick(_, .failed): break
                    case .next: m.phase += 1
                    }
                    return []
                }
                func subscriptions(_ m: Model) -> Subscriptions<Message> {
                    switch m.phase {
                    case 0: Subscriptions { Subscription.every(.milliseconds(5), key: "a", leeway: .microseconds(1)) { .tick("a", $0) } }
                    case 1: Subscriptions { Subscription.every(.seconds(60), key: "b", leeway: .milliseconds(1)) { .tick("b", $0) } }
                    default: Subscriptions { Subscription.every(.milliseconds(10), key: "c", leeway: .microseconds(1)) { .tick("c", $0) } }
                    }
                }
            }
            let h = try Harness(P())
            try h.run(until: { (h.runtime.model.ticks["a"]?.count ?? 0) >= 2 })
            let ticksOfA = h.runtime.model.ticks["a"]!.count
            // The loop does not run: "a" comes due four times over.
            usleep(20_000)
            try h.runtime.send(.next)
            #expect(h.driver.runningCount == 1)
            try h.run(for: .milliseconds(50))
            #expect(h.runtime.model.ticks["a"]!.count == ticksOfA)
            #expect(h.runtime.model.ticks["b"] == nil)
            let switched = monotonicMicros()
            try h.runtime.send(.next)
            try h.run(until: { (h.runtime.model.ticks["c"]?.count ?? 0) >= 3 })
            let elapsed = monotonicMicros() - switched
            let m = h.runtime.model
            #expect(m.ticks["a"]!.count == ticksOfA && m.ticks["b"] == nil)
            let c = m.ticks["c"]!
            #expect(c.first!.sequence == 1 + c.first!.missed)
            #expect(elapsed >= 29_000 && c.last!.sequence <= UInt64(elapsed / 10_000) + 1, "c: \(c), \(elapsed) µs")
        }

        @Test func oneShotTicksWithSequenceOneAndNothingMissedHoweverLate() throws {
            struct P: Program {
                func start() -> ([TimerSource.Tick], [Never]) { ([], []) }
                func update(_ m: inout [TimerSource.Tick], _ e: TimerSource.Event) -> [Never] {
                    if case .tick(let t) = e { m.append(t) }
                    return []
                }
                func subscriptions(_ m: [TimerSource.Tick]) -> Subscriptions<TimerSource.Event> {
                    Subscriptions {
                        Subscription.after(.zero, key: "now") { $0 }
                        Subscription.after(.milliseconds(1), key: "late", leeway: .microseconds(1)) { $0 }
                    }
                }
            }
            let h = try Harness(P())
            // The loop is late: fifty 1 ms intervals pass before it runs.
            usleep(50_000)
            try h.run(until: { h.runtime.model.count == 2 })
            #expect(h.runtime.model == [.init(sequence: 1, missed: 0), .init(sequence: 1, missed: 0)])
        }
    }
}
