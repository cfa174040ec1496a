import CSystemd
import Glibc
import Reconcile

/// What both connectivity backends share: the last reported state, the
/// subscription's granularity, settle, and emitting one event per change the
/// subscriber asked for.
///
/// A state is compared with the last reported one through the configured
/// `Granularity`: a change the subscriber does not look at wakes nothing, and
/// the next event carries the whole state current then. With settle, the
/// candidate is what differs through that lens; it is reported once it has
/// held for the settle time (the newest state of that candidate is sent).
final class ConnectivityReporter {
    /// Weak: the ticket's driver state holds the backend that holds this
    /// (see `DescriptorRunner.ticket`): a ticket that goes away without a
    /// stop stops the backend through the driver's runner.
    private weak var ticket: SourceTicket?
    private let loop: EventLoop
    private(set) var configuration: ConnectivitySource.Configuration
    private var reported: ConnectivitySource.State?
    private var candidate: ConnectivitySource.State?
    private var candidateSince: Int64 = 0
    private var settleTimer: EventSource?
    /// The failure last reported, while the backend is failing.
    private var failure: SourceFailure?

    init(ticket: SourceTicket, configuration: ConnectivitySource.Configuration, loop: EventLoop) {
        self.ticket = ticket
        self.configuration = configuration
        self.loop = loop
    }

    private var granularity: ConnectivitySource.Granularity { configuration.granularity }

    /// Offers the backend's current state; emits now, or after it has held
    /// for `settle`, if it differs from what was last reported in what the
    /// subscriber looks at. After a failure, the first state is always reported.
    func offer(_ state: ConnectivitySource.State) {
        failure = nil
        guard let reported else {
            emit(state, since: wallClockMicroseconds())
            return
        }
        guard granularity.distinguishes(reported, state) else {
            // Nothing the subscriber looks at changed (or a flap came back).
            candidate = nil
            cancelSettle()
            return
        }
        guard let settle = configuration.settle else {
            emit(state, since: wallClockMicroseconds())
            return
        }
        if let c = candidate, !granularity.distinguishes(c, state) {
            candidate = state   // the same candidate, newer detail: keep its start
        } else {
            candidate = state
            candidateSince = wallClockMicroseconds()
            armSettle(settle)
        }
    }

    /// Reports a backend failure, once per distinct failure while failing;
    /// the next offered state is then reported whatever it is.
    func fail(_ failure: SourceFailure) {
        guard failure != self.failure else { return }
        self.failure = failure
        reported = nil
        candidate = nil
        cancelSettle()
        ticket?.fail(failure)
    }

    /// The backend retries (attempt `attempt`) after `after`.
    func restarting(attempt: Int, after: Duration) {
        // A batch of one: a retry announced to every source of a backend
        // (a bus reconnect, a netlink resync) is one reconcile
        // (`RetryAttempts.announceRestarting`).
        guard let ticket else { return }
        RetryAttempts.announceRestarting(ConnectivitySource.Event.restarting(attempt: attempt, after: after), of: ConnectivitySource.self,
                                         to: ticket)
    }

    /// New filters, settle or granularity: the backend recomputes and offers
    /// again (a finer granularity then reports what the coarser one held back).
    func retune(_ c: ConnectivitySource.Configuration) {
        configuration = c
        if c.settle == nil, let pending = candidate {
            candidate = nil
            cancelSettle()
            if let reported, !c.granularity.distinguishes(reported, pending) { return }
            emit(pending, since: candidateSince)
        }
    }

    func stop() {
        cancelSettle()
    }

    private func emit(_ state: ConnectivitySource.State, since: Int64) {
        reported = state
        candidate = nil
        cancelSettle()
        ticket?.emit(ConnectivitySource.Event.changed(.init(state: state, changedAt: since)))
    }

    private func cancelSettle() {
        settleTimer?.close()
        settleTimer = nil
    }

    private func armSettle(_ settle: Duration) {
        cancelSettle()
        var s: OpaquePointer?
        // Absolute and saturating: a settle too long for usec_t never ends.
        let due = usecAdd(loop.now(CLOCK_MONOTONIC), max(1, usec(settle)))
        let r = sd_event_add_time(loop.handle, &s, CLOCK_MONOTONIC, due, 1000, { _, _, ud in
            let me = Unmanaged<ConnectivityReporter>.fromOpaque(ud!).takeUnretainedValue()
            // The candidate held for the whole settle time.
            if let c = me.candidate, me.reported.map({ me.granularity.distinguishes($0, c) }) ?? true {
                me.emit(c, since: me.candidateSince)
            } else {
                me.cancelSettle()
            }
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        if r >= 0 { settleTimer = EventSource(s!) } else if let c = candidate { emit(c, since: candidateSince) }
    }
}
