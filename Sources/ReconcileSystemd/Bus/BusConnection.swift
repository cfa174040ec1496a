import CSystemd
import Glibc
import Reconcile

/// What a bus source is to its connection: told when the bus is up (add its
/// matches, read again) and when it is lost or missing (one failure event).
protocol BusConnectionClient: AnyObject {
    /// The connection is (again) usable: add matches, read state.
    func busConnected(_ connection: BusConnection)
    /// The connection is missing or lost; every slot on it is already gone.
    func busLost(_ failure: SourceFailure)
    /// The client's own decision about the next reconnect at `now` (its
    /// restart policy's schedule), or nil: it has no policy of its own and
    /// follows the connection's default (`BusAddress.defaultReconnect`).
    func reconnectDecision(at now: Duration) -> RestartSchedule.Decision?
    /// The reconnect is armed after `delay` (the shortest any client asked
    /// for); `decision` is what this client decided.
    func busReconnecting(_ decision: RestartSchedule.Decision, after delay: Duration)
    /// The bus answered its first call since the connection came up: the
    /// client's schedule starts from its first delay again.
    func busAnswered()
}

extension BusConnectionClient {
    func reconnectDecision(at now: Duration) -> RestartSchedule.Decision? { nil }
    func busReconnecting(_ decision: RestartSchedule.Decision, after delay: Duration) {}
    func busAnswered() {}
}

/// A bus source's side of its restart policy: its own attempts (a
/// `RetryAttempts`; once it gave up it ignores the bus until its
/// subscription changes); the connection arms the one timer.
extension RetryAttempts {
    /// Hands a bus source's `.restarting` to the program as a batch of one:
    /// its `update` runs now and the reconcile is left to the runtime's next
    /// pump, so one reconnect attempt announced to every source on the
    /// connection is one reconcile, not one per source.
    static func announceRestarting<S: Source>(_ event: S.Event, of kind: S.Type, to ticket: SourceTicket) {
        if !ticket.emit(batch: [event], of: kind) { ticket.emit(event) }
    }

    /// Tells the bus source `source` what `decision` with the connection's
    /// `delay` means for it: `restarting` (attempt, delay); at the cap,
    /// `leave` and then one last failure; for `.never`, `leave` only.
    func announce(_ decision: RestartSchedule.Decision, after delay: Duration, source: String,
                  restarting: (Int, Duration) -> Void, fail: (SourceFailure) -> Void, leave: () -> Void) {
        Self.announce(decision, after: delay, restarting: restarting, capReached: { n, window in
            fail(RestartPolicy.capReached(operation: "reconnect \(source)", attempts: n, retries: "reconnects", within: "\(window)",
                                          then: "; the source stays failed until its subscription changes"))
        }, leave: leave)
    }
}

/// Told when a watched name's owner changes (nil: no owner).
protocol BusNameObserver: AnyObject {
    /// `name`'s owner is now `owner` (a unique name), or nobody.
    func ownerChanged(_ name: String, to owner: String?)
}

/// One connection to one bus, shared by every bus source and call of a
/// driver on that bus (`BusConnections`).
///
/// It connects when the first source or call needs it and stays open while
/// the driver is attached. A bus that is missing at start, or lost later
/// (sd-bus's local `Disconnected` signal), is one failure event on every
/// source, then a reconnect on the restart mechanism's backoff (the
/// shortest delay its sources' policies ask for; by default
/// `BusAddress.defaultReconnect`, 100 ms doubling to 5 s), each attempt a
/// `.restarting` on the sources, after which every source re-adds its
/// matches and reads again. Names are tracked here once per name for all sources
/// (NameOwnerChanged plus GetNameOwner), so owner checks compare unique names.
final class BusConnection {
    /// The first and the longest reconnect delay (µs) of the connection's
    /// own schedule, `BusAddress.defaultReconnect` (100 ms doubling to 5 s).
    static let reconnectInitial = UInt64(BusAddress.defaultReconnect.backoffSchedule?.initial.saturatingMicroseconds ?? 0)
    static let reconnectMaximum = UInt64(BusAddress.defaultReconnect.backoffSchedule?.maximum.saturatingMicroseconds ?? 0)
    /// How long a new connection may take to answer its first call.
    static let answerTimeout: UInt64 = 5_000_000

