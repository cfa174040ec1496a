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
