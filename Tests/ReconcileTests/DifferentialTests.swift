import TestSupport
import Reconcile
import Testing

/// One desired subscription as plain data: a timer (interval retunable, clock
/// restarts) or a feed (any topic change restarts).
struct Spec: Equatable {
    var isTimer: Bool
    var key: Int
    var interval: Int
    var clock: TimerSource.Clock
    var topic: String

    var id: SubscriptionID { isTimer ? SubscriptionID(TimerSource.self, key: key) : SubscriptionID(Feed.self, key: "f\(key)") }
    var configuration: AnyHashable {
        isTimer ? AnyHashable(TimerSource.Configuration(interval: .milliseconds(interval), clock: clock)) : AnyHashable(topic)
    }
    func subscription(tag: Int = 0) -> Subscription<Int> {
        isTimer
            ? .every(.milliseconds(Int64(interval)), key: key, clock: clock) { _ in tag }
            : .feed("f\(key)", topic: topic) { _ in tag }
    }

    static func random(using rng: inout SplitMix64, keys: Int = 40) -> Spec {
        Spec(isTimer: Bool.random(using: &rng), key: Int.random(in: 0..<keys, using: &rng),
             interval: [10, 20, 50].randomElement(using: &rng)!,
             clock: [.monotonic, .boottime].randomElement(using: &rng)!,
             topic: ["x", "y", "z"].randomElement(using: &rng)!)
    }
}

/// The obviously correct reconciler: a dictionary and a loop.
struct ReferenceReconciler {
    struct Active { var configuration: AnyHashable; var generation: Int }
    var active: [SubscriptionID: Active] = [:]
    var generation = 0

    mutating func reconcile(_ desired: [Spec]) -> Plan {
        var seen = Set<SubscriptionID>()
        var restarts: [Plan.Step] = [], retunes: [Plan.Step] = [], starts: [Plan.Step] = []
        var kept = 0
        var duplicates: [SubscriptionID] = []
        for d in desired {
            let id = d.id, c = d.configuration
            guard seen.insert(id).inserted else {
                duplicates.append(id)
                continue
            }
            if let a = active[id] {
                if a.configuration == c {
                    kept += 1
                } else if d.isTimer, let old = a.configuration.base as? TimerSource.Configuration,
                          TimerSource.canRetune(from: old, to: c.base as! TimerSource.Configuration) {
                    retunes.append(.retune(id, from: a.configuration, to: c))
                    active[id]!.configuration = c
                } else {
                    generation += 1
                    restarts.append(.restart(id, from: a.configuration, to: c))
                    active[id] = Active(configuration: c, generation: generation)
                }
            } else {
                generation += 1
                starts.append(.start(id, c))
                active[id] = Active(configuration: c, generation: generation)
            }
        }
        let gone = active.filter { !seen.contains($0.key) }.sorted { $0.value.generation < $1.value.generation }
        for (id, _) in gone { active[id] = nil }
        return Plan(steps: gone.map { .stop($0.key) } + restarts + retunes + starts, kept: kept, duplicates: duplicates)
    }
}

/// Random edits of a desired list: shifts, shuffles, duplicates, retunes,
/// restarts, insertions, removals, and unchanged sets built again.
func mutate(_ list: inout [Spec], using rng: inout SplitMix64) {
    switch Int.random(in: 0..<12, using: &rng) {
    case 0: // shift: insert at the front
        for _ in 0..<Int.random(in: 1...3, using: &rng) { list.insert(.random(using: &rng), at: 0) }
    case 1: // shift: remove from the front
        list.removeFirst(min(list.count, Int.random(in: 1...3, using: &rng)))
    case 2:
        list.shuffle(using: &rng)
    case 3: // duplicate an identity elsewhere, maybe with other parameters
        if var s = list.randomElement(using: &rng) {
            if Bool.random(using: &rng) { s.interval = 99 }
            list.insert(s, at: Int.random(in: 0...list.count, using: &rng))
        }
    case 4: // retune: intervals of some timers
        for i in list.indices where Int.random(in: 0..<4, using: &rng) == 0 { list[i].interval = [10, 20, 50].randomElement(using: &rng)! }
    case 5: // restart: clocks and topics
        for i in list.indices where Int.random(in: 0..<5, using: &rng) == 0 {
            list[i].clock = list[i].clock == .monotonic ? .boottime : .monotonic
            list[i].topic = ["x", "y", "z"].randomElement(using: &rng)!
        }
    case 6: // rotate
        if list.count > 1 {
            let k = Int.random(in: 1..<list.count, using: &rng)
            list = Array(list[k...] + list[..<k])
        }
    case 7: // remove some
        list.removeAll { _ in Int.random(in: 0..<6, using: &rng) == 0 }
    case 8: // append some
        for _ in 0..<Int.random(in: 1...6, using: &rng) { list.append(.random(using: &rng)) }
    case 9: // reverse a run
        if list.count > 2 {
            let a = Int.random(in: 0..<list.count - 1, using: &rng), b = Int.random(in: a + 1..<list.count, using: &rng)
            list[a...b].reverse()
        }
    case 10:
        if Int.random(in: 0..<8, using: &rng) == 0 { list = [] }
    default: // unchanged (built again below)
        break
    }
    if list.count > 80 { list.removeLast(list.count - 80) }
}

@Suite struct DifferentialTests {
    /// The reconciler's plan equals the reference model's at every step:
    /// same steps in the same order, same kept count, same duplicates.
    @Test(arguments: Array(1...10) as [UInt64])
    func plansEqualTheReferenceModelStepByStep(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        let reconciler = Reconciler<Int>()
        var reference = ReferenceReconciler()
        var list: [Spec] = []
        for step in 0..<3_000 {
            mutate(&list, using: &rng)
            let plan = reconciler.reconcile(Subscriptions(list.map { $0.subscription(tag: step) }))
            let expected = reference.reconcile(list)
            #expect(plan == expected, "seed \(seed) step \(step)")
            if plan != expected { return }
            #expect(reconciler.count == reference.active.count)
        }
        let active = reference.active.sorted { $0.value.generation < $1.value.generation }.map(\.key)
        #expect(reconciler.activeIDs == active)
    }

    /// Starts reuse the entries of stopped sources that nothing holds; a
    /// plan the caller still holds keeps the entries it names, so its steps
    /// read the same later (plans are kept at random for up to 8 steps).
    @Test(arguments: Array(1...10) as [UInt64])
    func heldPlansReadTheSameWhileLaterStartsReuseEntries(seed: UInt64) {
        var rng = SplitMix64(seed: seed &+ 1_000)
        let reconciler = Reconciler<Int>()
        var reference = ReferenceReconciler()
        var list: [Spec] = []
        var held: [(plan: Plan, text: String, step: Int)] = []
        for step in 0..<3_000 {
            mutate(&list, using: &rng)
            let plan = reconciler.reconcile(Subscriptions(list.map { $0.subscription(tag: step) }))
            let expected = reference.reconcile(list)
            #expect(plan == expected, "seed \(seed) step \(step)")
            if plan != expected { return }
            if Bool.random(using: &rng) { held.append((plan, plan.description, step)) }
            if held.count > 8 || (!held.isEmpty && Bool.random(using: &rng)) {
                let h = held.removeFirst()
                #expect(h.plan.description == h.text, "seed \(seed): plan of step \(h.step) read at step \(step)")
            }
        }
        for h in held { #expect(h.plan.description == h.text, "seed \(seed): plan of step \(h.step)") }
        let active = reference.active.sorted { $0.value.generation < $1.value.generation }.map(\.key)
        #expect(reconciler.activeIDs == active)
    }
}