    let address: BusAddress
    private let loop: EventLoop
    private let logger: DaemonLogger
    /// The sd-bus connection while connected (or connecting).
    private(set) var handle: OpaquePointer?
    private var localSlot: OpaquePointer?
    private var answerTimer: EventSource?
    /// The connection's own schedule (`BusAddress.defaultReconnect`), for
    /// clients without a policy of their own.
    private lazy var retry = Retry(loop: loop, policy: BusAddress.defaultReconnect) { [unowned self] in
        connect()
    }
    private var attempts = 0
    /// The failure that took the connection down, while it is down.
    private(set) var lastFailure: SourceFailure?
    private var clients: [ObjectIdentifier: Client] = [:]
    private var names: [String: NameWatch] = [:]
    /// Calls waiting for their reply, so a lost or closed bus ends each.
    var calls: [ObjectIdentifier: BusPendingCall] = [:]
    /// How deep we are in this connection's sd-bus callbacks: a connection
    /// must not be freed while sd-bus dispatches on it.
    private var callbackDepth = 0
    private var closed = false
    /// AddMatch / RemoveMatch sent (matches added and released), for tests.
    private(set) var matchesAdded = 0, matchesRemoved = 0

    /// A registered source, and whether it was told of the current outage.
    private final class Client {
        unowned let client: any BusConnectionClient
        var told = false
        init(_ client: any BusConnectionClient) { self.client = client }
    }

    init(address: BusAddress, loop: EventLoop, logger: DaemonLogger) {
        self.address = address
        self.loop = loop
        self.logger = logger
    }

    /// Whether the connection is open (it may still be authenticating:
    /// messages sent now are queued by sd-bus).
    var isUp: Bool { handle != nil }

    private var userdata: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    // MARK: Clients

    /// Adds `client`: told at once that the bus is up (connecting first if
    /// need be) or that it is missing.
    func register(_ client: any BusConnectionClient) {
        let entry = Client(client)
        clients[ObjectIdentifier(client)] = entry
        if handle != nil { return client.busConnected(self) }
        // A connect tells every client (connected, or the failure once).
        if !retry.isArmed { return connect() }
        if let lastFailure {
            entry.told = true
            client.busLost(lastFailure)
        }
    }

    /// Removes `client` (its stop).
    func unregister(_ client: any BusConnectionClient) {
        clients[ObjectIdentifier(client)] = nil
    }

    /// Runs `body` as one of this connection's sd-bus callbacks.
    func inCallback(_ body: () -> Void) {
        callbackDepth += 1
        defer { callbackDepth -= 1 }
        body()
    }

    /// Whether `m` came on the connection in use (not on one being retired).
    func isCurrent(_ m: OpaquePointer?) -> Bool {
        guard let handle else { return false }
        return sd_bus_message_get_bus(m) == handle
    }

    // MARK: Connecting

    private func open() throws(SystemdError) -> OpaquePointer {
        var b: OpaquePointer?
        switch address {
        case .system:
            try check("sd_bus_open_system", sd_bus_open_system(&b))
        case .user:
            try check("sd_bus_open_user", sd_bus_open_user(&b))
        case .address(let text):
            try check("sd_bus_new", sd_bus_new(&b))
            var r = sd_bus_set_address(b, text)
            if r >= 0 { r = sd_bus_set_bus_client(b, 1) }
            if r >= 0 { r = sd_bus_start(b) }
            if r < 0 {
                sd_bus_close_unref(b)
                throw SystemdError(r == -EINVAL ? "sd_bus_set_address" : "sd_bus_start", errno: -r)
            }
        }
        let r = sd_bus_attach_event(b, loop.handle, 0)
        if r < 0 {
            sd_bus_close_unref(b)
            throw SystemdError("sd_bus_attach_event", errno: -r)
        }
        return b!
    }

