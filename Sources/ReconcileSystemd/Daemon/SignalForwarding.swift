import CSystemd
import Glibc
import Reconcile
import Synchronization

/// Signals taken by a thread that does not block them, passed on to the
/// loop's thread, where they are blocked and read through signalfd.
///
/// Why: in an `async` main on Linux, the main thread ends in libdispatch's
/// `dispatch_main`, which parks it in `sigsuspend` with an **empty** mask
/// (measured: `SigBlk: 0000000000000000` for the main thread after the first
/// `await`, even when `Signals.block()` ran first; a SIGTERM then killed the
/// process). Every process-directed signal goes to that thread, so a loop
/// on another thread would never see SIGTERM. A handler (`SA_SIGINFO`)
/// re-queues each such signal on the loop's thread with
/// `rt_tgsigqueueinfo`, keeping the sender's pid, so `SignalSource` events
/// and the daemon's shutdown still say who sent it.
///
/// Before the loop's thread exists (`DaemonService.init` installs the
/// handler; `run()` starts the thread later, from a task) a signal is
/// **held**: its siginfo kept in a slot of its own, then re-queued on the
/// loop's thread by `attach()`, where the loop reads it once it runs. So a
/// SIGTERM between making the service and its loop running is a graceful
/// shutdown, not the default action's kill (measured before: 150 of 200
/// such SIGTERMs killed the process). Like the kernel's own pending set, a
/// held signal is one per number: a second before `attach()` is dropped.
///
/// What would break it: another handler for the same signal (refused:
/// `DaemonError.signalHandled`), or the loop's thread not blocking the
/// signal (`DaemonService` blocks them in the thread it starts). The
/// handler touches only atomics and its own slot (async-signal-safe);
/// `prepare` initialises every static it uses before installing it, so
/// no lazy initialisation runs in the handler.
enum SignalForwarding {
    /// The loop thread's kernel id (0: none yet; a signal then is held).
    static let target = Atomic<Int32>(0)
    /// Signals whose slot a handler has claimed (being written or held).
    static let claimed = Atomic<UInt64>(0)
    /// Signals held: their slot is written, `attach()` forwards them.
    static let held = Atomic<UInt64>(0)
    /// One siginfo per signal number (1...64), written only by the handler
    /// that claimed it, read only by whoever took its `held` bit.
    nonisolated(unsafe) static let slots: UnsafeMutablePointer<siginfo_t> = {
        let p = UnsafeMutablePointer<siginfo_t>.allocate(capacity: 65)
        p.initialize(repeating: siginfo_t(), count: 65)
        return p
    }()
    /// The dispositions replaced, by signal number.
    private static let replaced = Mutex<[Int32: sigaction]>([:])
    /// Signals ignored (`SIG_IGN`, as a shell does for a background job's
    /// SIGINT): they reach no thread, so nothing can take them from the loop.
    private static let ignored = Mutex<Set<Int32>>([])

    /// Forwards `signals` to the calling thread (the loop's) from whichever
    /// thread takes them, and the signals held until now.
    /// - Throws: `DaemonError.signalHandled` when one has another handler.
    /// - Returns: the signals held until now, re-queued on this thread.
    @discardableResult
    static func install(_ signals: [SignalSource.Signal]) throws(DaemonError) -> [Int32] {
        try prepare(signals)
        return attach()
    }

    /// Makes the calling thread the loop's: signals go to it from now on,
    /// and those held so far are re-queued on it.
    /// - Returns: the numbers of the signals held until now.
    @discardableResult
    static func attach() -> [Int32] {
        let tid = CSystemd_gettid()
        target.store(tid, ordering: .sequentiallyConsistent)
        let pending = held.exchange(0, ordering: .sequentiallyConsistent)
        var forwarded: [Int32] = []
        for signo in Int32(1)...64 where pending & (1 << UInt64(signo - 1)) != 0 {
            _ = CSystemd_forward_signal(tid, signo, slots + Int(signo))
            claimed.bitwiseAnd(~(1 << UInt64(signo - 1)), ordering: .sequentiallyConsistent)
            forwarded.append(signo)
        }
        return forwarded
    }

