@testable import Reconcile
import TestSupport
import ReconcileTesting
import Testing

/// The group nodes of a set's top level, in order.
private func groupNodes<M>(_ set: Subscriptions<M>) -> [ObjectIdentifier] {
    set.parts.compactMap { part in
        if case .group(let node) = part { return ObjectIdentifier(node) }
        return nil
    }
}

/// Groups keyed `keys`, group `k`'s input `inputs[k]`, one timer each whose
/// interval is its input.
private func timerGroups(_ keys: [Int], _ inputs: [Int: Int]) -> Subscriptions<Int> {
    Subscriptions {
        for k in keys {
            Subscriptions.group(k, inputs[k, default: 0]) { v in
                Subscription<Int>.every(.seconds(1 + v), key: k) { _ in k }
            }
        }
    }
}

/// The sets a program built, kept for the test to look at.
private final class BuiltSets: @unchecked Sendable {
    var sets: [Subscriptions<Int>] = []
}

/// A program of three groups whose inputs its messages set.
private struct ThreeGroups: Program {
    let built: BuiltSets
    func start() -> ([Int], [Never]) { ([0, 0, 0], []) }
    struct SetInput { var group: Int; var input: Int }
    func update(_ model: inout [Int], _ message: SetInput) -> [Never] {
        model[message.group] = message.input
        return []
    }
    func subscriptions(_ model: [Int]) -> Subscriptions<SetInput> {
        let set = Subscriptions<Int> {
            for g in model.indices {
                Subscriptions.group(g, model[g]) { g, v in Subscription<Int>.every(.seconds(1 + v), key: g) { _ in g } }
            }
        }
        built.sets.append(set)
        return set.map { SetInput(group: $0, input: -1) }
    }
}

@Suite struct GroupReuseTests {
    /// The runtime builds its program's set for reuse.
    @Test func theRuntimeOffersItsProgramTheLastNodes() throws {
        let built = BuiltSets()
        let runtime = Runtime(ThreeGroups(built: built), driver: VirtualDriver())
        try runtime.start()
        try runtime.send(.init(group: 1, input: 4))
        #expect(runtime.lastPlan.steps.map(\.outcome) == ["retune"])
        #expect(built.sets.count == 2)
        let (first, second) = (groupNodes(built.sets[0]), groupNodes(built.sets[1]))
        #expect(second[0] == first[0] && second[1] != first[1] && second[2] == first[2])
    }

    /// Built for the reconciler, a group whose key and input are unchanged
    /// is its last node again (no new node): in its place, after a group
    /// removed before it, and after one inserted before it. A changed input,
    /// a new key, or a set built outside `reconcile(building:)` get new nodes.
    @Test func unchangedGroupsAreGivenTheirLastNodes() {
        let r = Reconciler<Int>()
        var keys = [10, 11, 12, 13]
        var inputs: [Int: Int] = [:]
        var built = Subscriptions<Int>.none
        func reconcile() -> Plan { r.reconcile(building: { built = timerGroups(keys, inputs); return built }) }
        #expect(reconcile().steps.count == 4)
        let first = Dictionary(uniqueKeysWithValues: zip(keys, groupNodes(built)))

        inputs[11] = 5
        var plan = reconcile()
        #expect(plan.steps.map(\.outcome) == ["retune"])
        var now = groupNodes(built)
        #expect(now[0] == first[10] && now[2] == first[12] && now[3] == first[13])
        #expect(now[1] != first[11])
        let eleven = now[1]

        keys.removeFirst()                         // 11, 12, 13: each found one place on
        plan = reconcile()
        #expect(plan.steps.map(\.outcome) == ["stop"] && plan.kept == 3)
        now = groupNodes(built)
        #expect(now == [eleven, first[12], first[13]])

        keys.insert(9, at: 0)                      // 9 is new; 11, 12, 13 found in place again
        plan = reconcile()
        #expect(plan.steps.map(\.outcome) == ["start"] && plan.kept == 3)
        #expect(Array(groupNodes(built).dropFirst()) == [eleven, first[12], first[13]])

        // Built outside the reconciler, nothing is offered.
        let outside = timerGroups(keys, inputs)
        #expect(Set(groupNodes(outside)).isDisjoint(with: groupNodes(built)))
        #expect(r.reconcile(outside).kept == 4)
    }

    /// Groups nested in a group that is built are offered that group's last
    /// children.
    @Test func nestedGroupsAreOfferedTheirParentsLastChildren() {
        let r = Reconciler<Int>()
        var outerInput = 0
        var innerInputs = [0, 0, 0]
        var inner: [ObjectIdentifier] = []
        func set() -> Subscriptions<Int> {
            Subscriptions.group("outer", outerInput) { _ in
                let nested = Subscriptions<Int> {
                    for k in 0..<3 {
                        Subscriptions.group(k, innerInputs[k]) { v in Subscription<Int>.every(.seconds(1 + v), key: k) { _ in k } }
                    }
                }
                let _ = inner = groupNodes(nested)
                nested
            }
        }
        r.reconcile(building: set)
        let first = inner
        #expect(first.count == 3)
        // The outer group's input changes (its body reads the inner inputs
        // too: it is rebuilt), one inner input changes: the other two
        // inner groups are their last nodes.
        outerInput = 1
        innerInputs[2] = 7
        let plan = r.reconcile(building: set)
        #expect(plan.steps.map(\.outcome) == ["retune"])
        #expect(inner[0] == first[0] && inner[1] == first[1] && inner[2] != first[2])
    }

