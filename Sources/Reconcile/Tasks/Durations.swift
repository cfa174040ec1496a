// The library's one conversion between `Duration` and integer microseconds.
// Every other conversion (sd-event's `usec_t` in ReconcileSystemd, the
// virtual driver's clock, plan logs) goes through these two functions, so a
// duration of any size converts without trapping.

extension Duration {
    /// Whole microseconds, truncated toward zero, saturating at the ends of
    /// `Int64`: a duration of ±292,471 years or more gives `Int64.max` /
    /// `Int64.min` instead of trapping. The library's one conversion from
    /// `Duration` to microseconds (`usec(_:)` in ReconcileSystemd builds on it).
    ///
    /// Cheap for durations under about 21 hours (2⁷⁶ attoseconds): a shift and
    /// a 64-bit division by a constant (a multiplication) instead of a
    /// 128-bit division.
    @inlinable public var saturatingMicroseconds: Int64 {
        let a = attoseconds
        let m = a.magnitude
        let us: UInt64
        if m >> 76 == 0 {
            // 10¹² = 2¹² · 5¹²: floor(floor(m / 2¹²) / 5¹²) = floor(m / 10¹²).
            us = UInt64(truncatingIfNeeded: m >> 12) / 244_140_625
        } else {
            let q = m / 1_000_000_000_000
            if q > UInt128(Int64.max) { return a < 0 ? .min : .max }
            us = UInt64(q)
        }
        return a < 0 ? -Int64(us) : Int64(us)
    }

    /// A duration of `us` microseconds; exact for every `Int64` (a `Duration`
    /// holds ±5.4·10²⁴ years, microseconds hold ±292,471).
    public static func microseconds(_ us: Int64) -> Duration {
        Duration(secondsComponent: us / 1_000_000, attosecondsComponent: (us % 1_000_000) * 1_000_000_000_000)
    }

    /// A short human form: `5s`, `300ms`, `1.5s`, `2m`, `1h`, `250us`; any duration,
    /// however large, formats without trapping (`-` in front when negative).
    public var short: String {
        let us = attoseconds / 1_000_000_000_000
        if us == 0 { return "0s" }
        let sign = us < 0 ? "-" : ""
        let m = us.magnitude
        if m % 3_600_000_000 == 0 { return "\(sign)\(m / 3_600_000_000)h" }
        if m % 60_000_000 == 0 { return "\(sign)\(m / 60_000_000)m" }
        if m % 1_000_000 == 0 { return "\(sign)\(m / 1_000_000)s" }
        if m >= 1_000_000 { return "\(sign)\(m / 1_000_000).\(pad3((m % 1_000_000) / 1000))s".replacingTrailingZeros() }
        if m % 1000 == 0 { return "\(sign)\(m / 1000)ms" }
        return "\(sign)\(m)us"
    }
}

private func pad3(_ v: UInt128) -> String {
    let s = String(v)
    return String(repeating: "0", count: max(0, 3 - s.count)) + s
}

extension String {
    fileprivate func replacingTrailingZeros() -> String {
        guard hasSuffix("s"), contains(".") else { return self }
        var body = String(dropLast())
        while body.hasSuffix("0") { body.removeLast() }
        if body.hasSuffix(".") { body.removeLast() }
        return body + "s"
    }
}
