// --record / --replay glue: the transcript's header keeps the command line,
// and a replay rebuilds the program and the renderer from it.
import Glibc
import IndicatorCore
import Reconcile
import ReconcileReplay

/// The command line to note in a transcript: without `--record`/`--replay`,
/// with the config path made absolute (it is part of a subscription's
/// identity), and with `--logind` as decided at start (`on` or `off`).
func recordedArguments(_ args: [String], _ options: Arguments, followsLogind: Bool) -> [String] {
    var out: [String] = []
    var i = 0
    while i < args.count {
        let a = args[i]
        let name = a.split(separator: "=", maxSplits: 1).first.map(String.init) ?? a
        switch name {
        case "--record", "--replay", "--logind":
            i += a.contains("=") ? 1 : 2
            continue
        case "--config":
            out.append("--config=" + (options.config ?? ""))
            i += a.contains("=") ? 1 : 2
            continue
        default: out.append(a)
        }
        i += 1
    }
    // What `--logind auto` decided at start, so that a replay decides the same.
    out.append("--logind=" + (followsLogind ? "on" : "off"))
    return out
}

/// Prints what the recorded session printed and exits: 0 when the replay
/// matched the recording, 3 when the file is not a usable transcript of this
/// program, 4 when the program now decides differently (the first
/// divergence goes to stderr).
func replaySession(_ path: String) -> Never {
    func stop(_ message: String, _ code: Int32) -> Never {
        var bytes = Array("connectivity-indicator: \(message)\n".utf8)
        _ = write(2, &bytes, bytes.count)
        exit(code)
    }
    // No loop takes signals here: they keep their default action (a mask
    // inherited from the parent is lifted), so SIGTERM stops a replay.
    var answered = sigset_t()
    sigemptyset(&answered)
    for s in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&answered, s) }
    pthread_sigmask(SIG_UNBLOCK, &answered, nil)
    let transcript: Transcript
    do { transcript = try Transcript(contentsOf: path) } catch { stop("\(error)", 3) }
    let name = String(reflecting: Indicator.self)
    guard transcript.program == name else {
        stop("\(TranscriptError.programMismatch(expected: name, found: transcript.program))", 3)
    }
    let o: Arguments
    switch parseArguments(transcript.arguments ?? [], directory: "/") {
    case .success(let a): o = a
    case .failure(let e): stop("the transcript's command line: \(e.message)", 3)
    }
    let terminal = isatty(1) == 1 && o.format == .text
    let renderer = Renderer(format: o.format, terminal: terminal)
    // A transcript recorded before logind was followed says nothing: off.
    let program = Indicator(base: o.settings, format: o.format, configPath: o.config, once: o.once,
                            followsLogind: o.logind == .on)
    let start = transcript.startedAtMicros
    var output = ViewOutput(renderer)
    do {
        let outcome = try Replay.run(program, transcript) { runtime, driver in
            runtime.didCommit = { model in
                let now = start.addingReportingOverflow(driver.now.saturatingMicroseconds)
                guard !now.overflow, let line = output.next(model, now: now.partialValue) else { return }
                out(terminal ? line : line + "\n")
            }
        }
        if terminal { out("\n") }
        if let d = outcome.divergence { stop("\(d)", 4) }
        exit(0)
    } catch {
        stop("\(error)", 3)
    }
}
