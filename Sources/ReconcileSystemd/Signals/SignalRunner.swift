import CSystemd
import Glibc
import Reconcile

/// Blocking signals so the loop can read them (sd-event uses signalfd).
public enum Signals {
    /// Blocks `signals` in the calling thread. Call it first thing in `main`,
    /// before any thread starts: threads inherit the mask, and a signal that
    /// is blocked in only some threads may still kill the process.
    /// The corresponding C function is `pthread_sigmask`.
    /// SIGCHLD is always blocked too: child processes (`ProcessSource`) are
    /// watched through the loop, and `sd_event_add_child` requires it.
    public static func block(_ signals: [SignalSource.Signal] = SignalSource.Signal.allCases) throws(SystemdError) {
        let numbers = signals.map(\.rawValue) + [SIGCHLD]
        _ = try numbers.withUnsafeBufferPointer { (b) throws(SystemdError) in
            try check("pthread_sigmask", CSystemd_block_signals(b.baseAddress, Int32(b.count)))
        }
    }

    /// Whether `signal` is blocked in the calling thread.
    public static func isBlocked(_ signal: SignalSource.Signal) -> Bool {
        CSystemd_signal_is_blocked(signal.rawValue) == 1
    }

    /// The signals among `signals` that some thread of this process does not
    /// block (read from `/proc/self/task/*/status`). A signal not blocked
    /// everywhere may be taken by another thread instead of the loop
    /// (unless `DaemonService` forwards it to the loop's thread).
    public static func notBlockedEverywhere(_ signals: [SignalSource.Signal]) -> [SignalSource.Signal] {
        var blockedEverywhere = UInt64.max
        guard let dir = opendir("/proc/self/task") else {
            return signals.filter { !isBlocked($0) }
        }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let tid = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard tid.first?.isNumber == true, let mask = blockedMask(tid) else { continue }
            blockedEverywhere &= mask
        }
        // A forwarded signal reaches the loop's thread from any thread (Daemon/SignalForwarding.swift).
        return signals.filter { blockedEverywhere & (1 << UInt64($0.rawValue - 1)) == 0 && !SignalForwarding.isForwarding($0) }
    }

    private static func blockedMask(_ tid: String) -> UInt64? {
        guard let f = fopen("/proc/self/task/\(tid)/status", "r") else { return nil }
        defer { fclose(f) }
        var line = [CChar](repeating: 0, count: 512)
        while fgets(&line, Int32(line.count), f) != nil {
            let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if text.hasPrefix("SigBlk:") {
                return UInt64(String(text.dropFirst(7)).trimmingCharacters(in: " \t\n"), radix: 16)
            }
        }
        return nil
    }
}

extension SignalSource: SystemdSource {
    /// Adds a signalfd-backed sd-event signal source (the signal must be blocked in every thread).
    public static func start(_ ticket: SourceTicket, _ configuration: Signal, context: SourceContext) throws -> any RunningSource {
        try SignalRunner(ticket: ticket, signal: configuration, loop: context.loop)
    }
}

/// A signal read through the loop (signalfd), never in an async handler.
final class SignalRunner: DriverRunner {
    // `ticket` (the base's, unretained: it owns this runner while it runs).
    private let signal: SignalSource.Signal
    private var source: EventSource?

    init(ticket: SourceTicket, signal: SignalSource.Signal, loop: EventLoop) throws {
        self.signal = signal
        super.init()
        self.ticket = ticket
        guard Signals.notBlockedEverywhere([signal]).isEmpty else {
            throw SourceFailure(operation: "sd_event_add_signal", code: EBUSY,
                                reason: "\(signal) is not blocked in every thread: call Signals.block() at the start of main, before any thread starts")
        }
        var s: OpaquePointer?
        let r = sd_event_add_signal(loop.handle, &s, signal.rawValue, { _, info, ud in
            Unmanaged<SignalRunner>.fromOpaque(ud!).takeUnretainedValue().received(Int32(bitPattern: info?.pointee.ssi_pid ?? 0))
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        if r == -EBUSY {
            throw SourceFailure(operation: "sd_event_add_signal", code: EBUSY,
                                reason: "\(signal) already has a source on this loop (the Daemon handles its shutdown signals unless told not to)")
        }
        try check("sd_event_add_signal", r)
        source = EventSource(s!)
    }

    private func received(_ sender: Int32) {
        guard source != nil, let ticket else { return }
        ticket.emit(SignalSource.Event.received(signal, sender: sender))
    }

    override func stop() {
        source?.close()
        source = nil
    }

    deinit { stop() }
}

extension String {
    fileprivate func trimmingCharacters(in set: String) -> String {
        var s = Substring(self)
        while let c = s.first, set.contains(c) { s.removeFirst() }
        while let c = s.last, set.contains(c) { s.removeLast() }
        return String(s)
    }
}
