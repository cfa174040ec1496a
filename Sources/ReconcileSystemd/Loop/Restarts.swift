import CSystemd
import Reconcile

// Restarting subscriptions on sd-event: the core's `RestartSupervisor` runs
// the attempts through the driver's own start and stop, and waits on a
// `LoopTimer` (Loop/Backoff.swift).

extension SystemdDriver: RestartHost {
    /// Starts an attempt the way its kind starts (the supervisor's ticket).
    package func startAttempt(_ ticket: SourceTicket) { start(ticket) }

    /// Stops an attempt.
    package func stopAttempt(_ ticket: SourceTicket) { stop(ticket) }

    /// A one-shot sd-event timer on the loop.
    package func makeRestartTimer(_ fire: @escaping () -> Void) -> any RestartTimer {
        LoopTimer(loop: loop, action: fire)
    }

    /// The loop's monotonic now.
    package var restartNow: Duration { loopTime }

    /// The system's random bits.
    package func restartRandom() -> UInt64 {
        var g = SystemRandomNumberGenerator()
        return g.next()
    }

    /// Starts `ticket` under its restart policy when it has one; false when
    /// it has none (or is an attempt itself).
    func startRestarting(_ ticket: SourceTicket) -> Bool {
        guard let supervisor = RestartSupervisor(ticket, host: self) else { return false }
        // Owned before the first attempt: a failure it reports may stop it at once.
        own(RestartRunner(supervisor), ticket)
        supervisor.start()
        return true
    }
}

/// A restarting subscription's running source: its supervisor.
final class RestartRunner: DriverRunner {
    let supervisor: RestartSupervisor
    init(_ supervisor: RestartSupervisor) { self.supervisor = supervisor }
    override func stop() { supervisor.stop() }
    deinit { stopOwned() }
}
