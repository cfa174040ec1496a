extension Duration {
    /// Whole microseconds (rounded down), as sd-event and timerfd count.
    public var microseconds: Int64 {
        let (s, atto) = components
        return s * 1_000_000 + atto / 1_000_000_000_000
    }

    /// A duration of `us` microseconds.
    public static func microseconds(_ us: Int64) -> Duration { .nanoseconds(us * 1000) }

    /// A short human form: `5s`, `300ms`, `1.5s`, `2m`, `250us`.
    public var short: String {
        let us = microseconds
        if us == 0 { return "0s" }
        if us % 60_000_000 == 0 { return "\(us / 60_000_000)m" }
        if us % 1_000_000 == 0 { return "\(us / 1_000_000)s" }
        if us >= 1_000_000 { return "\(us / 1_000_000).\(pad3((us % 1_000_000) / 1000))s".replacingTrailingZeros() }
        if us % 1000 == 0 { return "\(us / 1000)ms" }
        return "\(us)us"
    }
}

private func pad3(_ v: Int64) -> String {
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
