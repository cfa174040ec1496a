import CSystemd
import Glibc
import Reconcile

/// Syslog priorities, as journald and `<N>` stderr prefixes use them.
public enum LogLevel: Int32, Comparable, Sendable, CaseIterable {
    /// 0: the system is unusable.
    case emergency = 0
    /// 1: act now.
    case alert
    /// 2: critical conditions.
    case critical
    /// 3: errors (a driver bug, a dropped event).
    case error
    /// 4: warnings (source failures, duplicates).
    case warning
    /// 5: normal but significant (shutdown, config problems).
    case notice
    /// 6: informational (the default level: lifecycle lines such as the watchdog's period).
    case info
    /// 7: debug (one line per reconcile that changed something, each plan step, late deliveries).
    case debug

    /// Whether `a` is more severe than `b` (a lower priority number).
    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }
}

/// One log line with structured fields (`SUBSCRIPTION=`, `OUTCOME=` ...).
public struct LogRecord: Sendable, Equatable {
    /// The record's priority.
    public var level: LogLevel
    /// The human line (journald's `MESSAGE=`).
    public var message: String
    /// Field names are upper case letters, digits and `_`.
    public var fields: [String: String]

    /// A record at `level` saying `message`, with journal `fields`.
    public init(level: LogLevel, message: String, fields: [String: String] = [:]) {
        self.level = level
        self.message = message
        self.fields = fields
    }
}

/// Where log records go: implement it to forward records to your own sink
/// or to filter them, and set it as `DaemonLogger.handler`.
///
/// ```swift
/// struct FailuresOnly: LogHandling {
///     var next: any LogHandling = .journal
///     func handle(_ record: LogRecord) {
///         if record.level <= .warning { next.handle(record) }
///     }
/// }
/// ```
///
/// `handle` is called on the thread that logs (the loop thread, for
/// everything the runtime and driver log); it must not block.
public protocol LogHandling: Sendable {
    /// Takes one record that passed the logger's level.
    func handle(_ record: LogRecord)
}

extension LogHandling where Self == LogSink {
    /// journald (`LogSink.journal`).
    public static var journal: LogSink { LogSink.journal }
    /// Standard error (`LogSink.stderr`).
    public static var stderr: LogSink { LogSink.stderr }
    /// journald when standard error is the journal, else standard error.
    public static var automatic: LogSink { LogSink.automatic }
}

/// The built-in handlers (journald, standard error), or a closure.
public struct LogSink: LogHandling {
    let write: @Sendable (LogRecord) -> Void

    /// A handler that calls `write` for every record (the host's own sink).
    public init(_ write: @escaping @Sendable (LogRecord) -> Void) { self.write = write }

    /// Calls the handler's closure.
    public func handle(_ record: LogRecord) { write(record) }

    /// journald, with the record's fields as journal fields.
    /// The corresponding C function is `sd_journal_sendv`.
    public static let journal = LogSink { record in
        var entries = ["MESSAGE=\(record.message)", "PRIORITY=\(record.level.rawValue)"]
        for (k, v) in record.fields.sorted(by: { $0.key < $1.key }) { entries.append("\(sanitize(k))=\(v)") }
        sendJournal(entries)
    }

    /// Standard error: one line per record with a `<N>` priority prefix (which
    /// journald understands when it reads the stream), or a plain level name
    /// on a terminal.
    public static let stderr = LogSink { record in
        let line: String
        if isatty(2) == 1 {
            line = "\(record.level): \(record.message)\n"
        } else {
            line = "<\(record.level.rawValue)>\(record.message)\n"
        }
        var bytes = Array(line.utf8)
        _ = Glibc.write(2, &bytes, bytes.count)
    }

    /// journald when standard error is connected to the journal
    /// (`JOURNAL_STREAM` names it), else `stderr`.
    public static var automatic: LogSink { stderrIsJournal() ? .journal : .stderr }

    /// Whether fd 2 is the stream `JOURNAL_STREAM` names (`device:inode`).
    public static func stderrIsJournal() -> Bool {
        guard let value = getenv("JOURNAL_STREAM").map({ String(cString: $0) }) else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let dev = UInt64(parts[0]), let ino = UInt64(parts[1]) else { return false }
        var st = stat()
        guard fstat(2, &st) == 0 else { return false }
        return UInt64(st.st_dev) == dev && UInt64(st.st_ino) == ino
    }
}