    private func connect() {
        guard !closed, handle == nil else { return }
        let bus: OpaquePointer
        do { bus = try open() } catch {
            fail(SourceFailure(operation: error.function, code: error.errno,
                               reason: "cannot connect to the \(address) bus: \(error.reason)"))
            return
        }
        handle = bus
        lastFailure = nil
        // sd-bus synthesizes Disconnected locally (no AddMatch is sent).
        var slot: OpaquePointer?
        let r = sd_bus_match_signal(bus, &slot, nil, "/org/freedesktop/DBus/Local", "org.freedesktop.DBus.Local", "Disconnected", { m, ud, _ in
            guard let ud else { return 0 }
            let me = Unmanaged<BusConnection>.fromOpaque(ud).takeUnretainedValue()
            me.inCallback {
                guard me.isCurrent(m) else { return }
                me.logger.warning("bus: lost the connection to the \(me.address) bus")
                me.lose(SourceFailure(operation: "sd-bus", code: ECONNRESET, reason: "lost the connection to the \(me.address) bus (Disconnected)"))
            }
            return 0
        }, userdata)
        guard r >= 0 else { return lose(SystemdError("sd_bus_match_signal", errno: -r).failure) }
        localSlot = slot
        armAnswerTimer()
        probe()
        for watch in names.values { arm(watch) }
        for c in Array(clients.values) where handle == bus {
            c.told = false
            c.client.busConnected(self)
        }
    }

    /// Asks the bus for its id: the first answer says the connection works
    /// (and resets the backoff); sd-bus does not time out a call while it
    /// is still authenticating, hence the timer beside it.
    private func probe() {
        call(service: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
             method: "GetId", arguments: [], timeout: Self.answerTimeout) { [weak self] result in
            guard let self else { return }
            switch result {
            case .success:
                answerTimer?.close(); answerTimer = nil
                retry.recovered()
                attempts = 0
                for c in Array(clients.values) { c.client.busAnswered() }
            case .failure(let e):
                guard e.name != BusError.disconnected else { return }   // Disconnected follows
                lose(SourceFailure(operation: "GetId", reason: "the \(address) bus did not answer: \(e.message)"))
            }
        }
    }

    private func armAnswerTimer() {
        answerTimer?.close(); answerTimer = nil
        var s: OpaquePointer?
        let r = sd_event_add_time_relative(loop.handle, &s, CLOCK_MONOTONIC, Self.answerTimeout, 100_000, { _, _, ud in
            let me = Unmanaged<BusConnection>.fromOpaque(ud!).takeUnretainedValue()
            me.answerTimer?.close(); me.answerTimer = nil
            me.lose(SourceFailure(operation: "sd_bus_start", code: ETIMEDOUT,
                                  reason: "the \(me.address) bus did not answer within \(BusConnection.answerTimeout / 1_000_000) s"))
            return 0
        }, userdata)
        if r >= 0 { answerTimer = EventSource(s!) }
    }

    /// The connection is unusable: drop it, tell every client, try again later.
    private func lose(_ failure: SourceFailure) {
        guard handle != nil else { return }
        // The clients release their slots first, while the connection is still theirs.
        tell(failure)
        retireHandle()
        scheduleReconnect()
    }

    /// Reports `failure` to every client and schedules a reconnect.
    private func fail(_ failure: SourceFailure) {
        tell(failure)
        scheduleReconnect()
    }

    /// Each client not yet told of this outage gets `failure`, once.
    private func tell(_ failure: SourceFailure) {
        lastFailure = failure
        for c in Array(clients.values) where !c.told {
            c.told = true
            c.client.busLost(failure)
        }
    }

