import Glibc
import Reconcile

// The `groups` benchmark: a desired set of `groups` × `perGroup`
// subscriptions (1,000 × 1,000 by default) where one reconcile changes one
// group (its first subscription, a timer, gets another interval: one retune).
// Every implementation computes the whole desired set from its model on every
// reconcile, as a program's `subscriptions(model)` does, and reconciles it
// with our `Reconciler` (the plan only, no driver), built inside
// `reconcile(building:)` as the runtime does (an unchanged group is given
// its last node back). A group's model is its size and a version; its input
// is that model.
//
// - `groups`: `Subscriptions.group(g, model[g]) { m in … }` per group, the
//   body capturing its key `g` (one closure context per group and build);
//   an unchanged group is neither built nor diffed.
// - `groups, keyed body`: `Subscriptions.group(g, model[g]) { g, m in … }`,
//   the body given its key: it captures nothing (no closure context).
// - `groups, nested 32 × 32`: 32 outer groups whose input is their 32
//   groups' models (an array: unchanged, the same buffer, compared in one
//   step), each holding its 32 keyed groups; one change builds one outer
//   body and one inner body, and skips 31 + 31 groups.
// - `rebuild-all`: today's API without groups: all subscriptions built and
//   diffed on every reconcile.
// - `hand-cached`: the program caches each group's built array itself and
//   rebuilds only the changed one, then hands over the concatenated flat
//   set: building is saved, diffing all of it is not.
// - `… none changed`: the model changed but no group did: every group is
//   skipped (the per-group skip cost is this ÷ groups).

/// One group's part of the model: its input.
struct GroupModel: Equatable {
    var size: Int
    var version: Int
}

/// Group `g`'s subscriptions for `model` (the version is the first one's variant).
func groupSubscriptions(_ g: Int, _ model: GroupModel) -> [Subscription<BenchMessage>] {
    var subs: [Subscription<BenchMessage>] = []
    subs.reserveCapacity(model.size)
    let base = g * model.size
    for i in 0..<model.size { subs.append(makeSubscription(base + i, variant: i == 0 ? model.version & 1 : 0)) }
    return subs
}

/// Groups per outer group in the nested cases.
let nestedFanOut = 32

final class GroupsCase: Benchmark {
    enum Kind: String, CaseIterable {
        case groups, keyed = "groups, keyed body", nested = "groups, nested 32 × 32"
        case rebuildAll = "rebuild-all", handCached = "hand-cached"
        case unchanged = "groups, none changed", keyedUnchanged = "groups, keyed body, none changed"
        case nestedUnchanged = "groups, nested 32 × 32, none changed"

        var changesNothing: Bool { self == .unchanged || self == .keyedUnchanged || self == .nestedUnchanged }
        var isNested: Bool { self == .nested || self == .nestedUnchanged }
    }

    let kind: Kind
    let groups: Int
    let perGroup: Int
    var reconciler = Reconciler<BenchMessage>()
    /// The model: one entry per group; for the nested cases, in chunks of
    /// `nestedFanOut` (an outer group's input).
    var models: [GroupModel] = []
    var chunks: [[GroupModel]] = []
    var cache: [[Subscription<BenchMessage>]] = []
    var lastPlan = Plan()

    init(_ kind: Kind, groups: Int, perGroup: Int) {
        self.kind = kind
        self.groups = groups
        self.perGroup = perGroup
    }

