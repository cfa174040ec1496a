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

    struct Padded: Hashable, Sendable { var flag: UInt8; var number: Int }

    /// Keys and configurations are mostly found equal by their bytes
    /// (`Equality`); what is equal in another representation still is.
    @Test func equalKeysInAnotherRepresentationAreStillTheSameIdentity() {
        #expect(SubscriptionID(TimerSource.self, key: 0.0) == SubscriptionID(TimerSource.self, key: -0.0))
        let composed = "caf\u{E9}", decomposed = "cafe\u{301}"
        #expect(Array(composed.utf8) != Array(decomposed.utf8))
        #expect(SubscriptionID(TimerSource.self, key: composed) == SubscriptionID(TimerSource.self, key: decomposed))
        let long = String(repeating: "conf.d/", count: 8)
        #expect(SubscriptionID(TimerSource.self, key: long + composed) == SubscriptionID(TimerSource.self, key: long + decomposed))
        #expect(SubscriptionID(TimerSource.self, key: Padded(flag: 1, number: 2)) == SubscriptionID(TimerSource.self, key: Padded(flag: 1, number: 2)))
    }

    @Test func differentKeysOfOneTypeAreDifferentIdentities() {
        let long = String(repeating: "conf.d/", count: 8)
        #expect(SubscriptionID(TimerSource.self, key: long + "a") != SubscriptionID(TimerSource.self, key: long + "b"))
        #expect(SubscriptionID(TimerSource.self, key: "a") != SubscriptionID(TimerSource.self, key: "b"))
        #expect(SubscriptionID(TimerSource.self, key: 1) != SubscriptionID(TimerSource.self, key: 2))
        #expect(SubscriptionID(TimerSource.self, key: Padded(flag: 1, number: 2)) != SubscriptionID(TimerSource.self, key: Padded(flag: 1, number: 3)))
        #expect(SubscriptionID(TimerSource.self, key: 0.0) != SubscriptionID(TimerSource.self, key: 1.0))
    }

    /// The one reflexivity exception the standard library names: a NaN key
    /// is its own identity (kept, not restarted on every reconcile).
    @Test func aNaNKeyIsTheSameIdentityAsItself() {
        #expect(SubscriptionID(TimerSource.self, key: Double.nan) == SubscriptionID(TimerSource.self, key: Double.nan))
    }

    @Test func fileWatchConfigurationsCompareFieldByField() {
        typealias C = FileWatchSource.Configuration
        let path = "/srv/reconcile/conf.d/unit-1234.conf"
        #expect(C(path: path) == C(path: String(path.utf8)))
        #expect(C(path: "/srv/caf\u{E9}") == C(path: "/srv/cafe\u{301}"))
        #expect(C(path: path) != C(path: path + "x"))
        #expect(C(path: path) != C(path: path, symlinks: .noFollow))
        #expect(C(path: path) != C(path: path, reportExisting: true))
        #expect(C(path: path) != C(path: path, restart: .never))
        #expect(C(path: path, restart: .never) == C(path: path, restart: .never))
        #expect(C(path: path, restart: .backoff(initial: .seconds(1))) != C(path: path, restart: .backoff(initial: .seconds(2))))
        #expect(C(path: path).hashValue == C(path: String(path.utf8)).hashValue)
    }
}
