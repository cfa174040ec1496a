/// Where messages from sources go: implemented by `Runtime`.
protocol MessageSink<Message>: AnyObject {
    associatedtype Message
    func enqueue(_ message: Message, from source: ActiveSource?)
    /// Queues `count` messages of `source` (`message(i)` makes the i-th, in
    /// order, each once) and processes them as one batch.
    func enqueue(batch count: Int, from source: ActiveSource, message: (Int) -> Message)
    /// Processes the messages `produce` makes, as they come, as one batch
    /// (`SourceTicket.stream`); `rest` makes those it has not made yet (a
    /// shutdown during the batch reports them as dropped).
    func enqueue(stream source: ActiveSource, rest: () -> [Message], _ produce: (_ deliver: (Message) -> Bool) -> Void)
    func report(_ diagnostic: Diagnostic)
    func makePoster(for source: ActiveSource) -> EventPoster
}

/// Runs a `Program` on a driver's loop: mailbox, commands, reconcile.
///
/// Single-threaded: every call except through a `Sender` or `EventPoster`
/// must come from the driver's loop thread.
///
/// - `send` appends to the mailbox; if nothing is draining, draining starts:
///   each message runs `update`, the model is committed, then its commands
///   are handed to `perform` in order. Messages sent meanwhile are processed
///   after the current one.
/// - When the mailbox is empty, subscriptions are reconciled once (never for
///   intermediate models, and not at all when an `Equatable` model is
///   unchanged since the last reconcile).
public final class Runtime<P: Program>: DriverHost {
    struct Envelope {
        let message: P.Message
        let source: ActiveSource?
        let origin: MessageOrigin
    }

    enum State { case idle, running, shutDown }

    /// The program being run.
    public let program: P
    /// The committed model.
    /// (Its exclusivity is unchecked, as the runtime's other hot fields:
    /// the runtime is single-threaded and `update` gets it `inout` from
    /// this class only; a dynamic check cost a lookup per message.)
    @exclusivity(unchecked) public private(set) var model: P.Model
    /// Counters: messages, reconciles, driver calls, late deliveries.
    @exclusivity(unchecked) public private(set) var stats = RuntimeStats()
    /// The plan of the last reconcile: empty when it asked the driver for
    /// nothing (or was skipped because an `Equatable` model was unchanged).
    /// `ProgramTester.lastPlan` holds the same value for the same step.
    public private(set) var lastPlan = Plan()

    /// Called after each committed model (render here).
    /// (The hooks' exclusivity is unchecked too: each message reads them.)
    @exclusivity(unchecked) public var didCommit: ((P.Model) -> Void)?
    /// Called after each reconcile that changed something or saw duplicates.
    public var didReconcile: ((Plan) -> Void)?
    /// Called for each diagnostic (duplicates, failures, late deliveries).
    public var diagnostics: ((Diagnostic) -> Void)?
    /// Called with each transcript record (start, message, plan,
    /// diagnostic) on the loop thread; see `TranscriptRecord`.
    @exclusivity(unchecked) public var transcript: ((TranscriptRecord<P.Message, P.Command>) -> Void)?
    /// (Package-internal: the recorder's hook.) When set, called for each message instead of `transcript`, with the
    /// record's fields as arguments (index, message, origin, loop time,
    /// round, commands): no record value is built in this generic code, so
    /// a recorder specialised for the program's types takes it cheaply.
    @exclusivity(unchecked) @usableFromInline package var transcriptMessage: ((Int, P.Message, MessageOrigin, Duration, Int, [P.Command]) -> Void)?

