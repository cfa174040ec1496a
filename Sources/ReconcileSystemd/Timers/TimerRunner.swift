import CSystemd
import Glibc
import Reconcile

extension TimerSource.Clock {
    /// The Linux clock id.
    public var clockID: clockid_t {
        switch self {
        case .monotonic: CLOCK_MONOTONIC
        case .boottime: CLOCK_BOOTTIME
        case .realtime: CLOCK_REALTIME
        }
    }
}

extension TimerSource: SystemdSource {
    /// Adds an sd-event timer on the configured clock. (`SystemdDriver`
    /// starts timers without this generic entry: see `SystemdDriver.start`.)
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        let runner = TimerRunner(loop: context.loop)
        try runner.start(ticket, configuration)
        return runner
    }
}

/// A timer on sd-event's timerfd. Tick *k* is due at origin + *k*·interval;
/// each firing re-arms from the schedule, not from the wake-up time, so it
/// does not drift; a late loop gets one tick with `missed` set. A one-shot
/// ticks once with sequence 1 and missed 0. Due times saturate at
/// `USEC_INFINITY`: an interval too large for `usec_t` never fires.
///
/// A stopped runner can be started again for another ticket: the driver
/// keeps stopped runners for later starts (`SystemdDriver.spareTimers`).
final class TimerRunner: DriverRunner {
    // `ticket` (the base's): read only while armed (`handle` set); stop
    // clears it.
    private let loop: EventLoop
    private var clock: clockid_t = CLOCK_MONOTONIC
    private var repeats = true
    /// `kept` while the timer runs; nil when stopped.
    private var handle: OpaquePointer?
    /// The sd-event source this runner owns (no wrapper object), on
    /// `clock` with accuracy `leeway`; kept, parked, while stopped.
    private var kept: OpaquePointer?
    private var origin: UInt64 = 0
    private var interval: UInt64 = 1
    private var leeway: UInt64 = 1
    private var sequence: UInt64 = 0
    private var fired = false

    /// A stopped runner for timers on `loop`.
    init(loop: EventLoop) {
        self.loop = loop
        super.init()
    }

    deinit { release() }

    /// Arms the (stopped) runner for `ticket` with configuration `c`. A
    /// runner that ran before on the same clock moves the source it kept
    /// (parked at `USEC_INFINITY`, see `stop`) to the new due time: one
    /// `sd_event_source_set_time`, no allocation and no free (plus
    /// `set_enabled` after a one-shot fired, `set_time_accuracy` for another
    /// leeway). Another clock gets a new source.
    func start(_ ticket: SourceTicket, _ c: TimerSource.Configuration) throws(SystemdError) {
        let clock = c.clock.clockID
        repeats = c.repeats
        interval = max(1, usec(c.interval))
        let leeway = usecAccuracy(c.leeway)
        origin = loop.now(clock)
        sequence = 0
        fired = false
        let due = usecAdd(origin, interval)
        if let kept, clock == self.clock {
            if leeway != self.leeway {
                try check("sd_event_source_set_time_accuracy", sd_event_source_set_time_accuracy(kept, leeway))
                self.leeway = leeway
            }
            try check("sd_event_source_set_time", sd_event_source_set_time(kept, due))
            // On already (returns at once) unless a one-shot fired.
            try check("sd_event_source_set_enabled", sd_event_source_set_enabled(kept, Int32(SD_EVENT_ONESHOT)))
        } else {
            release()
            var s: OpaquePointer?
            try check("sd_event_add_time", sd_event_add_time(
                loop.handle, &s, clock, due, leeway,
                { _, _, ud in
                    // No retain: the runner owns this source and outlives its
                    // dispatch (a stop from inside `fire` parks or releases the
                    // source but the runner itself stays in the pool or with
                    // its ticket until after the callback; `emit` is the last use).
                    Unmanaged<TimerRunner>.fromOpaque(ud!)._withUnsafeGuaranteedRef { $0.fire() }
                    return 0
                }, Unmanaged.passUnretained(self).toOpaque()))
            self.clock = clock
            self.leeway = leeway
            kept = s
        }
        handle = kept
        self.ticket = ticket
        EventSource.accountReleasedByOwner()
    }

    private func fire() {
        guard let handle, let ticket else { return }
        guard repeats else {
            // A one-shot has one due time: however late, nothing was missed.
            fired = true
            sequence = 1
            ticket.emit(TimerSource.Event.tick(.init(sequence: 1, missed: 0)))
            return
        }
        let now = loop.now(clock)
        let due = max(sequence + 1, now >= origin ? (now - origin) / interval : 0)
        let missed = due - sequence - 1
        sequence = due
        // Re-arm before emitting: the program may stop this timer.
        sd_event_source_set_time(handle, usecAdd(origin, usecMultiply(due + 1, interval)))
        sd_event_source_set_enabled(handle, Int32(SD_EVENT_ONESHOT))
        ticket.emit(TimerSource.Event.tick(.init(sequence: due, missed: missed)))
    }

    override func retune(to configuration: AnyHashable) throws {
        guard let c = configuration.base as? TimerSource.Configuration else { return }
        try retune(to: c)
    }

    /// The driver's retune: the configuration read typed (no `AnyHashable`).
    override func retune(_ ticket: SourceTicket) throws {
        guard let c = ticket.configuration(as: TimerSource.self) else { return }
        try retune(to: c)
    }

    /// Applies a new interval and leeway in place.
    func retune(to c: TimerSource.Configuration) throws(SystemdError) {
        guard let handle else { return }
        let newInterval = max(1, usec(c.interval))
        leeway = usecAccuracy(c.leeway)
        try check("sd_event_source_set_time_accuracy", sd_event_source_set_time_accuracy(handle, leeway))
        if repeats {
            // The next tick is one new interval after the last due time.
            origin = usecAdd(origin, usecMultiply(sequence, interval))
            sequence = 0
            interval = newInterval
        } else {
            interval = newInterval
            if fired { return }
        }
        try check("sd_event_source_set_time", sd_event_source_set_time(handle, usecAdd(origin, usecMultiply(sequence + 1, interval))))
        try check("sd_event_source_set_enabled", sd_event_source_set_enabled(handle, Int32(SD_EVENT_ONESHOT)))
    }

    /// Parks the source at `USEC_INFINITY` and keeps it for the next start:
    /// it never comes due there, and sd-event drops a pending firing when
    /// its time is set, so nothing reaches the next ticket. (Parked rather
    /// than turned off: an off source still sits in sd-event's two timer
    /// queues, and turning it off and on again moves it through both
    /// twice; parking and re-arming move it once each, cheaper than
    /// `sd_event_add_time` with its allocation and `disable_unref` with its
    /// free.) A source that cannot be parked (the loop finished) is released.
    override func stop() {
        if let h = handle {
            handle = nil
            ticket = nil
            EventSource.releasedByOwner()
            if sd_event_source_set_time(h, usecInfinity) < 0 { release() }
        }
    }

    /// Stops the timer and releases the kept source.
    func release() {
        stop()
        if let k = kept {
            kept = nil
            sd_event_source_disable_unref(k)
        }
    }
}
