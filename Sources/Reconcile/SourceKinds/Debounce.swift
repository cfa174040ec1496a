/// The identity of a debounce timer: the debouncer's name and the phase it
/// waits out.
///
/// Two debouncers in one program (a config file, an editor buffer) have
/// their own names, so their timers never share an identity, even when their
/// phases have equal counters. Build debounces with
/// `Subscription.debounce(_:phase:after:_:)`.
public struct DebounceKey: Hashable, Sendable, CustomStringConvertible {
    /// The debouncer's name (unique within the program).
    public let name: String
    /// The phase whose quiet moment the timer waits for.
    public let phase: Phase

    /// The key of debouncer `name`'s timer for `phase`.
    public init(_ name: String, phase: Phase) {
        self.name = name
        self.phase = phase
    }

    /// `name phase N`, as plans show it.
    public var description: String { "\(name) \(phase)" }
}

extension Subscription {
    /// A debounce: a one-shot timer named `name`, due `delay` after the model
    /// entered `phase`. A new phase is a new timer (the old one stops), so only
    /// the last of a burst fires; `update` checks the phase the message
    /// carries (`Phase.isCurrent`) to reject a tick that was already queued.
    ///
    /// ```swift
    /// if model.dirty {
    ///     let phase = model.phase
    ///     Subscription.debounce("save", phase: phase, after: .seconds(2)) { _ in .quiet(phase) }
    /// }
    /// ```
    @inlinable
    public static func debounce(
        _ name: String, phase: Phase, after delay: Duration, clock: TimerSource.Clock = .monotonic,
        leeway: Duration = TimerSource.defaultLeeway, _ tag: @escaping (TimerSource.Event) -> Message
    ) -> Subscription {
        Subscription(TimerSource.self, key: DebounceKey(name, phase: phase),
                     configuration: .init(interval: delay, repeats: false, clock: clock, leeway: leeway), tag: tag)
    }

    /// A bare `Phase` is not a timer key: two debouncers whose counters are
    /// equal would share one identity (a duplicate; the second never fires).
    @available(*, deprecated, message: "a bare Phase as a timer key collides with any other debouncer at the same count: use Subscription.debounce(_:phase:after:_:)")
    @inlinable
    public static func after(
        _ delay: Duration, key: Phase, clock: TimerSource.Clock = .monotonic,
        leeway: Duration = TimerSource.defaultLeeway, _ tag: @escaping (TimerSource.Event) -> Message
    ) -> Subscription {
        Subscription(TimerSource.self, key: key,
                     configuration: .init(interval: delay, repeats: false, clock: clock, leeway: leeway), tag: tag)
    }

    /// A bare `Phase` is not a timer key (see `after(_:key:clock:leeway:_:)`).
    @available(*, deprecated, message: "a bare Phase as a timer key collides with any other timer keyed by a phase at the same count: key by a name and the phase")
    @inlinable
    public static func every(
        _ interval: Duration, key: Phase, clock: TimerSource.Clock = .monotonic,
        leeway: Duration = TimerSource.defaultLeeway, _ tag: @escaping (TimerSource.Event) -> Message
    ) -> Subscription {
        Subscription(TimerSource.self, key: key,
                     configuration: .init(interval: interval, repeats: true, clock: clock, leeway: leeway), tag: tag)
    }
}
