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

    /// Two boxes compared as the keep path compares them (pointer, bytes in
    /// place, then by value), and through the box's own `isEqual`.
    static func same<T: Hashable>(_ a: T, _ b: T) -> Bool {
        let x = TypedHashableBox(a), y = TypedHashableBox(b)
        let viaKeepPath = ReconcileEngine.sameBox(x, y)
        #expect(viaKeepPath == x.isEqual(y))
        #expect(viaKeepPath == y.isEqual(x))
        return viaKeepPath
    }

    /// A copy of `s` in a buffer of its own (`String(s.utf8)` shares it).
    static func copy(_ s: String) -> String { String(decoding: Array(s.utf8), as: UTF8.self) }

    /// Keys and configurations are mostly found equal by their bytes
    /// (`Equality`); what is equal in another representation still is.
    @Test func equalValuesInAnotherRepresentationAreStillEqual() {
        #expect(Self.same(0.0, -0.0))
        let composed = "caf\u{E9}", decomposed = "cafe\u{301}"
        #expect(Array(composed.utf8) != Array(decomposed.utf8))
        #expect(Self.same(composed, decomposed))
        let long = String(repeating: "conf.d/", count: 8)
        #expect(Self.same(long + composed, long + decomposed))
        #expect(Self.same(long, Self.copy(long)))
        #expect(Self.same(Padded(flag: 1, number: 2), Padded(flag: 1, number: 2)))
        #expect(Self.same([1, 2, 3], [1, 2, 3]))
        #expect(SubscriptionID(TimerSource.self, key: composed) == SubscriptionID(TimerSource.self, key: decomposed))
    }

    /// What differs is never found equal by its bytes: the value's bytes,
    /// a string's, or the box's type.
    @Test func differentValuesAreNotEqual() {
        let long = String(repeating: "conf.d/", count: 8)
        #expect(!Self.same(long + "a", long + "b"))
        #expect(!Self.same(long, long + "x"))
        #expect(!Self.same("a", "b"))
        #expect(!Self.same(1, 2))
        #expect(!Self.same(Padded(flag: 1, number: 2), Padded(flag: 1, number: 3)))
        #expect(!Self.same(Padded(flag: 1, number: 2), Padded(flag: 2, number: 2)))
        #expect(!Self.same(0.0, 1.0))
        #expect(!Self.same(UInt8(1), UInt8(2)))
        // Same bytes, different types: not equal.
        #expect(!ReconcileEngine.sameBox(TypedHashableBox(Int64(7)), TypedHashableBox(UInt64(7))))
        #expect(!TypedHashableBox(Int64(7)).isEqual(TypedHashableBox(UInt64(7))))
    }

    @Test func fileWatchConfigurationsCompareFieldByField() {
        typealias C = FileWatchSource.Configuration
        let path = "/srv/reconcile/conf.d/unit-1234.conf"
        #expect(Self.same(C(path: path), C(path: Self.copy(path))))
        #expect(C(path: path) == C(path: Self.copy(path)))
        #expect(Self.same(C(path: "/srv/caf\u{E9}"), C(path: "/srv/cafe\u{301}")))
        #expect(!Self.same(C(path: path), C(path: path + "x")))
        #expect(!Self.same(C(path: path), C(path: path, symlinks: .noFollow)))
        #expect(!Self.same(C(path: path), C(path: path, reportExisting: true)))
        #expect(!Self.same(C(path: path), C(path: path, restart: .never)))
        #expect(Self.same(C(path: path, restart: .never), C(path: Self.copy(path), restart: .never)))
        #expect(!Self.same(C(path: path, restart: .backoff(initial: .seconds(1))), C(path: path, restart: .backoff(initial: .seconds(2)))))
        #expect(C(path: path).hashValue == C(path: Self.copy(path)).hashValue)
        #expect(C(path: "/srv/caf\u{E9}").hashValue == C(path: "/srv/cafe\u{301}").hashValue)
    }

    /// `Equality.bytesEqual` at every length to 40 (words, overlapping
    /// tails, halves): equal bytes are equal, one byte changed anywhere is not.
    @Test func bytesAreComparedWholeAtEveryLength() {
        for count in 0...40 {
            let a = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            a.withUnsafeBytes { x in
                var b = a
                b.withUnsafeBytes { y in #expect(Equality.bytesEqual(x.baseAddress, y.baseAddress, count), "length \(count)") }
                for k in 0..<count {
                    b = a
                    b[k] ^= 0x40
                    b.withUnsafeBytes { y in #expect(!Equality.bytesEqual(x.baseAddress, y.baseAddress, count), "length \(count), byte \(k)") }
                }
            }
        }
    }
}