    /// Arms the reconnect after the shortest delay its clients ask for:
    /// each client with a restart policy decides by its own schedule, the
    /// others (and a connection with no client) by the connection's own
    /// (`BusAddress.defaultReconnect`). When every client gave up, nothing
    /// is armed: the next source or call connects at once.
    private func scheduleReconnect() {
        guard !closed, !retry.isArmed else { return }
        let now = Duration.microseconds(Int64(clamping: loop.now(CLOCK_MONOTONIC)))
        var decisions: [(Client, RestartSchedule.Decision)] = []
        var shortest: Duration?
        var followsDefault = clients.isEmpty
        for c in Array(clients.values) {
            guard let d = c.client.reconnectDecision(at: now) else {
                followsDefault = true
                continue
            }
            decisions.append((c, d))
            if case .restart(_, let after) = d { shortest = min(shortest ?? after, after) }
        }
        if followsDefault, case .restart(_, let d) = retry.decide() {
            shortest = min(shortest ?? d, d)
        }
        var armed: Duration?
        if let shortest {
            do {
                let delay = try retry.arm(after: shortest)
                armed = shortest
                attempts += 1
                logger.info("bus: reconnecting to the \(address) bus in \(delay / 1000) ms (attempt \(attempts))",
                            ["RECONNECT_ATTEMPT": "\(attempts)", "RECONNECT_DELAY_USEC": "\(delay)"])
            } catch {
                logger.warning("bus: cannot schedule a reconnect to the \(address) bus: \(error)")
            }
        }
        // Each call may stop sources (the program reacts at once).
        for (c, d) in decisions where clients[ObjectIdentifier(c.client)] === c {
            if case .restart = d, armed == nil { continue }
            c.client.busReconnecting(d, after: armed ?? .zero)
        }
    }

    /// Ends pending calls, drops name watches' slots, frees the connection
    /// (on the next loop iteration when inside its own callback).
    private func retireHandle() {
        answerTimer?.close(); answerTimer = nil
        guard let bus = handle else { return }
        handle = nil
        for call in Array(calls.values) {
            call.finish(.failure(BusError(BusError.disconnected, "the connection to the \(address) bus was lost")))
        }
        for watch in names.values { disarm(watch) }
        if let localSlot { sd_bus_slot_set_userdata(localSlot, nil); sd_bus_slot_unref(localSlot) }
        localSlot = nil
        guard callbackDepth > 0 else {
            sd_bus_detach_event(bus)
            sd_bus_close_unref(bus)
            return
        }
        if !loop.releaseOnNextIteration(RetiredConnection(bus)) {
            logger.warning("bus: cannot defer closing a connection; it stays open")
        }
    }

    /// The driver detaches: everything ends, nothing reconnects.
    func close() {
        closed = true
        retry.close()
        clients = [:]
        retireHandle()
        names = [:]
    }

    deinit { close() }

    // MARK: Matches

    /// Adds the match `rule` (AddMatch, asynchronously); `callback` gets
    /// `userdata`. A refused match calls `refused` (on the loop).
    func addMatch(_ rule: String, _ callback: sd_bus_message_handler_t, userdata: UnsafeMutableRawPointer,
                  installed: sd_bus_message_handler_t? = nil) throws(SystemdError) -> OpaquePointer {
        guard let handle else { throw SystemdError("sd_bus_add_match_async", errno: ENOTCONN) }
        var slot: OpaquePointer?
        try check("sd_bus_add_match_async", sd_bus_add_match_async(handle, &slot, rule, callback, installed, userdata))
        matchesAdded += 1
        return slot!
    }

    /// Releases a match slot (RemoveMatch when the bus is still open); its
    /// callback never runs again.
    func removeMatch(_ slot: OpaquePointer) {
        sd_bus_slot_set_userdata(slot, nil)
        sd_bus_slot_unref(slot)
        matchesRemoved += 1
    }

    // MARK: Names

    /// A name's owner, followed for every observer.
    final class NameWatch {
        let name: String
        /// The owner's unique name; nil: no owner or not known yet.
        var owner: String?
        var known = false
        var slot: OpaquePointer?
        var observers: [ObjectIdentifier: Observer] = [:]
        /// Bumped when the watch is re-armed: a late GetNameOwner reply is ignored.
        var generation = 0
        unowned let connection: BusConnection
        init(name: String, connection: BusConnection) {
            self.name = name
            self.connection = connection
        }
        struct Observer { unowned let observer: any BusNameObserver }
    }

