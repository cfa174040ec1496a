import TestSupport
import Testing
@testable import Reconcile

/// A plan's start records hold their entries and boxes unretained
/// (`Reconciler/StartRecords.swift`): a plan kept past its reconcile must
/// still read as it was, after later reconciles stop, free and recycle its
/// entries and retune them, after a shutdown, and after the reconciler is gone.
@Suite struct PlanRecordsTests {
    enum Fixed: Source {
        typealias Configuration = Int
        typealias Event = Int
        static let name = "fixed"
        static func failed(_ failure: SourceFailure) -> Int { -1 }
    }

    enum Tunable: Source {
        typealias Configuration = Int
        typealias Event = Int
        static let name = "tunable"
        static func failed(_ failure: SourceFailure) -> Int { -1 }
        static func canRetune(from old: Int, to new: Int) -> Bool { true }
    }

    /// A freshly built set (new boxes every call: nothing else holds them).
    func set(_ configs: [(String, Int)], tunable: Bool = false) -> Subscriptions<Int> {
        Subscriptions(configs.map { key, config in
            tunable
                ? Subscription(Tunable.self, key: key, configuration: config) { $0 }
                : Subscription(Fixed.self, key: key, configuration: config) { $0 }
        })
    }

    @Test func aKeptPlanReadsItsStartsAfterItsEntriesStopAndAreRecycled() {
        let r = Reconciler<Int>()
        let first = r.reconcile(set([("a", 1), ("b", 2), ("c", 3)]))
        let expected = first.description
        #expect(first.steps.count == 3)
        // Stop them all (retired), then start others (recycling the retired
        // entries unless the kept plan holds them), then stop and start again.
        for round in 0..<4 {
            r.reconcile(set(round % 2 == 0 ? [] : [("x\(round)", round), ("y\(round)", round)]))
        }
        #expect(first.description == expected)
        #expect(first.steps == [.start(SubscriptionID(Fixed.self, key: "a"), AnyHashable(1)),
                                .start(SubscriptionID(Fixed.self, key: "b"), AnyHashable(2)),
                                .start(SubscriptionID(Fixed.self, key: "c"), AnyHashable(3))])
    }

    @Test func aKeptPlanReadsTheBoxesItStartedWithAfterRetunes() {
        let r = Reconciler<Int>()
        let first = r.reconcile(set([("a", 1), ("b", 2)], tunable: true))
        let retune = r.reconcile(set([("a", 10), ("b", 20)], tunable: true))
        #expect(retune.steps.map(\.outcome) == ["retune", "retune"])
        r.reconcile(set([("a", 100), ("b", 200)], tunable: true))
        #expect(first.steps.map(\.description) == ["start tunable:a: 1", "start tunable:b: 2"])
    }

    @Test func aKeptPlanOutlivesItsReconciler() {
        var plan: Plan?
        do {
            let r = Reconciler<Int>()
            plan = r.reconcile(set([("a", 1), ("b", 2)]))
        }
        #expect(plan?.steps.map(\.description) == ["start fixed:a: 1", "start fixed:b: 2"])
    }

    @Test func plansDroppedAtOnceShareOneStoreAndAllocateNoRecordsAfterTheFirst() {
        let r = Reconciler<Int>()
        var store: ObjectIdentifier?
        for round in 0..<6 {
            let plan = r.reconcile(set(round % 2 == 0 ? [("a\(round)", 1), ("b\(round)", 2)] : []))
            if round % 2 == 0 {
                let s = ObjectIdentifier(plan.records.starts.store!)
                if let store { #expect(s == store) }
                store = s
                #expect(plan.steps.count == 2)
            }
        }
    }

    @Test func aKeptPlanIsGivenUpNotReused() {
        let r = Reconciler<Int>()
        let first = r.reconcile(set([("a", 1)]))
        let second = r.reconcile(set([("a", 1), ("b", 2)]))
        #expect(first.records.starts.store !== second.records.starts.store)
        #expect(first.steps.map(\.description) == ["start fixed:a: 1"])
        #expect(second.steps.map(\.description) == ["start fixed:b: 2"])
    }
}
