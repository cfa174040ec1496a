import Glibc
import TestSupport
import Testing
@testable import Reconcile

/// The layout assumptions of the engine's two unsafe tricks
/// (`Reconciler/Erasure.swift`, `Reconciler/PlanRecords+Layout.swift`),
/// checked so that a change that breaks them fails here, not in a daemon.
@Suite struct LayoutTests {
    struct Large { var a: (Int, Int, Int, Int, Int, Int, Int, Int); var s: String }
    enum Generic<T> { case some(T), none }
    final class Object {}
    enum Empty {}

    @Test func aSubscriptionOfAnyMessageTypeIsLaidOutAsTheWalkReadsIt() {
        #expect(ReconcileEngine.layoutMatches(Int.self))
        #expect(ReconcileEngine.layoutMatches(String.self))
        #expect(ReconcileEngine.layoutMatches(Large.self))
        #expect(ReconcileEngine.layoutMatches(Generic<Large>.self))
        #expect(ReconcileEngine.layoutMatches(Object.self))
        #expect(ReconcileEngine.layoutMatches(Empty.self))
        #expect(ReconcileEngine.layoutMatches(((Int) -> String).self))
        #expect(ReconcileEngine.layoutMatches((any Sendable).self))
    }

    /// A source whose every change restarts (no retune).
    enum Fixed: Source {
        typealias Configuration = Int
        typealias Event = Int
        static let name = "fixed"
        static func failed(_ failure: SourceFailure) -> Int { -1 }
    }

    func set(_ configs: [String: Int]) -> Subscriptions<Large> {
        Subscriptions(configs.sorted { $0.key < $1.key }.map { key, config in
            Subscription(Fixed.self, key: key, configuration: config) { _ in Large(a: (0, 0, 0, 0, 0, 0, 0, 0), s: "") }
        })
    }

    @Test func planRecordsAreReadInPlaceAtTheirFieldsOffsets() {
        let r = Reconciler<Large>()
        let first = r.reconcile(set(["a": 1, "b": 1, "c": 1]))
        var starts: [(ObjectIdentifier, ObjectIdentifier)] = []
        PlanRecords.forEachStart(first.records.starts) { e, box in
            starts.append((ObjectIdentifier(e), ObjectIdentifier(box.takeUnretainedValue())))
        }
        #expect(starts.count == 3)
        #expect(starts.map(\.0) == first.records.starts.map { ObjectIdentifier($0.source) })
        #expect(starts.map(\.1) == first.records.starts.map { ObjectIdentifier($0.configuration) })

        let second = r.reconcile(set(["a": 2, "b": 2, "c": 1]))
        #expect(second.records.restarts.count == 2)
        var old: [ObjectIdentifier] = [], new: [ObjectIdentifier] = []
        PlanRecords.forEach(second.records.restarts) { old.append(ObjectIdentifier($0)) }
        PlanRecords.forEach(second.records.restarts, offset: PlanRecords.restartNewOffset) { new.append(ObjectIdentifier($0)) }
        #expect(old == second.records.restarts.map { ObjectIdentifier($0.old) })
        #expect(new == second.records.restarts.map { ObjectIdentifier($0.new) })
        #expect(old != new)

        let third = r.reconcile(set([:]))
        var stopped: [ObjectIdentifier] = []
        PlanRecords.forEach(third.records.stops) { stopped.append(ObjectIdentifier($0)) }
        #expect(stopped == third.records.stops.map { ObjectIdentifier($0!) })
        #expect(stopped.count == 3)
    }
}

/// `make check-invariants` runs the engine's suites with the checks compiled
/// in: this fails if the flag did not reach the build.
@Suite struct InvariantChecksTests {
    @Test func theChecksAreCompiledInWhenAsked() {
        let asked = getenv("RECONCILE_CHECK_INVARIANTS").map { String(cString: $0) } == "1"
        #expect(ReconcileEngine.checksInvariants == asked)
    }

    @Test func theEngineAndTableHoldTheirInvariantsAfterChurn() {
        let r = Reconciler<Int>()
        var rng = SplitMix64(seed: 18)
        for _ in 0..<200 {
            let keys = (0..<Int.random(in: 0..<64, using: &rng)).map { _ in Int.random(in: 0..<100, using: &rng) }
            r.reconcile(Subscriptions(keys.map { k in Subscription.every(.seconds(1 + k % 3), key: k) { _ in k } }))
            r.engine._checkInvariants()
        }
    }

    /// `HashableBox.sameBytes` reads a box's value in place, where its
    /// `layout` says: checked for alignments 1 to 16 (offsets 24 and 32).
    @Test func aBoxsValueLiesWhereItsEqualityReadsIt() {
        func check<T: Hashable>(_ value: T) -> Bool {
            let box = TypedHashableBox(value)
            let address = UnsafeRawPointer(Unmanaged.passUnretained(box).toOpaque()) + Int(box.layout >> 32)
            guard Int(box.layout & 0xFFFF_FFFF) == MemoryLayout<T>.size else { return false }
            return withUnsafeBytes(of: box.value) { bytes in
                bytes.indices.allSatisfy { address.load(fromByteOffset: $0, as: UInt8.self) == bytes[$0] }
            }
        }
        #expect(check(UInt8(0xA5)))
        #expect(check(UInt16(0xBEEF)))
        #expect(check(-1234567890123 as Int))
        #expect(check("a string longer than fifteen bytes, in a buffer of its own"))
        #expect(check("small"))
        #expect(check(SIMD4<Float>(1, 2, 3, 4)))
        #expect(check(SIMD8<Int64>(1, 2, 3, 4, 5, 6, 7, 8)))
        #expect(check(Duration.seconds(3)))
        // The offsets the checks above cover: after the base's one word,
        // and rounded up for a 16-byte alignment.
        #expect(TypedHashableBox<Int>.valueOffset == 24)
        #expect(TypedHashableBox<SIMD4<Float>>.valueOffset == 32)
        #expect(MemoryLayout<SIMD4<Float>>.alignment == 16)
        // A timer's configuration has no padding inside (its bytes are all
        // its fields'), so equal ones are found equal by their bytes.
        #expect(MemoryLayout<TimerSource.Configuration>.size == 2 * MemoryLayout<Duration>.size + 2)
    }
}
