import TestSupport
import Reconcile
import ReconcileTesting
import Testing

/// Counts how often group bodies run.
final class BuildCounter {
    var builds = 0
    /// Keyed bodies given another key than their group's.
    var wrongKeys = 0
}

/// `list` cut into groups (some nested), each group's input its own specs:
/// a pure body, so a grouped set must reconcile exactly like the flat list.
func grouped(_ list: [Spec], cuts: [Int], nestEvery: Int, counter: BuildCounter) -> Subscriptions<Int> {
    var parts: [[Spec]] = []
    var start = 0
    for c in cuts.sorted() where c > start && c < list.count {
        parts.append(Array(list[start..<c]))
        start = c
    }
    parts.append(Array(list[start...]))
    var set = Subscriptions<Int>.none
    set = Subscriptions {
        for (n, part) in parts.enumerated() {
            if n % 3 == 2 {
                part.map { $0.subscription() }          // plain, between groups
            } else if nestEvery > 0 && n % nestEvery == 0 {
                Subscriptions.group("outer\(n)", part) { specs in
                    let _ = counter.builds += 1
                    let half = specs.count / 2
                    Subscriptions.group("inner", Array(specs[..<half])) { inner in
                        let _ = counter.builds += 1
                        inner.map { $0.subscription() }
                    }
                    specs[half...].map { $0.subscription() }
                }
            } else if n % 2 == 1 {
                // The keyed form: the body is given its key (captures nothing).
                Subscriptions.group(n, part) { key, specs in
                    let _ = counter.builds += 1
                    let _ = counter.wrongKeys += key == n ? 0 : 1
                    specs.map { $0.subscription() }
                }
            } else {
                Subscriptions.group(n, part) { specs in
                    let _ = counter.builds += 1
                    specs.map { $0.subscription() }
                }
            }
        }
    }
    return set
}

@Suite struct GroupTests {
    /// Groups change cost, never the plan: over random edits and random
    /// regroupings (subscriptions moving between groups, groups appearing
    /// and vanishing, nesting), every plan equals the reference model's on
    /// the flattened list. With `building`, each set is built inside
    /// `reconcile(building:)`, as the runtime does (unchanged groups reuse
    /// their last nodes).
    @Test(arguments: Array(1...10) as [UInt64], [false, true])
    func groupedSetsPlanLikeTheFlatReference(seed: UInt64, building: Bool) {
        var rng = SplitMix64(seed: seed)
        let reconciler = Reconciler<Int>()
        var reference = ReferenceReconciler()
        let counter = BuildCounter()
        var list: [Spec] = []
        var cuts: [Int] = []
        for step in 0..<3_000 {
            mutate(&list, using: &rng)
            if Int.random(in: 0..<4, using: &rng) == 0 {
                cuts = (0..<Int.random(in: 0...6, using: &rng)).map { _ in Int.random(in: 0...max(1, list.count), using: &rng) }
            }
            let build = { grouped(list, cuts: cuts, nestEvery: Int(seed % 3), counter: counter) }
            let plan = building ? reconciler.reconcile(building: build) : reconciler.reconcile(build())
            let expected = reference.reconcile(list)
            #expect(plan == expected, "seed \(seed) step \(step)")
            if plan != expected { return }
        }
        let active = reference.active.sorted { $0.value.generation < $1.value.generation }.map(\.key)
        #expect(reconciler.activeIDs == active)
        #expect(counter.wrongKeys == 0)
    }

