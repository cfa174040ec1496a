import Synchronization

/// A source kind whose subscriptions can restart by themselves after a
/// failure or an end (`RestartPolicy`), run by any driver.
///
/// The driver runs each attempt on a ticket of its own (a new activation of
/// the kind's runner); when the attempt fails or ends, the driver stops it,
/// and the program sees the failure (or the end), then
/// `restarting(attempt:after:)`, then the next attempt's events. Whatever a
/// stopped attempt emits afterwards is refused (`Diagnostic.eventAfterStop`)
/// and its posters refuse new events, as for a stopped activation. When the
/// policy's cap is reached the program sees one last failure and the source
/// stays stopped until its subscription changes.
public protocol RestartableSource: Source {
    /// The policy a configuration asks for.
    /// - Parameter configuration: The subscription's configuration.
    static func restartPolicy(_ configuration: Configuration) -> RestartPolicy
    /// The event that says attempt `attempt` (from 1) starts after `after`.
    /// - Parameters:
    ///   - attempt: The attempt's number since the source last recovered.
    ///   - after: The delay before it starts.
    static func restarting(attempt: Int, after: Duration) -> Event
    /// Whether `event` ends the source (a stream's `.finished`); the default
    /// is that no event does.
    /// - Parameter event: An event of the running attempt.
    static func isEnd(_ event: Event) -> Bool
    /// Whether `event` ends the source under `configuration` (a process's
    /// clean exit ends it only when its condition says `.always`); the
    /// default is `isEnd(_:)`.
    /// - Parameters:
    ///   - event: An event of the running attempt.
    ///   - configuration: The subscription's configuration.
    static func isEnd(_ event: Event, configuration: Configuration) -> Bool
    /// Whether `event` shows the attempt is healthy, so the next restart
    /// waits `initial` again; the default is that every event does (a
    /// process's `.started` and output do not: a child that prints and
    /// exits at once would never back off).
    /// - Parameter event: An event of the running attempt.
    static func isRecovery(_ event: Event) -> Bool
}

extension RestartableSource {
    /// No event ends the source.
    public static func isEnd(_ event: Event) -> Bool { false }
    /// `isEnd(event)`.
    public static func isEnd(_ event: Event, configuration: Configuration) -> Bool { isEnd(event) }
    /// Every event is a recovery.
    public static func isRecovery(_ event: Event) -> Bool { true }

    static func backoff(of ticket: SourceTicket) -> Backoff? {
        guard let configuration = ticket.configuration(as: Self.self), case .backoff(let b) = restartPolicy(configuration) else { return nil }
        return b
    }
    /// Whether an event ends the source under `ticket`'s configuration as
    /// it is now (looked up once, here: the supervisor keeps the test until
    /// the configuration changes).
    static func endTest(of ticket: SourceTicket) -> (Any) -> Bool {
        guard let configuration = ticket.configuration(as: Self.self) else {
            return { event in (event as? Event).map { isEnd($0) } ?? false }
        }
        return { event in (event as? Event).map { isEnd($0, configuration: configuration) } ?? false }
    }
    static func isRecoveryEvent(_ event: Any) -> Bool { (event as? Event).map(isRecovery) ?? true }
    static func restartingEvent(_ attempt: Int, _ after: Duration) -> Any { restarting(attempt: attempt, after: after) }
}

/// What a driver gives the restart mechanism: how to start and stop one
/// attempt of a kind, a one-shot timer on its clock, its time and its
/// randomness. `SystemdDriver` (sd-event timers) and `VirtualDriver`
/// (virtual time) implement it; all calls come from the loop thread.
package protocol RestartHost: AnyObject {
    /// Starts `ticket` (an attempt) the way the driver starts its kind.
    func startAttempt(_ ticket: SourceTicket)
    /// Stops `ticket` (an attempt): it emits nothing afterwards.
    func stopAttempt(_ ticket: SourceTicket)
    /// A one-shot timer that calls `fire` on the loop thread when it expires.
    func makeRestartTimer(_ fire: @escaping () -> Void) -> any RestartTimer
    /// The driver's monotonic time now.
    var restartNow: Duration { get }
    /// Random bits for the jitter.
    func restartRandom() -> UInt64
}

/// A driver's one-shot timer for restarts.
package protocol RestartTimer: AnyObject {
    /// Arms the timer to fire after `delay` (again, if armed); a failure to
    /// arm it is returned.
    func arm(after delay: Duration) -> SourceFailure?
    /// Disarms the timer and releases what it holds.
    func cancel()
}

