import Reconcile
import ReconcileSystemd
import Testing

/// A debounce on the real loop, as a daemon's own test would run it.
private struct Saver: Program {
    struct Model: Equatable { var dirty = false; var saves = 0; var phase = Phase() }
    enum Message { case edited, quiet(Phase) }

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .edited:
            model.dirty = true
            model.phase.advance()
        case .quiet(let p):
            guard model.phase.isCurrent(p) else { break }
            model.dirty = false
            model.saves += 1
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            if model.dirty {
                let phase = model.phase
                Subscription.debounce("save", phase: phase, after: .milliseconds(20)) { _ in .quiet(phase) }
            }
        }
    }
}

extension SystemdTests {
    @Suite struct LoopTesterTests {
        @Test func runsAProgramOnTheRealLoopUntilItsModelSaysSo() throws {
            let t = try LoopTester(Saver())
            try t.runtime.send(.edited)
            try t.runtime.send(.edited)
            #expect(try t.run(until: { $0.saves == 1 }, timeout: .seconds(5)))
            #expect(!t.model.dirty)
            // Nothing else fires: the first phase's timer was stopped.
            try t.run(for: .milliseconds(60))
            #expect(t.model.saves == 1)
        }

        @Test func aWaitThatIsNotMetReturnsFalseAtItsDeadline() throws {
            let t = try LoopTester(Saver())
            let started = ContinuousClock.now
            #expect(try !t.run(until: { $0.saves > 0 }, timeout: .milliseconds(100)))
            let waited = ContinuousClock.now - started
            #expect(waited >= .milliseconds(100) && waited < .seconds(3))
        }

        @Test func shutdownStopsEverySourceOnceAndIsIdempotent() throws {
            let t = try LoopTester(Saver())
            try t.runtime.send(.edited)
            let report = t.shutdown()
            #expect(report.stopped.count == 1)
            #expect(t.shutdown().stopped.count == 1)
            #expect(throws: RuntimeError.self) { try t.runtime.send(.edited) }
        }
    }
}