    /// Verifying groups needs the new bodies: nothing is reused.
    @Test func verifyingGroupsReusesNothing() {
        let r = Reconciler<Int>()
        r.verifiesGroups = true
        var built = Subscriptions<Int>.none
        r.reconcile(building: { built = timerGroups([1, 2], [:]); return built })
        let first = groupNodes(built)
        #expect(r.reconcile(building: { built = timerGroups([1, 2], [:]); return built }).kept == 2)
        #expect(Set(first).isDisjoint(with: groupNodes(built)))
    }

    /// A task made while the set is built inherits the binding; it is
    /// refused (it could run on another thread, after the reconcile). And a
    /// binding kept past its reconcile is refused in the very task that made
    /// it (what a task running at a finished task's address would see).
    @Test func aTaskMadeWhileBuildingIsOfferedNothing() async {
        let r = Reconciler<Int>()
        var built = Subscriptions<Int>.none
        r.reconcile(building: { built = timerGroups([1], [:]); return built })
        let last = groupNodes(built)
        var task: Task<(inherited: Bool, offered: Bool, node: ObjectIdentifier?), Never>?
        var kept: GroupReuse.Binding?
        r.reconcile(building: {
            kept = GroupReuse.current
            #expect(GroupReuse.active() != nil)
            task = Task { (GroupReuse.current != nil, GroupReuse.active() != nil, groupNodes(timerGroups([1], [:])).first) }
            built = timerGroups([1], [:])
            return built
        })
        #expect(groupNodes(built) == last)          // the reconcile's own build reuses
        let seen = await task?.value
        #expect(seen?.inherited == true)
        #expect(seen?.offered == false)
        #expect(seen?.node != nil && seen?.node != last.first)
        #expect(kept.map(GroupReuse.accepts) == false)
    }

    /// Changed inputs keep their places: the groups after two changed ones,
    /// after a removal and a change, and after two removals are their last
    /// nodes (the last by a lookup of the key).
    @Test func groupsAfterChangesAndRemovalsFindTheirPlaces() {
        let r = Reconciler<Int>()
        var keys = Array(0..<8)
        var inputs: [Int: Int] = [:]
        var built = Subscriptions<Int>.none
        func reconcile() -> Plan { r.reconcile(building: { built = timerGroups(keys, inputs); return built }) }
        func nodes() -> [Int: ObjectIdentifier] { Dictionary(uniqueKeysWithValues: zip(keys, groupNodes(built))) }
        _ = reconcile()
        var last = nodes()
        func reused() -> [Int] { let now = nodes(); return keys.filter { now[$0] == last[$0] } }

        inputs[1] = 1; inputs[2] = 1                   // two changed, side by side
        #expect(reconcile().steps.map(\.outcome) == ["retune", "retune"])
        #expect(reused() == [0, 3, 4, 5, 6, 7])
        last = nodes()

        keys.remove(at: 1); inputs[2] = 2              // one removed, the next changed
        #expect(reconcile().steps.count == 2)
        #expect(reused() == [0, 3, 4, 5, 6, 7])
        last = nodes()

        keys.removeSubrange(1...2)                     // two removed
        #expect(reconcile().steps.map(\.outcome) == ["stop", "stop"])
        #expect(reused() == [0, 4, 5, 6, 7])
    }

    /// A group whose subtree had duplicates is always built anew, as
    /// without reuse; the groups after it still find their places.
    @Test func aGroupWithDuplicatesIsNotReused() {
        let r = Reconciler<Int>()
        var built = Subscriptions<Int>.none
        func set() -> Subscriptions<Int> {
            Subscriptions {
                Subscriptions.group("dup", 0) { _ in
                    Subscription<Int>.every(.seconds(1), key: "d") { _ in 0 }
                    Subscription<Int>.every(.seconds(1), key: "d") { _ in 1 }
                }
                Subscriptions.group("plain", 0) { _ in Subscription<Int>.every(.seconds(1), key: "p") { _ in 2 } }
            }
        }
        #expect(r.reconcile(building: { built = set(); return built }).duplicates.count == 1)
        let first = groupNodes(built)
        #expect(r.reconcile(building: { built = set(); return built }).duplicates.count == 1)
        let second = groupNodes(built)
        #expect(second[0] != first[0] && second[1] == first[1])
    }

