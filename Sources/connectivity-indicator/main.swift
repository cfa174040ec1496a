// connectivity-indicator: a live indicator of this machine's connectivity.
import Glibc
import Synchronization
import IndicatorCore
import Reconcile
import ReconcileSystemd

let version = "0.1.0"

let help = """
    connectivity-indicator — a live indicator of this machine's connectivity

    usage: connectivity-indicator [options]

      --format text|json|waybar  output (default text: one line redrawn on a
                                 terminal, one line per change otherwise)
      --once                     print the current state and exit: 0 online, 1 not
      --backend auto|kernel|networkd
                                 where the state comes from (default auto)
      --include GLOB             only these interfaces (repeatable)
      --exclude GLOB             not these interfaces (repeatable)
      --settle DURATION          report a state only after it held this long (2s, 500ms;
                                 at most 24h)
      --config FILE              key = value settings, watched and applied live
                                 (a regular file of at most 1 MiB)
      --logind auto|on|off       pause while logind says the machine prepares for
                                 sleep, then print one fresh report (default auto:
                                 when a system bus is there at start)
      --record FILE              record the session's transcript to FILE (mode 0600)
      --replay FILE              print what a recorded session printed, from its
                                 transcript (no netlink, no bus); exit 3 when FILE
                                 is not a transcript of this program, 4 when the
                                 program now decides differently
      --bus system|user|ADDRESS  serve the state on a bus: owns
                                 org.reconcile.Connectivity1, properties State,
                                 Online, Interfaces (with change signals), method
                                 Refresh()
      --help, --version

    A value that starts with '-' is given as --option=value.

    examples:
      connectivity-indicator
      connectivity-indicator --format json --exclude 'docker*' --exclude 'veth*'
      connectivity-indicator --once && echo online
      connectivity-indicator --format waybar --settle 2s

    SIGHUP re-reads the config file. While logind (on the system bus) says the
    machine is preparing for sleep, nothing is printed; on resume one fresh
    report is. Docs: Docs/ConnectivityIndicator.md
    """

func fail(_ message: String) -> Never {
    var bytes = Array("connectivity-indicator: \(message)\n".utf8)
    _ = write(2, &bytes, bytes.count)
    exit(2)
}

func out(_ text: String) {
    var bytes = Array(text.utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeMutableBytes { write(1, $0.baseAddress, $0.count) }
        if n <= 0 { return }
        offset += n
    }
}

func currentDirectory() -> String {
    var buffer = [CChar](repeating: 0, count: 4096)
    guard getcwd(&buffer, buffer.count) != nil else { return "." }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

// Arguments first (no thread is started before the signals are blocked).
let options: Arguments
switch parseArguments(Array(CommandLine.arguments.dropFirst()), directory: currentDirectory()) {
case .failure(let e): fail(e.message)
case .success(let a) where a.action == .help: out(help + "\n"); exit(0)
case .success(let a) where a.action == .version: out("connectivity-indicator \(version)\n"); exit(0)
case .success(let a): options = a
}
// A replay has no loop to take signals: SIGTERM and SIGINT stop it.
if let path = options.replay { replaySession(path) }

// Block the signals for the loop, before anything could start a thread.
do { try Signals.block() } catch { fail("cannot block signals: \(error)") }
let terminal = isatty(1) == 1 && options.format == .text
let renderer = Renderer(format: options.format, terminal: terminal)
/// `--logind auto` decided once, at start: a system bus whose socket is not
/// there is not waited for (no warning on every start without one).
let followsLogind: Bool
switch options.logind {
case .on: followsLogind = true
case .off: followsLogind = false
case .auto:
    var st = stat()
    followsLogind = systemBusSocket(address: getenv("DBUS_SYSTEM_BUS_ADDRESS").map { String(cString: $0) })
        .map { stat($0, &st) == 0 && st.st_mode & S_IFMT == S_IFSOCK } ?? true
}
let program = Indicator(base: options.settings, format: options.format, configPath: options.config, once: options.once,
                        followsLogind: followsLogind)

var daemonOptions = Daemon<Indicator>.Options()
/// The line last printed, so a log line on the terminal can clear it first
/// and draw it again after (the status line is redrawn in place, without a
/// newline; a log line written after it would be glued to it).
let drawn = Mutex<String?>(nil)

/// On a terminal, stderr log lines start on a line of their own and the
/// status line is drawn again below them.
struct TerminalAware: LogHandling {
    func handle(_ record: LogRecord) {
        guard terminal else { return LogSink.stderr.handle(record) }
        let line = drawn.withLock { $0 }
        if line != nil { out("\r\u{1B}[2K") }
        LogSink.stderr.handle(record)
        if let line { out(line) }
    }
}

// `--once` is a command whose answer is its output and exit code: only a
// warning or worse goes to stderr (no shutdown report on every run).
daemonOptions.logger = DaemonLogger(level: options.once ? .warning : .notice,
                                    handler: LogSink.stderrIsJournal() ? LogSink.journal : TerminalAware())
// SIGHUP (`systemctl reload` with `ExecReload=kill -HUP $MAINPID`) is a
// reload: RELOADING=1, the config read again, READY=1 once it was applied.
daemonOptions.reloadMessage = .reload
// A read already under way when SIGHUP came is followed by another one
// (the file may have changed after it began): READY=1 waits for both.
daemonOptions.reloadDone = { !$0.configReading }
if let path = options.record {
    daemonOptions.recordPath = path
    daemonOptions.recordArguments = recordedArguments(Array(CommandLine.arguments.dropFirst()), options, followsLogind: followsLogind)
}
do {
    let daemon = try Daemon(program, options: daemonOptions) { command, daemon in
        switch command {
        case .readConfig(let path):
            // Off the loop thread (a path on a hung network mount blocks in
            // `stat` or `read`); the answer comes back through the task
            // lane, never refused for capacity. The program asks for one
            // read at a time.
            let started = daemon.tasks.run(id: "config", placement: .offload) {
                // Only a regular file, opened non-blocking, at most
                // `Settings.maximumConfigSize` bytes (BoundedFile).
                switch BoundedFile.readText(path, limit: Settings.maximumConfigSize) {
                case .success(let text): .configRead(path: path, contents: text)
                case .failure(let e): .configUnreadable(path: path, reason: e.reason)
                }
            }
            // During a reload READY=1 waits for it (and `reloadDone`).
            if daemon.isReloading { daemon.readyWaits(for: "config") }
            // Refused only once shutdown has begun.
            if !started { daemon.logger.notice("config \(path) not read: shutting down") }
        case .log(let text):
            daemon.logger.notice(text)
        case .exit(let code):
            daemon.stop(exitCode: code)
        }
    }
    var output = ViewOutput(renderer)
    daemon.didCommit = { model in
        guard let line = output.next(model, now: wallClockMicroseconds()) else { return }
        if terminal { drawn.withLock { $0 = line } }
        out(terminal ? line : line + "\n")
    }
    let service = try options.bus.map { try serveOnBus($0, daemon) }
    let code = try daemon.run()
    service?.shutdown()
    if terminal { out("\n") }
    exit(code)
} catch {
    var bytes = Array("connectivity-indicator: \(error)\n".utf8)
    _ = write(2, &bytes, bytes.count)
    exit(1)
}