    let driver: any Driver
    let perform: (P.Command, Runtime<P>) -> Void
    let reconciler = Reconciler<P.Message>()
    let inbox: Inbox<P.Message>
    @exclusivity(unchecked) var mailbox: [Envelope] = []
    @exclusivity(unchecked) var head = 0
    @exclusivity(unchecked) var state = State.idle
    @exclusivity(unchecked) var draining = false
    /// The batch `enqueue(batch:from:message:)` is delivering (its message
    /// maker, set only while it runs), its size and the index of its next
    /// message: what a shutdown during it reports as dropped.
    @exclusivity(unchecked) var batchMessage: ((Int) -> P.Message)?
    @exclusivity(unchecked) var batchCount = 0
    @exclusivity(unchecked) var batchNext = 0
    /// The rest of the batch `enqueue(stream:rest:_:)` is delivering (set
    /// only while it runs; a shutdown calls it once).
    @exclusivity(unchecked) var streamRest: (() -> [P.Message])?
    /// A source's batch was delivered and its reconcile left to the next
    /// pump (`enqueue(batch:from:)`); any reconcile before it clears this.
    @exclusivity(unchecked) var reconcileDeferred = false
    var waker: Waker?
    var reconciledModel: P.Model?
    var startCommands: [P.Command]
    var posterSources: [Activation: ActiveSource] = [:]
    /// Stopped sources with a poster, each with how many inbox items must
    /// have been taken (`inboxTaken`) before its last post has been: its
    /// entry in `posterSources` stays until then, so every event it posted
    /// before its stop is delivered (late), however far behind the inbox is.
    var retiredPosters: [(activation: Activation, until: Int)] = []
    /// Inbox items taken so far.
    var inboxTaken = 0
    /// Reconcile passes so far (skipped ones included): a transcript's round.
    var rounds = 0
    /// Owned tasks (Tasks.swift); their results join the mailbox in `moveInbox`.
    let taskRegistry = TaskRegistry<P.Message>()

    /// A runtime for `program` on `driver`.
    /// - Parameters:
    ///   - program: the program to run.
    ///   - driver: the driver that runs its sources (and whose loop runs it).
    ///   - inboxCapacity: how many cross-thread messages may wait at once.
    ///   - perform: the host's command interpreter; it may `send` outcomes.
    public init(
        _ program: P, driver: any Driver, inboxCapacity: Int = 4096,
        perform: @escaping (P.Command, Runtime<P>) -> Void = { _, _ in }
    ) {
        self.program = program
        self.driver = driver
        self.perform = perform
        self.inbox = Inbox(capacity: inboxCapacity)
        (self.model, self.startCommands) = program.start()
        reconciler.owner = self
    }

    /// Whether `start()` ran and `shutdown()` did not.
    public var isRunning: Bool { state == .running }

    /// The running subscriptions' identities, in activation order.
    public var activeIDs: [SubscriptionID] { reconciler.activeIDs }

    /// Debugging: build groups whose input is unchanged too and report a
    /// group whose subscriptions changed anyway
    /// (`Diagnostic.groupDependsOnMoreThanInput`). Costs what groups save.
    public var verifiesGroups: Bool {
        get { reconciler.verifiesGroups }
        set { reconciler.verifiesGroups = newValue }
    }

    /// Attaches the driver, performs the start commands, processes queued
    /// messages (those the start commands sent among them, as one batch) and
    /// reconciles for the first time. Idempotent while running.
    /// - Throws: `RuntimeError.shutDown` after shutdown; the driver's error if
    ///   it cannot attach.
    public func start() throws {
        switch state {
        case .running: return
        case .shutDown: throw RuntimeError.shutDown
        case .idle: break
        }
        let waker = try driver.attach(self)
        inbox.setWaker(waker)
        self.waker = waker
        taskRegistry.attach(waker: waker, runner: (driver as? any TaskDriver)?.taskRunner)
        state = .running
        let commands = startCommands
        startCommands = []
        transcript?(.start(time: driver.loopTime, commands: commands))
        didCommit?(model)
        // Messages the start commands send wait for the first drain below
        // (one batch, as a transcript records it).
        draining = true
        for c in commands {
            perform(c, self)
            if state != .running { draining = false; return }
        }
        draining = false
        moveInbox()
        drainAndReconcile(force: true)
    }

