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
        case start(SubscriptionID, Activation)
        case retune(SubscriptionID, Activation)
        case stop(SubscriptionID, Activation)

        /// The identity the call was about.
        public var id: SubscriptionID {
            switch self { case .start(let i, _), .retune(let i, _), .stop(let i, _): i }
        }

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
        var due: Int64 { origin + interval * Int64(sequence + 1) }
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

    public init() {
        executor = VirtualExecutor()
        tasks = VirtualTasks(executor: executor)
    }

    /// The virtual time since the driver was created.
    public var now: Duration { .microseconds(nowMicros) }

    /// The identities running now.
    public var runningIDs: Set<SubscriptionID> { Set(running.keys) }

    /// How many times a source with `id` was started / stopped.
    public func starts(of id: SubscriptionID) -> Int { startCounts[id, default: 0] }
    public func stops(of id: SubscriptionID) -> Int { stopCounts[id, default: 0] }

    // MARK: Driver

    public func attach(_ host: any DriverHost) throws -> Waker {
        self.host = host
        let flag = wakePending
        return Waker { flag.set() }
    }

    public func start(_ ticket: SourceTicket) {
        log.append(.start(ticket.id, ticket.activation))
        if running[ticket.id] != nil { contractViolations.append("start of running \(ticket.id)") }
        running[ticket.id] = ticket
        startCounts[ticket.id, default: 0] += 1
        if let failure = failOnStart[ticket.id] {
            ticket.fail(failure)
            return
        }
        if startTaskBacked(ticket) { return }
        if let config = ticket.configuration(as: TimerSource.self) {
            timers[ticket.activation] = TimerState(
                ticket: ticket, origin: nowMicros, interval: max(1, config.interval.microseconds),
                repeats: config.repeats, sequence: 0)
        }
    }

    public func retune(_ ticket: SourceTicket, from old: AnyHashable) {
        log.append(.retune(ticket.id, ticket.activation))
        guard running[ticket.id] === ticket else {
            contractViolations.append("retune of stopped \(ticket.id) \(ticket.activation)")
            return
        }
        if let config = ticket.configuration(as: TimerSource.self), var t = timers[ticket.activation] {
            // The next tick comes one new interval after the last due time.
            t.origin = t.origin + t.interval * Int64(t.sequence)
            t.interval = max(1, config.interval.microseconds)
            t.sequence = 0
            timers[ticket.activation] = t
        }
    }

    public func stop(_ ticket: SourceTicket) {
        log.append(.stop(ticket.id, ticket.activation))
        guard running[ticket.id] === ticket else {
            contractViolations.append("stop of unknown or stopped \(ticket.id) \(ticket.activation)")
            return
        }
        running[ticket.id] = nil
        stopCounts[ticket.id, default: 0] += 1
        timers[ticket.activation] = nil
        stopTaskBacked(ticket)
    }

    public func detach() { host = nil }

    // MARK: Time

    /// Moves the clock forward by `duration`, firing every timer due on the
    /// way in time order (each firing is processed, and subscriptions
    /// reconciled, before the next one), then pumps the inbox.
    public func advance(by duration: Duration) {
        let target = nowMicros + duration.microseconds
        runUntilIdle()
        while true {
            // Timers and clock sleeps, in time order (a timer first on a tie).
            let timer = nextDue(before: target)
            let sleep = clockSource.nextDeadline(notAfter: .microseconds(target)).map { ($0 + .nanoseconds(999)).microseconds }
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
        nowMicros += duration.microseconds
        clockSource.set(now: .microseconds(nowMicros))
        let overdue = timers.filter { $0.value.due <= nowMicros }.sorted { $0.value.due < $1.value.due }
        for (activation, t) in overdue {
            guard timers[activation] != nil else { continue }
            let passed = UInt64((nowMicros - t.origin) / t.interval) - t.sequence
            fire(activation, missed: t.repeats ? passed - 1 : 0, advanceBy: t.repeats ? passed : 1)
        }
        runUntilIdle()
    }

    private func nextDue(before limit: Int64) -> (Activation, Int64)? {
        var best: (Activation, Int64)?
        for (a, t) in timers where t.due <= limit {
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
    /// source would). Returns false when `id` is not running.
    @discardableResult
    public func emit(_ event: Any, to id: SubscriptionID) -> Bool {
        guard let ticket = running[id] else { return false }
        ticket.emit(event)
        return true
    }

    /// Reports a failure of the running source `id`.
    @discardableResult
    public func fail(_ id: SubscriptionID, _ failure: SourceFailure) -> Bool {
        guard let ticket = running[id] else { return false }
        ticket.fail(failure)
        return true
    }

    /// A poster for the running source `id`, as a source on another thread
    /// would hold. Its events wait in the runtime's inbox until `runUntilIdle`.
    public func poster(for id: SubscriptionID) -> EventPoster? {
        running[id]?.poster()
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

/// A flag other threads set to ask the loop to pump.
final class WakeFlag: Sendable {
    private let value = Mutex(false)
    func set() { value.withLock { $0 = true } }
    func take() -> Bool { value.withLock { let v = $0; $0 = false; return v } }
}
