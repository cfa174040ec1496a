/// RFC 3339 timestamps in UTC: the one formatter the transcript's header,
/// the indicator's JSON and anything else that writes a time use.
public enum Timestamp {
    /// `micros` (microseconds since the Unix epoch) as RFC 3339 in UTC with
    /// `fractionDigits` digits of the second (0 to 6; 3: milliseconds, 6:
    /// microseconds, both truncated): `2026-11-30T14:00:00.123Z`.
    ///
    /// Total over `Int64`: no step can overflow (a value read from a file is
    /// safe), and years outside 0000–9999 are written with their sign or
    /// more digits.
    public static func rfc3339(micros: Int64, fractionDigits: Int = 6) -> String {
        // Floor division without `micros - 999_999` (which overflows at the bottom).
        var secs = micros / 1_000_000
        var sub = micros % 1_000_000
        if sub < 0 {
            secs -= 1
            sub += 1_000_000
        }
        var days = secs >= 0 ? secs / 86400 : (secs - 86399) / 86400
        let rem = secs - days * 86400
        // Civil from days (Howard Hinnant's algorithm).
        days += 719_468
        let era = (days >= 0 ? days : days - 146_096) / 146_097
        let doe = days - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        var y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        if m <= 2 { y += 1 }
        func p(_ v: Int64, _ w: Int) -> String { let s = String(v); return String(repeating: "0", count: max(0, w - s.count)) + s }
        let digits = min(max(fractionDigits, 0), 6)
        var fraction = ""
        if digits > 0 {
            var scale: Int64 = 1
            for _ in digits..<6 { scale *= 10 }
            fraction = "." + p(sub / scale, digits)
        }
        return "\(p(y, 4))-\(p(m, 2))-\(p(d, 2))T\(p(rem / 3600, 2)):\(p(rem % 3600 / 60, 2)):\(p(rem % 60, 2))\(fraction)Z"
    }
}

extension JSONOutput {
    /// `s` as a JSON string literal (quotes and escapes included): the one
    /// escaper the encoder, the indicator and the benchmark's report use.
    public static func quoted(_ s: String) -> String {
        var out = JSONOutput(capacity: s.utf8.count + 2)
        out.string(s)
        return out.text
    }
}
