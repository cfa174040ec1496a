import Testing
@testable import Reconcile

/// Identities: equal only for equal keys of one type, and hashed so that keys
/// of different types do not collide by construction.
@Suite struct IdentityTests {
    struct EmptyA: Hashable, Sendable {}
    struct EmptyB: Hashable, Sendable {}

    @Test func subscriptionIDsOfTwoEmptyKeyTypesHashApart() {
        let a = SubscriptionID(TimerSource.self, key: EmptyA())
        let b = SubscriptionID(TimerSource.self, key: EmptyB())
        #expect(a != b)
        #expect(a.hashValue != b.hashValue)
        #expect(a.cachedHash != b.cachedHash)
        #expect(a == SubscriptionID(TimerSource.self, key: EmptyA()))
    }

    @Test func taskIDsOfTwoEmptyKeyTypesHashApart() {
        let a = TaskID(EmptyA())
        let b = TaskID(EmptyB())
        #expect(a != b)
        #expect(a.hashValue != b.hashValue)
        #expect(a.cachedHash != b.cachedHash)
        #expect(a == TaskID(EmptyA()))
    }

    @Test func equalValuesOfDifferentKeyTypesAreDifferentIdentities() {
        #expect(SubscriptionID(TimerSource.self, key: 1) != SubscriptionID(TimerSource.self, key: Int64(1)))
        #expect(TaskID("x") != TaskID(Substring("x")))
    }
}
