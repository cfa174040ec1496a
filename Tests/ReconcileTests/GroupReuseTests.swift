@testable import Reconcile
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

    /// A task made while the set is built inherits the binding; it is not
    /// offered anything (it could run on another thread, after the reconcile).
    @Test func aTaskMadeWhileBuildingIsOfferedNothing() async {
        let r = Reconciler<Int>()
        var built = Subscriptions<Int>.none
        r.reconcile(building: { built = timerGroups([1], [:]); return built })
        let last = groupNodes(built)
        var task: Task<ObjectIdentifier?, Never>?
        r.reconcile(building: {
            task = Task { groupNodes(timerGroups([1], [:])).first }
            built = timerGroups([1], [:])
            return built
        })
        #expect(groupNodes(built) == last)          // the reconcile's own build reuses
        let fromTask = await task?.value
        #expect(fromTask != nil && fromTask != last.first)
    }
}
