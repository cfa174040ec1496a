import Reconcile
import Synchronization

/// A driver with a virtual clock, for testing programs and the runtime.
///
/// It honours the same contract as the sd-event driver: start once, stop at
/// most once, nothing emitted after stop. Timers (`TimerSource`) run on the
/// virtual clock; any other source kind gets events only when a test injects
/// them. Every driver call is logged.
public final class VirtualDriver: Driver {
    /// One driver call the runtime made.
    public enum Call: Equatable, CustomStringConvertible {
        /// The runtime started this identity's activation.
        case start(SubscriptionID, Activation)
        /// The runtime retuned this activation in place.
        case retune(SubscriptionID, Activation)
        /// The runtime stopped this activation.
        case stop(SubscriptionID, Activation)

        /// The identity the call was about.
        public var id: SubscriptionID {
            switch self { case .start(let i, _), .retune(let i, _), .stop(let i, _): i }
        }

        /// `start timer:t #1`, as tests compare it.
        public var description: String {
            switch self {
            case .start(let i, let a): "start \(i) \(a)"
            case .retune(let i, let a): "retune \(i) \(a)"
            case .stop(let i, let a): "stop \(i) \(a)"
            }
        }
    }

    private struct TimerState {
        var ticket: SourceTicket
        var origin: Int64        // µs: when the timer was (re)based
        var interval: Int64      // µs
        var repeats: Bool
        var sequence: UInt64     // ticks due so far
        /// Saturating: `Int64.max` is never (a timer too far out never comes due).
        var due: Int64 {
            let (span, overflow) = interval.multipliedReportingOverflow(by: Int64(clamping: sequence + 1))
            return overflow ? .max : saturatingSum(origin, span)
        }
    }

    /// Every call, in order.
    public private(set) var log: [Call] = []
    /// The running tickets by identity.
    public private(set) var running: [SubscriptionID: SourceTicket] = [:]
    /// Failures to report when a source with this identity starts.
    public var failOnStart: [SubscriptionID: SourceFailure] = [:]

    private var nowMicros: Int64 = 0
    private var timers: [Activation: TimerState] = [:]
    private weak var host: (any DriverHost)?
    private let wakePending = WakeFlag()
    private var startCounts: [SubscriptionID: Int] = [:]
    private var stopCounts: [SubscriptionID: Int] = [:]
    /// True if the runtime ever asked for something the contract forbids
    /// (stop of an unknown or already stopped activation, retune after stop).
    public private(set) var contractViolations: [String] = []

    /// Tasks: recorded by identity, run only when a test says (VirtualEffects.swift).
    public let tasks: VirtualTasks
    /// Where tasks and stream sources run: inside `runUntilIdle`/`advance`.
    public let executor: VirtualExecutor
    let clockSource = VirtualClockSource()
    var taskSourceStops: [Activation: () -> Void] = [:]
    /// Restarting subscriptions (`RestartPolicy.backoff`) by activation.
    var supervisors: [Activation: RestartSupervisor] = [:]
    private var attemptCounts: [SubscriptionID: Int] = [:]

    /// The random bits restart jitter is drawn from (the system's by
    /// default; a test sets a seeded generator for an exact schedule).
    public var restartRandomness: () -> UInt64 = {
        var g = SystemRandomNumberGenerator()
        return g.next()
    }

    /// A driver at virtual time zero with nothing running.
    public init() {
        executor = VirtualExecutor()
        tasks = VirtualTasks(executor: executor)
    }

    /// The virtual time since the driver was created.
    public var now: Duration { .microseconds(nowMicros) }

    /// The loop time stamped on transcript records: the virtual clock.
    public var loopTime: Duration { now }

    /// Whether timers fire on their own as the clock moves (default). A
    /// replay turns this off: every message comes from the transcript.
    public var firesTimers = true

    /// The identities running now.
    public var runningIDs: Set<SubscriptionID> { Set(running.keys) }

    /// How many times a source with `id` was started / stopped.
    public func starts(of id: SubscriptionID) -> Int { startCounts[id, default: 0] }
    /// How many times a source with `id` was stopped.
    public func stops(of id: SubscriptionID) -> Int { stopCounts[id, default: 0] }
    /// How many attempts of the restarting subscription `id` were started
    /// (the first included; zero for a subscription without a restart policy).
    public func attempts(of id: SubscriptionID) -> Int { attemptCounts[id, default: 0] }

    // MARK: Driver

    /// Connects the runtime; the returned waker marks the inbox for the next `runUntilIdle`.
    public func attach(_ host: any DriverHost) throws -> Waker {
        self.host = host
        let flag = wakePending
        return Waker { flag.set() }
    }

