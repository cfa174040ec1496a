import CSystemd
import Glibc
import Reconcile
import Synchronization

/// Runs a runtime's sources on an sd-event loop.
///
/// Every source callback and every message runs on the loop's thread. Other
/// threads reach the runtime through its `Sender` or an `EventPoster`, which
/// wake the loop through an eventfd.
public final class SystemdDriver: Driver {
    /// The loop the sources run on.
    public let loop: EventLoop
    /// The logger sources use (`SourceContext.logger`). Plan steps are logged
    /// by the host from `Runtime.didReconcile` (`DaemonLogger.logReconcile(_:)`), not here.
    public var logger: DaemonLogger

    /// Running sources live on their tickets (`driverState`, a
    /// `DriverRunner`), linked unretained into this list through themselves
    /// so `detach` and deinit can stop the ones the runtime did not.
    private let owned = OwnedSources()
    /// What each kind conforms to (`KindInfo`), looked up once per kind.
    private var kinds: [ObjectIdentifier: KindInfo] = [:]
    private var lastKind: (id: ObjectIdentifier, info: KindInfo)?
    /// Stopped timer runners (unlinked), armed again by later timer starts
    /// (no allocation and no free per timer); at most `spareTimerLimit`.
    /// A runner is made only when none is spare, so this never holds more
    /// than the most timers that ran at once: a daemon that ran 100,000
    /// starts them again with no allocation at all. (A runner holds no
    /// sd-event source: timers share one per clock and accuracy, `timerQueues`.)
    /// (Loop thread only, no access spans a reentrant call: no dynamic
    /// exclusivity checks, as on the runners' links below.)
    @exclusivity(unchecked) private var spareTimers: [TimerRunner] = []
    /// About 28 MB of spare runners at most (a runner is about 112 bytes).
    static let spareTimerLimit = 262_144
    /// Stopped file watch runners (unlinked, with their `Watch` records and
    /// lists), started again by later watches; at most `spareWatchLimit`.
    private var spareWatches: [FileWatchRunner] = []
    static let spareWatchLimit = 16_384
    private weak var host: (any DriverHost)?
    /// Set by `detach` (until the next `attach`): `start` refuses.
    private var detached = false
    private var wakeSource: EventSource?
    private var wakeChannel: WakeChannel?
    private var inotifyKeeper: EventSource?
    /// The timers' queues: one sd-event source per clock and accuracy (see `TimerQueues`).
    let timerQueues: TimerQueues
    /// The file watches' shared directory watches (see `DirectoryWatches`).
    lazy var directoryWatches = DirectoryWatches(loop: loop, flushGuard: flushGuard)
    /// The file watches' flushes' check (`FlushGuard`), run from the wake
    /// source's prepare callback while a flush waits.
    let flushGuard = FlushGuard()
    /// The descriptor, listener and process sources' shared state
    /// (IO/IOState.swift), made by the first of them.
    var ioState: IOState?
    /// The bus sources' and calls' connections, one per bus (see `Bus/`).
    lazy var buses = BusConnections(loop: loop, logger: logger)

    /// A driver for sources on `loop`.
    public init(loop: EventLoop, logger: DaemonLogger = DaemonLogger()) {
        self.loop = loop
        self.logger = logger
        timerQueues = TimerQueues(loop: loop)
    }

    /// How many sources are running now.
    public var runningCount: Int { owned.count }

    /// The loop's monotonic time (`sd_event_now`: the time of the current
    /// iteration's wakeup), stamped on transcript records.
    public var loopTime: Duration { .microseconds(Int64(clamping: loop.now())) }

