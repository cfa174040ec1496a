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
    /// Starts a timer on the driver's queue of the configured clock and
    /// accuracy. (`SystemdDriver` starts timers without this generic entry:
    /// see `SystemdDriver.start`.)
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        let runner = TimerRunner(queues: context.driver.timerQueues)
        try runner.start(ticket, configuration)
        return runner
    }
}

/// A timer on its driver's `TimerQueue` of its clock and accuracy (one
/// sd-event source per clock and accuracy, not per timer). Tick *k* is due
/// at origin + *k*·interval; each firing reschedules from the schedule, not
/// from the wake-up time, so it does not drift; a late loop gets one tick
/// with `missed` set. A one-shot ticks once with sequence 1 and missed 0.
/// Due times saturate at `USEC_INFINITY`: an interval too large for
/// `usec_t` never fires.
///
/// A stopped runner can be started again for another ticket: the driver
/// keeps stopped runners for later starts (`SystemdDriver.spareTimers`).
final class TimerRunner: DriverRunner {
    // `ticket` (the base's): read only while running (`queue` set); stop
    // clears it.
    let queues: TimerQueues
    /// The queue this timer runs on; nil when stopped. Unretained: the
    /// driver's `TimerQueues` keeps every queue a running timer is on.
    @exclusivity(unchecked) private var queue: Unmanaged<TimerQueue>?
    /// The position in `queue`'s heap; -1 when not in it (stopped, or a
    /// one-shot that fired).
    @exclusivity(unchecked) var heapIndex = -1
    @exclusivity(unchecked) private var repeats = true
    @exclusivity(unchecked) private var origin: UInt64 = 0
    @exclusivity(unchecked) private var interval: UInt64 = 1
    @exclusivity(unchecked) private var sequence: UInt64 = 0
    @exclusivity(unchecked) private var fired = false

    /// A stopped runner for timers on `queues`.
    init(queues: TimerQueues) {
        self.queues = queues
        super.init()
    }

    deinit { stop() }

    /// Starts the (stopped) runner for `ticket` with configuration `c`: a
    /// push onto its queue's heap, with no sd-event call unless it is the
    /// queue's new earliest due time (then `sd_event_source_set_time`, or
    /// `sd_event_add_time` for the queue's first).
    func start(_ ticket: SourceTicket, _ c: TimerSource.Configuration) throws(SystemdError) {
        let q = queues.queue(c.clock.clockID, usecAccuracy(c.leeway))
        repeats = c.repeats
        interval = max(1, usec(c.interval))
        origin = queues.loop.now(q._withUnsafeGuaranteedRef { $0.clock })
        sequence = 0
        fired = false
        try q.insert(self, due: usecAdd(origin, interval))
        q._withUnsafeGuaranteedRef { $0.members += 1 }
        queue = q
        self.ticket = ticket
    }

    /// Due: the queue's dispatch at the iteration's time `now` (on the
    /// timer's clock). Reschedules (or, a one-shot, leaves the heap) before
    /// emitting: the program may stop this timer, or others.
    func fire(_ now: UInt64) {
        guard let queue, let ticket else { return }
        guard repeats else {
            // A one-shot has one due time: however late, nothing was missed.
            fired = true
            sequence = 1
            queue._withUnsafeGuaranteedRef { $0.remove(self) }
            ticket.emit(TimerSource.Event.tick(.init(sequence: 1, missed: 0)))
            return
        }
        let due = max(sequence + 1, now >= origin ? (now - origin) / interval : 0)
        let missed = due - sequence - 1
        sequence = due
        // Within a dispatch: no sd-event call, nothing thrown.
        try? queue.update(self, due: usecAdd(origin, usecMultiply(due + 1, interval)))
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

    /// Applies a new interval and leeway in place (another leeway moves the
    /// timer to that accuracy's queue; the clock stays).
    func retune(to c: TimerSource.Configuration) throws(SystemdError) {
        guard let current = queue else { return }
        let newInterval = max(1, usec(c.interval))
        if repeats {
            // The next tick is one new interval after the last due time.
            origin = usecAdd(origin, usecMultiply(sequence, interval))
            sequence = 0
        }
        interval = newInterval
        let scheduled = repeats || !fired
        let due = usecAdd(origin, usecMultiply(sequence + 1, interval))
        let accuracy = usecAccuracy(c.leeway)
        let (clock, same) = current._withUnsafeGuaranteedRef { ($0.clock, $0.accuracy == accuracy) }
        if same {
            guard scheduled else { return }
            try current.update(self, due: due)
            return
        }
        leave(current)
        queue = nil
        let target = queues.queue(clock, accuracy)
        // A failure to arm leaves the timer on no queue (it fails; nothing fires).
        if scheduled { try target.insert(self, due: due) }
        target._withUnsafeGuaranteedRef { $0.members += 1 }
        queue = target
    }

    /// Takes this runner off `q` (its heap and its members).
    private func leave(_ q: Unmanaged<TimerQueue>) {
        q._withUnsafeGuaranteedRef { q in
            if heapIndex >= 0 { q.remove(self) }
            q.members -= 1
        }
    }

    /// Takes the timer off its queue: a due time that passed but was not
    /// delivered yet goes with it, so nothing reaches the next ticket.
    override func stop() {
        ticket = nil
        guard let q = queue else { return }
        queue = nil
        leave(q)
    }
}

extension Unmanaged where Instance == TimerQueue {
    /// `TimerQueue.insert` without a retain of the queue.
    @inline(__always)
    func insert(_ runner: TimerRunner, due: UInt64) throws(SystemdError) {
        let failure: SystemdError? = _withUnsafeGuaranteedRef { q in
            do throws(SystemdError) { try q.insert(runner, due: due) } catch { return error }
            return nil
        }
        if let failure { throw failure }
    }

    /// `TimerQueue.update` without a retain of the queue.
    @inline(__always)
    func update(_ runner: TimerRunner, due: UInt64) throws(SystemdError) {
        let failure: SystemdError? = _withUnsafeGuaranteedRef { q in
            do throws(SystemdError) { try q.update(runner, due: due) } catch { return error }
            return nil
        }
        if let failure { throw failure }
    }
}