    /// Logs the start, fails it when `failOnStart` says so, and arms timers on the virtual clock.
    public func start(_ ticket: SourceTicket) {
        log.append(.start(ticket.id, ticket.activation))
        if running[ticket.id] != nil { contractViolations.append("start of running \(ticket.id)") }
        running[ticket.id] = ticket
        startCounts[ticket.id, default: 0] += 1
        if let supervisor = RestartSupervisor(ticket, host: self) {
            // Each attempt starts through `startAttempt` (failOnStart included).
            supervisors[ticket.activation] = supervisor
            supervisor.start()
            return
        }
        if let failure = failOnStart[ticket.id] {
            ticket.fail(failure)
            return
        }
        if startTaskBacked(ticket) { return }
        if let config = ticket.configuration(as: TimerSource.self) {
            timers[ticket.activation] = TimerState(
                ticket: ticket, origin: nowMicros, interval: max(1, config.interval.saturatingMicroseconds),
                repeats: config.repeats, sequence: 0)
        }
    }

    /// Logs the retune; a timer's next tick comes one new interval after its last due time.
    public func retune(_ ticket: SourceTicket, from old: AnyHashable) {
        log.append(.retune(ticket.id, ticket.activation))
        guard running[ticket.id] === ticket else {
            contractViolations.append("retune of stopped \(ticket.id) \(ticket.activation)")
            return
        }
        if let config = ticket.configuration(as: TimerSource.self), var t = timers[ticket.activation] {
            // The next tick comes one new interval after the last due time.
            t.origin = t.due - t.interval
            t.interval = max(1, config.interval.saturatingMicroseconds)
            t.sequence = 0
            timers[ticket.activation] = t
        }
    }

    /// Logs the stop; the source emits nothing afterwards.
    public func stop(_ ticket: SourceTicket) {
        log.append(.stop(ticket.id, ticket.activation))
        guard running[ticket.id] === ticket else {
            contractViolations.append("stop of unknown or stopped \(ticket.id) \(ticket.activation)")
            return
        }
        running[ticket.id] = nil
        stopCounts[ticket.id, default: 0] += 1
        timers[ticket.activation] = nil
        supervisors.removeValue(forKey: ticket.activation)?.stop()
        stopTaskBacked(ticket)
    }

    /// Disconnects the runtime.
    public func detach() { host = nil }

    // MARK: Time

    /// Moves the clock forward by `duration`, firing every timer due on the
    /// way in time order (each firing is processed, and subscriptions
    /// reconciled, before the next one), then pumps the inbox.
    public func advance(by duration: Duration) {
        let target = saturatingSum(nowMicros, duration.saturatingMicroseconds)
        runUntilIdle()
        while true {
            // Timers and clock sleeps, in time order (a timer first on a tie).
            let timer = firesTimers ? nextDue(before: target) : nil
            let sleep = clockSource.nextDeadline(notAfter: .microseconds(target)).map { ($0 + .nanoseconds(999)).saturatingMicroseconds }
            if let (activation, due) = timer, sleep.map({ due <= $0 }) ?? true {
                nowMicros = due
                clockSource.set(now: .microseconds(due))
                fire(activation, missed: 0)
            } else if let due = sleep {
                nowMicros = due
                clockSource.set(now: .microseconds(due))
            } else {
                break
            }
            runUntilIdle()
        }
        nowMicros = target
        clockSource.set(now: .microseconds(target))
        runUntilIdle()
    }

    /// Moves the clock forward by `duration` as if the loop were blocked, then
    /// fires each overdue timer once, reporting how many due times it missed.
    public func stall(for duration: Duration) {
        nowMicros = saturatingSum(nowMicros, duration.saturatingMicroseconds)
        clockSource.set(now: .microseconds(nowMicros))
        let overdue = !firesTimers ? [] : timers.filter { $0.value.due <= nowMicros && $0.value.due < .max }.sorted { $0.value.due < $1.value.due }
        for (activation, t) in overdue {
            guard timers[activation] != nil else { continue }
            let passed = UInt64((nowMicros - t.origin) / t.interval) - t.sequence
            fire(activation, missed: t.repeats ? passed - 1 : 0, advanceBy: t.repeats ? passed : 1)
        }
        runUntilIdle()
    }

    private func nextDue(before limit: Int64) -> (Activation, Int64)? {
        var best: (Activation, Int64)?
        for (a, t) in timers where t.due <= limit && t.due < .max {
            if let b = best, (b.1, b.0) <= (t.due, a) { continue }
            best = (a, t.due)
        }
        return best
    }

    private func fire(_ activation: Activation, missed: UInt64, advanceBy: UInt64 = 1) {
        guard var t = timers[activation] else { return }
        t.sequence += advanceBy
        let tick = TimerSource.Tick(sequence: t.sequence, missed: missed)
        if t.repeats { timers[activation] = t } else { timers[activation] = nil }
        t.ticket.emit(TimerSource.Event.tick(tick))
    }

    // MARK: Injection

