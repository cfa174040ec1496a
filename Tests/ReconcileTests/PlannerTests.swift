import Reconcile
import ReconcileTesting
import Testing

@Suite struct PlannerTests {
    typealias Subs = Subscriptions<Int>

    let autosave = SubscriptionID(TimerSource.self, key: "autosave")

    @Test func sameIdentitySameConfigurationIsKept() {
        let a = Subs { Subscription.every(.seconds(5), key: "autosave") { _ in 1 } }
        let plan = Reconciler.plan(from: a, to: a)
        #expect(plan == Plan(steps: [], kept: 1))
        #expect(plan.isEmpty)
    }

    @Test func intervalChangeIsARetune() {
        let plan = Reconciler.plan(
            from: Subs { Subscription.every(.seconds(5), key: "autosave") { _ in 1 } },
            to: Subs { Subscription.every(.seconds(2), key: "autosave") { _ in 1 } })
        #expect(plan.steps == [.retune(autosave, from: AnyHashable(TimerSource.Configuration(interval: .seconds(5))),
                                       to: AnyHashable(TimerSource.Configuration(interval: .seconds(2))))])
        #expect(plan.description == "retune timer:autosave: every 5s -> every 2s\nkeep 0")
    }

    @Test func clockChangeIsARestart() {
        let plan = Reconciler.plan(
            from: Subs { Subscription.every(.seconds(5), key: "autosave") { _ in 1 } },
            to: Subs { Subscription.every(.seconds(5), key: "autosave", clock: .boottime) { _ in 1 } })
        #expect(plan.steps.map(\.description) == ["restart timer:autosave: every 5s -> every 5s boottime"])
    }

    @Test func sourceWithoutInPlaceChangeRestarts() {
        let plan = Reconciler.plan(
            from: Subs { Subscription.feed("news", topic: "a") { _ in 1 } },
            to: Subs { Subscription.feed("news", topic: "b") { _ in 1 } })
        #expect(plan.steps.map(\.description) == ["restart feed:news: a -> b"])
    }

    @Test func goneIdentityIsStoppedAndStopsComeFirst() {
        let plan = Reconciler.plan(
            from: Subs {
                Subscription.every(.seconds(1), key: "a") { _ in 1 }
                Subscription.every(.seconds(1), key: "b") { _ in 1 }
                Subscription.feed("f", topic: "x") { _ in 1 }
                Subscription.every(.seconds(1), key: "r") { _ in 1 }
            },
            to: Subs {
                Subscription.every(.seconds(1), key: "new") { _ in 1 }
                Subscription.every(.seconds(1), key: "r") { _ in 1 }
                Subscription.feed("f", topic: "y") { _ in 1 }
                Subscription.every(.seconds(9), key: "b") { _ in 1 }
            })
        #expect(plan.steps.map(\.description) == [
            "stop timer:a",
            "restart feed:f: x -> y",
            "retune timer:b: every 1s -> every 9s",
            "start timer:new: every 1s",
        ])
        #expect(plan.kept == 1)
    }

    @Test func stopOrderFollowsActivationOrderWhateverTheHashing() {
        let keys = (0..<200).map { "k\($0)" }
        let r = Reconciler<Int>()
        r.reconcile(Subs(keys.map { k in Subscription.every(.seconds(1), key: k) { _ in 1 } }))
        let plan = r.reconcile(.none)
        #expect(plan.steps == keys.map { .stop(SubscriptionID(TimerSource.self, key: $0)) })
    }

    @Test func duplicateIdentityIsReportedAndFirstWins() {
        let plan = Reconciler.plan(from: .none, to: Subs {
            Subscription.every(.seconds(1), key: "t") { _ in 1 }
            Subscription.every(.seconds(2), key: "t") { _ in 2 }
        })
        #expect(plan.steps.map(\.description) == ["start timer:t: every 1s"])
        #expect(plan.duplicates == [SubscriptionID(TimerSource.self, key: "t")])
    }

    @Test func sameKeyUnderDifferentKindsIsNotADuplicate() {
        let plan = Reconciler.plan(from: .none, to: Subs {
            Subscription.every(.seconds(1), key: "x") { _ in 1 }
            Subscription.feed("x", topic: "t") { _ in 1 }
        })
        #expect(plan.duplicates.isEmpty)
        #expect(plan.steps.count == 2)
    }

    @Test func builderHandlesConditionalsOptionalsAndLoops() {
        func build(_ flag: Bool, _ extra: Int?, _ n: Int) -> Subs {
            Subs {
                if flag {
                    Subscription.every(.seconds(1), key: "on") { _ in 1 }
                } else {
                    Subscription.every(.seconds(1), key: "off") { _ in 1 }
                }
                if let extra {
                    Subscription.every(.seconds(Int64(extra)), key: "extra") { _ in 1 }
                }
                for i in 0..<n {
                    Subscription.every(.seconds(1), key: i) { _ in i }
                }
                Subs([Subscription.signal(.hangup) { _ in 0 }])
            }
        }
        #expect(build(true, nil, 2).ids.map(\.description) == ["timer:on", "timer:0", "timer:1", "signal:SIGHUP"])
        #expect(build(false, 3, 0).ids.map(\.description) == ["timer:off", "timer:extra", "signal:SIGHUP"])
    }

    @Test func mappedSubscriptionsKeepIdentityAndMapMessages() {
        let child = Subs { Subscription.every(.seconds(1), key: "c") { _ in 7 } }
        let parent = child.map { "child \($0)" }
        #expect(parent.ids == child.ids)
        #expect(parent.items[0].message(for: TimerSource.Event.tick(.init(sequence: 1, missed: 0))) == "child 7")
        #expect(parent.items[0].message(for: "not a timer event") == nil)
    }
}
