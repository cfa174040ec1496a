import CSystemd
import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// Timers keyed by name with their own interval and leeway; records every
/// tick with the time `update` saw it (CLOCK_MONOTONIC, µs).
struct Named: Program {
    struct Timer: Equatable {
        var name: String
        var interval: Duration
        var leeway: Duration = .microseconds(1)
        var repeats = true
    }
    struct Seen: Equatable {
        var tick: TimerSource.Tick
        var at: Int64
    }
    struct Model: Equatable {
        var timers: [Timer]
        var seen: [String: [Seen]] = [:]
        /// On a tick of the first, the others stop (in that tick's reconcile).
        var stopOthersOnTick = false
    }
    enum Message { case tick(String, TimerSource.Event), set([Timer]) }
    let initial: Model
    func start() -> (Model, [Never]) { (initial, []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .tick(let name, .tick(let t)):
            model.seen[name, default: []].append(.init(tick: t, at: monotonicMicros()))
            if model.stopOthersOnTick { model.timers.removeAll { $0.name != name } }
        case .tick(_, .failed): break
        case .set(let timers): model.timers = timers
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions(model.timers.map { t in
            t.repeats
                ? Subscription.every(t.interval, key: t.name, leeway: t.leeway) { .tick(t.name, $0) }
                : Subscription.after(t.interval, key: t.name, leeway: t.leeway) { .tick(t.name, $0) }
        })
    }
}

/// Raw sd-event timers on the same loop, as a program would make them
/// itself: one source each, re-armed from its schedule (due + interval) in
/// its callback, which records when it ran.
final class RawTimers {
    final class One {
        let interval: UInt64
        var due: UInt64
        var fired: [(due: UInt64, at: Int64)] = []
        var source: OpaquePointer?
        init(interval: UInt64, due: UInt64) { self.interval = interval; self.due = due }
    }
    var timers: [One] = []

    func add(_ loop: EventLoop, origin: UInt64, interval: Duration, accuracy: Duration) {
        let us = interval.usec
        let one = One(interval: us, due: origin + us)
        let r = sd_event_add_time(loop.handle, &one.source, CLOCK_MONOTONIC, one.due, accuracy.usec, { s, _, ud in
            let one = Unmanaged<One>.fromOpaque(ud!).takeUnretainedValue()
            one.fired.append((one.due, monotonicMicros()))
            one.due += one.interval
            sd_event_source_set_time(s, one.due)
            sd_event_source_set_enabled(s, Int32(SD_EVENT_ONESHOT))
            return 0
        }, Unmanaged.passUnretained(one).toOpaque())
        precondition(r >= 0)
        timers.append(one)
    }

    deinit { for t in timers { sd_event_source_disable_unref(t.source) } }
}

extension SystemdTests {
    /// Timers of one clock and accuracy share one sd-event source
    /// (`TimerQueue`); these hold them to what one sd-event source per
    /// timer does on the same loop.
    @Suite struct TimerQueues {
        /// Starts `timers` in a reconcile outside an iteration, so every
        /// timer's origin is the loop's time read here.
        func started(_ timers: [Named.Timer], stopOthersOnTick: Bool = false) throws -> (Harness<Named>, UInt64) {
            let h = try Harness(Named(initial: .init(timers: [], stopOthersOnTick: stopOthersOnTick)))
            _ = try h.loop.runOnce(timeout: .zero)
            let origin = h.loop.now()
            try h.runtime.send(.set(timers))
            #expect(h.loop.now() == origin)
            return (h, origin)
        }

        @Test func coalescedTimersFireNoEarlierThanRawSdEventAndWithinTheirAccuracy() throws {
            let live = EventSourceAccounting.live
            let fine: [Duration] = [.milliseconds(7), .milliseconds(11), .milliseconds(13), .milliseconds(17)]
            let coarse: [Duration] = [.milliseconds(20), .milliseconds(30)]
            let loose = Duration.milliseconds(15)
            let timers = fine.enumerated().map { Named.Timer(name: "f\($0.offset)", interval: $0.element) }
                + coarse.enumerated().map { Named.Timer(name: "c\($0.offset)", interval: $0.element, leeway: loose) }
            let (h, origin) = try started(timers)
            // Two accuracies: two sd-event sources for six timers (and the
            // runtime's wake-up eventfd).
            #expect(EventSourceAccounting.live == live + 3)
            let raw = RawTimers()
            for t in timers { raw.add(h.loop, origin: origin, interval: t.interval, accuracy: t.leeway) }
            try h.run(until: { raw.timers.allSatisfy { $0.fired.count >= 10 } && timers.allSatisfy { (h.runtime.model.seen[$0.name]?.count ?? 0) >= 10 } })
            for (i, t) in timers.enumerated() {
                let seen = h.runtime.model.seen[t.name]!
                let interval = Int64(t.interval.usec)
                // Every due time accounted for, none early.
                #expect(seen.reduce(0) { $0 + 1 + $1.tick.missed } == seen.last!.tick.sequence)
                let ours = seen.map { $0.at - (Int64(origin) + Int64($0.tick.sequence) * interval) }
                let theirs = raw.timers[i].fired.map { $0.at - Int64($0.due) }
                #expect(ours.allSatisfy { $0 >= 0 }, "\(t.name) early: \(ours)")
                #expect(theirs.allSatisfy { $0 >= 0 }, "raw \(t.name) early: \(theirs)")
                // Within the accuracy, as sd-event's own: the median tick
                // (a loaded machine may delay any one of them).
                let bound = Int64(t.leeway.usec) + 5_000
                #expect(ours.sorted()[ours.count / 2] <= bound, "\(t.name): \(ours) µs late")
                #expect(theirs.sorted()[theirs.count / 2] <= bound, "raw \(t.name): \(theirs) µs late")
            }
            _ = h.runtime.shutdown()
            #expect(EventSourceAccounting.live == live)
        }