    /// Follows `name`'s owner for `observer`; told at once when it is known.
    func watchName(_ name: String, _ observer: any BusNameObserver) {
        let watch: NameWatch
        if let w = names[name] { watch = w } else {
            watch = NameWatch(name: name, connection: self)
            names[name] = watch
            if handle != nil { arm(watch) }
        }
        watch.observers[ObjectIdentifier(observer)] = .init(observer: observer)
        if watch.known { observer.ownerChanged(name, to: watch.owner) }
    }

    /// The current owner of a watched name (nil: none or not known yet).
    func owner(of name: String) -> String? { names[name]?.owner }

    /// Stops following `name` for `observer` (the last one drops the match).
    func unwatchName(_ name: String, _ observer: any BusNameObserver) {
        guard let watch = names[name] else { return }
        watch.observers[ObjectIdentifier(observer)] = nil
        guard watch.observers.isEmpty else { return }
        disarm(watch)
        names[name] = nil
    }

    private func arm(_ watch: NameWatch) {
        disarm(watch)
        watch.generation += 1
        let rule = "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',interface='org.freedesktop.DBus',"
            + "member='NameOwnerChanged',arg0='\(watch.name)'"
        do {
            watch.slot = try addMatch(rule, { m, ud, _ in
                guard let ud else { return 0 }
                let watch = Unmanaged<NameWatch>.fromOpaque(ud).takeUnretainedValue()
                let me = watch.connection
                me.inCallback {
                    guard me.isCurrent(m), let m else { return }
                    guard let args = try? BusMarshalling.readAll(m), args.count == 3, let new = args[2].string else { return }
                    me.ownerIs(watch, new.isEmpty ? nil : new)
                }
                return 0
            }, userdata: Unmanaged.passUnretained(watch).toOpaque())
        } catch {
            logger.warning("bus: cannot follow \(watch.name): \(error)")
        }
        let generation = watch.generation
        call(service: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
             method: "GetNameOwner", arguments: [.string(watch.name)], timeout: nil) { [weak self, weak watch] result in
            guard let self, let watch, names[watch.name] === watch, watch.generation == generation else { return }
            switch result {
            case .success(let values): ownerIs(watch, values.first?.string)
            case .failure(let e) where e.name == "org.freedesktop.DBus.Error.NameHasNoOwner": ownerIs(watch, nil)
            case .failure(let e):
                if e.name != BusError.disconnected { logger.warning("bus: GetNameOwner \(watch.name): \(e)") }
            }
        }
    }

    private func disarm(_ watch: NameWatch) {
        if let slot = watch.slot { removeMatch(slot) }
        watch.slot = nil
        watch.known = false
        watch.owner = nil
        watch.generation += 1
    }

    private func ownerIs(_ watch: NameWatch, _ owner: String?) {
        guard !watch.known || watch.owner != owner else { return }
        watch.known = true
        watch.owner = owner
        for (id, o) in Array(watch.observers) where watch.observers[id] != nil && names[watch.name] === watch {
            o.observer.ownerChanged(watch.name, to: owner)
        }
    }

    // MARK: Calls

