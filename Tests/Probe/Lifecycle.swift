import Glibc
import Reconcile
import ReconcileSystemd

/// The service-manager protocol (issue 21): reload, slow start, failed
/// start, long grace, the fd store, credentials.
struct LifecycleProgram: Program {
    /// What the start does.
    enum Start { case quick, slow(Duration), fail, longTask, stubborn(Duration) }
    let begin: Start
    let reloadWork: Duration

    struct Model: Equatable { var reloads = 0, reloaded = 0, started = false }
    enum Message: Sendable { case reload, reloadDone, startDone, stopping, ended }
    enum Command { case work(String, Duration), fail, longTask, stubborn(Duration), say(String) }

    func start() -> (Model, [Command]) {
        switch begin {
        case .quick: (Model(started: true), [])
        case .slow(let d): (Model(), [.work("start", d)])
        case .fail: (Model(), [.fail])
        case .longTask: (Model(started: true), [.longTask])
        case .stubborn(let d): (Model(started: true), [.stubborn(d)])
        }
    }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .reload:
            model.reloads += 1
            return [.say("reload \(model.reloads)"), .work("reload", reloadWork)]
        case .reloadDone:
            model.reloaded += 1
            return [.say("reload task done")]
        case .startDone:
            model.started = true
            return [.say("start task done")]
        case .stopping: return [.say("stopping")]
        case .ended: return [.say("long task ended")]
        }
    }

    func status(_ model: Model) -> String? {
        model.started ? "reloads \(model.reloads) done \(model.reloaded)" : "starting"
    }
}

/// `lifecycle quick|slow MS|fail|long|stubborn MS|unit PATH MS [--reload-ms MS]
/// [--extend-ms MS] [--grace MS] [--max-extend-ms MS] [--start-timeout-ms MS]`.
func runLifecycleProbe(_ args: ArraySlice<String>) -> Int32 {
    var args = args
    var begin = LifecycleProgram.Start.quick
    switch args.popFirst() {
    case "slow": begin = .slow(.milliseconds(Int(args.popFirst() ?? "") ?? 0))
    case "fail": begin = .fail
    case "long": begin = .longTask
    case "stubborn": begin = .stubborn(.milliseconds(Int(args.popFirst() ?? "") ?? 0))
    case "unit":
        // Under systemd (scripts/systemd-namespace-test.sh): the socket
        // from the fd store or bound and stored, then `stubborn`.
        let path = args.popFirst() ?? "/run/life.sock"
        do {
            let (socket, passed, stored) = try FileDescriptorStore.socket(named: "web", orBind: path)
            var st = stat()
            fstat(socket.fd, &st)
            say("pid \(getpid()) socket passed=\(passed) stored=\(stored) inode=\(st.st_ino)")
        } catch {
            say("socket error \(error)")
        }
        begin = .stubborn(.milliseconds(Int(args.popFirst() ?? "") ?? 0))
    default: break
    }
    var reloadWork = Duration.milliseconds(300)
    var options = Daemon<LifecycleProgram>.Options()
    options.logger = DaemonLogger(level: .info, handler: LogSink { say("log: \($0.message)") })
    options.reloadMessage = .reload
    options.shutdownMessage = .stopping
    while let flag = args.popFirst(), let value = args.popFirst().flatMap({ Int($0) }) {
        switch flag {
        case "--reload-ms": reloadWork = .milliseconds(value)
        case "--extend-ms": options.timeoutExtensionInterval = .milliseconds(value)
        case "--grace": options.shutdownGrace = .milliseconds(value)
        case "--max-extend-ms": options.maximumStartExtension = .milliseconds(value)
        case "--start-timeout-ms": options.startTimeout = .milliseconds(value)
        default: break
        }
    }
    do {
        let daemon = try Daemon(LifecycleProgram(begin: begin, reloadWork: reloadWork), options: options) { command, daemon in
            switch command {
            case .say(let line): say(line)
            case .work(let id, let d):
                let clock = daemon.clock
                daemon.tasks.run(id: id) {
                    try? await clock.sleep(for: d)
                    return id == "start" ? .startDone : .reloadDone
                }
                say("\(id) waits: \(daemon.readyWaits(for: id))")
            case .fail:
                daemon.fail("config missing: /nonexistent/probe.conf", errno: ENOENT, exitCode: 4)
            case .stubborn(let d):
                // Runs until cancelled, then keeps going for `d` (a long shutdown).
                daemon.tasks.run(id: "stubborn", placement: .offload) {
                    while !Task.isCancelled { usleep(10_000) }
                    say("stubborn task cancelled: \(d) more")
                    usleep(UInt32(clamping: d.components.seconds * 1_000_000 + d.components.attoseconds / 1_000_000_000_000))
                    return .ended
                }
            case .longTask:
                // Ignores cancellation for a while: the grace is spent.
                daemon.tasks.run(id: "long", placement: .offload) {
                    usleep(1_500_000)
                    return .ended
                }
            }
        }
        say("running")
        let code = try daemon.run()
        say("exit \(code) tasks: \(daemon.taskReport) live=\(EventSourceAccounting.live)")
        return code
    } catch {
        say("error \(error)")
        return 3
    }
}

