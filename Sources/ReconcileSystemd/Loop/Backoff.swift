import CSystemd
import Glibc
import Reconcile

// The restart mechanism's real part: its delays come from the core's
// `RestartSchedule` (the library's one backoff), its clock is one sd-event
// one-shot timer per restarting source (`LoopTimer`). Restarting
// subscriptions (`RestartSupervisor`, run by `SystemdDriver`) and the
// backends' own retries (`RetryTimer`: the bus reconnect, the netlink
// resync, a failed file watch's re-arming) both use it.

/// One one-shot timer source on the loop, made at the first `arm` and armed
/// again for the next (no new source per retry, so a retry that could be
/// scheduled once always can).
///
/// `action` runs on the loop when the timer expires; the owner captures
/// itself `unowned` and calls `cancel()` when it stops (before it goes away).
final class LoopTimer: RestartTimer {
    private let loop: EventLoop
    private let action: () -> Void
    private var source: EventSource?
    /// The timer is armed and has not fired.
    private(set) var isArmed = false

    init(loop: EventLoop, action: @escaping () -> Void) {
        self.loop = loop
        self.action = action
    }

    /// Arms the timer `delay` microseconds from the loop's now (again, if armed).
    func arm(microseconds delay: UInt64) throws(SystemdError) {
        let due = usecAdd(loop.now(CLOCK_MONOTONIC), delay)
        if let handle = source?.handle {
            _ = try check("sd_event_source_set_time", sd_event_source_set_time(handle, due))
            _ = try check("sd_event_source_set_enabled", sd_event_source_set_enabled(handle, Int32(SD_EVENT_ONESHOT)))
        } else {
            var s: OpaquePointer?
            _ = try check("sd_event_add_time", sd_event_add_time(loop.handle, &s, CLOCK_MONOTONIC, due, 1000, { _, _, ud in
                let me = Unmanaged<LoopTimer>.fromOpaque(ud!).takeUnretainedValue()
                withExtendedLifetime(me) {
                    me.isArmed = false
                    me.action()
                }
                return 0
            }, Unmanaged.passUnretained(self).toOpaque()))
            source = EventSource(s!)
        }
        isArmed = true
    }

    /// Arms the timer after `delay` (the restart mechanism's entry).
    func arm(after delay: Duration) -> SourceFailure? {
        do { try arm(microseconds: usec(delay)) } catch { return error.failure }
        return nil
    }

    /// Disarms the timer and releases its source.
    func cancel() {
        source?.close()
        source = nil
        isArmed = false
    }

    deinit { source?.close() }
}

/// A backend's retry on the loop: delays from a `RestartSchedule` that
/// doubles from `initial` up to `maximum`, without jitter or cap (a backend
/// retries as long as it runs), back to `initial` after `reset()`; the
/// timer is a `LoopTimer`.
final class RetryTimer {
    private var delays: RestartSchedule
    private let timer: LoopTimer
    /// A retry is armed and has not run.
    var isArmed: Bool { timer.isArmed }
    /// The delay of the last retry armed (µs).
    private(set) var lastDelay: UInt64 = 0

    /// A retry with delays from `initial` to `maximum` microseconds.
    convenience init(loop: EventLoop, initial: UInt64, maximum: UInt64, action: @escaping () -> Void) {
        self.init(loop: loop, backoff: Backoff(initial: .microseconds(Int64(clamping: initial)), factor: 2,
                                               maximum: .microseconds(Int64(clamping: maximum))), action: action)
    }

    /// The backoff its delays come from.
    let backoff: Backoff
    private let loop: EventLoop

    /// A retry with the delays of `backoff` (its jitter drawn from the
    /// system's generator); its cap ignored unless `capped` (then
    /// `decide()` gives up once it is reached).
    init(loop: EventLoop, backoff: Backoff, capped: Bool = false, action: @escaping () -> Void) {
        var schedule = backoff
        if !capped { schedule.attempts = .max }
        self.backoff = backoff
        self.loop = loop
        delays = RestartSchedule(schedule)
        timer = LoopTimer(loop: loop, action: action)
    }

    /// The schedule's decision now (the loop's monotonic time counts the
    /// cap's window), not armed: `arm(after:)` the delay of a `.restart`.
    func decide() -> RestartSchedule.Decision {
        var random = SystemRandomNumberGenerator()
        return delays.next(at: .microseconds(Int64(clamping: loop.now(CLOCK_MONOTONIC))), random: &random)
    }

    /// Arms the retry after the schedule's next delay (again, if one is
    /// armed) and returns that delay (µs).
    @discardableResult
    func schedule() throws(SystemdError) -> UInt64 {
        try arm(after: nextDelay())
    }

    /// Draws the schedule's next delay (the attempt counts) without arming.
    func nextDelay() -> Duration {
        var random = SystemRandomNumberGenerator()
        guard case .restart(_, let after) = delays.next(at: .zero, random: &random) else { return .microseconds(Int64(clamping: lastDelay)) }
        return after
    }

    /// Arms the retry after `delay` (one a caller's schedules chose, or
    /// `nextDelay()`) and returns it (µs).
    @discardableResult
    func arm(after delay: Duration) throws(SystemdError) -> UInt64 {
        let micros = usec(delay)
        try timer.arm(microseconds: micros)
        lastDelay = micros
        return micros
    }

    /// The next retry comes after the first delay again (after a success).
    func reset() { delays.recovered() }

    /// Cancels an armed retry and releases the timer source.
    func close() { timer.cancel() }
}