    /// Calls a method; `done` runs on the loop with the reply's values or a
    /// `BusError` (a timeout is NoReply, a lost bus Disconnected). Returns
    /// the pending call (cancel it to drop the call), nil when `done` already ran.
    @discardableResult
    func call(service: String, path: String, interface: String, method: String, arguments: [BusValue],
              timeout: UInt64?, _ done: @escaping (Result<[BusValue], BusError>) -> Void) -> BusPendingCall? {
        guard let handle else {
            done(.failure(BusError(BusError.disconnected, lastFailure?.reason ?? "not connected to the \(address) bus")))
            return nil
        }
        var m: OpaquePointer?
        var r = sd_bus_message_new_method_call(handle, &m, service, path, interface, method)
        guard r >= 0, let m else {
            done(.failure(BusError(BusError.invalidArgs, "cannot make the call: \(SystemdError("sd_bus_message_new_method_call", errno: -r).reason)")))
            return nil
        }
        defer { sd_bus_message_unref(m) }
        do { try BusMarshalling.append(m, arguments) } catch {
            done(.failure(BusError(BusError.invalidArgs, "cannot send the arguments: \(error)")))
            return nil
        }
        let pending = BusPendingCall(connection: self, done: done)
        var slot: OpaquePointer?
        r = sd_bus_call_async(handle, &slot, m, { reply, ud, _ in
            guard let ud else { return 0 }
            let pending = Unmanaged<BusPendingCall>.fromOpaque(ud).takeUnretainedValue()
            guard let me = pending.connection else { return 0 }
            me.inCallback {
                guard let reply else { return }
                if let e = busMethodError(reply) {
                    pending.finish(.failure(e))
                } else {
                    do { pending.finish(.success(try BusMarshalling.readAll(reply))) } catch {
                        pending.finish(.failure(BusError(BusError.invalidArgs, "the reply cannot be read: \(error)")))
                    }
                }
            }
            return 0
        }, Unmanaged.passUnretained(pending).toOpaque(), timeout ?? 0)
        guard r >= 0 else {
            done(.failure(BusError(BusError.disconnected, "cannot send the call: \(SystemdError("sd_bus_call_async", errno: -r).reason)")))
            return nil
        }
        pending.slot = slot
        calls[ObjectIdentifier(pending)] = pending
        return pending
    }
}

/// A method call waiting for its reply: held by its connection until it
/// ends (reply, error, loss of the bus, cancel). Loop thread only.
final class BusPendingCall {
    weak var connection: BusConnection?
    var slot: OpaquePointer?
    private var done: ((Result<[BusValue], BusError>) -> Void)?

    init(connection: BusConnection, done: @escaping (Result<[BusValue], BusError>) -> Void) {
        self.connection = connection
        self.done = done
    }

    /// Ends the call with `result` (once): the slot goes, `done` runs.
    func finish(_ result: Result<[BusValue], BusError>) {
        guard let done else { return }
        self.done = nil
        release()
        done(result)
    }

    /// Drops the call without calling `done`: the slot goes (a late reply
    /// is dropped by sd-bus, nothing is sent).
    func cancel() {
        done = nil
        release()
    }

    private func release() {
        if let slot {
            sd_bus_slot_set_userdata(slot, nil)
            sd_bus_slot_unref(slot)
        }
        slot = nil
        connection?.calls[ObjectIdentifier(self)] = nil
    }
}

/// A connection freed on the next loop iteration (it was retired from
/// inside one of its own callbacks).
private final class RetiredConnection {
    let handle: OpaquePointer
    init(_ handle: OpaquePointer) { self.handle = handle }
    deinit {
        sd_bus_detach_event(handle)
        sd_bus_close_unref(handle)
    }
}

/// A driver's bus connections, one per bus (loop thread only).
final class BusConnections {
    private let loop: EventLoop
    private let logger: DaemonLogger
    private var connections: [BusAddress: BusConnection] = [:]

    init(loop: EventLoop, logger: DaemonLogger) {
        self.loop = loop
        self.logger = logger
    }

    /// The connection to `address` (made on first use; it connects when a
    /// source registers or a call is made).
    func connection(_ address: BusAddress) -> BusConnection {
        if let c = connections[address] { return c }
        let c = BusConnection(address: address, loop: loop, logger: logger)
        connections[address] = c
        return c
    }

    /// The connection to `address`, connecting now if it is not up (for calls).
    func connected(_ address: BusAddress) -> BusConnection {
        let c = connection(address)
        c.ensureConnecting()
        return c
    }

    /// Closes every connection (driver detach).
    func close() {
        for c in connections.values { c.close() }
        connections = [:]
    }
}

extension BusConnection {
    /// Connects now unless connected or a reconnect is already scheduled.
    func ensureConnecting() {
        if handle == nil, !retry.isArmed { connect() }
    }
}
