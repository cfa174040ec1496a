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

/// Every probe program's commands: print a line; stop the daemon.
enum Say { case say(String), stop(Int32) }

/// Stops the daemon from its start command (before the first reconcile ends).
struct StopAtStartProgram: Program {
    enum Message { case never }
    typealias Command = Say
    func start() -> (Int, [Command]) { (0, [.say("stopping"), .stop(3)]) }
    func update(_ model: inout Int, _ message: Message) -> [Command] { [] }
    func subscriptions(_ model: Int) -> Subscriptions<Message> { Subscriptions([]) }
}

/// Subscribes to SIGHUP and SIGUSR1; its status counts SIGHUPs.
struct SignalProgram: Program {
    struct Model: Equatable { var hups = 0; var log: [String] = [] }
    enum Message { case signal(SignalSource.Event) }
    typealias Command = Say
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
    typealias Command = Say
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

/// Follows connectivity and prints each change on one line. With several
/// granularities, SIGUSR1 retunes the subscription to the next one in place;
/// SIGUSR2 prints the runtime's start/stop/retune counts.
struct ConnectivityProgram: Program {
    let configuration: ConnectivitySource.Configuration
    var granularities: [ConnectivitySource.Granularity] = []
    /// Drop the watch on a failure whose reason contains this.
    var dropOn: String?
    struct Model: Equatable { var events = 0; var granularity = 0; var dropped = false }
    enum Message { case connectivity(ConnectivitySource.Event), signal(SignalSource.Event) }
    typealias Command = Say
    func start() -> (Model, [Command]) { (Model(), []) }
    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .connectivity(.changed(let c)):
            model.events += 1
            let s = c.state
            let ifaces = s.interfaces.map { "\($0.name):\($0.state.rawValue):\($0.addresses.count)" }.joined(separator: ",")
            let addrs = s.interfaces.flatMap(\.addresses).joined(separator: ",")
            let route = s.defaultRoute.map { "\($0)" } ?? "?"
            return [.say("state=\(s.state.rawValue) online=\(s.online) default=\(route) backend=\(s.backend.rawValue) ifaces=\(ifaces) addrs=\(addrs)")]
        case .connectivity(.failed(let f)):
            model.events += 1
            if let dropOn, f.reason.contains(dropOn) {
                model.dropped = true
                return [.say("failed \(f.reason)"), .say("dropped the watch")]
            }
            return [.say("failed \(f.reason)")]
        case .connectivity(.restarting):
            // Not printed: the connectivity tests read the states and failures line by line.
            return []
        case .signal(.received(.user1, _)):
            model.granularity = min(model.granularity + 1, max(0, granularities.count - 1))
            return [.say("granularity \(granularity(model).rawValue)")]
        case .signal(.received(.user2, _)):
            return [.say("stats")]
        case .signal:
            return []
        }
    }
    func granularity(_ model: Model) -> ConnectivitySource.Granularity {
        granularities.isEmpty ? configuration.granularity : granularities[model.granularity]
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        var c = configuration
        c.granularity = granularity(model)
        return Subscriptions {
            if !model.dropped { Subscription.connectivity(c, key: "net") { .connectivity($0) } }
            Subscription.signal(.user1) { .signal($0) }
            Subscription.signal(.user2) { .signal($0) }
        }
    }
}

