import Reconcile
import Glibc

// sd-event counts time in `usec_t`: unsigned 64-bit microseconds, with
// `USEC_INFINITY` (2^64 - 1) meaning "never". Every `Duration` handed to
// sd-event goes through `usec(_:)`; time arithmetic on `usec_t` saturates at
// `USEC_INFINITY` (see Docs/Reliability.md, "Durations and timers").

/// sd-event's `USEC_INFINITY`: a time that never comes.
public let usecInfinity: UInt64 = .max

/// The one conversion from `Duration` to sd-event's `usec_t`. Saturating:
/// a negative duration gives 0; a duration of `Int64.max` microseconds
/// (292,471 years) or more gives `USEC_INFINITY`, "never". (Public as
/// `Duration.usec`, for sources of one's own.)
package func usec(_ duration: Duration) -> UInt64 {
    let us = duration.saturatingMicroseconds
    if us <= 0 { return 0 }
    if us == .max { return usecInfinity }
    return UInt64(us)
}

extension Duration {
    /// The duration as sd-event's `usec_t`, through the one saturating
    /// conversion: 0 for a negative duration, `USEC_INFINITY` ("never")
    /// from `Int64.max` microseconds on. For `SystemdSource`s of one's own
    /// that arm sd-event timers.
    public var usec: UInt64 { ReconcileSystemd.usec(self) }

    /// The duration of `usec` microseconds (exact for every `usec_t`;
    /// `USEC_INFINITY` gives 2^64 - 1 µs, callers that mean "never" check it
    /// first).
    public init(usec: UInt64) {
        self.init(secondsComponent: Int64(usec / 1_000_000), attosecondsComponent: Int64(usec % 1_000_000) * 1_000_000_000_000)
    }
}

/// `a + b` on `usec_t`, saturating at `USEC_INFINITY` (which absorbs).
func usecAdd(_ a: UInt64, _ b: UInt64) -> UInt64 {
    let (sum, overflow) = a.addingReportingOverflow(b)
    return overflow ? usecInfinity : sum
}

/// `a · k` on `usec_t`, saturating at `USEC_INFINITY`.
func usecMultiply(_ a: UInt64, _ k: UInt64) -> UInt64 {
    let (product, overflow) = a.multipliedReportingOverflow(by: k)
    return overflow ? usecInfinity : product
}

/// A leeway as sd-event's timer accuracy: at least 1 µs (0 would select
/// sd-event's default of 250 ms) and below `USEC_INFINITY` (which sd-event
/// rejects with EINVAL).
func usecAccuracy(_ leeway: Duration) -> UInt64 {
    min(max(1, usec(leeway)), usecInfinity - 1)
}

/// `clock`'s time now in microseconds (`clock_gettime`): every reading of
/// a clock in microseconds outside sd-event goes through here (the loop
/// clock's `now`, a `Duration`, keeps nanoseconds). Saturating: a time before the
/// clock's epoch (a realtime clock set before 1970) gives 0.
func clockMicroseconds(_ clock: clockid_t) -> UInt64 {
    var ts = timespec()
    clock_gettime(clock, &ts)
    guard ts.tv_sec >= 0 else { return 0 }
    return usecAdd(usecMultiply(UInt64(ts.tv_sec), 1_000_000), UInt64(ts.tv_nsec / 1000))
}

/// The wall clock (`CLOCK_REALTIME`) in microseconds since the Unix epoch:
/// the timestamps of connectivity events, transcript headers and the
/// indicator's output.
public func wallClockMicroseconds() -> Int64 {
    Int64(clamping: clockMicroseconds(CLOCK_REALTIME))
}
