import CSystemd
import Glibc
import Reconcile

// The restart mechanism's real part: its delays come from the core's
// `RestartSchedule` (the library's one backoff), its clock is one sd-event
// one-shot timer per restarting source (`LoopTimer`). Restarting
// subscriptions (`RestartSupervisor`, run by `SystemdDriver`) and the
// backends' own retries (`Retry`: the bus reconnect, the netlink resync, a
// failed file watch's re-arming) both use it.

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

/// One source's retries under its restart policy, without a timer: the
/// attempts counted by the policy's `RestartSchedule` (jitter from the
/// system's generator), whether it gave up (`.never` after a failure, or
/// its cap reached). A bus source keeps one and its connection arms the
/// one timer (`BusConnection`); every other retry is a `Retry`.
struct RetryAttempts {
    /// The policy the attempts follow.
    private(set) var policy: RestartPolicy
    private var schedule: RestartSchedule?
    /// It retries no more: `.never` after a failure, or its cap reached.
    private(set) var gaveUp = false

    init(_ policy: RestartPolicy) {
        self.policy = policy
        schedule = policy.backoffSchedule.map(RestartSchedule.init)
    }

    /// Follows `policy` from now: another policy starts its schedule from
    /// the beginning; the same one changes nothing.
    mutating func follow(_ policy: RestartPolicy) {
        if policy != self.policy { self = RetryAttempts(policy) }
    }

    /// The decision after a failure at `now` (`.giveUp(0, 0)` for `.never`,
    /// and after it gave up).
    mutating func decide(at now: Duration) -> RestartSchedule.Decision {
        guard !gaveUp, var s = schedule else {
            gaveUp = true
            return .giveUp(attempts: 0, within: .zero)
        }
        var random = SystemRandomNumberGenerator()
        let d = s.next(at: now, random: &random)
        schedule = s
        if case .giveUp = d { gaveUp = true }
        return d
    }

    /// The source works again: the next failure waits the first delay
    /// again, and it retries again if it had given up. (The cap's window
    /// still counts the retries it made.)
    mutating func recovered() {
        schedule?.recovered()
        gaveUp = false
    }

    /// Tells the source what `decision`, armed after `delay`, means for it:
    /// `restarting` (attempt, delay); at the cap, `leave` and then
    /// `capReached` (attempts, window); for `.never`, `leave` only.
    static func announce(_ decision: RestartSchedule.Decision, after delay: Duration, restarting: (Int, Duration) -> Void,
                         capReached: (Int, Duration) -> Void, leave: () -> Void) {
        switch decision {
        case .restart(let n, _): restarting(n, delay)
        case .giveUp(0, _): leave()
        case .giveUp(let n, let window):
            leave()
            capReached(n, window)
        }
    }
}

/// A source's retry on the loop, the one driver-side helper every backend
/// retry uses (the bus connection's reconnect, the netlink resync, a failed
/// file watch's re-arming): its attempts are a `RetryAttempts` (counted by
/// the policy's `RestartSchedule`), its timer a `LoopTimer` armed through
/// the checked `usec` conversion, and `next()` says what the source
/// announces (`.restarting`, the cap's last failure, nothing for `.never`).
final class Retry {
    /// What a failure came to.
    enum Step {
        /// Attempt `attempt` is armed after `after`: announce `.restarting`.
        case restarting(attempt: Int, after: Duration)
        /// The cap is reached (`attempts` within `within`): one last failure.
        case gaveUp(attempts: Int, within: Duration)
        /// `.never` (or it gave up before): nothing is retried or announced.
        case never
        /// The timer could not be armed (the attempt counted).
        case cannotArm(SystemdError)
    }

    private(set) var attempts: RetryAttempts
    private let loop: EventLoop
    private let timer: LoopTimer
    /// A retry is armed and has not run.
    var isArmed: Bool { timer.isArmed }
    /// The delay of the last retry armed (µs).
    private(set) var lastDelay: UInt64 = 0
    /// The policy the retries follow.
    var policy: RestartPolicy { attempts.policy }
    /// It retries no more (until `recovered()`).
    var gaveUp: Bool { attempts.gaveUp }

    /// Retries under `policy`; `action` runs on the loop when one is due.
    init(loop: EventLoop, policy: RestartPolicy, action: @escaping () -> Void) {
        attempts = RetryAttempts(policy)
        self.loop = loop
        timer = LoopTimer(loop: loop, action: action)
    }

    /// The loop's monotonic now (what the cap's window counts).
    private var now: Duration { .microseconds(Int64(clamping: loop.now(CLOCK_MONOTONIC))) }

    /// The schedule's decision now, not armed: `arm(after:)` the delay of a `.restart`.
    func decide() -> RestartSchedule.Decision { attempts.decide(at: now) }

    /// After a failure: decides and arms the retry.
    func next() -> Step {
        guard !attempts.gaveUp, policy != .never else { return .never }
        switch decide() {
        case .restart(let n, let after):
            do { try arm(after: after) } catch { return .cannotArm(error) }
            return .restarting(attempt: n, after: after)
        case .giveUp(let n, let window):
            return .gaveUp(attempts: n, within: window)
        }
    }

    /// Arms the retry after `delay` (again, if one is armed) and returns it (µs).
    @discardableResult
    func arm(after delay: Duration) throws(SystemdError) -> UInt64 {
        let micros = usec(delay)
        try timer.arm(microseconds: micros)
        lastDelay = micros
        return micros
    }

    /// Follows `policy` from now (another one starts from its first attempt).
    func follow(_ policy: RestartPolicy) { attempts.follow(policy) }

    /// The source works again (see `RetryAttempts.recovered()`).
    func recovered() { attempts.recovered() }

    /// A new run of the source (a reused runner's next start) under
    /// `policy`: no attempt, and no cap window, carried over from the last.
    func restart(_ policy: RestartPolicy) { attempts = RetryAttempts(policy) }

    /// Cancels an armed retry and releases the timer source.
    func close() { timer.cancel() }
}
