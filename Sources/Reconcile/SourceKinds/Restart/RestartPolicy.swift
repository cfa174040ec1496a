// The restart mechanism's pure part: the policy a subscription names, the
// delays it gives (jitter bounds included) and the cap on attempts in a
// window. The one backoff of the library: the drivers' restarts
// (`RestartSupervisor`) and the sd-event backends' retries (file watch,
// netlink resync, bus reconnect: `Retry` in ReconcileSystemd) all take
// their delays from a `RestartSchedule`.

/// How a source restarts after it failed or ended.
public enum RestartPolicy: Hashable, Sendable, CustomStringConvertible {
    /// It does not: a failed or ended source stays so until its identity or
    /// configuration changes (the default).
    case never
    /// A new attempt after each failure or end, after a delay from `Backoff`,
    /// until the cap on attempts in its window is reached.
    case backoff(Backoff)

    /// A backoff policy (see `Backoff.init`).
    /// - Parameters:
    ///   - initial: The delay before the first restart.
    ///   - factor: What each further delay is multiplied by (at least 1).
    ///   - maximum: The longest delay.
    ///   - jitter: The fraction (0...1) a delay may be shortened by at random.
    ///   - attempts: The most restarts within `window`; the next failure ends the source.
    ///   - window: The span the attempts are counted over.
    public static func backoff(initial: Duration = .milliseconds(100), factor: Double = 2, maximum: Duration = .seconds(30),
                               jitter: Double = 0.2, attempts: Int = 10, within window: Duration = .seconds(60)) -> RestartPolicy {
        .backoff(Backoff(initial: initial, factor: factor, maximum: maximum, jitter: jitter, attempts: attempts, window: window))
    }

    /// The backoff, or nil for `never`.
    package var backoffSchedule: Backoff? {
        if case .backoff(let b) = self { b } else { nil }
    }

    /// The one last failure of a source whose retries reached the cap:
    /// "gave up after `attempts` `retries` within `window` (the restart
    /// policy's cap)" and what that leaves (`then`, from its punctuation on).
    package static func capReached(operation: String, code: Int32? = nil, attempts: Int, retries: String, within window: String,
                                   then: String) -> SourceFailure {
        SourceFailure(operation: operation, code: code,
                      reason: "gave up after \(attempts) \(retries) within \(window) (the restart policy's cap)\(then)")
    }

    /// Whether `a` and `b` are the same policy (field by field: the
    /// synthesized `==` copied both payloads out first). A case or field
    /// added must be compared here too (the synthesized hash covers it).
    public static func == (a: RestartPolicy, b: RestartPolicy) -> Bool {
        switch (a, b) {
        case (.never, .never): true
        case (.backoff(let x), .backoff(let y)): x == y
        default: false
        }
    }

    /// `never`, or the backoff's description.
    public var description: String {
        switch self {
        case .never: "never"
        case .backoff(let b): b.description
        }
    }
}

/// Delays that grow by a factor up to a maximum, shortened by a random
/// jitter, with a cap on attempts in a window.
///
/// Attempt `n` (from 1) waits `min(maximum, initial · factorⁿ⁻¹)`, shortened
/// by jitter: a delay `d` becomes a value drawn uniformly from
/// `[d · (1 − jitter), d]`, so no delay is ever above `maximum` and
/// restarts of many sources spread out instead of arriving together.
public struct Backoff: Hashable, Sendable, CustomStringConvertible {
    /// The delay before the first attempt.
    public var initial: Duration
    /// What each further delay is multiplied by.
    public var factor: Double
    /// The longest delay.
    public var maximum: Duration
    /// The fraction (0...1) a delay may be shortened by.
    public var jitter: Double
    /// The most attempts within `window`.
    public var attempts: Int
    /// The span attempts are counted over.
    public var window: Duration

    /// A backoff; out-of-range values are brought into range (negative
    /// durations to zero, `factor` to at least 1, `maximum` to at least
    /// `initial`, `jitter` into 0...1, `attempts` to at least 1), so any
    /// input gives a schedule that terminates and never traps.
    /// - Parameters:
    ///   - initial: The delay before the first attempt.
    ///   - factor: What each further delay is multiplied by.
    ///   - maximum: The longest delay.
    ///   - jitter: The fraction a delay may be shortened by at random.
    ///   - attempts: The most attempts within `window`.
    ///   - window: The span attempts are counted over.
    public init(initial: Duration, factor: Double = 2, maximum: Duration, jitter: Double = 0,
                attempts: Int = .max, window: Duration = .seconds(60)) {
        self.initial = max(.zero, initial)
        self.factor = factor.isNaN ? 1 : min(max(1, factor), 1e6)
        self.maximum = max(self.initial, maximum)
        self.jitter = jitter.isNaN ? 0 : min(max(0, jitter), 1)
        self.attempts = max(1, attempts)
        self.window = max(.zero, window)
    }