    /// Installs the handler for `signals` with no loop thread yet: what
    /// arrives is held until `attach()`.
    /// - Throws: `DaemonError.signalHandled` when one has another handler.
    static func prepare(_ signals: [SignalSource.Signal]) throws(DaemonError) {
        // Every static the handler reads, initialised here, not in it.
        _ = (target.load(ordering: .relaxed), claimed.load(ordering: .relaxed), held.load(ordering: .relaxed), slots)
        let failed: SignalSource.Signal? = replaced.withLock { replaced in
            for signal in signals where replaced[signal.rawValue] == nil {
                var old = sigaction()
                sigaction(signal.rawValue, nil, &old)
                let handler = unsafeBitCast(old.__sigaction_handler, to: Int.self)
                if handler == 1 {   // SIG_IGN: reaches no thread; left as it is
                    _ = ignored.withLock { $0.insert(signal.rawValue) }
                    continue
                }
                if handler != 0 { return signal }   // someone else's handler
                var action = sigaction()
                action.__sigaction_handler.sa_sigaction = forwardSignal
                action.sa_flags = SA_SIGINFO | SA_RESTART
                sigfillset(&action.sa_mask)
                sigaction(signal.rawValue, &action, nil)
                replaced[signal.rawValue] = old
            }
            return nil
        }
        if let failed { throw .signalHandled(failed) }
    }

    /// Puts the replaced dispositions back; later signals act as before.
    /// - Parameter resending: no loop read the signals (its run failed before
    ///   it had a daemon, or never came): those still held, and those
    ///   forwarded to the calling thread but not read, are sent to the
    ///   process again, so they act now as they would have without us (a
    ///   SIGTERM then ends the process).
    static func remove(resending: Bool = false) {
        var waiting = sigset_t()
        sigemptyset(&waiting)
        if resending { sigpending(&waiting) }
        let restored: [Int32] = replaced.withLock { replaced in
            for (signo, var old) in replaced { sigaction(signo, &old, nil) }
            defer { replaced = [:] }
            return Array(replaced.keys)
        }
        ignored.withLock { $0 = [] }
        target.store(0, ordering: .sequentiallyConsistent)
        let pending = held.exchange(0, ordering: .sequentiallyConsistent)
        claimed.store(0, ordering: .sequentiallyConsistent)
        guard resending else { return }
        for signo in restored.sorted() where pending & (1 << UInt64(signo - 1)) != 0 || sigismember(&waiting, signo) == 1 {
            kill(getpid(), signo)
        }
    }

    /// Whether `signal` is forwarded now (or ignored, so no thread takes it).
    static func isForwarding(_ signal: SignalSource.Signal) -> Bool {
        replaced.withLock { $0[signal.rawValue] != nil } || ignored.withLock { $0.contains(signal.rawValue) }
    }

    /// The signals forwarded now, for the log.
    static var forwarded: [SignalSource.Signal] {
        replaced.withLock { $0.keys.sorted().compactMap(SignalSource.Signal.init(rawValue:)) }
    }
}

/// The handler: async-signal-safe (atomics, a copy into the signal's own
/// slot, one system call; errno kept by `CSystemd_forward_signal`).
private let forwardSignal: @convention(c) (Int32, UnsafeMutablePointer<siginfo_t>?, UnsafeMutableRawPointer?) -> Void = { signo, info, _ in
    guard let info, signo >= 1, signo <= 64 else { return }
    let tid = SignalForwarding.target.load(ordering: .sequentiallyConsistent)
    if tid > 0 {
        _ = CSystemd_forward_signal(tid, signo, info)
        return
    }
    // No loop thread yet: hold it (one per signal number, as the kernel does).
    let bit: UInt64 = 1 << UInt64(signo - 1)
    guard SignalForwarding.claimed.bitwiseOr(bit, ordering: .sequentiallyConsistent).oldValue & bit == 0 else { return }
    SignalForwarding.slots[Int(signo)] = info.pointee
    SignalForwarding.held.bitwiseOr(bit, ordering: .sequentiallyConsistent)
    // attach() may have drained before this was held: then forward it here
    // (whoever clears the held bit forwards it, exactly once).
    let now = SignalForwarding.target.load(ordering: .sequentiallyConsistent)
    if now > 0, SignalForwarding.held.bitwiseAnd(~bit, ordering: .sequentiallyConsistent).oldValue & bit != 0 {
        _ = CSystemd_forward_signal(now, signo, SignalForwarding.slots + Int(signo))
        SignalForwarding.claimed.bitwiseAnd(~bit, ordering: .sequentiallyConsistent)
    }
}
