import TestSupport
import Reconcile
import ReconcileTesting
import Testing

/// Samples of the whole `Int64` range: the boundaries, every power of two
/// and its neighbours, the unit boundaries, then uniform and
/// log-uniform random values (so small magnitudes are covered too).
func int64Samples(count: Int = 50_000, seed: UInt64 = 0x5EED) -> [Int64] {
    var v: [Int64] = [.min, .min + 1, -1, 0, 1, .max - 1, .max]
    for shift in 0..<63 {
        let p = Int64(1) << shift
        v += [p - 1, p, p + 1, -p + 1, -p, -p - 1]
    }
    for unit in [1_000, 1_000_000, 60_000_000, 1_000_000_000, 1_000_000_000_000] as [Int64] {
        v += [unit - 1, unit, unit + 1, -unit, .max / unit, .max / unit + 1, .min / unit, .min / unit - 1]
    }
    var rng = SplitMix64(seed: seed)
    for _ in 0..<count {
        v.append(Int64(bitPattern: rng.next()))
        let bits = Int.random(in: 0...63, using: &rng)
        v.append(Int64(bitPattern: rng.next()) >> bits)
    }
    return v
}

func clampToInt64(_ x: Int128) -> Int64 {
    x > Int128(Int64.max) ? .max : x < Int128(Int64.min) ? .min : Int64(x)
}

/// The one conversion between `Duration` and microseconds, over the whole
/// `Int64` range in every unit: it never traps, it is exact where the
/// result fits, and it saturates where it does not.
@Suite struct DurationConversionTests {
    @Test func microsecondsRoundTripExactlyForEveryInt64() {
        for x in int64Samples() {
            let d = Duration.microseconds(x)
            #expect(d.attoseconds == Int128(x) * 1_000_000_000_000, "x = \(x)")
            #expect(d.saturatingMicroseconds == x, "x = \(x)")
        }
    }

    @Test func secondsSaturateAtTheEndsOfInt64() {
        for x in int64Samples() {
            #expect(Duration.seconds(x).saturatingMicroseconds == clampToInt64(Int128(x) * 1_000_000), "x = \(x)")
            #expect(Duration.milliseconds(x).saturatingMicroseconds == clampToInt64(Int128(x) * 1_000), "x = \(x)")
        }
        #expect(Duration.seconds(Int64.max).saturatingMicroseconds == .max)
        #expect(Duration.seconds(Int64.min).saturatingMicroseconds == .min)
        #expect((Duration.seconds(Int64.max) * 18).saturatingMicroseconds == .max)
    }

    @Test func subMicrosecondPartsTruncateTowardZero() {
        for x in int64Samples() {
            #expect(Duration.nanoseconds(x).saturatingMicroseconds == x / 1000, "x = \(x)")
        }
        #expect(Duration.nanoseconds(1999).saturatingMicroseconds == 1)
        #expect(Duration.nanoseconds(-1999).saturatingMicroseconds == -1)
    }

    @Test func cheapPathAgreesWithInt128DivisionAroundItsBoundary() {
        // Below 2^76 attoseconds the conversion shifts and divides in 64 bits;
        // above, it divides in 128. Both must truncate toward zero alike.
        var rng = SplitMix64(seed: 0x76)
        var samples: [Int128] = [0, 1, -1, 999_999_999_999, 1_000_000_000_000, -1_000_000_000_000]
        for shift in 70...82 {
            let p = Int128(1) << shift
            for d in [-1_000_000_000_001, -4097, -4096, -1, 0, 1, 4095, 4096, 1_000_000_000_001] as [Int128] {
                samples += [p + d, -(p + d)]
            }
        }
        for _ in 0..<20_000 {
            let bits = Int.random(in: 0...100, using: &rng)
            let x = (Int128(rng.next()) << 64 | Int128(rng.next())) >> (27 + bits)
            samples += [x, -x]
        }
        for a in samples {
            #expect(Duration(attoseconds: a).saturatingMicroseconds == clampToInt64(a / 1_000_000_000_000), "attoseconds = \(a)")
        }
    }

    @Test func shortFormatsEveryDurationWithoutTrapping() {
        for x in int64Samples(count: 5_000) {
            let expected = x == 0 ? "0s" : x % 3600 == 0 ? "\(x / 3600)h" : x % 60 == 0 ? "\(x / 60)m" : "\(x)s"
            #expect(Duration.seconds(x).short == expected, "x = \(x)")
            _ = Duration.microseconds(x).short
            _ = Duration.nanoseconds(x).short
        }
        #expect(Duration.seconds(Int64.max).short == "9223372036854775807s")
        #expect((Duration.seconds(Int64.max) * 18).short == "166020696663385964526s")
        #expect(Duration.milliseconds(1500).short == "1.5s")
        #expect(Duration.milliseconds(-1500).short == "-1.5s")
        #expect(Duration.microseconds(250).short == "250us")
        #expect(Duration.milliseconds(300).short == "300ms")
        #expect(Duration.seconds(120).short == "2m")
        #expect(Duration.seconds(7200).short == "2h")
    }

    @Test func virtualTimersTooFarOutNeverFireAndNeverTrap() {
        // The virtual driver's clock goes through the same conversion.
        struct P: Program {
            func start() -> (Int, [Never]) { (0, []) }
            func update(_ m: inout Int, _ e: TimerSource.Event) -> [Never] { m += 1; return [] }
            func subscriptions(_ m: Int) -> Subscriptions<TimerSource.Event> {
                Subscriptions {
                    Subscription.every(.seconds(Int64.max), key: "huge") { $0 }
                    Subscription.after(.seconds(Int64.max), key: "late") { $0 }
                }
            }
        }
        let driver = VirtualDriver()
        let runtime = Runtime(P(), driver: driver)
        try? runtime.start()
        driver.advance(by: .seconds(Int64.max))
        driver.stall(for: .seconds(Int64.max))
        #expect(runtime.model == 0)
        #expect(driver.now.saturatingMicroseconds == .max)
    }
}