    @Test func unchangedGroupIsNeitherBuiltNorDiffedAndCountsAsKept() {
        let counter = BuildCounter()
        func set(_ a: Int, _ b: Int) -> Subscriptions<Int> {
            Subscriptions {
                Subscriptions.group("a", a) { n in
                    let _ = counter.builds += 1
                    (0..<n).map { i in Subscription.every(.seconds(1), key: "a\(i)") { _ in i } }
                }
                Subscriptions.group("b", b) { n in
                    let _ = counter.builds += 1
                    (0..<n).map { i in Subscription.every(.seconds(1), key: "b\(i)") { _ in i } }
                }
            }
        }
        let r = Reconciler<Int>()
        #expect(r.reconcile(set(3, 2)).steps.count == 5)
        #expect(counter.builds == 2)
        let plan = r.reconcile(set(3, 3))
        #expect(counter.builds == 3)
        #expect(plan.steps.map(\.description) == ["start timer:b2: every 1s"])
        #expect(plan.kept == 5)
    }

    @Test func subscriptionMovingBetweenGroupsIsKeptNotRestarted() {
        func set(_ inA: Bool) -> Subscriptions<Int> {
            Subscriptions {
                Subscriptions.group("a", inA) { inA in
                    if inA { Subscription.every(.seconds(1), key: "x") { _ in 1 } }
                }
                Subscriptions.group("b", !inA) { inB in
                    if inB { Subscription.every(.seconds(2), key: "x") { _ in 2 } }
                }
            }
        }
        let r = Reconciler<Int>()
        r.reconcile(set(true))
        let plan = r.reconcile(set(false))
        #expect(plan.steps.map(\.description) == ["retune timer:x: every 1s -> every 2s"])
    }

    @Test func duplicateAcrossGroupsIsReportedAndTheFirstInDocumentOrderWins() {
        func set(_ v: Int) -> Subscriptions<Int> {
            Subscriptions {
                Subscriptions.group("a", v) { v in Subscription.every(.seconds(Int64(v)), key: "x") { _ in 1 } }
                Subscriptions.group("b", 0) { _ in Subscription.every(.seconds(9), key: "x") { _ in 2 } }
            }
        }
        let r = Reconciler<Int>()
        let first = r.reconcile(set(1))
        #expect(first.steps.map(\.description) == ["start timer:x: every 1s"])
        #expect(first.duplicates == [SubscriptionID(TimerSource.self, key: "x")])
        // Group b is skipped (its input is unchanged) and still reports its duplicate.
        let second = r.reconcile(set(2))
        #expect(second.steps.map(\.description) == ["retune timer:x: every 1s -> every 2s"])
        #expect(second.duplicates == [SubscriptionID(TimerSource.self, key: "x")])
    }

    @Test func skippedGroupDeliversThroughTheCurrentMapping() throws {
        struct Parent: Program {
            struct Model { var phase = 0; var received: [Message] = [] }
            enum Message: Equatable { case next, child(phase: Int, Int) }
            func start() -> (Model, [Never]) { (Model(), []) }
            func update(_ model: inout Model, _ message: Message) -> [Never] {
                if message == .next { model.phase += 1 } else { model.received.append(message) }
                return []
            }
            func subscriptions(_ model: Model) -> Subscriptions<Message> {
                let phase = model.phase
                let child = Subscriptions<Int>.group("child", 0) { _ in
                    Subscription.every(.seconds(1), key: "c") { _ in 7 }
                }
                return child.map { Message.child(phase: phase, $0) }
            }
        }
        let driver = VirtualDriver()
        let rt = Runtime(Parent(), driver: driver)
        try rt.start()
        try rt.send(.next)
        try rt.send(.next)
        #expect(rt.stats.starts == 1)
        // The last reconcile kept the skipped group: nothing to do.
        #expect(rt.lastPlan.isEmpty && rt.lastPlan.kept == 1)
        driver.advance(by: .seconds(1))
        #expect(rt.model.received == [.child(phase: 2, 7)])
    }

