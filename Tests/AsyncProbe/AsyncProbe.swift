// reconcile-async-probe: a daemon from an `async` main (issue 21, item 5),
// run by the ReconcileSystemd tests as a child process. One line per event
// on stdout.
//
//   main        try await daemon.run() first thing (the loop on the main thread)
//   late        the same after another await: DaemonError.notOnLoopThread
//   service     DaemonService in a task; stdin "cancel" cancels the task,
//               "trigger" calls triggerGracefulShutdown(); SIGTERM works too
//   early       DaemonService made first thing, "created" said at once (a
//               test sends SIGTERM then, before the service runs), run, exit
//   failing     the same, then waits for a stdin line (the test's SIGTERM is
//               held meanwhile) and runs a service whose daemon cannot be made
//   dropped     the same, then releases the service without running it
import Glibc
import Reconcile
import ReconcileSystemd

func say(_ line: String) {
    var bytes = Array((line + "\n").utf8)
    _ = write(1, &bytes, bytes.count)
}

/// One task that sleeps until cancelled; its status says when it started.
struct SleeperProgram: Program {
    var sleeps = true
    struct Model: Equatable { var ended = 0 }
    enum Message: Sendable { case ended, stopping }
    enum Command { case sleep, say(String) }
    func start() -> (Model, [Command]) { (Model(), sleeps ? [.sleep] : []) }
    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .ended:
            model.ended += 1
            return [.say("task ended")]
        case .stopping: return [.say("shutdown message")]
        }
    }
    func status(_ model: Model) -> String? { "sleeping" }
}

func makeDaemon(sleeps: Bool = true) throws -> Daemon<SleeperProgram> {
    var options = Daemon<SleeperProgram>.Options()
    options.logger = DaemonLogger(level: .info, handler: LogSink { say("log: \($0.message)") })
    options.shutdownMessage = .stopping
    return try Daemon(SleeperProgram(sleeps: sleeps), options: options) { command, daemon in
        switch command {
        case .say(let line): say(line)
        case .sleep:
            let clock = daemon.clock
            daemon.tasks.run(id: "sleep") {
                try await clock.sleep(for: .seconds(3600))
                return .ended
            } failure: { _ in .ended }
        }
    }
}

/// A line from stdin, read on this thread.
func lineFromStdin() -> String {
    var bytes: [UInt8] = []
    var byte: UInt8 = 0
    while read(0, &byte, 1) == 1, byte != 10 { bytes.append(byte) }
    return String(decoding: bytes, as: UTF8.self)
}

/// A line from stdin, read off the cooperative pool.
func readLine() async -> String? {
    await withCheckedContinuation { (c: CheckedContinuation<String?, Never>) in
        var thread = pthread_t()
        let box = Unmanaged.passRetained(LineBox(c)).toOpaque()
        pthread_create(&thread, nil, { p in
            let box = Unmanaged<LineBox>.fromOpaque(p!).takeRetainedValue()
            var bytes: [UInt8] = []
            var byte: UInt8 = 0
            while read(0, &byte, 1) == 1, byte != 10 { bytes.append(byte) }
            box.c.resume(returning: bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self))
            return nil
        }, box)
        pthread_detach(thread)
    }
}

final class LineBox: Sendable {
    let c: CheckedContinuation<String?, Never>
    init(_ c: CheckedContinuation<String?, Never>) { self.c = c }
}

@main struct AsyncProbe {
    static func main() async {
        let mode = CommandLine.arguments.count > 1 ? CommandLine.arguments[1] : ""
        switch mode {
        case "main", "late":
            if CommandLine.arguments.contains("debug") { dumpThreads("start") }
            do {
                try Signals.block()
                if CommandLine.arguments.contains("debug") { dumpThreads("blocked") }
                let daemon = try makeDaemon()
                if CommandLine.arguments.contains("debug") { dumpThreads("made") }
                if mode == "late" { try await Task.sleep(for: .milliseconds(1)) }
                say("running")
                let code = try await daemon.run()
                say("exit \(code) tasks: \(daemon.taskReport)")
                exit(code)
            } catch {
                say("error \(error)")
                if CommandLine.arguments.contains("debug") { dumpThreads("error") }
                exit(3)
            }
        case "service":
            let service = DaemonService { try makeDaemon() }
            let task = Task { try await service.run() }
            say("running")
            Task {
                while let line = await readLine() {
                    say("stdin \(line)")
                    if line == "cancel" { task.cancel() }
                    if line == "trigger" { service.triggerGracefulShutdown() }
                }
            }
            do {
                let code = try await task.value
                say("exit \(code) \(service.shutdown.map(\.description) ?? "no report")")
                exit(code)
            } catch {
                say("error \(error)")
                exit(3)
            }
        case "early":
            // No notify socket, no task: as quick as a daemon can be. The
            // test's SIGTERM may come before the service's thread exists.
            let service = DaemonService { try makeDaemon(sleeps: false) }
            say("created")
            do {
                let code = try await service.run()
                say("exit \(code) \(service.shutdown.map(\.description) ?? "no report")")
                exit(code)
            } catch {
                say("error \(error)")
                exit(3)
            }
        case "failing":
            let service = DaemonService<SleeperProgram> { throw DaemonError.serviceAlreadyRan }
            say("created")
            say("got \(lineFromStdin())")
            do {
                _ = try await service.run()
                say("exit without error")
            } catch {
                say("error \(error)")
            }
            exit(3)
        case "dropped":
            // The mask systemd starts a service with (the test runner that
            // spawned us blocks its signals, and a child inherits that).
            var none = sigset_t()
            sigemptyset(&none)
            sigprocmask(SIG_SETMASK, &none, nil)
            withExtendedLifetime(DaemonService { try makeDaemon(sleeps: false) }) { _ in
                say("created")
                say("got \(lineFromStdin())")
            }
            say("released")
            exit(3)
        default:
            say("usage: reconcile-async-probe main | late | service | early | failing | dropped")
            exit(2)
        }
    }
}

/// Each thread's blocked-signal mask (`debug`): which thread would take a signal.
func dumpThreads(_ tag: String) {
    var link = [CChar](repeating: 0, count: 128)
    let n = readlink("/proc/thread-self", &link, 127)
    let me = n > 0 ? String(decoding: link[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
    var line = "\(tag): pid \(getpid()) self \(me):"
    guard let d = opendir("/proc/self/task") else { return say(line) }
    while let e = readdir(d) {
        let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        guard name.first?.isNumber == true, let f = fopen("/proc/self/task/\(name)/status", "r") else { continue }
        var buffer = [CChar](repeating: 0, count: 256)
        while fgets(&buffer, 256, f) != nil {
            let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if text.hasPrefix("SigBlk:") { line += " \(name)=\(text.dropFirst(7).filter { !$0.isWhitespace })" }
        }
        fclose(f)
    }
    closedir(d)
    say(line)
}