/// `fdstore NAME PATH exit|serve|remove`: the socket NAME from the fd
/// store, or bound to PATH and stored. `exit`: stop at once; `serve`: answer
/// one connection with `hello <pid>`, then stop; `remove`: remove it from
/// the store (`FDSTOREREMOVE=1`), then stop.
struct FDStoreProgram: Program {
    let fd: Int32
    let name: String
    let serve: Bool
    enum Message { case listener(ListenerSource.Event) }
    enum Command { case stop, answer(Int32) }
    func start() -> (Int, [Command]) { (0, serve ? [] : [.stop]) }
    func update(_ model: inout Int, _ message: Message) -> [Command] {
        if case .listener(.accepted(let c)) = message { return [.answer(c.fd), .stop] }
        return []
    }
    func subscriptions(_ model: Int) -> Subscriptions<Message> {
        Subscriptions { if serve { Subscription.listen(fd, name: name) { .listener($0) } } }
    }
}

func runFDStoreProbe(name: String, path: String, mode: String) -> Int32 {
    let serve = mode == "serve"
    do {
        var options = Daemon<FDStoreProgram>.Options()
        options.logger = DaemonLogger(level: .info, handler: LogSink { say("log: \($0.message)") })
        // The socket first (it needs no loop), then the daemon around it.
        let (socket, passed, stored) = try FileDescriptorStore.socket(named: name, orBind: path)
        var st = stat()
        fstat(socket.fd, &st)
        say("socket passed=\(passed) stored=\(stored) inode=\(st.st_ino) fd=\(socket.fd)")
        if mode == "remove" {
            try FileDescriptorStore.remove(named: name)
            say("removed \(name)")
        }
        let daemon = try Daemon(FDStoreProgram(fd: socket.fd, name: name, serve: serve), options: options) { command, daemon in
            switch command {
            case .stop: daemon.stop(exitCode: 0)
            case .answer(let fd):
                var bytes = Array("hello \(getpid())\n".utf8)
                _ = write(fd, &bytes, bytes.count)
            }
        }
        let code = try daemon.run()
        say("exit \(code)")
        return code
    } catch {
        say("error \(error)")
        return 3
    }
}

/// `credential NAME`: reads the credential and prints it (or why not).
func runCredentialProbe(name: String) -> Int32 {
    switch Credentials.read(name, limit: 4096) {
    case .success(let text): say("credential \(name)=\(text)")
    case .failure(let e): say("credential \(name) unreadable: \(e)")
    }
    return 0
}

/// Runs until SIGTERM; its status is fixed.
struct IdleProgram: Program {
    enum Message { case never }
    func start() -> (Int, [Never]) { (0, []) }
    func update(_ model: inout Int, _ message: Message) -> [Never] { [] }
    func status(_ model: Int) -> String? { "idle" }
}

/// `fdstore-cycle PATH`, under systemd (scripts/systemd-namespace-test.sh):
/// says which descriptors came back; stores `web` and `keep` (sockets at
/// PATH.web, PATH.keep) when they did not, removes `web` when it did; then
/// runs until SIGTERM. Restarted twice: `web` comes back once, `keep` twice.
func runFDStoreCycleProbe(path: String) -> Int32 {
    let passed = SocketActivation.adopted().map(\.name).sorted()
    say("pid \(getpid()) passed=[\(passed.joined(separator: ","))]")
    do {
        if passed.contains("web") {
            try FileDescriptorStore.remove(named: "web")
            say("pid \(getpid()) removed web")
        } else {
            _ = try FileDescriptorStore.socket(named: "web", orBind: path + ".web")
            say("pid \(getpid()) stored web")
        }
        if !passed.contains("keep") {
            _ = try FileDescriptorStore.socket(named: "keep", orBind: path + ".keep")
            say("pid \(getpid()) stored keep")
        }
        var options = Daemon<IdleProgram>.Options()
        options.logger = DaemonLogger(level: .info, handler: LogSink { say("log: \($0.message)") })
        let daemon = try Daemon(IdleProgram(), options: options)
        let code = try daemon.run()
        say("pid \(getpid()) exit \(code)")
        return code
    } catch {
        say("error \(error)")
        return 3
    }
}