    /// The desired set for the current model, as the program builds it.
    func desired() -> Subscriptions<BenchMessage> {
        switch kind {
        case .groups, .unchanged:
            return Subscriptions {
                for g in 0..<groups {
                    Subscriptions.group(g, models[g]) { m in Subscriptions(groupSubscriptions(g, m)) }
                }
            }
        case .keyed, .keyedUnchanged:
            return Subscriptions {
                for g in 0..<groups {
                    Subscriptions.group(g, models[g]) { g, m in Subscriptions(groupSubscriptions(g, m)) }
                }
            }
        case .nested, .nestedUnchanged:
            return Subscriptions {
                for o in chunks.indices {
                    Subscriptions.group(o, chunks[o]) { o, chunk in
                        for i in chunk.indices {
                            Subscriptions.group(o * nestedFanOut + i, chunk[i]) { g, m in Subscriptions(groupSubscriptions(g, m)) }
                        }
                    }
                }
            }
        case .rebuildAll:
            var all: [Subscription<BenchMessage>] = []
            all.reserveCapacity(groups * perGroup)
            for g in 0..<groups { all.append(contentsOf: groupSubscriptions(g, models[g])) }
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
        models = Array(repeating: GroupModel(size: perGroup, version: 0), count: groups)
        chunks = stride(from: 0, to: groups, by: nestedFanOut).map { Array(models[$0..<min(groups, $0 + nestedFanOut)]) }
        if kind == .handCached { cache = (0..<groups).map { groupSubscriptions($0, models[$0]) } }
        reconciler.reconcile(building: desired)
    }

    func run(_ iteration: Int) -> Int {
        if !kind.changesNothing {
            let g = (iteration &* 7919) % groups
            models[g].version &+= 1
            if kind.isNested { chunks[g / nestedFanOut][g % nestedFanOut].version &+= 1 }
            if kind == .handCached { cache[g] = groupSubscriptions(g, models[g]) }
        }
        lastPlan = reconciler.reconcile(building: desired)
        return lastPlan.kept
    }

    func tearDown() {
        reconciler = Reconciler()
        cache = []
        chunks = []
    }
}

func groupsBenchmark(groups: Int, perGroup: Int, budget: Budget, quick: Bool, into records: inout [Record]) {
    let size = groups * perGroup
    progress("groups: \(grouped(groups)) × \(grouped(perGroup))")
    var medians: [GroupsCase.Kind: Double] = [:]
    // GROUPS_ONLY=<kind> runs one case (for a profiler), as EFFECTS_ONLY does.
    let only = getenv("GROUPS_ONLY").map { String(cString: $0) }
    // Quick: rebuild-all (a million subscriptions built per run, seconds
    // each) is left out.
    for kind in GroupsCase.Kind.allCases where (only == nil && !(quick && kind == .rebuildAll)) || only == kind.rawValue {
        let bench = GroupsCase(kind, groups: groups, perGroup: perGroup)
        // Rebuilding a million subscriptions takes about a second a run.
        var b = budget
        if kind == .rebuildAll || kind == .handCached { b.minRuns = 3 }
        let m = measure(bench, b)
        let expectedKept = kind.changesNothing ? size : size - 1
        if bench.lastPlan.kept != expectedKept || bench.lastPlan.steps.count != (kind.changesNothing ? 0 : 1) {
            warn("groups \(kind.rawValue): kept \(bench.lastPlan.kept), steps \(bench.lastPlan.steps.count); expected \(expectedKept) and \(kind.changesNothing ? 0 : 1)")
        }
        medians[kind] = m.median
        var r = Record(benchmark: "groups", implementation: kind.rawValue, size: size, churn: nil, unit: "reconcile",
                       runs: m.runs, medianNanos: m.median, p99Nanos: m.p99, perSubscription: false,
                       allocations: m.allocationsPerRun, rangeMin: m.rangeMin, rangeMax: m.rangeMax)
        if kind == .unchanged || kind == .keyedUnchanged { r.extra.append(("ns_per_skipped_group", m.median / Double(groups))) }
        if kind == .nestedUnchanged { r.extra.append(("ns_per_unchanged_group", m.median / Double(groups))) }
        records.append(r)
        progress("groups \(kind.rawValue): \(duration(m.median))")
    }
    if let ours = medians[.groups] {
        for i in records.indices where records[i].benchmark == "groups" {
            records[i].extra.append(("ratio_over_groups", records[i].medianNanos / ours))
        }
    }
    guard only == nil else { return }
    // The yardsticks the ratios are taken against: one group of `perGroup`
    // reconciled alone (the same change, a reconciler with nothing else),
    // and a kept flat subscription (a no-op plan of a freshly built flat
    // set of 100,000, per subscription).
    let alone = GroupsCase(.groups, groups: 1, perGroup: perGroup)
    let a = measure(alone, budget)
    records.append(Record(benchmark: "groups", implementation: "one group alone", size: perGroup, churn: nil, unit: "reconcile",
                          runs: a.runs, medianNanos: a.median, p99Nanos: a.p99, perSubscription: false,
                          allocations: a.allocationsPerRun, rangeMin: a.rangeMin, rangeMax: a.rangeMax))
    let flat = SetTable(size: 100_000)
    let kept = ReconcileCase(.plan, sets: flat.list, initial: flat.base, cycle: [flat.baseCopy2, flat.baseCopy])
    let k = measure(kept, budget)
    let perKept = k.median / Double(flat.size)
    records.append(Record(benchmark: "groups", implementation: "flat set, no-op (plan)", size: flat.size, churn: nil, unit: "reconcile",
                          runs: k.runs, medianNanos: k.median, p99Nanos: k.p99, perSubscription: true,
                          allocations: k.allocationsPerRun, extra: [("ns_per_kept_subscription", perKept)],
                          variant: "fresh", rangeMin: k.rangeMin, rangeMax: k.rangeMax))
    if let i = records.firstIndex(where: { $0.benchmark == "groups" && $0.implementation == GroupsCase.Kind.groups.rawValue }) {
        records[i].extra.append(("ratio_changed_over_alone", records[i].medianNanos / a.median))
        if let skipped = medians[.unchanged] {
            records[i].extra.append(("ratio_skip_over_kept", skipped / Double(groups) / perKept))
        }
    }
    progress("groups: one group alone \(duration(a.median)); a kept flat subscription \(significant(perKept)) ns")
}