func runDaemon<P: Program>(_ program: P, logToStdout: Bool = false) -> Int32 where P.Command == Say {
    do {
        var options = Daemon<P>.Options()
        options.logger = DaemonLogger(level: .info, handler: logToStdout ? LogSink { say("log: \($0.message)") } : .stderr)
        let daemon = try Daemon(program, options: options) { command, daemon in
            switch command {
            case .say("stats"):
                let s = daemon.runtime.stats
                say("stats starts=\(s.starts) stops=\(s.stops) retunes=\(s.retunes) restarts=\(s.restarts)")
            case .say(let line): say(line)
            case .stop(let code): daemon.stop(exitCode: code)
            }
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
case "stop-at-start":
    exit(runDaemon(StopAtStartProgram()))
case "watch" where args.count > 2:
    exit(runDaemon(WatchProgram(path: args[2])))
case "connectivity":
    var c = ConnectivitySource.Configuration()
    var granularities: [ConnectivitySource.Granularity] = []
    var dropOn: String?
    var i = 2
    while i + 1 < args.count {
        switch args[i] {
        case "--backend": c.backend = ConnectivitySource.Backend(rawValue: args[i + 1]) ?? .auto
        case "--include": c.include.append(args[i + 1])
        case "--exclude": c.exclude.append(args[i + 1])
        case "--rcvbuf": c.receiveBuffer = Int(args[i + 1])
        case "--settle": c.settle = .milliseconds(Int(args[i + 1]) ?? 0)
        case "--drop-on": dropOn = args[i + 1]
        case "--granularity":
            granularities = args[i + 1].split(separator: ",").compactMap { ConnectivitySource.Granularity(rawValue: String($0)) }
        default: break
        }
        i += 2
    }
    exit(runDaemon(ConnectivityProgram(configuration: c, granularities: granularities, dropOn: dropOn), logToStdout: true))
case "maintask":
    // README-style: a `Task {}` in the perform closure of top-level code.
    // The closure is main-actor isolated; the loop holds the main thread and
    // drains the main actor's queue, so the task runs and resumes there.
    var mainTaskOptions = Daemon<MainTaskProgram>.Options()
    mainTaskOptions.drainsMainQueue = !args.contains("nodrain")   // nodrain: show the hang it fixes
    let daemon = try Daemon(MainTaskProgram(), options: mainTaskOptions) { command, daemon in
        switch command {
        case .spawn:
            Task {
                say("task ran loop=\(daemon.loop.isOnLoopThread)")
                try? await Task.sleep(for: .milliseconds(20))
                say("resumed loop=\(daemon.loop.isOnLoopThread)")
                daemon.stop(exitCode: 7)
            }
        }
    }
    say("running")
    exit(try daemon.run())
case "tasks" where args.count > 4:
    exit(runTasksProbe(tasks: Int(args[2]) ?? 0, stubborn: Int(args[3]) ?? 0,
                       grace: args[4] == "max" ? .seconds(Int64.max) : .milliseconds(Int(args[4]) ?? 0),
                       spinning: args.count > 5 ? Int(args[5]) ?? 0 : 0))
case "stress-send" where args.count > 4:
    exit(stressSend(threads: Int(args[2]) ?? 8, messages: Int(args[3]) ?? 20_000, capacity: Int(args[4]) ?? 64))
case "stress-churn" where args.count > 2:
    exit(stressChurn(seconds: Int(args[2]) ?? 60))
case "forge" where args.count > 2:
    exit(forgeNetlink(to: UInt32(args[2]) ?? 0))
case "lifecycle":
    exit(runLifecycleProbe(args.dropFirst(2)))
case "fdstore" where args.count > 4:
    exit(runFDStoreProbe(name: args[2], path: args[3], mode: args[4]))
case "fdstore-cycle" where args.count > 2:
    exit(runFDStoreCycleProbe(path: args[2]))
case "credential" where args.count > 2:
    exit(runCredentialProbe(name: args[2]))
case "loop-fd-limit":
    // Out of descriptors when the loop's executor needs its eventfd: a
    // thrown SystemdError (no trap), for an owned and a borrowed loop.
    exit(loopAtDescriptorLimit())
default:
    say("usage: reconcile-probe daemon | stop-at-start | watch PATH | connectivity [--backend B] [--include G] [--exclude G] [--rcvbuf N] [--settle MS] [--granularity G,G...] [--drop-on TEXT] | forge PORT | maintask [nodrain] | tasks N STUBBORN GRACE_MS|max [SPINNING] | stress-send THREADS MESSAGES CAPACITY | stress-churn SECONDS | loop-fd-limit | lifecycle quick|slow MS|fail|long|stubborn MS|unit PATH MS [--reload-ms MS] [--extend-ms MS] [--grace MS] [--max-extend-ms MS] [--start-timeout-ms MS] | fdstore NAME PATH exit|serve|remove | fdstore-cycle PATH | credential NAME")
    exit(2)
}

/// Lowers the soft descriptor limit so that exactly `spare` more descriptors
/// can be opened; returns the old limit.
func limitDescriptors(spare: Int) -> rlimit {
    var old = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &old)
    let lowest = dup(0)
    close(lowest)
    var tight = old
    tight.rlim_cur = rlim_t(Int(lowest) + spare)
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &tight)
    return old
}

func loopAtDescriptorLimit() -> Int32 {
    // sd_event_new takes the one spare descriptor; the executor's eventfd fails.
    var old = limitDescriptors(spare: 1)
    do {
        _ = try EventLoop()
        say("owned: created")
    } catch {
        say("owned: \(error)")
    }
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &old)
    guard let owner = try? EventLoop() else { say("no loop"); return 1 }
    old = limitDescriptors(spare: 0)
    do {
        _ = try EventLoop(borrowing: owner.handle)
        say("borrowed: created")
    } catch {
        say("borrowed: \(error)")
    }
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &old)
    // With descriptors again, both work.
    let ok = (try? EventLoop()) != nil && (try? EventLoop(borrowing: owner.handle)) != nil
    say(ok ? "recovered" : "still failing")
    return 0
}