    /// Queues `message`; processes it now unless already draining (loop thread).
    /// Before `start()` the message waits for the start.
    /// - Throws: `RuntimeError.shutDown` after shutdown.
    public func send(_ message: P.Message) throws(RuntimeError) {
        guard state != .shutDown else { throw .shutDown }
        enqueue(message, from: nil, origin: .host)
    }

    /// Moves cross-thread messages and events into the mailbox and processes
    /// them. Drivers call this after their waker fired.
    public func pumpInbox() {
        guard state == .running else { return }
        moveInbox()
        drainAndReconcile(force: reconcileDeferred)
        taskRegistry.checkSettled()
    }

    /// Inbox items one pump moves at most: a flood of posted events or
    /// sent messages reaches `update` in batches of this many (one
    /// reconcile each), and the loop's other sources (a timer) run between
    /// batches instead of waiting for the whole inbox (up to its capacity).
    static var pumpLimit: Int { 256 }

    private func moveInbox() {
        let items = inbox.take(upTo: Self.pumpLimit)
        inboxTaken += items.count
        for item in items {
            if let envelope = envelope(item) { mailbox.append(envelope) }
        }
        taskRegistry.takeResults { mailbox.append(Envelope(message: $0, source: nil, origin: .task($1))) }
        if !retiredPosters.isEmpty {
            // Posts from these were refused since their stop; those they
            // made before it are taken once `until` items were.
            let taken = inboxTaken
            retiredPosters.removeAll { r in
                guard r.until <= taken else { return false }
                posterSources.removeValue(forKey: r.activation)
                return true
            }
        }
    }

    /// An inbox item as a mailbox envelope: a poster's event is tagged with
    /// its subscription's tagger now (or the one it had when it stopped).
    private func envelope(_ item: Inbox<P.Message>.Item) -> Envelope? {
        switch item {
        case .message(let m):
            return Envelope(message: m, source: nil, origin: .sender)
        case .event(let activation, let event):
            guard let source = posterSources[activation] else { return nil }
            guard let m = reconciler.message(for: event, from: source) else {
                report(.eventTypeMismatch(source.id, String(describing: type(of: event))))
                return nil
            }
            return Envelope(message: m, source: source, origin: .source(source.id, source.activation))
        }
    }

    /// Stops every active source exactly once, closes the inbox and refuses
    /// later messages. A second call does nothing and reports nothing.
    @discardableResult
    public func shutdown() -> ShutdownReport<P.Message> {
        guard state != .shutDown else { return ShutdownReport(stopped: [], dropped: []) }
        let wasAttached = state == .running
        state = .shutDown
        let (tasks, undelivered) = taskRegistry.close()
        let sources = reconciler.removeAll()
        stats.stops += sources.count
        for s in sources { stop(s) }
        var batchRest = batchMessage.map { m in (batchNext..<max(batchNext, batchCount)).map(m) } ?? []
        batchNext = batchCount
        if let rest = streamRest {
            streamRest = nil
            batchRest += rest()
        }
        let dropped = batchRest + mailbox[head...].map(\.message) + inbox.close().compactMap { envelope($0)?.message } + undelivered
        mailbox = []
        head = 0
        posterSources = [:]
        retiredPosters = []
        if wasAttached { driver.detach() }
        return ShutdownReport(stopped: sources.map(\.id), dropped: dropped, tasks: tasks)
    }

    // MARK: - The loop

    /// - Parameter deferReconcile: leave the reconcile these messages need
    ///   to the next pump (waking the loop for it) instead of running it now.
    private func drainAndReconcile(force: Bool, deferReconcile: Bool = false) {
        guard state == .running, !draining else { return }
        draining = true
        defer { draining = false }
        var mustReconcile = force
        while state == .running {
            if head < mailboxCount {
                mustReconcile = true
                guard deliverQueued() else { return }
            }
            guard mustReconcile else { return }
            mustReconcile = false
            if deferReconcile {
                if !reconcileDeferred {
                    reconcileDeferred = true
                    waker?()
                }
                return
            }
            reconcile()
            rounds += 1
            if head >= mailboxCount { return }
        }
    }

