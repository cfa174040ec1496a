import Reconcile

/// What the command line asks for.
public struct Arguments: Equatable, Sendable {
    public enum Action: Equatable, Sendable { case run, help, version }

    public var action = Action.run
    public var settings = Settings()
    public var format = OutputFormat.text
    /// The config file, absolute.
    public var config: String?
    public var once = false
    /// `--record FILE`: record the session's transcript to this path.
    public var record: String?
    /// `--replay FILE`: print what the recorded session printed, then exit.
    public var replay: String?
    /// `--logind`: whether logind's PrepareForSleep pauses the indicator.
    public var logind = LogindPolicy.auto

    /// Whether the indicator follows logind's `PrepareForSleep` on the system bus.
    public enum LogindPolicy: String, Equatable, Sendable {
        /// When a system bus is there at start (its socket exists); a
        /// replay of a transcript that does not say takes this as `off`.
        case auto
        /// Always: a system bus that comes later is followed once it is
        /// there (each failed attempt to reach it is logged).
        case on
        /// Never.
        case off
    }
    /// `--bus system|user|ADDRESS`: serve the state on this bus (`ConnectivityService`).
    public var bus: BusAddress?

    public init() {}

    /// The options that take a value; `--option value` or `--option=value`.
    public static let valued = ["--format", "--backend", "--include", "--exclude", "--settle", "--config", "--record", "--replay", "--logind", "--bus"]
    /// The options without a value.
    public static let flags = ["--once", "--help", "-h", "--version"]
}

/// A command-line mistake: one line for standard error; the command exits 2.
public struct UsageError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}

/// Parses the indicator's command line (without the program name). A
/// relative `--config` path is made absolute against `directory`.
///
/// An option is never taken as another option's value: `--config --once`
/// is an error (`--config needs a value`). A value that starts with `-` is
/// given as `--option=value`.
public func parseArguments(_ args: [String], directory: String) -> Result<Arguments, UsageError> {
    var o = Arguments()
    var i = 0
    func fail(_ message: String) -> Result<Arguments, UsageError> { .failure(UsageError(message: message)) }
    while i < args.count {
        var option = args[i]
        var inline: String?
        if option.hasPrefix("--"), let eq = option.firstIndex(of: "=") {
            inline = String(option[option.index(after: eq)...])
            option = String(option[..<eq])
        }
        if Arguments.flags.contains(option) {
            if inline != nil { return fail("\(option) takes no value (see --help)") }
            switch option {
            case "--once": o.once = true
            case "--version": o.action = .version; return .success(o)
            default: o.action = .help; return .success(o)
            }
            i += 1
            continue
        }
        guard Arguments.valued.contains(option) else {
            return fail("unknown option '\(args[i])' (accepted: --format, --once, --backend, --include, --exclude, --settle, --config, --record, --replay, --logind, --bus, --help, --version)")
        }
        let v: String
        if let inline {
            v = inline
        } else {
            i += 1
            // The next word is the value unless it is itself an option.
            guard i < args.count, !args[i].hasPrefix("-") || args[i] == "-" else {
                return fail("\(option) needs a value (see --help)")
            }
            v = args[i]
        }
        if v.isEmpty { return fail("\(option) needs a value (see --help)") }
        switch option {
        case "--format":
            guard let f = OutputFormat(rawValue: v) else { return fail("bad value '\(v)' for --format (accepted: text, json, waybar)") }
            o.format = f
        case "--backend":
            guard let b = ConnectivitySource.Backend(rawValue: v) else { return fail("bad value '\(v)' for --backend (accepted: auto, kernel, networkd)") }
            o.settings.connectivity.backend = b
        case "--include": o.settings.connectivity.include.append(v)
        case "--exclude": o.settings.connectivity.exclude.append(v)
        case "--settle":
            guard let d = parseDuration(v) else {
                return fail("bad value '\(v)' for --settle (accepted: a duration from 0 to \(Settings.maximumSettle.short) like 500ms, 2s, 1m)")
            }
            o.settings.connectivity.settle = d == .zero ? nil : d
        case "--logind":
            guard let p = Arguments.LogindPolicy(rawValue: v) else { return fail("bad value '\(v)' for --logind (accepted: auto, on, off)") }
            o.logind = p
        case "--record": o.record = v
        case "--replay": o.replay = v
        case "--bus":
            switch v {
            case "system": o.bus = .system
            case "user": o.bus = .user
            default:
                guard v.contains(":") else { return fail("bad value '\(v)' for --bus (accepted: system, user, or a D-Bus address like unix:path=/run/x/bus)") }
                o.bus = .address(v)
            }
        default:   // --config
            o.config = v.hasPrefix("/") ? v : directory + "/" + v
        }
        i += 1
    }
    return .success(o)
}

/// The socket path to look for to tell whether the system bus is there, from
/// `DBUS_SYSTEM_BUS_ADDRESS` (`value`, nil when unset) as sd-bus reads it: the
/// first `unix:path=` of the address, or the standard socket when the
/// variable is unset. Nil when the address is of another kind (abstract,
/// TCP): it cannot be checked by a path, and is taken to be there.
public func systemBusSocket(address value: String?) -> String? {
    guard let value else { return "/run/dbus/system_bus_socket" }
    let first = value.split(separator: ";", maxSplits: 1).first.map(String.init) ?? value
    guard first.hasPrefix("unix:") else { return nil }
    for part in first.dropFirst(5).split(separator: ",") where part.hasPrefix("path=") {
        return unescapedBusAddressValue(String(part.dropFirst(5)))
    }
    return nil
}

/// A D-Bus address value with its `%xx` escapes decoded (invalid escapes kept as written).
func unescapedBusAddressValue(_ v: String) -> String {
    var bytes: [UInt8] = []
    let u = Array(v.utf8)
    var i = 0
    func hex(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): b - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): b - UInt8(ascii: "A") + 10
        default: nil
        }
    }
    while i < u.count {
        if u[i] == UInt8(ascii: "%"), i + 2 < u.count, let h = hex(u[i + 1]), let l = hex(u[i + 2]) {
            bytes.append(h << 4 | l)
            i += 3
        } else {
            bytes.append(u[i])
            i += 1
        }
    }
    return String(decoding: bytes, as: UTF8.self)
}
