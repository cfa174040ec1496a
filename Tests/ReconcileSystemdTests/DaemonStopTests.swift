import Reconcile
import ReconcileSystemd
import Testing

/// Asks to stop from its command interpreter and notes what `update` saw.
struct StopsFromACommand: Program {
    enum Message { case go, after, shuttingDown }
    enum Command { case quit, more }
    func start() -> (Model, [Command]) { (Model(), [.more]) }
    struct Model: Equatable { var seen: [String] = [] }
    func update(_ m: inout Model, _ message: Message) -> [Command] {
        m.seen.append("\(message)")
        return message == .go ? [.quit] : []
    }
}

extension SystemdTests {
    @Suite struct DaemonStop {
        @Test func stopFromACommandDeliversQueuedMessagesAndTheShutdownMessageFirst() throws {
            var options = Daemon<StopsFromACommand>.Options()
            options.shutdownSignals = []
            options.notify = false
            options.shutdownMessage = .shuttingDown
            let d = try Daemon(StopsFromACommand(), options: options) { command, daemon in
                switch command {
                case .more:
                    do { try daemon.runtime.send(.go) } catch { Issue.record("send: \(error)") }
                case .quit:
                    daemon.stop(exitCode: 3)
                    // Queued after the stop was asked for, before it runs.
                    do { try daemon.runtime.send(.after) } catch { Issue.record("send: \(error)") }
                }
            }
            #expect(try d.run() == 3)
            #expect(d.runtime.model.seen == ["go", "shuttingDown", "after"])
        }
    }
}