    /// Delivers the mailbox's envelopes from `head` on (those queued
    /// meanwhile too), then empties it; false when the runtime stopped
    /// running during one.
    ///
    /// (Out of line, as is every use of an envelope on the paths a
    /// dispatch takes when the mailbox is empty: generic code fetches the
    /// envelope's type metadata, a hash lookup of about 330 instructions, at
    /// the entry of a function that uses it on any path.)
    @inline(never)
    private func deliverQueued() -> Bool {
        while head < mailboxCount {
            let envelope = mailbox[head]
            head += 1
            deliver(envelope.message, from: envelope.source, origin: envelope.origin)
            if state != .running { return false }
        }
        mailbox.removeAll(keepingCapacity: true)
        head = 0
        return true
    }

    /// Runs `update` for one message, then its commands.
    ///
    /// What is not needed for every message is out of line (a late
    /// delivery, the transcript, `didCommit`, the commands' loop): this
    /// generic code then looks up neither the command's nor the model's
    /// type, nor makes room for either on the stack, for a message whose
    /// update returned no command (about 100 instructions a message).
    @inline(__always)
    private func deliver(_ message: P.Message, from source: ActiveSource?, origin: @autoclosure () -> MessageOrigin) {
        if let source, !source.isActive { reportLate(source) }
        let commands = program.update(&model, message)
        stats.messages += 1
        if transcriptMessage != nil || transcript != nil { record(message, origin: origin(), commands: commands) }
        if didCommit != nil { commit() }
        if !Self.isEmpty(commands) { performAll(commands) }
    }

    /// Whether `commands` is empty, read from the array's storage header,
    /// which is the same for every element type of a native array (every
    /// array without Objective-C interoperability, as on Linux): asked of
    /// `[P.Command]` itself, this generic code would look the array's type
    /// up first. (Where an array may be a bridged `NSArray`, asked of it.)
    @inline(__always)
    private static func isEmpty(_ commands: [P.Command]) -> Bool {
        #if _runtime(_ObjC)
        commands.isEmpty
        #else
        unsafeBitCast(commands, to: [UInt8].self).isEmpty
        #endif
    }

    /// `mailbox.count`, read from the array's storage header as `isEmpty`
    /// reads `commands`: asked of `[Envelope]` itself, this generic code
    /// looks the envelope's type up first (about 330 instructions, at every
    /// dispatch that finds the mailbox empty).
    @inline(__always)
    private var mailboxCount: Int {
        #if _runtime(_ObjC)
        mailbox.count
        #else
        unsafeBitCast(mailbox, to: [UInt8].self).count
        #endif
    }

    @inline(never)
    private func reportLate(_ source: ActiveSource) {
        stats.lateDeliveries += 1
        report(.lateDelivery(source.id, source.activation))
    }

    @inline(never)
    private func commit() { didCommit?(model) }

    /// `commands` performed in order; a command that ends the runtime ends
    /// the loop.
    @inline(never)
    private func performAll(_ commands: [P.Command]) {
        for c in commands {
            perform(c, self)
            if state != .running { return }
        }
    }

    /// The transcript record of the message `deliver` just handled (out of
    /// line: a record's type is looked up at run time in this generic
    /// code, a cost no message should pay when nothing records).
    @inline(never)
    private func record(_ message: P.Message, origin: MessageOrigin, commands: [P.Command]) {
        if let transcriptMessage {
            transcriptMessage(stats.messages - 1, message, origin, driver.loopTime, rounds, commands)
        } else if let transcript {
            transcript(.message(TranscriptMessage(index: stats.messages - 1, message: message, origin: origin,
                                                  time: driver.loopTime, round: rounds, commands: commands)))
        }
    }

