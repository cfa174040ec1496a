import CSystemd
import Glibc
import Reconcile

/// What both connectivity backends share: the last reported state, settle,
/// and emitting one event per change.
final class ConnectivityReporter {
    private let ticket: SourceTicket
    private let loop: EventLoop
    private(set) var configuration: ConnectivitySource.Configuration
    private var reported: ConnectivitySource.State?
    private var candidate: ConnectivitySource.State?
    private var candidateSince: Int64 = 0
    private var settleTimer: EventSource?
    private var failing = false

    init(ticket: SourceTicket, configuration: ConnectivitySource.Configuration, loop: EventLoop) {
        self.ticket = ticket
        self.configuration = configuration
        self.loop = loop
    }

    /// Offers the backend's current state; emits now, or after it has held
    /// for `settle`, if it differs from what was last reported.
    func offer(_ state: ConnectivitySource.State) {
        failing = false
        guard state != reported else {
            candidate = nil
            cancelSettle()
            return
        }
        guard let settle = configuration.settle, reported != nil else {
            emit(state, since: realtimeMicros())
            return
        }
        if state != candidate {
            candidate = state
            candidateSince = realtimeMicros()
            armSettle(settle)
        }
    }

    /// Reports a backend failure once (until a state is offered again).
    func fail(_ failure: SourceFailure) {
        guard !failing else { return }
        failing = true
        reported = nil
        ticket.fail(failure)
    }

    /// New filters or settle: the backend recomputes and offers again.
    func retune(_ c: ConnectivitySource.Configuration) {
        configuration = c
        if c.settle == nil, let pending = candidate {
            candidate = nil
            cancelSettle()
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
        ticket.emit(ConnectivitySource.Event.changed(.init(state: state, changedAt: since)))
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
            if let c = me.candidate, c != me.reported { me.emit(c, since: me.candidateSince) } else { me.cancelSettle() }
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        if r >= 0 { settleTimer = EventSource(s!) } else if let c = candidate { emit(c, since: candidateSince) }
    }
}

func realtimeMicros() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}