/// One subscription's restarts in a driver: starts attempts, sees their
/// failures and ends, asks its `RestartSchedule` for the next delay, and arms
/// the driver's timer. The driver holds it as the subscription's running
/// source and calls `stop()` when the runtime stops the subscription.
package final class RestartSupervisor {
    /// Weak, as each attempt's: the subscription's ticket holds the driver's
    /// runner, which holds this; a ticket that goes away without a stop (a
    /// runtime dropped without `shutdown()`) stops it through that runner's
    /// deinit. Held strongly, it was a cycle, and the attempts ran on (and
    /// restarted) while the driver lived. Cleared at stop.
    private weak var outer: SourceTicket?
    private let kind: any RestartableSource.Type
    private var schedule: RestartSchedule
    private unowned let host: any RestartHost
    private var timer: (any RestartTimer)?
    private var current: AttemptTicket?
    private var stopped = false
    /// The current attempt delivered an event since it started (a restart
    /// after that waits `initial` again).
    private var healthy = true
    /// Attempts started (the first included).
    package private(set) var started = 0
    /// When the current (or last) attempt started.
    private var startedAt: Duration = .zero
    /// Whether an event ends the source, for the configuration in
    /// `endTestBox` (the subscription's configuration is looked up again
    /// only when a retune replaced its box, not per event).
    private var endTest: (Any) -> Bool
    private var endTestBox: HashableBox

    /// The supervisor for `ticket` when its kind is restartable and its
    /// configuration asks for a backoff; nil otherwise (and for an attempt).
    /// - Parameters:
    ///   - ticket: The runtime's ticket of the subscription.
    ///   - host: The driver.
    package init?(_ ticket: SourceTicket, host: any RestartHost) {
        guard !(ticket is AttemptTicket), let kind = ticket.source as? any RestartableSource.Type,
              let backoff = kind.backoff(of: ticket) else { return nil }
        self.outer = ticket
        self.kind = kind
        self.schedule = RestartSchedule(backoff)
        endTest = kind.endTest(of: ticket)
        endTestBox = ticket.configurationBox
        self.host = host
    }

    /// The running attempt's ticket (nil while a restart is waiting).
    package var currentAttempt: SourceTicket? { current }

    /// Whether `event` ends the source under `outer`'s current configuration.
    private func isEnd(_ event: Any, of outer: SourceTicket) -> Bool {
        if outer.configurationBox !== endTestBox {
            endTest = kind.endTest(of: outer)
            endTestBox = outer.configurationBox
        }
        return endTest(event)
    }

    /// Starts the first attempt.
    package func start() { launch() }

    /// Stops the running attempt and a waiting restart; nothing more is emitted.
    package func stop() {
        guard !stopped else { return }
        stopped = true
        timer?.cancel()
        timer = nil
        if let c = current {
            current = nil
            c.kill()
            host.stopAttempt(c)
        }
        outer = nil
    }

    private func launch() {
        guard !stopped, let outer else { return }
        started += 1
        startedAt = host.restartNow
        let attempt = AttemptTicket(outer, number: started, supervisor: self)
        current = attempt
        host.startAttempt(attempt)
    }

    fileprivate func emitted(_ event: Any, by attempt: AttemptTicket) {
        guard attempt === current, let outer else { return attempt.rejected() }
        if isEnd(event, of: outer) { return ended(attempt, report: { outer.emit(event) }) }
        if !healthy, kind.isRecoveryEvent(event) {
            healthy = true
            schedule.recovered()
        }
        outer.emit(event)
    }

    /// A batch of the current attempt: the events before its first end are
    /// one batch on the subscription's ticket (a recovery among them counts
    /// as one), then the end ends the attempt; what follows it is refused
    /// like any event of a stopped attempt.
    fileprivate func emitted<S: Source>(batch events: [S.Event], of source: S.Type, by attempt: AttemptTicket) {
        guard attempt === current, let outer else {
            for _ in events { attempt.rejected() }
            return
        }
        let end = events.firstIndex { isEnd($0, of: outer) }
        let delivered = events[..<(end ?? events.endIndex)]
        if !healthy, delivered.contains(where: { kind.isRecoveryEvent($0) }) {
            healthy = true
            schedule.recovered()
        }
        if !delivered.isEmpty {
            // The subscription's ticket is the runtime's: it takes the batch.
            if !outer.emit(batch: Array(delivered), of: source) { for e in delivered { outer.emit(e) } }
        }
        guard let end else { return }
        // The program may have stopped the subscription (or this attempt) meanwhile.
        guard !stopped, attempt === current else {
            for _ in events[end...] { attempt.rejected() }
            return
        }
        ended(attempt, report: { outer.emit(events[end]) })
        for _ in events[(end + 1)...] { attempt.rejected() }
    }

    fileprivate func failed(_ failure: SourceFailure, by attempt: AttemptTicket) {
        guard attempt === current, let outer else { return attempt.rejected() }
        ended(attempt, report: { outer.fail(failure) })
    }

    fileprivate func poster(for attempt: AttemptTicket) -> EventPoster {
        guard attempt === current, let outer else { return EventPoster(activation: attempt.activation) { _ in .closed } }
        let inner = outer.poster()
        let gate = attempt.gate
        // The gate is held while posting, so once `kill` returns no post of
        // the attempt can enter the inbox.
        return EventPoster(activation: attempt.activation) { event in
            gate.open.withLock { alive in alive ? inner.post(event) : .closed }
        }
    }

    /// The attempt failed or ended: stop it, decide, tell the program.
    private func ended(_ attempt: AttemptTicket, report: () -> Void) {
        current = nil
        attempt.kill()
        host.stopAttempt(attempt)
        // An attempt that ran a whole window is a recovery too: the
        // restarts before it no longer count against the cap either.
        let now = host.restartNow
        if schedule.backoff.window > .zero, now - startedAt >= schedule.backoff.window {
            healthy = true
            schedule.recovered()
        }
        var random = HostRandom(host: host)
        let decision = schedule.next(at: now, random: &random)
        healthy = false
        if case .restart(_, let delay) = decision {
            if timer == nil { timer = host.makeRestartTimer { [weak self] in self?.launch() } }
            if let failure = timer?.arm(after: delay) {
                report()
                guard !stopped, let outer else { return }
                return outer.fail(failure)
            }
        }
        // Each call below may stop this subscription (the program reacts at once).
        report()
        guard !stopped, let outer else { return }
        switch decision {
        case .restart(let n, let delay):
            outer.emit(kind.restartingEvent(n, delay))
        case .giveUp(let n, let window):
            outer.fail(RestartPolicy.capReached(operation: "restart \(outer.id)", attempts: n, retries: "restarts", within: window.short,
                                                then: "; the source stays stopped until its subscription changes"))
        }
    }
}