    private func reconcile() {
        reconcileDeferred = false
        if let last = reconciledModel, program.isUnchanged(last, model) {
            stats.skippedReconciles += 1
            lastPlan = Plan()
            return
        }
        // The last plan's stopped entries may be reused by this reconcile's
        // starts once nothing holds them (see `SourceTicket`).
        lastPlan = Plan()
        // The start records' boxes are retained below, as each source starts.
        let plan = reconciler.reconcileDeferringBoxRetains(building: { program.subscriptions(model) })
        let actions = plan.records
        reconciledModel = model
        stats.reconciles += 1
        for d in plan.duplicates {
            stats.duplicates += 1
            report(.duplicateIdentity(d))
        }
        for g in plan.groupsNotPure { report(.groupDependsOnMoreThanInput(g)) }
        if !plan.isEmpty {
            stats.stops += actions.stops.count + actions.restarts.count
            stats.retunes += actions.retunes.count
            stats.restarts += actions.restarts.count
            stats.starts += actions.restarts.count + actions.starts.count
            let driver = self.driver
            PlanRecords.forEach(actions.stops) { stop($0) }
            PlanRecords.forEach(actions.restarts) { stop($0) }    // each restart's old entry
            for r in actions.retunes { driver.retune(r.source, from: r.from.hashable) }
            PlanRecords.forEach(actions.restarts, offset: PlanRecords.restartNewOffset) { driver.start($0) }
            PlanRecords.forEachStart(actions.starts) { source, box in
                _ = box.retain()    // the started entry's own reference (deferred by the reconcile)
                driver.start(source)
            }
        }
        lastPlan = plan
        if !plan.isEmpty || !plan.duplicates.isEmpty {
            transcript?(.plan(plan, time: driver.loopTime, round: rounds))
            didReconcile?(plan)
        }
    }

    /// Stops `source` in the driver (the caller counts it in `stats`).
    private func stop(_ source: ActiveSource) {
        source.isActive = false
        if source.hasPoster {
            retiredPosters.append((source.activation, inboxTaken + inbox.retire(source.activation)))
        }
        driver.stop(source)
    }
}

extension Runtime: MessageSink {
    func enqueue(_ message: P.Message, from source: ActiveSource?) {
        enqueue(message, from: source, origin: source.map { .source($0.id, $0.activation) } ?? .host)
    }

    func enqueue(_ message: P.Message, from source: ActiveSource?, origin: MessageOrigin) {
        guard state != .shutDown else { return }
        mailbox.append(Envelope(message: message, source: source, origin: origin))
        if state == .running { drainAndReconcile(force: false) }
    }

    /// When nothing is draining and the mailbox is empty (a dispatch on the
    /// loop, the usual case) the batch is delivered straight from the
    /// array, without an envelope per message; messages sent meanwhile
    /// queue behind it. The reconcile the batch needs is left to the next
    /// pump (the loop is woken for it): the loop's other ready sources run
    /// first, so a round over many busy descriptors reconciles once, not
    /// once per descriptor; any message that reconciles earlier (a timer's
    /// tick) takes it along.
    func enqueue(batch count: Int, from source: ActiveSource, message: (Int) -> P.Message) {
        guard state != .shutDown, count > 0 else { return }
        guard state == .running, !draining, head >= mailboxCount else {
            return queue(batch: count, from: source, message: message)
        }
        draining = true
        // Each message is made as it is delivered (no array of them); the
        // maker is reachable from `shutdown` only while this runs.
        withoutActuallyEscaping(message) { message in
            batchMessage = message
            batchCount = count
            batchNext = 0
            while batchNext < batchCount {
                let i = batchNext
                batchNext += 1
                deliver(message(i), from: source, origin: .source(source.id, source.activation))
                if state != .running { break }
            }
            batchMessage = nil
            batchCount = 0
            batchNext = 0
        }
        draining = false
        drainAndReconcile(force: true, deferReconcile: waker != nil)
    }

