import ReconcileTranscript
import Reconcile

/// What is printed after each commit: the rendered line when it differs from
/// the last one printed, or the first one after a resume from sleep (a fresh
/// report, even when it reads as the last one before the sleep). The live
/// indicator and its replay print through one of these.
public struct ViewOutput: Sendable {
    public let renderer: Renderer
    private var last: String?
    private var wakes = 0

    /// Nothing printed yet.
    public init(_ renderer: Renderer) { self.renderer = renderer }

    /// The line to print for `model` (`now`: µs since the epoch), or nil
    /// when there is nothing new to print.
    public mutating func next(_ model: Indicator.Model, now: Int64) -> String? {
        guard let line = renderer.render(model, now: now), line != last || model.wakes != wakes else { return nil }
        last = line
        wakes = model.wakes
        return line
    }
}

/// Turns the model into output lines. `now` (µs since the epoch) only feeds
/// the relative time of the text view.
public struct Renderer: Sendable {
    public var format: OutputFormat
    public var terminal: Bool

    public init(format: OutputFormat, terminal: Bool) {
        self.format = format
        self.terminal = terminal
    }

    /// The line for `model`, or nil before anything is known (and while the
    /// machine prepares for sleep).
    public func render(_ model: Indicator.Model, now: Int64) -> String? {
        // Nothing while the machine prepares for sleep: the state shown
        // then would be about to be wrong.
        if model.sleeping { return nil }
        switch format {
        case .text: return text(model, now: now)
        case .json: return json(model)
        case .waybar: return waybar(model)
        }
    }

    func text(_ m: Indicator.Model, now: Int64) -> String? {
        let line: String
        let mark: String
        if let f = m.failure {
            line = "unknown: \(f)"
            mark = "\u{1b}[33m●\u{1b}[0m"
        } else if let c = m.latest {
            let s = c.state
            if s.online {
                line = "online via \(s.primary?.name ?? s.backend.rawValue)"
                mark = "\u{1b}[32m●\u{1b}[0m"
            } else {
                line = "offline (\(s.state.rawValue))"
                mark = s.state >= .degraded ? "\u{1b}[33m●\u{1b}[0m" : "\u{1b}[31m●\u{1b}[0m"
            }
        } else {
            return nil
        }
        guard terminal else { return line }
        var since = ""
        if m.settings.showSince, let c = m.latest, m.failure == nil {
            // Saturated: a replayed time may be anything an Int64 holds.
            let (elapsed, overflow) = now.subtractingReportingOverflow(c.changedAt)
            since = " for " + relative(overflow ? (c.changedAt < 0 ? .max : 0) : max(0, elapsed))
        }
        return "\r\u{1b}[2K" + (m.settings.color ? mark + " " : "") + line + since
    }

    /// Every record has the same fields: while the backend fails, `state` is
    /// `unknown`, `backend` the configured one, `changed_at` null, no
    /// interfaces, and `error` the reason (null otherwise).
    func json(_ m: Indicator.Model) -> String? {
        if let f = m.failure {
            return "{\"state\":\"unknown\",\"online\":false,\"default_route\":null,\"backend\":\(quote(m.settings.connectivity.backend.rawValue)),\"changed_at\":null,\"interfaces\":[],\"error\":\(quote(f))}"
        }
        guard let c = m.latest else { return nil }
        let s = c.state
        let ifaces = s.interfaces.map {
            "{\"name\":\(quote($0.name)),\"state\":\(quote($0.state.rawValue)),\"addresses\":[\($0.addresses.map(quote).joined(separator: ","))]}"
        }
        let route = s.defaultRoute.map { $0 ? "true" : "false" } ?? "null"
        return "{\"state\":\(quote(s.state.rawValue)),\"online\":\(s.online),\"default_route\":\(route),\"backend\":\(quote(s.backend.rawValue)),\"changed_at\":\(quote(rfc3339(c.changedAt))),\"interfaces\":[\(ifaces.joined(separator: ","))],\"error\":null}"
    }

    func waybar(_ m: Indicator.Model) -> String? {
        if let f = m.failure {
            return "{\"text\":\"?\",\"tooltip\":\(quote("unknown: " + f)),\"class\":\"error\",\"alt\":\"unknown\"}"
        }
        guard let c = m.latest else { return nil }
        let s = c.state
        let name = s.primary?.name ?? s.backend.rawValue
        let cls = s.online ? "online" : (s.state >= .degraded ? "degraded" : "offline")
        let tooltip = ([s.online ? "online via \(name)" : "offline (\(s.state.rawValue))"]
            + s.interfaces.map { "\($0.name): " + ([$0.state.rawValue] + $0.addresses).joined(separator: " ") }).joined(separator: "\n")
        return "{\"text\":\(quote(s.online ? name : "offline")),\"tooltip\":\(quote(tooltip)),\"class\":\(quote(cls)),\"alt\":\(quote(s.state.rawValue))}"
    }
}

/// "45s", "3m", "2h 5m", "3d 4h".
public func relative(_ micros: Int64) -> String {
    let s = micros / 1_000_000
    if s < 60 { return "\(s)s" }
    if s < 3600 { return "\(s / 60)m" }
    if s < 86400 { return "\(s / 3600)h \(s % 3600 / 60)m" }
    return "\(s / 86400)d \(s % 86400 / 3600)h"
}

/// RFC 3339 in UTC with milliseconds: `2026-11-30T14:00:00.123Z` (total over `Int64`).
public func rfc3339(_ micros: Int64) -> String { Timestamp.rfc3339(micros: micros, fractionDigits: 3) }

/// A JSON string literal.
public func quote(_ s: String) -> String { JSONOutput.quoted(s) }
