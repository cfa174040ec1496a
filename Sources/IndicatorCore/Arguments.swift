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
    /// `--bus system|user|ADDRESS`: serve the state on this bus (`ConnectivityService`).
    public var bus: BusAddress?

    public init() {}

    /// The options that take a value; `--option value` or `--option=value`.
    public static let valued = ["--format", "--backend", "--include", "--exclude", "--settle", "--config", "--record", "--replay", "--bus"]
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
            return fail("unknown option '\(args[i])' (accepted: --format, --once, --backend, --include, --exclude, --settle, --config, --record, --replay, --bus, --help, --version)")
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
