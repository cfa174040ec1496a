/// Retry delays in microseconds: doubling from `initial`, never above
/// `maximum`; back to `initial` after a success (the networkd backend's
/// reconnects, a failed file watch's re-arming).
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
