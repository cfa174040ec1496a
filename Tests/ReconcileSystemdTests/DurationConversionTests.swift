import CSystemd
import TestSupport
import Reconcile
import ReconcileTranscript
@testable import ReconcileSystemd
import Glibc
import Testing


/// The boundaries of `UInt64`, every power of two and its neighbours, then
/// uniform and log-uniform random values.
func uint64Samples(count: Int = 50_000, seed: UInt64 = 0x05EC) -> [UInt64] {
    var v: [UInt64] = [0, 1, .max - 1, .max, UInt64(Int64.max) - 1, UInt64(Int64.max), UInt64(Int64.max) + 1]
    for shift in 0..<64 {
        let p = UInt64(1) << shift
        v += [p - 1, p, p &+ 1]
    }
    var rng = SplitMix64(state: seed)
    for _ in 0..<count {
        v.append(rng.next())
        v.append(rng.next() >> UInt64.random(in: 0...63, using: &rng))
    }
    return v
}

/// A timer whose interval the test changes; counts ticks.
struct Stretched: Program {
    struct Model: Equatable { var interval: Duration; var ticks = 0; var fast = 0 }
    enum Message { case tick, fast, interval(Duration) }
    let initial: Duration
    func start() -> (Model, [Never]) { (Model(interval: initial), []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .tick: model.ticks += 1
        case .fast: model.fast += 1
        case .interval(let d): model.interval = d
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.every(model.interval, key: "stretched", leeway: model.interval) { _ in .tick }
            Subscription.after(model.interval, key: "once", leeway: model.interval) { _ in .tick }
            Subscription.every(.milliseconds(5), key: "fast") { _ in .fast }
        }
    }
}

extension SystemdTests {
    /// `usec(_:)`, sd-event's `usec_t` from a `Duration`, over the whole
    /// range, and timers at the ends of it on a real loop.
    @Suite struct DurationConversion {
        @Test func usecOfEveryMicrosecondCountSaturatesAtInfinity() {
            var rng = SplitMix64(state: 0x05EC)
            var samples: [Int64] = [.min, .min + 1, -1, 0, 1, .max - 1, .max]
            for _ in 0..<50_000 { samples.append(Int64(bitPattern: rng.next()) >> Int64.random(in: 0...63, using: &rng)) }
            for x in samples {
                let expected: UInt64 = x <= 0 ? 0 : x == .max ? usecInfinity : UInt64(x)
                #expect(usec(.microseconds(x)) == expected, "x = \(x)")
                // Seconds: the same, through the saturating microseconds.
                let s = Int128(x) * 1_000_000
                let fromSeconds: UInt64 = s <= 0 ? 0 : s >= Int128(Int64.max) ? usecInfinity : UInt64(s)
                #expect(usec(.seconds(x)) == fromSeconds, "x = \(x)")
            }
            #expect(usec(.seconds(Int64.max)) == usecInfinity)
            #expect(usec(.seconds(Int64.min)) == 0)
        }

        @Test func everyUsecIsAnExactDuration() {
            for u in uint64Samples() {
                let d = Duration(usec: u)
                #expect(d.attoseconds == Int128(u) * 1_000_000_000_000, "u = \(u)")
                // Back again: exact below Int64.max µs, "never" from there.
                #expect(usec(d) == (u < UInt64(Int64.max) ? u : usecInfinity), "u = \(u)")
            }
        }

        /// The one wall-clock reader agrees with the system's time of day
        /// and formats as RFC 3339 in the transcript header.
        @Test func wallClockMicrosecondsIsTheTimeOfDay() {
            var tv = timeval()
            gettimeofday(&tv, nil)
            let reference = Int64(tv.tv_sec) * 1_000_000 + Int64(tv.tv_usec)
            let now = wallClockMicroseconds()
            #expect(now >= reference && now - reference < 1_000_000)
            #expect(Timestamp.rfc3339(micros: 1_000_000_000_123_456) == "2001-09-09T01:46:40.123456Z")
            #expect(clockMicroseconds(CLOCK_MONOTONIC) > 0)
        }

        @Test func usecArithmeticSaturatesAtInfinity() {
            let samples = uint64Samples(count: 5_000)
            var rng = SplitMix64(state: 7)
            for a in samples {
                let b = samples[Int.random(in: 0..<samples.count, using: &rng)]
                let sum = UInt128(a) + UInt128(b)
                #expect(usecAdd(a, b) == (sum >= UInt128(usecInfinity) ? usecInfinity : UInt64(sum)), "\(a) + \(b)")
                let product = UInt128(a) * UInt128(b)
                #expect(usecMultiply(a, b) == (product >= UInt128(usecInfinity) ? usecInfinity : UInt64(product)), "\(a) · \(b)")
                let accuracy = usecAccuracy(Duration(usec: a))
                #expect(accuracy >= 1 && accuracy < usecInfinity, "leeway \(a)")
            }
        }

        @Test func timersAtTheEndOfTimeStartRetuneAndNeverFire() throws {
            // Repeating and one-shot, with leeways as large: armed, never due.
            let h = try Harness(Stretched(initial: .seconds(Int64.max)))
            try h.run(until: { h.runtime.model.fast >= 5 })
            #expect(h.runtime.model.ticks == 0)
            #expect(h.runtime.stats.starts == 3)
            // Retuned to just below and back to the end of usec_t.
            try h.runtime.send(.interval(Duration(usec: usecInfinity - 1)))
            try h.run(until: { h.runtime.model.fast >= 10 })
            try h.runtime.send(.interval(.seconds(Int64.max) * 18))
            try h.run(until: { h.runtime.model.fast >= 15 })
            #expect(h.runtime.model.ticks == 0)
            #expect(h.runtime.stats.retunes == 4)
            // Negative intervals are as soon as possible, not a trap.
            try h.runtime.send(.interval(.seconds(-1)))
            try h.run(until: { h.runtime.model.ticks >= 3 })
        }

        @Test func loopRunsWithAnyTimeout() throws {
            let loop = try EventLoop()
            #expect(try loop.runOnce(timeout: .seconds(Int64.min)) == false)
            #expect(try loop.runOnce(timeout: .zero) == false)
        }
    }
}