private func sanitize(_ key: String) -> String {
    let mapped = key.uppercased().map { c -> Character in (c.isLetter && c.isASCII) || c.isNumber || c == "_" ? c : "_" }
    let s = String(mapped).drop { $0 == "_" || $0.isNumber }
    return s.isEmpty ? "FIELD" : String(s)
}

private func sendJournal(_ entries: [String]) {
    var storage = entries.map { Array($0.utf8) }
    var iovecs: [iovec] = []
    iovecs.reserveCapacity(storage.count)
    for i in storage.indices {
        storage[i].withUnsafeMutableBytes { b in
            iovecs.append(iovec(iov_base: b.baseAddress, iov_len: b.count))
        }
    }
    // The pointers stay valid: `storage` is not touched until the call returns.
    withExtendedLifetime(storage) {
        _ = sd_journal_sendv(&iovecs, Int32(iovecs.count))
    }
}

/// A small logging facade: a minimum level and a handler.
public struct DaemonLogger: Sendable {
    /// Records below this level are dropped.
    public var level: LogLevel
    /// Where records go.
    public var handler: any LogHandling

    /// A logger at `level` writing to `handler` (journald or stderr by default).
    public init(level: LogLevel = .info, handler: any LogHandling = LogSink.automatic) {
        self.level = level
        self.handler = handler
    }

    /// Logs `message` with `fields` at `level`.
    public func log(_ level: LogLevel, _ message: @autoclosure () -> String, _ fields: @autoclosure () -> [String: String] = [:]) {
        guard level <= self.level else { return }
        handler.handle(LogRecord(level: level, message: message(), fields: fields()))
    }

    /// Whether a record at `level` would be written.
    public func isEnabled(_ level: LogLevel) -> Bool { level <= self.level }

    /// Logs at `.debug`.
    public func debug(_ m: @autoclosure () -> String, _ f: @autoclosure () -> [String: String] = [:]) { log(.debug, m(), f()) }
    /// Logs at `.info`.
    public func info(_ m: @autoclosure () -> String, _ f: @autoclosure () -> [String: String] = [:]) { log(.info, m(), f()) }
    /// Logs at `.notice`.
    public func notice(_ m: @autoclosure () -> String, _ f: @autoclosure () -> [String: String] = [:]) { log(.notice, m(), f()) }
    /// Logs at `.warning`.
    public func warning(_ m: @autoclosure () -> String, _ f: @autoclosure () -> [String: String] = [:]) { log(.warning, m(), f()) }
    /// Logs at `.error`.
    public func error(_ m: @autoclosure () -> String, _ f: @autoclosure () -> [String: String] = [:]) { log(.error, m(), f()) }
}

extension DaemonLogger {
    /// Logs what one reconcile did, at debug (a daemon at the default level
    /// `.info` writes nothing per reconcile): one line with the counts by
    /// outcome when it asked the driver for something (fields `STARTED=`,
    /// `RETUNED=`, `RESTARTED=`, `STOPPED=`, `KEPT=`), then each step once
    /// (`SUBSCRIPTION=`, `OUTCOME=`). `Daemon` calls this from
    /// `Runtime.didReconcile`; a host running its own `Runtime` on a
    /// `SystemdDriver` can do the same (`runtime.didReconcile = logger.logReconcile`).
    public func logReconcile(_ plan: Plan) {
        guard !plan.isEmpty, isEnabled(.debug) else { return }
        var started = 0, retuned = 0, restarted = 0, stopped = 0
        for step in plan.steps {
            switch step {
            case .start: started += 1
            case .retune: retuned += 1
            case .restart: restarted += 1
            case .stop: stopped += 1
            }
        }
        let counts = [("started", started), ("retuned", retuned), ("restarted", restarted), ("stopped", stopped), ("kept", plan.kept)]
        debug("reconcile: " + counts.filter { $0.1 > 0 || $0.0 == "kept" }.map { "\($0.1) \($0.0)" }.joined(separator: ", "),
              Dictionary(uniqueKeysWithValues: counts.map { ($0.0.uppercased(), "\($0.1)") }))
        for step in plan.steps {
            debug(step.description, ["SUBSCRIPTION": "\(step.id)", "OUTCOME": step.outcome])
        }
    }
}