    func enqueue(stream source: ActiveSource, rest: () -> [P.Message], _ produce: (_ deliver: (P.Message) -> Bool) -> Void) {
        guard state != .shutDown else { return produce { _ in false } }
        guard state == .running, !draining, head >= mailboxCount else { return queue(stream: source, produce) }
        let origin = MessageOrigin.source(source.id, source.activation)
        draining = true
        // The rest is reachable from `shutdown` only while this runs.
        withoutActuallyEscaping(rest) { rest in
            streamRest = rest
            produce { message in
                deliver(message, from: source, origin: origin)
                return state == .running
            }
            streamRest = nil
        }
        draining = false
        drainAndReconcile(force: true, deferReconcile: waker != nil)
    }

    /// A batch that arrives while messages wait or are being delivered:
    /// queued behind them (out of line: see `deliverQueued`).
    @inline(never)
    private func queue(batch count: Int, from source: ActiveSource, message: (Int) -> P.Message) {
        let origin = MessageOrigin.source(source.id, source.activation)
        for i in 0..<count { mailbox.append(Envelope(message: message(i), source: source, origin: origin)) }
        if state == .running { drainAndReconcile(force: false) }
    }

    /// As `queue(batch:from:message:)`, for a stream's events.
    @inline(never)
    private func queue(stream source: ActiveSource, _ produce: (_ deliver: (P.Message) -> Bool) -> Void) {
        let origin = MessageOrigin.source(source.id, source.activation)
        produce {
            mailbox.append(Envelope(message: $0, source: source, origin: origin))
            return true
        }
        if state == .running { drainAndReconcile(force: false) }
    }

    func report(_ diagnostic: Diagnostic) {
        switch diagnostic {
        case .sourceFailed: stats.failures += 1
        case .eventAfterStop, .eventTypeMismatch: stats.droppedEvents += 1
        case .duplicateIdentity, .lateDelivery, .groupDependsOnMoreThanInput: break
        }
        transcript?(.diagnostic(diagnostic, time: driver.loopTime))
        diagnostics?(diagnostic)
    }

    func makePoster(for source: ActiveSource) -> EventPoster {
        posterSources[source.activation] = source
        inbox.register(source.activation)
        let inbox = self.inbox
        let activation = source.activation
        return EventPoster(activation: activation) { inbox.post(.event(activation, $0)) }
    }
}

extension Runtime where P.Message: Sendable {
    /// A handle that sends messages from any thread (bounded; see `Sender`).
    public func sender() -> Sender<P.Message> { Sender(inbox: inbox) }
}

// MARK: - Effects (owned tasks, the clock)

extension Runtime {
    /// The owned tasks a command interpreter starts and cancels by identity.
    public var tasks: TaskRegistry<P.Message> { taskRegistry }

    /// The clock tasks sleep on: the driver's (`TaskDriver`), else `ContinuousClock`.
    public var clock: LoopClock { (driver as? any TaskDriver)?.clock ?? .continuous }

    /// Whether `beginShutdown()` or `shutdown()` was called.
    public var isShuttingDown: Bool { state == .shutDown || taskRegistry.isShuttingDown }

    /// First half of a graceful shutdown: cancels every task, refuses new
    /// ones, and returns how many still run. Sources and messages go on
    /// (cancelled tasks' results are delivered) until `shutdown()`; a host
    /// that runs the loop waits for `whenTasksEnded` or its grace deadline.
    @discardableResult
    public func beginShutdown() -> Int { taskRegistry.beginShutdown() }

    /// Calls `body` on the loop thread (after a pump) once every task ended
    /// after `beginShutdown()`; not called when none was running.
    public func whenTasksEnded(_ body: @escaping () -> Void) { taskRegistry.onSettled = body }
}
