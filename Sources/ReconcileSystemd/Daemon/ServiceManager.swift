import CSystemd
import Glibc

/// Notifications to the service manager (`Type=notify` units).
public enum ServiceManager {
    /// Sends `state` (`READY=1`, `STATUS=...`, `STOPPING=1`). Returns false
    /// when there is no manager to tell (no `NOTIFY_SOCKET`) or it failed.
    /// The corresponding C function is `sd_notify`.
    @discardableResult
    public static func notify(_ state: String) -> Bool {
        sd_notify(0, state) > 0
    }

    /// Sends `state` with `descriptors` attached (`SCM_RIGHTS`): what
    /// `FDSTORE=1` needs. Returns false when there is no manager to tell or
    /// it failed. The descriptors stay open here.
    /// The corresponding C function is `sd_pid_notify_with_fds`.
    @discardableResult
    public static func notify(_ state: String, descriptors: [Int32]) -> Bool {
        descriptors.withUnsafeBufferPointer { b in
            sd_pid_notify_with_fds(0, 0, state, b.baseAddress, UInt32(b.count)) > 0
        }
    }

    /// Whether the manager listens (`NOTIFY_SOCKET` is set).
    public static var isListening: Bool { getenv("NOTIFY_SOCKET") != nil }

    /// The `RELOADING=1` message: with `MONOTONIC_USEC=` (`CLOCK_MONOTONIC`
    /// now, in microseconds), which systemd 253's `Type=notify-reload`
    /// requires and 252 ignores.
    /// - Parameter monotonicUsec: the time to send; nil: now.
    public static func reloadingMessage(monotonicUsec: UInt64? = nil) -> String {
        "RELOADING=1\nMONOTONIC_USEC=\(monotonicUsec ?? clockMicroseconds(CLOCK_MONOTONIC))"
    }

    /// The `EXTEND_TIMEOUT_USEC=` message: the manager waits `duration`
    /// more for the next message before its start, reload or stop timeout
    /// applies (through the one saturating conversion, Loop/Usec.swift).
    public static func extendTimeoutMessage(_ duration: Duration) -> String {
        "EXTEND_TIMEOUT_USEC=\(usec(duration))"
    }

    /// The message for a failure: `STATUS=` with `reason` (on one line),
    /// then `ERRNO=` and/or `BUSERROR=` when given.
    public static func failureMessage(_ reason: String, errno: Int32? = nil, busError: String? = nil) -> String {
        var lines = ["STATUS=" + oneLine(reason)]
        if let errno { lines.append("ERRNO=\(errno)") }
        if let busError { lines.append("BUSERROR=" + oneLine(busError)) }
        return lines.joined(separator: "\n")
    }

    /// How a barrier ended.
    public enum BarrierOutcome: Equatable, Sendable {
        /// The manager had read every message sent before it.
        case reached
        /// No manager listens (`NOTIFY_SOCKET` unset): nothing to wait for.
        case noManager
        /// The manager did not answer in time (or the call failed): the errno.
        case failed(Int32)
    }

    /// Waits, at most `timeout`, until the manager has read every message
    /// sent before (`BARRIER=1`): call it last before exit, so the final
    /// `STATUS=`/`ERRNO=` is not lost with the process. Blocks the calling
    /// thread for at most `timeout`; never call it from a loop callback.
    /// The corresponding C function is `sd_notify_barrier`.
    public static func barrier(timeout: Duration) -> BarrierOutcome {
        let r = sd_notify_barrier(0, max(1, usec(timeout)))
        return r > 0 ? .reached : r == 0 ? .noManager : .failed(-r)
    }

    /// `text` with its line breaks as spaces (a notify field is one line).
    static func oneLine(_ text: String) -> String {
        String(text.map { $0 == "\n" || $0 == "\r" ? " " : $0 })
    }

    /// The watchdog interval the manager asked for, if any: `WATCHDOG_USEC`
    /// as checked by `sd_watchdog_enabled` (a number from 1 to 2^64 - 2, for
    /// this process when `WATCHDOG_PID` is set). Exact for every value.
    /// The corresponding C function is `sd_watchdog_enabled`.
    public static var watchdogInterval: Duration? {
        var interval: UInt64 = 0
        guard sd_watchdog_enabled(0, &interval) > 0 else { return nil }
        return Duration(usec: interval)
    }

    /// The shortest watchdog interval a daemon honours: 20 ms. A manager that
    /// asks for less (`WATCHDOG_USEC=1`) gets a ping every 10 ms, not a busy
    /// loop; it cannot be satisfied anyway.
    public static let minimumWatchdogInterval: Duration = .milliseconds(20)

    /// How often a daemon pings for the watchdog `interval`: every half
    /// interval (as sd-event does), the interval clamped to at least
    /// `minimumWatchdogInterval`.
    public static func watchdogPingPeriod(for interval: Duration) -> Duration {
        max(interval, minimumWatchdogInterval) / 2
    }
}

/// Sends `WATCHDOG=1` from the loop every `period` (with a quarter period
/// of leeway): a timer on the loop, so a stuck loop stops pinging and the
/// manager notices. Due times saturate: a period too long for `usec_t`
/// never pings.
final class WatchdogPinger {
    private let loop: EventLoop
    private let period: UInt64
    private var source: EventSource?

    init(loop: EventLoop, period: Duration) throws(SystemdError) {
        self.loop = loop
        self.period = max(1, usec(period))
        var s: OpaquePointer?
        try check("sd_event_add_time", sd_event_add_time(
            loop.handle, &s, CLOCK_MONOTONIC, usecAdd(loop.now(), self.period), usecAccuracy(period / 4),
            { s, _, ud in
                Unmanaged<WatchdogPinger>.fromOpaque(ud!).takeUnretainedValue().ping(s)
                return 0
            }, Unmanaged.passUnretained(self).toOpaque()))
        source = EventSource(s!)
        try check("sd_event_source_set_enabled", sd_event_source_set_enabled(s, Int32(SD_EVENT_ON)))
    }

    private func ping(_ s: OpaquePointer?) {
        ServiceManager.notify("WATCHDOG=1")
        sd_event_source_set_time(s, usecAdd(loop.now(), period))
    }

    func close() {
        source?.close()
        source = nil
    }
}