    @Test func verifyingGroupsReportsABodyThatReadsMoreThanItsInput() throws {
        final class Leak { var interval: Int64 = 1 }
        let leak = Leak()
        func set() -> Subscriptions<Int> {
            Subscriptions.group("g", 0) { _ in Subscription.every(.seconds(leak.interval), key: "t") { _ in 1 } }
        }
        let r = Reconciler<Int>()
        r.verifiesGroups = true
        #expect(r.reconcile(set()).groupsNotPure.isEmpty)
        #expect(r.reconcile(set()).groupsNotPure.isEmpty)
        leak.interval = 2
        let plan = r.reconcile(set())
        #expect(plan.groupsNotPure == ["g"])
        #expect(plan.steps.map(\.description) == ["retune timer:t: every 1s -> every 2s"])
        // Without verification the same impure body is skipped.
        let quiet = Reconciler<Int>()
        leak.interval = 1
        quiet.reconcile(set())
        leak.interval = 5
        #expect(quiet.reconcile(set()).isEmpty)
    }

    @Test func keyedBodyIsGivenItsKeyAndSkippedWhenItsInputIsUnchanged() {
        let counter = BuildCounter()
        var keys: [String] = []
        func set(_ a: Int, _ b: Int) -> Subscriptions<Int> {
            Subscriptions {
                for (name, n) in [("a", a), ("b", b)] {
                    Subscriptions.group(name, n) { key, n in
                        let _ = counter.builds += 1
                        let _ = keys.append(key)
                        (0..<n).map { i in Subscription.every(.seconds(1), key: "\(key)\(i)") { _ in i } }
                    }
                }
            }
        }
        let r = Reconciler<Int>()
        #expect(r.reconcile(set(2, 1)).steps.count == 3)
        #expect(keys == ["a", "b"])
        let plan = r.reconcile(set(2, 2))
        #expect(keys == ["a", "b", "b"])
        #expect(plan.steps.map(\.description) == ["start timer:b1: every 1s"])
        #expect(plan.kept == 3)
        #expect(r.reconcile(set(2, 2)).isEmpty)
        #expect(counter.builds == 3)
    }

    /// A set holds one part inline and several in an array; the builder
    /// moves a `for` loop's sets into one. Whatever the shape (empty sets,
    /// single subscriptions, arrays, groups, `if`, nested sets), the items
    /// come out in document order and reconcile like the flat list.
    @Test func setsOfOneOrManyPartsKeepDocumentOrder() {
        func timer(_ k: String) -> Subscription<Int> { .every(.seconds(1), key: k) { _ in 0 } }
        for shape in 0..<32 {
            let withEmpty = shape & 1 != 0, withGroup = shape & 2 != 0, withSingle = shape & 4 != 0
            let nested = shape & 8 != 0, loops = shape & 16 != 0 ? 3 : 1
            var expected: [String] = []
            if withSingle { expected.append("s") }
            for i in 0..<loops {
                if withGroup { expected += ["g\(i)a", "g\(i)b"] }
                expected.append("p\(i)")
            }
            if nested { expected += ["n", "m"] }
            let set = Subscriptions<Int> {
                if withEmpty { Subscriptions<Int>.none }
                if withSingle { timer("s") }
                for i in 0..<loops {
                    if withGroup {
                        Subscriptions.group(i, "g\(i)") { prefix in [timer(prefix + "a"), timer(prefix + "b")] }
                    }
                    if withEmpty { [Subscription<Int>]() }
                    timer("p\(i)")
                }
                if nested {
                    Subscriptions { timer("n") }
                    Subscriptions([timer("m")])
                }
            }
            let ids = expected.map { SubscriptionID(TimerSource.self, key: $0) }
            #expect(set.ids == ids, "shape \(shape)")
            #expect(set.map { $0 + 1 }.ids == ids, "shape \(shape)")
            let r = Reconciler<Int>()
            #expect(r.reconcile(set).steps.count == ids.count, "shape \(shape)")
            #expect(r.activeIDs == ids, "shape \(shape)")
            #expect(r.reconcile(set).isEmpty, "shape \(shape)")
        }
    }

