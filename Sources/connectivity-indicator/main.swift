// connectivity-indicator: a live indicator of this machine's connectivity.
import Glibc
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
      --settle DURATION          report a state only after it held this long (2s, 500ms)
      --config FILE              key = value settings, watched and applied live
      --help, --version

    examples:
      connectivity-indicator
      connectivity-indicator --format json --exclude 'docker*' --exclude 'veth*'
      connectivity-indicator --once && echo online
      connectivity-indicator --format waybar --settle 2s

    SIGHUP re-reads the config file. Docs: Docs/ConnectivityIndicator.md
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

struct Options {
    var settings = Settings()
    var format = OutputFormat.text
    var config: String?
    var once = false
}

func parseArguments(_ args: [String]) -> Options {
    var o = Options()
    var i = 0
    func value(_ option: String) -> String {
        i += 1
        guard i < args.count else { fail("\(option) needs a value (see --help)") }
        return args[i]
    }
    while i < args.count {
        let a = args[i]
        switch a {
        case "--help", "-h": out(help + "\n"); exit(0)
        case "--version": out("connectivity-indicator \(version)\n"); exit(0)
        case "--once": o.once = true
        case "--format":
            let v = value(a)
            guard let f = OutputFormat(rawValue: v) else { fail("bad value '\(v)' for --format (accepted: text, json, waybar)") }
            o.format = f
        case "--backend":
            let v = value(a)
            guard let b = ConnectivitySource.Backend(rawValue: v) else { fail("bad value '\(v)' for --backend (accepted: auto, kernel, networkd)") }
            o.settings.connectivity.backend = b
        case "--include": o.settings.connectivity.include.append(value(a))
        case "--exclude": o.settings.connectivity.exclude.append(value(a))
        case "--settle":
            let v = value(a)
            guard let d = parseDuration(v) else { fail("bad value '\(v)' for --settle (accepted: a duration like 500ms, 2s, 1m, or 0)") }
            o.settings.connectivity.settle = d == .zero ? nil : d
        case "--config":
            let v = value(a)
            guard v.hasPrefix("/") || !v.isEmpty else { fail("bad value '' for --config (accepted: a file path)") }
            o.config = v.hasPrefix("/") ? v : currentDirectory() + "/" + v
        default:
            fail("unknown option '\(a)' (accepted: --format, --once, --backend, --include, --exclude, --settle, --config, --help, --version)")
        }
        i += 1
    }
    return o
}

func currentDirectory() -> String {
    var buffer = [CChar](repeating: 0, count: 4096)
    guard getcwd(&buffer, buffer.count) != nil else { return "." }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

func readFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var data: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = read(fd, &chunk, chunk.count)
        if n < 0 { return nil }
        if n == 0 { break }
        data += chunk[..<n]
        if data.count > 1 << 20 { return nil }
    }
    return String(decoding: data, as: UTF8.self)
}

func nowMicros() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}

// Block the signals first, before anything could start a thread.
do { try Signals.block() } catch { fail("cannot block signals: \(error)") }

let options = parseArguments(Array(CommandLine.arguments.dropFirst()))
let terminal = isatty(1) == 1 && options.format == .text
let renderer = Renderer(format: options.format, terminal: terminal)
let program = Indicator(base: options.settings, format: options.format, configPath: options.config, once: options.once)

var daemonOptions = Daemon<Indicator>.Options()
daemonOptions.logger = Logger(level: .notice)
do {
    let daemon = try Daemon(program, options: daemonOptions) { command, daemon in
        switch command {
        case .readConfig(let path):
            // The read may block (a FIFO, a slow mount): off the loop; the
            // result comes back as a message, never refused for capacity.
            daemon.tasks.run(id: "config", placement: .offload) { .configRead(path: path, contents: readFile(path)) }
        case .log(let text):
            daemon.logger.notice(text)
        case .exit(let code):
            daemon.stop(exitCode: code)
        }
    }
    var last: String?
    daemon.didCommit = { model in
        guard let line = renderer.render(model, now: nowMicros()), line != last else { return }
        last = line
        out(terminal ? line : line + "\n")
    }
    let code = try daemon.run()
    if terminal { out("\n") }
    exit(code)
} catch {
    var bytes = Array("connectivity-indicator: \(error)\n".utf8)
    _ = write(2, &bytes, bytes.count)
    exit(1)
}