    /// Connects the runtime: an eventfd on the loop pumps its inbox when woken.
    public func attach(_ host: any DriverHost) throws -> Waker {
        self.host = host
        detached = false
        let efd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        try checkLibc("eventfd", efd)
        var s: OpaquePointer?
        let r = sd_event_add_io(loop.handle, &s, efd, UInt32(EPOLLIN.rawValue), { _, fd, _, ud in
            var value: UInt64 = 0
            _ = read(fd, &value, 8)
            Unmanaged<SystemdDriver>.fromOpaque(ud!).takeUnretainedValue().host?.pumpInbox()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        if r < 0 {
            close(efd)
            throw SystemdError("sd_event_add_io", errno: -r)
        }
        wakeSource = EventSource(s!)
        // The wake source is always on and rarely ready: its prepare
        // callback (sd-event calls it before each iteration) checks the
        // file watches' waiting flushes, set only while one waits (an
        // earlier attach's notes, on its wake source, are let go first).
        flushGuard.hook = nil
        flushGuard.hook = { [unowned self] on in
            guard let h = self.wakeSource?.handle else { return }
            sd_event_source_set_prepare(h, on ? { _, ud in
                let driver = Unmanaged<SystemdDriver>.fromOpaque(ud!).takeUnretainedValue()
                driver.flushGuard.check(now: driver.loop.now())
                return 0
            } : nil)
        }
        let channel = WakeChannel(fd: efd)
        wakeChannel = channel
        return Waker { channel.wake() }
    }

    /// Starts the ticket's source on the loop; a kind that is not a `SystemdSource`, or a start that throws, becomes a failure event.
    public func start(_ ticket: SourceTicket) {
        // After `detach` nothing may be armed again: nothing would stop it.
        guard !detached else {
            ticket.fail(SourceFailure(operation: "start \(ticket.id)",
                                      reason: "the sd-event driver is detached; a runtime that goes on after its driver detached starts nothing"))
            return
        }
        // The built-in kinds directly (their configuration read by one
        // class compare, no existential on the way); others through their
        // `SystemdSource` conformance.
        let source = ticket.source
        switch ObjectIdentifier(source) {
        case ObjectIdentifier(TimerSource.self): startTimer(ticket); return
        case ObjectIdentifier(FileWatchSource.self): startWatch(ticket); return
        case ObjectIdentifier(SignalSource.self): startSignal(ticket); return
        default: break
        }
        // A subscription with a restart policy runs its attempts under a
        // supervisor (Loop/Restarts.swift).
        let info = kindInfo(source)
        if info.restartable, startRestarting(ticket) { return }
        // A connection's descriptor, the most frequent start of a server,
        // with its type known.
        if ObjectIdentifier(source) == ObjectIdentifier(DescriptorSource.self) { return startRunning(DescriptorSource.self, ticket) }
        guard let kind = info.systemd else {
            if let kind = ticket.source as? any TaskBackedSource.Type {
                // A task on the loop's executor (StreamSource).
                own(TaskSourceRunner(stop: kind.startTask(ticket, executor: loop.taskExecutor)), ticket)
                return
            }
            ticket.fail(SourceFailure(operation: "start \(ticket.id)",
                                      reason: "the sd-event driver cannot run source kind '\(ticket.id.kind)' (it does not conform to SystemdSource)"))
            return
        }
        startRunning(kind, ticket)
    }

    /// Starts a `SystemdSource` kind's runner. Called with the kind's type
    /// known (a connection's `DescriptorSource`, the most frequent start of
    /// a server) it is specialised: no existential, and no run-time lookup
    /// of the configuration box's type (about 500 instructions a start).
    private func startRunning<S: SystemdSource>(_ kind: S.Type, _ ticket: SourceTicket) {
        do {
            own(ForeignRunner(try kind._start(ticket, context: SourceContext(loop: loop, logger: logger, driver: self))), ticket)
        } catch {
            ticket.fail(Self.failure(error, ticket))
        }
    }

    /// Applies the ticket's new configuration in place; an error becomes a failure event.
    public func retune(_ ticket: SourceTicket, from old: AnyHashable) {
        // Only this driver sets `driverState`, always to a `DriverRunner`.
        guard let state = ticket.driverState else { return }
        do { try unsafeDowncast(state, to: DriverRunner.self).retune(ticket) } catch { ticket.fail(Self.failure(error, ticket)) }
    }

    /// Stops the source; it emits nothing afterwards.
    public func stop(_ ticket: SourceTicket) {
        // Moved out of the ticket (no retain and release). Only this driver
        // sets a ticket's `driverState`, always to a `DriverRunner`.
        guard let state = ticket.takeDriverState() else { return }
        Unmanaged<DriverRunner>.fromOpaque(Unmanaged.passUnretained(state).toOpaque())._withUnsafeGuaranteedRef { $0.stopOwned() }
        // A stopped timer or watch runner is moved into its spare list.
        let kind = ObjectIdentifier(type(of: state))
        if kind == ObjectIdentifier(TimerRunner.self) {
            if spareTimers.count < Self.spareTimerLimit { spareTimers.append(unsafeDowncast(consume state, to: TimerRunner.self)) }
        } else if kind == ObjectIdentifier(FileWatchRunner.self), spareWatches.count < Self.spareWatchLimit {
            spareWatches.append(unsafeDowncast(consume state, to: FileWatchRunner.self))
        }
    }

    /// A timer: its configuration read through the box's typed accessor, a
    /// stopped runner reused when there is one (no `SourceContext`, no
    /// existential on the way).
    private func startTimer(_ ticket: SourceTicket) {
        guard let configuration = ticket.configuration(as: TimerSource.self) else {
            ticket.fail(TimerSource.wrongConfiguration(ticket))
            return
        }
        let runner = spareTimers.popLast() ?? TimerRunner(queues: timerQueues)
        do {
            try runner.start(ticket, configuration)
        } catch {
            spareTimers.append(runner)
            ticket.fail(error.failure)
            return
        }
        own(consume runner, ticket)
    }

    /// A file watch: its configuration read by one class compare, no
    /// `SourceContext` or existential on the way.
    private func startWatch(_ ticket: SourceTicket) {
        guard let configuration = ticket.configuration(as: FileWatchSource.self) else {
            ticket.fail(FileWatchSource.wrongConfiguration(ticket))
            return
        }
        keepInotifyOpen()
        let runner = spareWatches.popLast() ?? FileWatchRunner(loop: loop, directories: directoryWatches)
        do {
            try runner.start(ticket, configuration)
        } catch {
            spareWatches.append(runner)
            ticket.fail(Self.failure(error, ticket))
            return
        }
        own(consume runner, ticket)
    }

    /// A signal, the same way.
    private func startSignal(_ ticket: SourceTicket) {
        guard let signal = ticket.configuration(as: SignalSource.self) else {
            ticket.fail(SignalSource.wrongConfiguration(ticket))
            return
        }
        do {
            own(try SignalRunner(ticket: ticket, signal: signal, loop: loop), ticket)
        } catch {
            ticket.fail(Self.failure(error, ticket))
        }
    }

    /// Links `runner`, started for `ticket`, and hangs it on the ticket.
    /// The runner is moved into `driverState` (no retain and release).
    @inline(__always)
    func own(_ runner: consuming DriverRunner, _ ticket: SourceTicket) {
        owned.link(.passUnretained(runner), ticket)
        ticket.driverState = consume runner
    }

    /// What the driver asks of a source kind at each start, found once
    /// per kind: each `as?` to a protocol is a conformance lookup (about
    /// 1,000 instructions a start for `RestartableSource` alone).
    private struct KindInfo {
        /// The kind as a `SystemdSource`, when it is one.
        let systemd: (any SystemdSource.Type)?
        /// Whether it is a `RestartableSource` (which may have a policy).
        let restartable: Bool
    }

    private func kindInfo(_ type: any Source.Type) -> KindInfo {
        let id = ObjectIdentifier(type)
        if let last = lastKind, last.id == id { return last.info }
        let info: KindInfo
        if let known = kinds[id] { info = known } else {
            info = KindInfo(systemd: type as? any SystemdSource.Type, restartable: type is any RestartableSource.Type)
            kinds[id] = info
        }
        lastKind = (id, info)
        return info
    }

    /// Disconnects the runtime. `Runtime.shutdown` stops every source before
    /// it detaches; a source still running here (the driver detached without
    /// a shutdown) is stopped now, with one warning: nothing this driver
    /// started stays armed on the loop after it detached.
    public func detach() {
        detached = true
        let left = owned.stopAll()
        if left > 0 {
            logger.warning("detach: stopped \(left) source(s) still running (the runtime did not shut down first)")
        }
        // Stopped children are reaped, unadopted connections closed.
        ioState?.detach()
        // Stopped watch runners keep their (off) flush source for reuse.
        for watch in spareWatches { watch.release() }
        spareWatches.removeAll()
        // Every timer is stopped: the queues' sd-event sources go.
        spareTimers.removeAll()
        timerQueues.release()
        buses.close()
        flushGuard.hook = nil
        wakeSource?.close()
        wakeSource = nil
        inotifyKeeper?.close()
        inotifyKeeper = nil
        wakeChannel?.close()
        wakeChannel = nil
        host = nil
    }

    /// A driver that goes away (a runtime dropped without `shutdown()`, and
    /// with it its driver) detaches: it stops every source it still owns, so
    /// none fires into a program that is gone, and closes its eventfd.
    deinit { detach() }

    /// sd-event closes its inotify fd when the last watch goes, and closing
    /// an inotify fd waits for an RCU grace period (about a millisecond): a
    /// watch that never fires keeps the fd while the driver is attached. It
    /// shares `/` with file watches, so it asks for their mask (see
    /// `FileWatchRunner.mask`).
    func keepInotifyOpen() {
        guard inotifyKeeper == nil else { return }
        var s: OpaquePointer?
        if sd_event_add_inotify(loop.handle, &s, "/", FileWatchRunner.mask, { _, _, _ in 0 }, nil) >= 0 {
            inotifyKeeper = EventSource(s!)
        }
    }

    static func failure(_ error: any Error, _ ticket: SourceTicket) -> SourceFailure {
        switch error {
        case let e as SourceFailure: e
        case let e as SystemdError: e.failure
        default: SourceFailure(operation: "start \(ticket.id)", reason: String(describing: error))
        }
    }
}

/// The eventfd other threads write to; closed under the same lock, so a late
/// wake never writes to a reused descriptor.
final class WakeChannel: Sendable {
    private let fd: Mutex<Int32>

    init(fd: Int32) { self.fd = Mutex(fd) }

    func wake() {
        fd.withLock { fd in
            guard fd >= 0 else { return }
            var one: UInt64 = 1
            _ = write(fd, &one, 8)
        }
    }

    func close() {
        fd.withLock { fd in
            if fd >= 0 { Glibc.close(fd) }
            fd = -1
        }
    }
}

/// A running source the driver started, and its place in the driver's
/// ownership list (intrusive: no node besides the runner). The built-in
/// runners derive from this; a user kind's `RunningSource` is held by a
/// `ForeignRunner`. Owned by its ticket (`driverState`), linked unretained
/// into the driver's `OwnedSources`. Stopped exactly once: by
/// `SystemdDriver.stop`, by the driver's detach or deinit, or when its ticket
/// goes away without a stop (each subclass's deinit stops it).
class DriverRunner: RunningSource {
    /// The ticket of the current run, whose `driverState` holds this (so it
    /// outlives the run: no reference count); set at start and link, read
    /// by the runner only while it is armed. A stopped runner may be started
    /// again for another ticket (timers, file watches).
    @exclusivity(unchecked) final unowned(unsafe) var ticket: SourceTicket?
    /// The list this is linked into; nil once unlinked. Unretained: the
    /// driver unlinks every runner before its list goes (detach, deinit).
    // Unmanaged rather than unowned(unsafe): reading it costs no retain.
    @exclusivity(unchecked) fileprivate final var list: Unmanaged<OwnedSources>?
    @exclusivity(unchecked) fileprivate final var prev: Unmanaged<DriverRunner>?
    @exclusivity(unchecked) fileprivate final var next: Unmanaged<DriverRunner>?

    init() {}

    /// Applies `configuration` in place (subclasses).
    func retune(to configuration: AnyHashable) throws {}
    /// Applies `ticket`'s configuration in place: the driver's entry (a
    /// subclass reads its own kind's configuration typed).
    func retune(_ ticket: SourceTicket) throws { try retune(to: ticket.configuration) }
    /// Stops the source itself; may be called again (does nothing then).
    func stop() {}

    /// Unlinks and stops the source (a second call does nothing).
    final func stopOwned() {
        guard let list else { return }
        list._withUnsafeGuaranteedRef { $0.unlink(self) }
        stop()
    }

    /// A subclass's deinit has stopped the source; unlink what is left.
    deinit { list?._withUnsafeGuaranteedRef { $0.unlink(self) } }
}

/// A user kind's running source (any `RunningSource`) in the driver's list.
final class ForeignRunner: DriverRunner {
    let source: any RunningSource
    init(_ source: any RunningSource) { self.source = source }
    override func retune(to configuration: AnyHashable) throws { try source.retune(to: configuration) }
    override func stop() { source.stop() }
    deinit { stopOwned() }
}

/// The driver's running sources, a doubly linked list through the runners
/// themselves (O(1) add and remove, no table, no node).
final class OwnedSources {
    // Loop thread only; no access spans a call that could reach the list.
    @exclusivity(unchecked) private var head: Unmanaged<DriverRunner>?
    @exclusivity(unchecked) private(set) var count = 0

    /// Links `runner` (new, or stopped and unlinked) started for `ticket`.
    @inline(__always)
    func link(_ runner: Unmanaged<DriverRunner>, _ ticket: SourceTicket) {
        let list = Unmanaged.passUnretained(self)
        let next = head
        runner._withUnsafeGuaranteedRef { r in
            r.ticket = ticket
            r.list = list
            r.next = next
        }
        next?._withUnsafeGuaranteedRef { $0.prev = runner }
        head = runner
        count += 1
    }

    fileprivate func unlink(_ runner: DriverRunner) {
        if let p = runner.prev { p.takeUnretainedValue().next = runner.next } else { head = runner.next }
        runner.next?.takeUnretainedValue().prev = runner.prev
        runner.prev = nil
        runner.next = nil
        runner.list = nil
        count -= 1
    }

    /// Stops every source still linked and clears its ticket's
    /// `driverState` (which releases the runner); returns how many there
    /// were.
    func stopAll() -> Int {
        var stopped = 0
        while let first = head {
            let runner = first.takeUnretainedValue()
            withExtendedLifetime(runner) {
                let ticket = runner.ticket
                runner.stopOwned()
                if let ticket, ticket.driverState === runner { ticket.driverState = nil }
            }
            stopped += 1
        }
        return stopped
    }
}
