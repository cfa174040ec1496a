import CSystemd

/// Notifications to the service manager (`Type=notify` units).
public enum ServiceManager {
    /// Sends `state` (`READY=1`, `STATUS=...`, `STOPPING=1`). Returns false
    /// when there is no manager to tell (no `NOTIFY_SOCKET`) or it failed.
    /// The corresponding C function is `sd_notify`.
    @discardableResult
    public static func notify(_ state: String) -> Bool {
        sd_notify(0, state) > 0
    }

    /// The watchdog interval the manager asked for, if any.
    /// The corresponding C function is `sd_watchdog_enabled`.
    public static var watchdogInterval: Duration? {
        var usec: UInt64 = 0
        guard sd_watchdog_enabled(0, &usec) > 0 else { return nil }
        return .microseconds(Int64(usec))
    }
}
