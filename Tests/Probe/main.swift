// reconcile-probe: a small daemon the ReconcileSystemd tests run as a child
// process, because signals, sd_notify, the watchdog and shutdown are
// process-wide. It prints one line per message on stdout.
import Glibc
import Reconcile
import ReconcileSystemd

func say(_ line: String) {
    var bytes = Array((line + "\n").utf8)
    _ = write(1, &bytes, bytes.count)
}

/// Subscribes to SIGHUP and SIGUSR1; its status counts SIGHUPs.
struct SignalProgram: Program {
    struct Model: Equatable { var hups = 0; var log: [String] = [] }
    enum Message { case signal(SignalSource.Event) }
    enum Command { case say(String) }
    func start() -> (Model, [Command]) { (Model(), []) }
    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .signal(.received(let s, let sender)):
            if s == .hangup { model.hups += 1 }
            return [.say("signal \(s) from \(sender)")]
        case .signal(.failed(let f)):
            return [.say("failed \(f)")]
        }
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.signal(.hangup) { .signal($0) }
            Subscription.signal(.user1) { .signal($0) }
        }
    }
    func status(_ model: Model) -> String? { "hups \(model.hups)" }
}

/// Watches one path and prints each event.
struct WatchProgram: Program {
    let path: String
    enum Message { case file(FileWatchSource.Event) }
    enum Command { case say(String) }
    func start() -> (Int, [Command]) { (0, []) }
    func update(_ model: inout Int, _ message: Message) -> [Command] {
        model += 1
        switch message {
        case .file(.failed(let f)): return [.say("failed \(f.code ?? 0) \(f.reason)")]
        case .file(let e): return [.say("file \(e)")]
        }
    }
    func subscriptions(_ model: Int) -> Subscriptions<Message> {
        Subscriptions { Subscription.watch(path) { .file($0) } }
    }
}

func runDaemon<P: Program>(_ program: P) -> Int32 where P.Command == SignalProgram.Command {
    do {
        var options = Daemon<P>.Options()
        options.logger = Logger(level: .info, handler: .stderr)
        let daemon = try Daemon(program, options: options) { command, _ in
            switch command { case .say(let s): say(s) }
        }
        say("running")
        let code = try daemon.run()
        say("exit \(code) stops=\(daemon.runtime.stats.stops) starts=\(daemon.runtime.stats.starts) live=\(EventSourceAccounting.live)")
        return code
    } catch {
        say("error \(error)")
        return 3
    }
}

let args = CommandLine.arguments
// Block the signals first, before anything could start a thread.
try Signals.block()
switch args.count > 1 ? args[1] : "" {
case "daemon":
    exit(runDaemon(SignalProgram()))
case "watch" where args.count > 2:
    do {
        var options = Daemon<WatchProgram>.Options()
        options.logger = Logger(level: .info, handler: .stderr)
        let daemon = try Daemon(WatchProgram(path: args[2]), options: options) { command, _ in
            switch command { case .say(let s): say(s) }
        }
        say("running")
        exit(try daemon.run())
    } catch {
        say("error \(error)")
        exit(3)
    }
default:
    say("usage: reconcile-probe daemon | watch PATH")
    exit(2)
}
