import TestSupport
import Reconcile
import ReconcileTesting
import Testing

/// A program whose desired set is whatever the last message said.
struct Scripted: Program {
    struct Entry: Equatable, Sendable {
        var key: Int
        var isTimer: Bool
        var interval: Int
        var clock: TimerSource.Clock
        var topic: String
    }
    struct Model: Equatable {
        var entries: [Entry] = []
        var phase = Phase()
        var events = 0
    }
    enum Message: Sendable { case set([Entry]), event(Phase) }

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .set(let e):
            model.entries = e
            model.phase.advance()
        case .event(let p):
            if model.phase.isCurrent(p) { model.events += 1 }
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        let phase = model.phase
        return Subscriptions(model.entries.map { e in
            e.isTimer
                ? Subscription.every(.milliseconds(e.interval), key: e.key, clock: e.clock) { _ in .event(phase) }
                : Subscription.feed("f\(e.key)", topic: e.topic) { _ in .event(phase) }
        })
    }
}

@Suite struct PropertyTests {
    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func activeSetAlwaysEqualsDesiredSet(seed: UInt64) throws {
        var rng = SplitMix64(seed: seed)
        let driver = VirtualDriver()
        let rt = Runtime(Scripted(), driver: driver, inboxCapacity: 100_000)
        try rt.start()
        var posters: [EventPoster] = []
        for _ in 0..<2_000 {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0..<6:
                var entries: [Scripted.Entry] = []
                for _ in 0..<Int.random(in: 0..<25, using: &rng) {
                    entries.append(.init(
                        key: Int.random(in: 0..<30, using: &rng), isTimer: Bool.random(using: &rng),
                        interval: [10, 20, 50].randomElement(using: &rng)!,
                        clock: [.monotonic, .boottime].randomElement(using: &rng)!,
                        topic: ["x", "y"].randomElement(using: &rng)!))
                }
                try rt.send(.set(entries))
            case 6, 7:
                driver.advance(by: .milliseconds(Int64.random(in: 1...60, using: &rng)))
            case 8:
                if let id = driver.runningIDs.randomElement(using: &rng) {
                    if id.kind == SourceKind(Feed.self) {
                        driver.emit(Feed.Event.item(1), to: id)
                    } else if let p = driver.poster(for: id) {
                        posters.append(p)
                    }
                }
            default:
                for p in posters { p.post(TimerSource.Event.tick(.init(sequence: 0, missed: 0))) }
                posters.removeAll()
                driver.runUntilIdle()
            }
            // The active set equals the desired set (first wins on duplicates).
            var desired: [SubscriptionID: AnyHashable] = [:]
            for s in Scripted().subscriptions(rt.model).items where desired[s.id] == nil {
                desired[s.id] = s.configuration
            }
            #expect(driver.running.mapValues(\.configuration) == desired)
            #expect(Set(rt.activeIDs) == Set(desired.keys))
        }
        // Every activation started once and stopped at most once.
        var starts: [Activation: Int] = [:], stops: [Activation: Int] = [:]
        for call in driver.log {
            switch call {
            case .start(_, let a): starts[a, default: 0] += 1
            case .stop(_, let a): stops[a, default: 0] += 1
            case .retune(_, let a): #expect(starts[a] == 1 && stops[a] == nil)
            }
        }
        #expect(starts.values.allSatisfy { $0 == 1 })
        #expect(stops.values.allSatisfy { $0 == 1 })
        #expect(Set(stops.keys).isSubset(of: Set(starts.keys)))
        // No event from a stopped activation reached the runtime.
        #expect(rt.stats.droppedEvents == 0)
        #expect(driver.contractViolations.isEmpty)
        #expect(rt.stats.messages > 0 && rt.stats.retunes > 0 && rt.stats.restarts > 0)
    }
}