    /// A reconciler building inside another's build is offered only its
    /// own last nodes: none on its first reconcile, then its own.
    @Test func aReconcilerInsideAnothersBuildIsOfferedOnlyItsOwn() {
        let outer = Reconciler<Int>(), inner = Reconciler<Int>()
        var outerSet = Subscriptions<Int>.none, innerSet = Subscriptions<Int>.none
        var innerNodes: [[ObjectIdentifier]] = []
        func reconcile(withInner: Bool) {
            outer.reconcile(building: {
                outerSet = timerGroups([1, 2], [:])
                if withInner {
                    inner.reconcile(building: { innerSet = timerGroups([1, 2], [:]); return innerSet })
                    innerNodes.append(groupNodes(innerSet))
                }
                return outerSet
            })
        }
        reconcile(withInner: false)
        let outerFirst = groupNodes(outerSet)
        reconcile(withInner: true)                  // the inner one's first reconcile, inside the outer's binding
        #expect(groupNodes(outerSet) == outerFirst)
        #expect(Set(innerNodes[0]).isDisjoint(with: outerFirst))
        reconcile(withInner: true)                  // its second: its own nodes
        #expect(groupNodes(outerSet) == outerFirst)
        #expect(innerNodes[1] == innerNodes[0])
    }

    /// A new second group with the key and input of an existing one is
    /// given a node of its own, not the first's (issue 19, item 13): under
    /// `reconcile(building:)` its timer starts and nothing is a duplicate,
    /// as under `reconcile(_:)`.
    @Test func aNewSecondOccurrenceOfAKeyIsNotHandedTheFirstsNode() {
        func set(_ bodies: [String]) -> Subscriptions<Int> {
            Subscriptions {
                for b in bodies {
                    Subscriptions.group("k", 0) { _ in Subscription<Int>.every(.seconds(1), key: b) { _ in 0 } }
                }
            }
        }
        let r = Reconciler<Int>()
        var built = Subscriptions<Int>.none
        r.reconcile(building: { built = set(["first"]); return built })
        let plan = r.reconcile(building: { built = set(["first", "second"]); return built })
        #expect(plan == Reconciler<Int>.plan(from: set(["first"]), to: set(["first", "second"])))
        #expect(plan.duplicates.isEmpty)
        #expect(plan.steps.count == 1)
        let nodes = groupNodes(built)
        #expect(nodes.count == 2 && nodes[0] != nodes[1])
        // A third, after a group of another key, the same way.
        let third = r.reconcile(building: { built = set(["first", "second", "third"]); return built })
        #expect(third.duplicates.isEmpty && third.steps.count == 1)
    }

    /// `reconcile(building:)` and `reconcile(_:)` plan alike, step by step,
    /// over random sets of groups whose keys repeat among siblings (nested
    /// too); each group's body depends on its key, input and occurrence.
    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func bothEntryPointsPlanAlike(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        struct G { var key: Int; var input: Int; var children: [G] }
        func randomGroups(depth: Int) -> [G] {
            (0..<Int.random(in: 0...6, using: &rng)).map { _ in
                G(key: Int.random(in: 0..<3, using: &rng), input: Int.random(in: 0..<3, using: &rng),
                  children: depth > 0 && Bool.random(using: &rng) ? randomGroups(depth: depth - 1) : [])
            }
        }
        func set(_ groups: [G], path: String) -> Subscriptions<Int> {
            var seen: [Int: Int] = [:]
            let named = groups.map { g -> (G, String) in
                let occurrence = seen[g.key, default: 0]
                seen[g.key] = occurrence + 1
                return (g, "\(path)/\(g.key).\(occurrence)")
            }
            return Subscriptions {
                for (g, id) in named {
                    Subscriptions.group(g.key, g.input) { v in
                        Subscription<Int>.every(.seconds(Int64(1 + v)), key: id) { _ in 0 }
                        set(g.children, path: id)
                    }
                }
            }
        }
        let building = Reconciler<Int>(), plain = Reconciler<Int>()
        var groups: [G] = []
        for step in 0..<400 {
            if groups.isEmpty || Int.random(in: 0..<4, using: &rng) == 0 {
                groups = randomGroups(depth: 2)
            } else {
                let i = Int.random(in: 0..<groups.count, using: &rng)
                switch Int.random(in: 0..<4, using: &rng) {
                case 0: groups.insert(groups[i], at: Int.random(in: 0...groups.count, using: &rng))
                case 1: groups.remove(at: i)
                case 2: groups[i].input = Int.random(in: 0..<3, using: &rng)
                default: groups.swapAt(i, Int.random(in: 0..<groups.count, using: &rng))
                }
            }
            let a = building.reconcile(building: { set(groups, path: "") })
            let b = plain.reconcile(set(groups, path: ""))
            #expect(a == b, "seed \(seed) step \(step)")
            if a != b { return }
        }
        #expect(building.activeIDs == plain.activeIDs)
    }
}
