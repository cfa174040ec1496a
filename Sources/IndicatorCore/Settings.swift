import Reconcile

/// How the indicator prints.
public enum OutputFormat: String, Sendable, CaseIterable {
    case text, json, waybar
}

/// Everything the indicator can be configured with (command line and file).
public struct Settings: Equatable, Sendable {
    /// Where connectivity comes from and what counts.
    public var connectivity = ConnectivitySource.Configuration()
    /// Text view: show for how long the state has held ("for 3m").
    public var showSince = true
    /// Text view on a terminal: colour the mark.
    public var color = true

    public init() {}

    /// The keys a config file may set.
    public static let keys = ["backend", "include", "exclude", "settle", "show_since", "color"]

    /// The longest settle time accepted (`--settle`, `settle =`): one day.
    /// Longer is a mistake (`3000000h`), reported as one.
    public static let maximumSettle: Duration = .seconds(86_400)

    /// The largest config file read: 1 MiB. A larger one is not read (it is
    /// reported), so a huge file cannot stall the loop.
    public static let maximumConfigSize = 1 << 20
}

/// A config file error: which line and why.
public struct ConfigError: Error, Equatable, Sendable, CustomStringConvertible {
    public var line: Int
    public var message: String
    public var description: String { "line \(line): \(message)" }
}

/// Parses the `key = value` config format on top of `base`.
///
///     # comments and blank lines are ignored
///     backend = auto            # auto | kernel | networkd
///     include = eth*, wl*       # globs, comma separated
///     exclude = docker*, veth*
///     settle = 2s               # a duration: 500ms, 2s, 1m (at most 24h); 0 for none
///     show_since = yes          # yes | no
///     color = yes               # yes | no
public func parseConfig(_ text: String, base: Settings) -> Result<Settings, ConfigError> {
    var s = base
    for (n, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
        let line = n + 1
        let content = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
        let trimmed = content.trimmed
        if trimmed.isEmpty { continue }
        guard let eq = trimmed.firstIndex(of: "=") else {
            return .failure(ConfigError(line: line, message: "expected 'key = value', got '\(trimmed)'"))
        }
        let key = String(trimmed[..<eq]).trimmed
        let value = String(trimmed[trimmed.index(after: eq)...]).trimmed
        switch key {
        case "backend":
            guard let b = ConnectivitySource.Backend(rawValue: value) else {
                return .failure(ConfigError(line: line, message: "bad backend '\(value)' (accepted: auto, kernel, networkd)"))
            }
            s.connectivity.backend = b
        case "include", "exclude":
            let globs = value.split(separator: ",").map { String($0).trimmed }.filter { !$0.isEmpty }
            if key == "include" { s.connectivity.include = globs } else { s.connectivity.exclude = globs }
        case "settle":
            guard let d = parseDuration(value) else {
                return .failure(ConfigError(line: line, message: "bad settle '\(value)' (a duration from 0 to \(Settings.maximumSettle.short): 500ms, 2s, 1m, or 0)"))
            }
            s.connectivity.settle = d == .zero ? nil : d
        case "show_since", "color":
            guard let b = parseBool(value) else {
                return .failure(ConfigError(line: line, message: "bad \(key) '\(value)' (accepted: yes, no)"))
            }
            if key == "color" { s.color = b } else { s.showSince = b }
        default:
            return .failure(ConfigError(line: line, message: "unknown key '\(key)' (accepted: \(Settings.keys.joined(separator: ", ")))"))
        }
    }
    return .success(s)
}

/// `500ms`, `2s`, `1.5s`, `1m`, `1h`, `0` (rounded to whole microseconds);
/// nil for anything else, a negative number or more than `maximum`.
public func parseDuration(_ text: String, maximum: Duration = Settings.maximumSettle) -> Duration? {
    let t = text.trimmed
    if t == "0" { return .zero }
    let units: [(String, Double)] = [("ms", 1e-3), ("s", 1), ("m", 60), ("h", 3600)]
    for (suffix, scale) in units where t.hasSuffix(suffix) {
        let number = t.dropLast(suffix.count)
        guard let v = Double(number), v >= 0, v.isFinite else { return nil }
        // Bounded before converting: the microseconds fit in Int64.
        let us = (v * scale * 1_000_000).rounded()
        guard us <= Double(maximum.saturatingMicroseconds), us < 0x1p63 else { return nil }
        return .microseconds(Int64(us))
    }
    return nil
}

func parseBool(_ text: String) -> Bool? {
    switch text.lowercased() {
    case "yes", "true", "on", "1": true
    case "no", "false", "off", "0": false
    default: nil
    }
}

extension String {
    var trimmed: String {
        var s = Substring(self)
        while let c = s.first, c == " " || c == "\t" || c == "\r" { s.removeFirst() }
        while let c = s.last, c == " " || c == "\t" || c == "\r" { s.removeLast() }
        return String(s)
    }
}