    /// Delivers `event` from the running source `id` on the loop (as the
    /// source would). Returns false when `id` is not running, and when
    /// `event` is not of its source's `Event` type (it is handed over anyway,
    /// as a buggy source would, and the runtime drops it with a diagnostic).
    /// Prefer the typed `emit(_:to:)` with a `TypedSubscriptionID`: a wrong
    /// type does not compile there.
    @discardableResult
    public func emit(_ event: Any, to id: SubscriptionID) -> Bool {
        guard let ticket = target(id) else { return false }
        ticket.emit(event)
        return accepts(ticket.source, event)
    }

    /// Delivers `events` from the running source `id` as one batch, as a
    /// driver's dispatch does (`SourceTicket.emit(batch:of:)`): through its
    /// current attempt when it restarts. Returns false when `id` is not
    /// running or its ticket takes no batch.
    @discardableResult
    package func emit<S: Source>(batch events: [S.Event], of kind: S.Type, to id: SubscriptionID) -> Bool {
        guard let ticket = target(id) else { return false }
        return ticket.emit(batch: events, of: kind)
    }

    /// Reports a failure of the running source `id`.
    @discardableResult
    public func fail(_ id: SubscriptionID, _ failure: SourceFailure) -> Bool {
        guard let ticket = target(id) else { return false }
        ticket.fail(failure)
        return true
    }

    /// A poster for the running source `id`, as a source on another thread
    /// would hold. Its events wait in the runtime's inbox until `runUntilIdle`.
    public func poster(for id: SubscriptionID) -> EventPoster? {
        target(id)?.poster()
    }

    /// The ticket events of `id` go through: its current attempt when it
    /// restarts (nil while a restart waits), else its own.
    private func target(_ id: SubscriptionID) -> SourceTicket? {
        guard let ticket = running[id] else { return nil }
        if let supervisor = supervisors[ticket.activation] { return supervisor.currentAttempt }
        return ticket
    }

    /// Pumps the runtime's inbox if a waker fired since the last pump.
    public func runUntilIdle() {
        while true {
            let ran = executor.runJobs()
            if wakePending.take() {
                host?.pumpInbox()
                continue
            }
            if !ran { return }
        }
    }
}

extension VirtualDriver: RestartHost {
    /// Starts an attempt of a restarting subscription: `failOnStart` fails
    /// it, a task-backed kind runs on the virtual executor, any other kind
    /// waits for injected events.
    package func startAttempt(_ ticket: SourceTicket) {
        attemptCounts[ticket.id, default: 0] += 1
        if let failure = failOnStart[ticket.id] { return ticket.fail(failure) }
        _ = startTaskBacked(ticket)
    }

    /// Stops an attempt (its task, for a task-backed kind).
    package func stopAttempt(_ ticket: SourceTicket) { stopTaskBacked(ticket) }

    /// A timer on the virtual clock: a task sleeping on `clock`.
    package func makeRestartTimer(_ fire: @escaping () -> Void) -> any RestartTimer {
        VirtualRestartTimer(clock: clock, executor: executor, fire: fire)
    }

    /// The virtual clock.
    package var restartNow: Duration { now }

    /// `restartRandomness()`.
    package func restartRandom() -> UInt64 { restartRandomness() }
}

/// A restart timer on the virtual clock.
private final class VirtualRestartTimer: RestartTimer {
    /// The fire closure, run only by jobs of the virtual executor (the loop).
    private struct Fire: @unchecked Sendable { let body: () -> Void }
    private let clock: LoopClock
    private let executor: VirtualExecutor
    private let fire: Fire
    private var task: Task<Void, Never>?

    init(clock: LoopClock, executor: VirtualExecutor, fire: @escaping () -> Void) {
        self.clock = clock
        self.executor = executor
        self.fire = Fire(body: fire)
    }

    func arm(after delay: Duration) -> SourceFailure? {
        task?.cancel()
        let clock = self.clock, fire = self.fire
        task = Task(executorPreference: executor) {
            do {
                try await clock.sleep(for: delay)
                fire.body()
            } catch {}
        }
        return nil
    }

    func cancel() {
        task?.cancel()
        task = nil
    }
}

/// A flag other threads set to ask the loop to pump.
final class WakeFlag: Sendable {
    private let value = Mutex(false)
    func set() { value.withLock { $0 = true } }
    func take() -> Bool { value.withLock { let v = $0; $0 = false; return v } }
}

/// `a + b` for the virtual clock (µs, never negative), saturating at `Int64.max`.
private func saturatingSum(_ a: Int64, _ b: Int64) -> Int64 {
    let (sum, overflow) = a.addingReportingOverflow(b)
    return overflow ? (b > 0 ? .max : .min) : sum
}

/// Whether `event` is of the `Event` type of `kind`.
package func accepts<S: Source>(_ kind: S.Type, _ event: Any) -> Bool { event is S.Event }
