import Reconcile

// The `groups` benchmark: a desired set of `groups` × `perGroup`
// subscriptions (1,000 × 1,000 by default) where one reconcile changes one
// group (its first subscription, a timer, gets another interval: one retune).
// Every implementation computes the whole desired set from its model on every
// reconcile, as a program's `subscriptions(model)` does, and reconciles it
// with our `Reconciler` (the plan only, no driver).
//
// - `groups`: `Subscriptions.group(g, version[g]) { … }` per group; an
//   unchanged group is neither built nor diffed.
// - `rebuild-all`: today's API without groups: all subscriptions built and
//   diffed on every reconcile.
// - `hand-cached`: the program caches each group's built array itself and
//   rebuilds only the changed one, then hands over the concatenated flat
//   set: building is saved, diffing all of it is not.
// - `groups, none changed`: the model changed but no group did: every
//   group is skipped (the per-group skip cost is this ÷ groups).

/// Group `g`'s subscriptions in `version` (the first one's variant).
func groupSubscriptions(_ g: Int, perGroup: Int, version: Int) -> [Subscription<BenchMessage>] {
    var subs: [Subscription<BenchMessage>] = []
    subs.reserveCapacity(perGroup)
    let base = g * perGroup
    for i in 0..<perGroup { subs.append(makeSubscription(base + i, variant: i == 0 ? version & 1 : 0)) }
    return subs
}

final class GroupsCase: Benchmark {
    enum Kind: String, CaseIterable {
        case groups, rebuildAll = "rebuild-all", handCached = "hand-cached", unchanged = "groups, none changed"
    }

    let kind: Kind
    let groups: Int
    let perGroup: Int
    var reconciler = Reconciler<BenchMessage>()
    var versions: [Int] = []
    var cache: [[Subscription<BenchMessage>]] = []
    var lastPlan = Plan()

    init(_ kind: Kind, groups: Int, perGroup: Int) {
        self.kind = kind
        self.groups = groups
        self.perGroup = perGroup
    }

    /// The desired set for the current versions, as the program builds it.
    func desired() -> Subscriptions<BenchMessage> {
        let perGroup = self.perGroup
        switch kind {
        case .groups, .unchanged:
            return Subscriptions {
                for g in 0..<groups {
                    Subscriptions.group(g, versions[g]) { v in
                        Subscriptions(groupSubscriptions(g, perGroup: perGroup, version: v))
                    }
                }
            }
        case .rebuildAll:
            var all: [Subscription<BenchMessage>] = []
            all.reserveCapacity(groups * perGroup)
            for g in 0..<groups { all.append(contentsOf: groupSubscriptions(g, perGroup: perGroup, version: versions[g])) }
            return Subscriptions(all)
        case .handCached:
            var all: [Subscription<BenchMessage>] = []
            all.reserveCapacity(groups * perGroup)
            for g in 0..<groups { all.append(contentsOf: cache[g]) }
            return Subscriptions(all)
        }
    }

    func setUp() {
        reconciler = Reconciler()
        versions = Array(repeating: 0, count: groups)
        if kind == .handCached { cache = (0..<groups).map { groupSubscriptions($0, perGroup: perGroup, version: 0) } }
        reconciler.reconcile(desired())
    }

    func run(_ iteration: Int) -> Int {
        if kind != .unchanged {
            let g = (iteration &* 7919) % groups
            versions[g] &+= 1
            if kind == .handCached { cache[g] = groupSubscriptions(g, perGroup: perGroup, version: versions[g]) }
        }
        lastPlan = reconciler.reconcile(desired())
        return lastPlan.kept
    }

    func tearDown() {
        reconciler = Reconciler()
        cache = []
    }
}

func groupsBenchmark(groups: Int, perGroup: Int, budget: Budget, into records: inout [Record]) {
    let size = groups * perGroup
    progress("groups: \(grouped(groups)) × \(grouped(perGroup))")
    var medians: [GroupsCase.Kind: Double] = [:]
    for kind in GroupsCase.Kind.allCases {
        let bench = GroupsCase(kind, groups: groups, perGroup: perGroup)
        // Rebuilding a million subscriptions takes about a second a run.
        var b = budget
        if kind == .rebuildAll || kind == .handCached { b.minRuns = min(b.minRuns, 5) }
        let m = measure(bench, b)
        let expectedKept = kind == .unchanged ? size : size - 1
        if bench.lastPlan.kept != expectedKept || (kind != .unchanged && bench.lastPlan.steps.count != 1) {
            warn("groups \(kind.rawValue): kept \(bench.lastPlan.kept), steps \(bench.lastPlan.steps.count); expected \(expectedKept) and \(kind == .unchanged ? 0 : 1)")
        }
        medians[kind] = m.median
        var r = Record(benchmark: "groups", implementation: kind.rawValue, size: size, churn: nil, unit: "reconcile",
                       runs: m.runs, medianNanos: m.median, p99Nanos: m.p99, perSubscription: false,
                       allocations: m.allocationsPerRun)
        if kind == .unchanged { r.extra.append(("ns_per_skipped_group", m.median / Double(groups))) }
        records.append(r)
        progress("groups \(kind.rawValue): \(duration(m.median))")
    }
    if let ours = medians[.groups] {
        for i in records.indices where records[i].benchmark == "groups" {
            records[i].extra.append(("ratio_over_groups", records[i].medianNanos / ours))
        }
    }
}
