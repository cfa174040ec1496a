import Reconcile
import Testing
import TestSupport

/// The restart mechanism's pure part: delays, jitter bounds, the cap.
@Suite struct RestartSchedules {
    /// The delays a schedule gives from t=0 on, each decided at the time the
    /// previous restart would have failed at once (the worst case).
    static func restartTimes(_ backoff: Backoff, until end: Duration, seed: UInt64 = 7) -> [Duration] {
        var schedule = RestartSchedule(backoff)
        var random = SplitMix64(seed: seed)
        var now = Duration.zero
        var times: [Duration] = []
        while now < end {
            guard case .restart(_, let after) = schedule.next(at: now, random: &random) else {
                // Given up: nothing until a window's worth later.
                now += backoff.window
                continue
            }
            now += after
            if now < end { times.append(now) }
        }
        return times
    }

    @Test func withoutJitterTheDelaysGrowByTheFactorUpToTheMaximum() {
        var s = RestartSchedule(Backoff(initial: .milliseconds(100), factor: 2, maximum: .seconds(1), jitter: 0))
        var random = SplitMix64(seed: 1)
        let decisions = (0..<6).map { _ in s.next(at: .zero, random: &random) }
        #expect(decisions == [.restart(attempt: 1, after: .milliseconds(100)), .restart(attempt: 2, after: .milliseconds(200)),
                              .restart(attempt: 3, after: .milliseconds(400)), .restart(attempt: 4, after: .milliseconds(800)),
                              .restart(attempt: 5, after: .seconds(1)), .restart(attempt: 6, after: .seconds(1))])
        // A recovery starts from `initial` again.
        s.recovered()
        #expect(s.next(at: .zero, random: &random) == .restart(attempt: 1, after: .milliseconds(100)))
        // A fractional factor.
        var f = RestartSchedule(Backoff(initial: .milliseconds(10), factor: 1.5, maximum: .seconds(1)))
        let delays = (0..<4).map { _ -> Duration in
            guard case .restart(_, let d) = f.next(at: .zero, random: &random) else { return .zero }
            return d
        }
        #expect(delays == [.milliseconds(10), .milliseconds(15), .microseconds(22_500), .microseconds(33_750)])
    }

    @Test func jitterShortensEachDelayWithinItsBoundsAndSpreadsThem() {
        let backoff = Backoff(initial: .milliseconds(100), factor: 2, maximum: .seconds(2), jitter: 0.5)
        #expect(backoff.bounds(forAttempt: 1) == .milliseconds(50)...(.milliseconds(100)))
        #expect(backoff.bounds(forAttempt: 6) == .seconds(1)...(.seconds(2)))
        var random = SplitMix64(seed: 42)
        for attempt in 1...6 {
            let bounds = backoff.bounds(forAttempt: attempt)
            var low = bounds.upperBound, high = bounds.lowerBound
            for _ in 0..<2_000 {
                var s = RestartSchedule(backoff)
                var d = Duration.zero
                for _ in 0..<attempt {
                    guard case .restart(_, let after) = s.next(at: .zero, random: &random) else { Issue.record("gave up"); return }
                    d = after
                }
                #expect(bounds.contains(d), "attempt \(attempt): \(d) outside \(bounds)")
                low = min(low, d)
                high = max(high, d)
            }
            // 2,000 draws cover the range: within 5% of each end.
            let span = bounds.upperBound - bounds.lowerBound
            #expect(low - bounds.lowerBound < span / 20 && bounds.upperBound - high < span / 20, "attempt \(attempt): \(low)...\(high)")
        }
    }

    @Test func theCapGivesUpWithinItsWindowAndAllowsAgainOnceTheWindowPassed() {
        var s = RestartSchedule(Backoff(initial: .milliseconds(10), factor: 1, maximum: .milliseconds(10), attempts: 3, window: .seconds(10)))
        var random = SplitMix64(seed: 3)
        #expect(s.next(at: .seconds(0), random: &random) == .restart(attempt: 1, after: .milliseconds(10)))
        #expect(s.next(at: .seconds(1), random: &random) == .restart(attempt: 2, after: .milliseconds(10)))
        #expect(s.next(at: .seconds(2), random: &random) == .restart(attempt: 3, after: .milliseconds(10)))
        #expect(s.next(at: .seconds(3), random: &random) == .giveUp(attempts: 3, within: .seconds(10)))
        #expect(s.next(at: .milliseconds(9_999), random: &random) == .giveUp(attempts: 3, within: .seconds(10)))
        // The restart at 0 s leaves the window at 10 s: one more is allowed.
        #expect(s.next(at: .seconds(10), random: &random) == .restart(attempt: 4, after: .milliseconds(10)))
        #expect(s.next(at: .seconds(10), random: &random) == .giveUp(attempts: 3, within: .seconds(10)))
    }

    @Test func aSourceThatFailsAtOnceRestartsFewerThan20TimesIn60Seconds() {
        // The default policy, uncapped and capped, jitter at its shortest and at random.
        let capped = Backoff(initial: .milliseconds(100), factor: 2, maximum: .seconds(30), jitter: 1, attempts: 10, window: .seconds(60))
        var uncapped = capped
        uncapped.attempts = .max
        for backoff in [capped, uncapped] {
            for seed in 0..<50 as Range<UInt64> {
                let times = Self.restartTimes(backoff, until: .seconds(60), seed: seed)
                #expect(times.count < 20, "\(backoff), seed \(seed): \(times.count) restarts")
            }
        }
        guard case .backoff(let d) = RestartPolicy.backoff() else { Issue.record("not a backoff"); return }
        #expect(Self.restartTimes(d, until: .seconds(60)).count <= 10)
    }

    @Test func outOfRangeParametersAreBroughtIntoRangeWithoutTrapping() {
        let b = Backoff(initial: .seconds(-1), factor: .nan, maximum: .seconds(-5), jitter: 7, attempts: -3, window: .seconds(-1))
        #expect(b.initial == .zero && b.factor == 1 && b.maximum == .zero && b.jitter == 1 && b.attempts == 1 && b.window == .zero)
        var random = SplitMix64(seed: 9)
        var huge = RestartSchedule(Backoff(initial: .seconds(Int64.max / 2_000_000), factor: 1e300, maximum: .seconds(Int64.max)))
        for _ in 0..<5 {
            guard case .restart(_, let d) = huge.next(at: .zero, random: &random) else { Issue.record("gave up"); return }
            #expect(d > .zero)
        }
        // An attempt number far out still gives the maximum, promptly.
        let far = Backoff(initial: .microseconds(1), factor: 1.000001, maximum: .seconds(1))
        #expect(far.delay(forAttempt: .max) <= .seconds(1))
        #expect(RestartPolicy.never.description == "never")
    }
}
