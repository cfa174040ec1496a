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
/// What would break it: another handler for the same signal (refused:
/// `DaemonError.signalHandled`), or the loop's thread not blocking the
/// signal (`DaemonService` blocks them in the thread it starts).
enum SignalForwarding {
    /// The loop thread's kernel id (0: none; a signal then is dropped).
    static let target = Atomic<Int32>(0)
    /// The dispositions replaced, by signal number.
    private static let replaced = Mutex<[Int32: sigaction]>([:])
    /// Signals ignored (`SIG_IGN`, as a shell does for a background job's
    /// SIGINT): they reach no thread, so nothing can take them from the loop.
    private static let ignored = Mutex<Set<Int32>>([])

    /// Forwards `signals` to the calling thread (the loop's) from whichever
    /// thread takes them.
    /// - Throws: `DaemonError.signalHandled` when one has another handler.
    static func install(_ signals: [SignalSource.Signal]) throws(DaemonError) {
        target.store(CSystemd_gettid(), ordering: .releasing)
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
    static func remove() {
        replaced.withLock { replaced in
            for (signo, var old) in replaced { sigaction(signo, &old, nil) }
            replaced = [:]
        }
        ignored.withLock { $0 = [] }
        target.store(0, ordering: .releasing)
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

/// The handler: async-signal-safe (an atomic load and one system call; errno kept).
private let forwardSignal: @convention(c) (Int32, UnsafeMutablePointer<siginfo_t>?, UnsafeMutableRawPointer?) -> Void = { signo, info, _ in
    let tid = SignalForwarding.target.load(ordering: .acquiring)
    if tid > 0, let info { _ = CSystemd_forward_signal(tid, signo, info) }
}
