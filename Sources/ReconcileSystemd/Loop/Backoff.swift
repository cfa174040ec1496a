import CSystemd
import Glibc

/// Retry delays in microseconds: doubling from `initial`, never above
/// `maximum`; back to `initial` after a success (`RetryTimer`'s delays).
struct Backoff {
    let initial: UInt64
    let maximum: UInt64
    private(set) var next: UInt64

    init(initial: UInt64, maximum: UInt64) {
        self.initial = initial
        self.maximum = maximum
        next = initial
    }

    /// The delay before the next attempt; the one after is twice as long.
    mutating func take() -> UInt64 {
        let d = next
        let (doubled, overflow) = next.multipliedReportingOverflow(by: 2)
        next = overflow ? maximum : min(maximum, doubled)
        return d
    }

    mutating func reset() { next = initial }
}

/// A retry on the loop after a `Backoff` delay: one one-shot timer source,
/// made at the first retry and armed again for the next (no new source per
/// retry, so a retry that could be scheduled once always can). The
/// networkd backend's reconnects, the netlink watcher's resyncs and a failed
/// file watch's re-arming use it.
///
/// `action` runs on the loop when a retry is due; the owner captures itself
/// `unowned` and calls `close()` when it stops (before it goes away).
final class RetryTimer {
    private var backoff: Backoff
    private let loop: EventLoop
    private let action: () -> Void
    private var source: EventSource?
    /// A retry is armed and has not run.
    private(set) var isArmed = false
    /// The delay of the last retry armed (µs).
    private(set) var lastDelay: UInt64 = 0

    init(loop: EventLoop, initial: UInt64, maximum: UInt64, action: @escaping () -> Void) {
        backoff = Backoff(initial: initial, maximum: maximum)
        self.loop = loop
        self.action = action
    }

    /// Arms the retry after the backoff's next delay (again, if one is
    /// armed) and returns that delay.
    @discardableResult
    func schedule() throws(SystemdError) -> UInt64 {
        let delay = backoff.take()
        let due = usecAdd(loop.now(CLOCK_MONOTONIC), delay)
        if let handle = source?.handle {
            _ = try check("sd_event_source_set_time", sd_event_source_set_time(handle, due))
            _ = try check("sd_event_source_set_enabled", sd_event_source_set_enabled(handle, Int32(SD_EVENT_ONESHOT)))
        } else {
            var s: OpaquePointer?
            _ = try check("sd_event_add_time", sd_event_add_time(loop.handle, &s, CLOCK_MONOTONIC, due, 1000, { _, _, ud in
                let me = Unmanaged<RetryTimer>.fromOpaque(ud!).takeUnretainedValue()
                withExtendedLifetime(me) {
                    me.isArmed = false
                    me.action()
                }
                return 0
            }, Unmanaged.passUnretained(self).toOpaque()))
            source = EventSource(s!)
        }
        isArmed = true
        lastDelay = delay
        return delay
    }

    /// The next retry comes after the first delay again (after a success).
    func reset() { backoff.reset() }

    /// Cancels an armed retry and releases the timer source.
    func close() {
        source?.close()
        source = nil
        isArmed = false
    }
}
