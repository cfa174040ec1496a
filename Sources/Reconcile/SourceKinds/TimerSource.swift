/// Timers: repeating or one-shot, on a chosen clock, with explicit leeway.
///
/// Repeating timers do not drift: tick *k* is due at start + *k*·interval.
/// When the loop was late by several intervals, one tick reports how many were
/// missed instead of a burst. Changing the interval or leeway is a retune in
/// place; changing the clock or between repeating and one-shot is a restart.
public enum TimerSource: Source {
    /// `timer`.
    public static let name = "timer"

    /// Which clock the timer runs on.
    public enum Clock: String, Hashable, Sendable, CaseIterable {
        /// Time since boot, not counting suspend (the default).
        case monotonic
        /// Time since boot, counting suspend.
        case boottime
        /// Wall-clock time: jumps when the clock is set.
        case realtime
    }

    /// The leeway a timer gets unless told otherwise: 1 ms. (sd-event's own
    /// default, 250 ms, is never used silently.)
    public static let defaultLeeway: Duration = .milliseconds(1)

    /// A timer's parameters.
    ///
    /// (The two one-byte fields come last: no padding inside the value,
    /// so two equal configurations have the same bytes and the keep path
    /// finds them equal without a call; see `Equality`.)
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The period (repeating) or the delay from start (one-shot).
        public var interval: Duration
        /// How late the loop may fire the timer to coalesce wake-ups.
        public var leeway: Duration
        /// Whether the timer repeats.
        public var repeats: Bool
        /// The clock.
        public var clock: Clock

        /// A timer every (or once after) `interval` on `clock`, with `leeway`.
        public init(interval: Duration, repeats: Bool = true, clock: Clock = .monotonic, leeway: Duration = TimerSource.defaultLeeway) {
            self.interval = interval
            self.repeats = repeats
            self.clock = clock
            self.leeway = leeway
        }

        /// `every 5s`, `after 300ms boottime leeway 1s`, as plans show it.
        public var description: String {
            var s = repeats ? "every \(interval.short)" : "after \(interval.short)"
            if clock != .monotonic { s += " \(clock.rawValue)" }
            if leeway != TimerSource.defaultLeeway { s += " leeway \(leeway.short)" }
            return s
        }
    }

    /// One firing.
    public struct Tick: Hashable, Sendable {
        /// Which interval this tick ends, counting from 1 at the first due time
        /// (missed ticks are counted too).
        public var sequence: UInt64
        /// How many earlier due times passed without a tick because the loop was
        /// late (0 when on time).
        public var missed: UInt64

        /// The tick ending interval `sequence`, after `missed` missed due times.
        public init(sequence: UInt64, missed: UInt64) {
            self.sequence = sequence
            self.missed = missed
        }
    }

    /// What a timer reports.
    public enum Event: Equatable, Sendable {
        /// The timer fired.
        case tick(Tick)
        /// The timer could not be armed (an unsupported clock, a dead loop).
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }

    /// Interval and leeway retune in place; a clock or repeat change restarts.
    public static func canRetune(from old: Configuration, to new: Configuration) -> Bool {
        old.clock == new.clock && old.repeats == new.repeats
    }
}

extension Subscription {
    /// A repeating timer keyed by `key`.
    @inlinable public static func every<Key: Hashable & Sendable>(
        _ interval: Duration, key: Key, clock: TimerSource.Clock = .monotonic,
        leeway: Duration = TimerSource.defaultLeeway, _ tag: @escaping (TimerSource.Event) -> Message
    ) -> Subscription {
        Subscription(TimerSource.self, key: key,
                     configuration: .init(interval: interval, repeats: true, clock: clock, leeway: leeway), tag: tag)
    }

    /// A one-shot timer keyed by `key`, due `delay` after it starts. For a
    /// debounce use `debounce(_:phase:after:_:)`: its key names the debouncer
    /// and carries the phase, so a new phase is a new timer.
    @inlinable public static func after<Key: Hashable & Sendable>(
        _ delay: Duration, key: Key, clock: TimerSource.Clock = .monotonic,
        leeway: Duration = TimerSource.defaultLeeway, _ tag: @escaping (TimerSource.Event) -> Message
    ) -> Subscription {
        Subscription(TimerSource.self, key: key,
                     configuration: .init(interval: delay, repeats: false, clock: clock, leeway: leeway), tag: tag)
    }
}