    /// The delay of attempt `attempt` (from 1) before jitter.
    public func delay(forAttempt attempt: Int) -> Duration {
        .microseconds(Self.micros(delayMicroseconds(attempt)))
    }

    /// The shortest and the longest delay jitter can give attempt `attempt`.
    public func bounds(forAttempt attempt: Int) -> ClosedRange<Duration> {
        let d = delayMicroseconds(attempt)
        return .microseconds(Self.micros(d * (1 - jitter)))...(.microseconds(Self.micros(d)))
    }

    /// The delay of attempt `attempt`, jittered by `unit` (0...1: 0 the
    /// longest delay, 1 the shortest).
    public func delay(forAttempt attempt: Int, unit: Double) -> Duration {
        let d = delayMicroseconds(attempt)
        let u = unit.isNaN ? 0 : min(max(0, unit), 1)
        return .microseconds(Self.micros(d * (1 - jitter * u)))
    }

    /// Whole microseconds of `d` (not negative), saturating at `Int64.max`.
    private static func micros(_ d: Double) -> Int64 {
        d >= 0x1p63 ? .max : Int64(max(0, d).rounded(.down))
    }

    private func delayMicroseconds(_ attempt: Int) -> Double {
        let top = Double(maximum.saturatingMicroseconds)
        var d = Double(initial.saturatingMicroseconds)
        guard factor > 1 else { return min(d, top) }
        // Bounded: a factor above 1 reaches the top within ~1100 steps
        // (or stays below it, a value the loop's cap gives anyway).
        var n = 1
        while n < attempt, d < top, n < 1_100 {
            d *= factor
            n += 1
        }
        return min(d, top)
    }

    /// `backoff 100ms×2 ≤30s jitter 0.2, 10 in 1m`.
    public var description: String {
        let cap = attempts == .max ? "" : ", \(attempts) in \(window.short)"
        return "backoff \(initial.short)×\(factor) ≤\(maximum.short) jitter \(jitter)\(cap)"
    }
}

/// The state of one source's restarts: which attempt comes next, its delay,
/// and when the cap is reached. Pure: the caller gives the time and the
/// randomness, so a schedule is exact on virtual time.
public struct RestartSchedule: Sendable {
    /// The policy's backoff.
    public let backoff: Backoff
    /// Attempts since the last recovery (the next one is `attempt + 1`).
    public private(set) var attempt = 0
    /// When each restart within the last window was decided (oldest first).
    private var recent: [Duration] = []

    /// What to do after a failure or an end.
    public enum Decision: Hashable, Sendable {
        /// Start attempt `attempt` after `after`.
        case restart(attempt: Int, after: Duration)
        /// The cap is reached: `attempts` restarts within `window` already.
        case giveUp(attempts: Int, within: Duration)
    }

    /// A schedule at its first attempt.
    /// - Parameter backoff: The delays and the cap.
    public init(_ backoff: Backoff) { self.backoff = backoff }

    /// The decision after a failure or an end at `now`, jittered by `random`.
    /// - Parameters:
    ///   - now: The current time (any monotonic origin).
    ///   - random: The source of the jitter.
    public mutating func next(at now: Duration, random: inout some RandomNumberGenerator) -> Decision {
        // Restarts decided more than a window ago no longer count.
        var drop = 0
        while drop < recent.count, now - recent[drop] >= backoff.window { drop += 1 }
        if drop > 0 { recent.removeFirst(drop) }
        guard recent.count < backoff.attempts else { return .giveUp(attempts: recent.count, within: backoff.window) }
        attempt += 1
        // Uncapped: no history; a large cap keeps a bounded one.
        if backoff.attempts != .max, recent.count < 4_096 { recent.append(now) }
        let unit = backoff.jitter == 0 ? 0 : Double(random.next() >> 11) / Double(1 << 53)
        return .restart(attempt: attempt, after: backoff.delay(forAttempt: attempt, unit: unit))
    }

    /// The source is healthy again: the next failure waits `initial` again.
    /// (The cap's window still counts the restarts it made.)
    public mutating func recovered() { attempt = 0 }
}
