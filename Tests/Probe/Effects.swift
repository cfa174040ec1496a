import Glibc
import Reconcile
import ReconcileSystemd

/// `maintask`: the README-style `Task {}` in a main.swift perform closure.
struct MainTaskProgram: Program {
    enum Message { case go }
    enum Command { case spawn }
    func start() -> (Int, [Command]) { (0, [.spawn]) }
    func update(_ model: inout Int, _ message: Message) -> [Command] { [] }
}

/// `tasks N STUBBORN GRACE_MS`: N tasks sleeping an hour on the loop's clock
/// (they end when cancelled) and STUBBORN tasks that ignore cancellation.
struct TasksProgram: Program {
    enum Message: Sendable { case started, shuttingDown, ended(Int, cancelled: Bool) }
    enum Command { case start, say(String) }
    func start() -> (Int, [Command]) { (0, [.start]) }
    func update(_ model: inout Int, _ message: Message) -> [Command] {
        switch message {
        case .started: return [.say("started")]
        case .shuttingDown: return [.say("shutdown began")]
        case .ended(let i, let cancelled):
            model += 1
            return [.say("ended \(i) cancelled=\(cancelled)")]
        }
    }
}

func runTasksProbe(tasks: Int, stubborn: Int, grace: Duration, spinning: Int = 0) -> Int32 {
    do {
        var options = Daemon<TasksProgram>.Options()
        options.logger = DaemonLogger(level: .info, handler: LogSink { say("log: \($0.message)") })
        options.shutdownGrace = grace
        options.shutdownMessage = .shuttingDown
        let daemon = try Daemon(TasksProgram(), options: options) { command, daemon in
            switch command {
            case .say(let line): say(line)
            case .start:
                let clock = daemon.clock
                for i in 0..<tasks {
                    daemon.tasks.run(id: i) {
                        try await clock.sleep(for: .seconds(3600))
                        return .ended(i, cancelled: false)
                    } failure: { error in
                        .ended(i, cancelled: error is CancellationError)
                    }
                }
                for j in 0..<stubborn {
                    daemon.tasks.run(id: "stubborn \(j)") {
                        // Never resumes, whatever cancellation says.
                        await withUnsafeContinuation { (_: UnsafeContinuation<Void, Never>) in }
                        return .ended(-1, cancelled: false)
                    }
                }
                for k in 0..<spinning {
                    daemon.tasks.run(id: "spinning \(k)") {
                        // Retries its sleep for ever, cancelled or not.
                        while true { try? await clock.sleep(for: .seconds(3600)) }
                    }
                }
                daemon.tasks.run(id: "hello") { .started }
            }
        }
        say("running")
        let code = try daemon.run()
        say("exit \(code) tasks: \(daemon.taskReport)")
        return code
    } catch {
        say("error \(error)")
        return 3
    }
}