        @Test func aBlockedLoopGivesOneTickPerTimerWhereRawSdEventDispatchesOnce() throws {
            // Three timers of one queue and their raw twins; the loop is
            // blocked for a little over five intervals after the first tick.
            let timers = (0..<3).map { Named.Timer(name: "t\($0)", interval: .milliseconds(50)) }
            let (h, origin) = try started(timers)
            let raw = RawTimers()
            for t in timers { raw.add(h.loop, origin: origin, interval: t.interval, accuracy: t.leeway) }
            try h.run(until: { timers.allSatisfy { h.runtime.model.seen[$0.name]?.count == 1 } && raw.timers.allSatisfy { $0.fired.count == 1 } })
            usleep(255_000)
            try h.run(until: { timers.allSatisfy { (h.runtime.model.seen[$0.name]?.count ?? 0) >= 2 } && raw.timers.allSatisfy { $0.fired.count >= 2 } })
            for (i, t) in timers.enumerated() {
                let seen = h.runtime.model.seen[t.name]!
                // Raw: the source dispatched once for the five due times.
                #expect(raw.timers[i].fired.count == 2)
                #expect(seen.map(\.tick) == [.init(sequence: 1, missed: 0), .init(sequence: 6, missed: 4)])
            }
            // Then each goes on from its schedule, not from the late wake-up.
            try h.run(until: { timers.allSatisfy { (h.runtime.model.seen[$0.name]?.count ?? 0) >= 3 } })
            for t in timers { #expect(h.runtime.model.seen[t.name]![2].tick == .init(sequence: 7, missed: 0)) }
        }

        @Test func aRetuneMovesOneTimerAndLeavesTheOthersOfItsQueueOnTheirSchedule() throws {
            let live = EventSourceAccounting.live
            let timers = [Named.Timer(name: "a", interval: .milliseconds(10)),
                          Named.Timer(name: "b", interval: .seconds(60)),
                          Named.Timer(name: "c", interval: .milliseconds(15))]
            let (h, origin) = try started(timers)
            #expect(EventSourceAccounting.live == live + 2)
            try h.run(until: { (h.runtime.model.seen["a"]?.count ?? 0) >= 2 })
            // b: 60 s → 20 ms (same leeway: its queue, one new interval from
            // its start); c: another leeway (another queue).
            let retuned = h.loop.now()
            try h.runtime.send(.set([timers[0], .init(name: "b", interval: .milliseconds(20)),
                                     .init(name: "c", interval: .milliseconds(15), leeway: .milliseconds(2))]))
            #expect(h.runtime.stats.retunes == 2 && h.runtime.stats.starts == 3 && h.runtime.stats.stops == 0)
            #expect(EventSourceAccounting.live == live + 3)
            try h.run(until: { ["a", "b", "c"].allSatisfy { (h.runtime.model.seen[$0]?.count ?? 0) >= 5 } })
            let m = h.runtime.model
            // a never changed: its schedule from its start.
            for s in m.seen["a"]! { #expect(s.at >= Int64(origin) + Int64(s.tick.sequence) * 10_000) }
            #expect(m.seen["a"]!.reduce(0) { $0 + 1 + $1.tick.missed } == m.seen["a"]!.last!.tick.sequence)
            // b: nothing fired before the retune; then due at origin + k·20 ms
            // (its last due time was its start: no tick yet).
            for s in m.seen["b"]! {
                #expect(s.at >= Int64(origin) + Int64(s.tick.sequence) * 20_000)
                #expect(s.at >= Int64(retuned))
            }
            // c keeps its schedule across the move: one new interval from its
            // last due time, never early.
            let c = m.seen["c"]!
            for pair in zip(c, c.dropFirst()) { #expect(pair.1.at > pair.0.at) }
            #expect(c.allSatisfy { $0.tick.sequence >= 1 })
            _ = h.runtime.shutdown()
            #expect(EventSourceAccounting.live == live)
        }

        @Test func moreTimersDueAtOnceThanOneDispatchTakesAreAllDeliveredOncePerDueTime() throws {
            // 600 timers with one interval: all due in the same iteration,
            // more than `TimerQueue.dispatchLimit` (256) per dispatch.
            let timers = (0..<600).map { Named.Timer(name: "t\($0)", interval: .milliseconds(100)) }
            let (h, origin) = try started(timers)
            try h.run(until: { timers.allSatisfy { (h.runtime.model.seen[$0.name]?.count ?? 0) >= 2 } }, timeout: .seconds(20))
            for t in timers {
                let seen = h.runtime.model.seen[t.name]!
                #expect(seen.first!.tick.sequence == 1 + seen.first!.tick.missed)
                #expect(seen.reduce(0) { $0 + 1 + $1.tick.missed } == seen.last!.tick.sequence)
                for s in seen { #expect(s.at >= Int64(origin) + Int64(s.tick.sequence) * 100_000) }
            }
        }

        @Test func timersDueInTheIterationOfTheTickThatStopsThemDoNotFire() throws {
            // Four timers of one queue, all due in the same iteration (the
            // loop blocked past their due time): the first tick's reconcile
            // stops the other three, due and not delivered; they never fire.
            let timers = (0..<4).map { Named.Timer(name: "t\($0)", interval: .milliseconds(20)) }
            let (h, _) = try started(timers, stopOthersOnTick: true)
            usleep(30_000)
            try h.run(until: { !h.runtime.model.seen.isEmpty })
            try h.run(for: .milliseconds(100))
            let m = h.runtime.model
            #expect(m.seen.count == 1, "\(m.seen.keys.sorted())")
            #expect(h.runtime.stats.droppedEvents == 0)
            #expect(h.driver.runningCount == 1)
        }

        @Test func queuesNoTimerUsesAreDroppedPastTheLimitAndTheOthersKeepTicking() throws {
            let live = EventSourceAccounting.live
            // 20 accuracies: 20 queues, each with its own sd-event source.
            let many = (0..<20).map { Named.Timer(name: "l\($0)", interval: .seconds(60), leeway: .microseconds(Int64(1 + $0))) }
            let ticking = Named.Timer(name: "tick", interval: .milliseconds(10))
            let (h, _) = try started(many + [ticking])
            #expect(EventSourceAccounting.live == live + 1 + 20)
            // They stop; a timer of yet another accuracy drops the queues no
            // timer uses (past 16), not the one "tick" runs on.
            try h.runtime.send(.set([ticking]))
            try h.runtime.send(.set([ticking, .init(name: "new", interval: .milliseconds(15), leeway: .microseconds(500))]))
            #expect(EventSourceAccounting.live == live + 1 + 2)
            try h.run(until: { (h.runtime.model.seen["tick"]?.count ?? 0) >= 3 && (h.runtime.model.seen["new"]?.count ?? 0) >= 2 })
            _ = h.runtime.shutdown()
            #expect(EventSourceAccounting.live == live)
        }

        @Test func aDebouncedPhaseAdvancedBeforeItsTimerFiresNeverDeliversAStalePhase() throws {
            // Twenty phases, each replacing the last's one-shot before it is
            // due (its stop takes it off the shared queue): only the last fires.
            struct P: Program {
                struct Model: Equatable { var phase = Phase(); var quiet: [Phase] = []; var stale = 0 }
                enum Message { case quiet(Phase), poke }
                func start() -> (Model, [Never]) { (Model(), []) }
                func update(_ m: inout Model, _ message: Message) -> [Never] {
                    switch message {
                    case .quiet(let p):
                        if m.phase.isCurrent(p) { m.quiet.append(p) } else { m.stale += 1 }
                    case .poke: m.phase.advance()
                    }
                    return []
                }
                func subscriptions(_ m: Model) -> Subscriptions<Message> {
                    let phase = m.phase
                    return Subscriptions { Subscription.debounce("d", phase: phase, after: .milliseconds(200), leeway: .microseconds(1)) { _ in .quiet(phase) } }
                }
            }
            let h = try Harness(P())
            for _ in 0..<20 {
                try h.runtime.send(.poke)
                try h.run(for: .milliseconds(2))
            }
            try h.run(until: { !h.runtime.model.quiet.isEmpty })
            try h.run(for: .milliseconds(60))
            #expect(h.runtime.model.quiet == [h.runtime.model.phase])
            #expect(h.runtime.model.stale == 0)
            #expect(h.runtime.stats.droppedEvents == 0)
        }
    }
}