/// The ticket of one attempt of a restarting subscription: its events go to
/// the subscription's ticket while it is the current attempt, and are
/// refused once it was stopped.
final class AttemptTicket: SourceTicket {
    private weak var supervisor: RestartSupervisor?
    /// Weak (see `RestartSupervisor.outer`).
    private weak var outer: SourceTicket?
    /// The attempt's number (1 for the first start).
    let number: Int
    /// Open while the attempt may post from other threads.
    let gate = AttemptGate()

    init(_ outer: SourceTicket, number: Int, supervisor: RestartSupervisor) {
        self.outer = outer
        self.number = number
        self.supervisor = supervisor
        super.init(activation: outer.activation, id: outer.id, configurationBox: outer.configurationBox)
    }

    override func emit(_ event: Any) {
        guard isActive, let supervisor else { return rejected() }
        supervisor.emitted(event, by: self)
    }

    /// A batch of the attempt's events (`SourceTicket.emit(batch:of:)`).
    func deliver<S: Source>(batch events: [S.Event], of kind: S.Type) {
        guard isActive, let supervisor else {
            for _ in events { rejected() }
            return
        }
        supervisor.emitted(batch: events, of: kind, by: self)
    }

    override func fail(_ failure: SourceFailure) {
        guard isActive, let supervisor else { return rejected() }
        hasFailed = true
        supervisor.failed(failure, by: self)
    }

    override func poster() -> EventPoster {
        guard isActive, let supervisor else { return EventPoster(activation: activation) { _ in .closed } }
        return supervisor.poster(for: self)
    }

    /// Marks the attempt stopped: its emits are refused, its posters closed.
    func kill() {
        isActive = false
        gate.open.withLock { $0 = false }
    }

    /// An event of a stopped attempt: reported as one after its stop.
    func rejected() {
        if let source = outer as? ActiveSource { source.link.rejectAfterStop(from: source) }
    }
}

/// Whether an attempt's posters still admit events (locked while posting).
final class AttemptGate: Sendable {
    let open = Mutex(true)
}

private struct HostRandom: RandomNumberGenerator {
    unowned let host: any RestartHost
    mutating func next() -> UInt64 { host.restartRandom() }
}