    /// Nesting makes the skip sublinear: one change among 32 × 32 groups
    /// builds the changed outer group's body and the changed inner group's,
    /// nothing else, and the plan is the one change.
    @Test func nestedGroupsBuildOnlyThePathToTheChange() {
        let counter = BuildCounter()
        func set(_ versions: [[Int]]) -> Subscriptions<Int> {
            Subscriptions {
                for (o, inner) in versions.enumerated() {
                    Subscriptions.group(o, inner) { o, inner in
                        let _ = counter.builds += 1
                        for (i, v) in inner.enumerated() {
                            Subscriptions.group(i, v) { i, v in
                                let _ = counter.builds += 1
                                Subscription.every(.seconds(Int64(1 + v)), key: o * 32 + i) { _ in 0 }
                            }
                        }
                    }
                }
            }
        }
        var versions = Array(repeating: Array(repeating: 0, count: 32), count: 32)
        let r = Reconciler<Int>()
        #expect(r.reconcile(set(versions)).steps.count == 1_024)
        #expect(counter.builds == 32 + 1_024)
        counter.builds = 0
        versions[17][5] += 1
        let plan = r.reconcile(set(versions))
        #expect(counter.builds == 2)
        #expect(plan.steps.map(\.description) == ["retune timer:549: every 1s -> every 2s"])
        #expect(plan.kept == 1_023)
        counter.builds = 0
        #expect(r.reconcile(set(versions)).isEmpty)
        #expect(counter.builds == 0)
    }

    /// Groups whose inputs rarely change, reordered, removed, inserted and
    /// duplicated (the same key twice), flat or under an outer group: the
    /// skipped ones count as kept wherever they moved, and every plan is
    /// the flat reference's. At least a quarter of the groups are skipped
    /// (positional or not). With `building`, as above.
    @Test(arguments: Array(1...6) as [UInt64], [false, true])
    func movedGroupsAreSkippedAndPlanLikeTheFlatReference(seed: UInt64, building: Bool) {
        var rng = SplitMix64(seed: seed)
        let reconciler = Reconciler<Int>()
        var reference = ReferenceReconciler()
        let counter = BuildCounter()
        // Group k's specs: fixed but for a version that changes now and then.
        var versions = Array(repeating: 0, count: 10)
        func specs(_ k: Int, _ v: Int) -> [Spec] {
            (0..<3).map { i in
                Spec(isTimer: true, key: k * 10 + i, interval: i == 0 ? [10, 20, 50][v % 3] : 10, clock: .monotonic, topic: "")
            }
        }
        var order = Array(0..<10)
        var walks = 0
        for step in 0..<600 {
            switch Int.random(in: 0..<6, using: &rng) {
            case 0: order.shuffle(using: &rng)
            case 1: if !order.isEmpty { order.remove(at: Int.random(in: 0..<order.count, using: &rng)) }
            case 2: order.insert(Int.random(in: 0..<10, using: &rng), at: Int.random(in: 0...order.count, using: &rng))
            case 3: versions[Int.random(in: 0..<10, using: &rng)] += 1
            case 4: if order.count > 1 { order.swapAt(0, order.count - 1) }
            default: break
            }
            let nested = step % 50 >= 25
            let current = order, vs = versions
            func inner() -> Subscriptions<Int> {
                Subscriptions<Int> {
                    for k in current {
                        Subscriptions.group(k, vs[k]) { k, v in
                            let _ = counter.builds += 1
                            specs(k, v).map { $0.subscription() }
                        }
                    }
                }
            }
            let build = { nested ? Subscriptions.group("outer", step) { _ in inner() } : inner() }
            walks += current.count
            let plan = building ? reconciler.reconcile(building: build) : reconciler.reconcile(build())
            let expected = reference.reconcile(current.flatMap { specs($0, vs[$0]) })
            #expect(plan == expected, "seed \(seed) step \(step)")
            if plan != expected { return }
        }
        // Groups with a duplicate key or duplicate subscriptions are always
        // built; the others are skipped unless their version changed.
        #expect(counter.builds * 4 < walks * 3)
    }
}
