/// Runs sources for a runtime: sd-event in `ReconcileSystemd`, virtual time in
/// `ReconcileTesting`. All calls come from the loop's thread.
///
/// The contract:
/// - `start` is called once per activation, `stop` at most once, and only for
///   a started activation; `retune` only between them.
/// - After `stop` returns, the activation emits nothing more: no `emit`, no
///   `fail`, and posters refuse new events.
/// - Events are handed to the ticket on the loop's thread (`emit`, `fail`), or
///   from other threads through the ticket's `poster()`.
/// - A ticket object may stand for a later activation after its `stop`: the
///   runtime reuses a stopped ticket that nothing else references (no strong,
///   weak or unowned reference). Let go of the ticket at `stop` (clear
///   `driverState`); do not key state by `ObjectIdentifier(ticket)` past
///   `stop`, and never keep an `unowned(unsafe)` or `Unmanaged` reference to
///   it past `stop` (one the runtime cannot see). Key by `ticket.id` and
///   `ticket.activation` instead.
public protocol Driver: AnyObject {
    /// Connects a runtime. The driver must call `host.pumpInbox()` on the loop
    /// thread soon after the returned waker is called from any thread.
    func attach(_ host: any DriverHost) throws -> Waker

    /// Starts the source described by `ticket` (its `source`, `configuration`).
    func start(_ ticket: SourceTicket)

    /// Applies `ticket.configuration` (changed from `old`) in place.
    func retune(_ ticket: SourceTicket, from old: AnyHashable)

    /// Stops the source; nothing of this activation is emitted afterwards.
    func stop(_ ticket: SourceTicket)

    /// Disconnects the runtime after its last stop (shutdown).
    func detach()

    /// The loop's monotonic time now (sd-event: `sd_event_now`; virtual
    /// drivers: their clock), stamped on transcript records. Default: zero.
    var loopTime: Duration { get }
}

extension Driver {
    /// Zero: a driver without a clock stamps records at time zero.
    public var loopTime: Duration { .zero }
}

/// The runtime side a driver calls back into.
public protocol DriverHost: AnyObject {
    /// Moves what other threads posted into the mailbox and processes it.
    func pumpInbox()
}

/// Wakes a driver's loop from any thread so it pumps the runtime's inbox.
public struct Waker: Sendable {
    let wake: @Sendable () -> Void
    /// A waker that calls `wake`.
    public init(_ wake: @escaping @Sendable () -> Void) { self.wake = wake }
    /// Wakes the loop.
    public func callAsFunction() { wake() }
}

/// A driver's handle on one activation: what to run and where its events go.
///
/// Tickets are made by the runtime for its starts and live on the loop's
/// thread. `emit` and `fail` must be called on that thread; other threads use
/// `poster()`.
///
/// A stopped ticket that nothing holds any more (no strong, weak or unowned
/// reference: not the driver, the mailbox, a plan or the program) may be
/// reused by a later start, with a new activation and identity. A driver
/// that keeps a ticket after `stop` therefore keeps it stopped, and one that
/// wants to call it later must hold it strongly (then it is not reused).
public class SourceTicket {
    // Stored properties are read on every driver call and written by the
    // runtime on the loop thread only: no dynamic exclusivity checks.

    /// The activation this ticket stands for (a reused ticket gets a new one).
    @exclusivity(unchecked) public final internal(set) var activation: Activation
    /// The subscription's identity.
    @exclusivity(unchecked) public final internal(set) var id: SubscriptionID
    /// The source kind's type.
    public var source: any Source.Type { id.kind.source }
    /// The current configuration (updated before `Driver.retune`).
    public var configuration: AnyHashable { configurationBox.hashable }
    /// The same, in its typed box (compared and cast without allocation).
    @usableFromInline @exclusivity(unchecked) final var configurationBox: HashableBox
    /// False once the runtime has stopped this activation.
    @exclusivity(unchecked) public final internal(set) var isActive = true
    /// True once the source has reported a failure.
    @exclusivity(unchecked) public final internal(set) var hasFailed = false
    /// Whether this activation handed out a poster (cross-thread events).
    @exclusivity(unchecked) final var hasPoster = false
    /// The reconciler's: the index in its group's order, a hint for its cursor
    /// (a wrong one costs a table lookup, never a wrong plan; here it packs
    /// with the flags above).
    @exclusivity(unchecked) final var position: UInt32 = 0
    /// The driver's own state for this activation (its running source), so a
    /// driver needs no table of its own. The runtime never reads it.
    public final var driverState: AnyObject? {
        get { state }
        set { state = newValue }
    }
    /// `driverState`'s storage. Accessed only in this module, where its
    /// exclusivity is unchecked (a driver's direct access from its own
    /// module would be checked dynamically, twice per start and stop).
    @exclusivity(unchecked) final var state: AnyObject?

    /// Moves `driverState` out, leaving nil (no retain and release).
    public final func takeDriverState() -> AnyObject? {
        var taken: AnyObject?
        swap(&taken, &state)
        return taken
    }

    init(activation: Activation, id: SubscriptionID, configurationBox: HashableBox) {
        self.activation = activation
        self.id = id
        self.configurationBox = configurationBox
    }

    /// The configuration as the source's own type (inlinable: where `S` is
    /// known this is one compare of the box's class).
    @inlinable public final func configuration<S: Source>(as: S.Type) -> S.Configuration? {
        configurationBox.value(as: S.Configuration.self)
    }

    /// Hands an event of the source's `Event` type to the program (loop thread).
    public func emit(_ event: Any) {}

    /// Reports that the source failed (loop thread). The subscription stays in
    /// place; it is restarted only when its configuration changes.
    public func fail(_ failure: SourceFailure) {}

    /// A sendable handle that posts events from any thread.
    public func poster() -> EventPoster { fatalError("SourceTicket.poster: abstract") }
}

/// What a post from another thread came to.
public enum PostResult: Equatable, Sendable {
    /// Queued for the loop.
    case accepted
    /// The runtime's inbox is at capacity; the event was not queued.
    case full
    /// The activation was stopped or the runtime shut down; not queued.
    case closed
}

/// Posts a source's events from any thread into the runtime's inbox.
public struct EventPoster: Sendable {
    let post: @Sendable (any Sendable) -> PostResult
    /// The activation the poster belongs to.
    public let activation: Activation

    init(activation: Activation, post: @escaping @Sendable (any Sendable) -> PostResult) {
        self.activation = activation
        self.post = post
    }

    /// Queues `event` and wakes the loop.
    @discardableResult
    public func post(_ event: some Sendable) -> PostResult { post(event as any Sendable) }
}
