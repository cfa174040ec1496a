import Reconcile
import ReconcileSystemd
import Synchronization
import Testing

/// A log handler that keeps every record (a daemon's own sink).
final class CapturingHandler: LogHandling {
    private let records = Mutex<[LogRecord]>([])
    func handle(_ record: LogRecord) { records.withLock { $0.append(record) } }
    var all: [LogRecord] { records.withLock { $0 } }
}

/// A handler that forwards only what passes `keep`.
struct Filter: LogHandling {
    let next: any LogHandling
    let keep: @Sendable (LogRecord) -> Bool
    func handle(_ record: LogRecord) { if keep(record) { next.handle(record) } }
}

/// Ticks a repeating timer; at tick 1 it wants three one-shot timers, at
/// tick 2 it drops them, at tick 3 it changes nothing and quits.
struct Burst: Program {
    enum Command { case quit }
    func start() -> (Int, [Command]) { (0, []) }
    func update(_ m: inout Int, _ e: TimerSource.Event) -> [Command] {
        m += 1
        return m == 3 ? [.quit] : []
    }
    func subscriptions(_ m: Int) -> Subscriptions<TimerSource.Event> {
        Subscriptions {
            Subscription.every(.milliseconds(5), key: "t") { $0 }
            if m == 1 {
                for k in ["a", "b", "c"] { Subscription.after(.seconds(60), key: k) { $0 } }
            }
        }
    }
}

extension SystemdTests {
    @Suite struct Logging {
        func runBurst(level: LogLevel, handler: any LogHandling) throws -> Daemon<Burst> {
            var options = Daemon<Burst>.Options()
            options.shutdownSignals = []
            options.notify = false
            options.logger = DaemonLogger(level: level, handler: handler)
            let d = try Daemon(Burst(), options: options) { _, daemon in daemon.stop(exitCode: 0) }
            #expect(try d.run() == 0)
            #expect(d.runtime.model == 3)
            return d
        }

        @Test func oneDebugLinePerChangingReconcileAndEachStepOnce() throws {
            let capture = CapturingHandler()
            _ = try runBurst(level: .debug, handler: capture)
            let info = capture.all.filter { $0.level == .debug && $0.message.hasPrefix("reconcile: ") }
            // Three reconciles changed something (start t; start a, b, c;
            // stop a, b, c); the one at tick 3 changed nothing.
            #expect(info.map(\.message) == [
                "reconcile: 1 started, 0 kept", "reconcile: 3 started, 1 kept", "reconcile: 3 stopped, 1 kept",
            ])
            #expect(info[1].fields == ["STARTED": "3", "RETUNED": "0", "RESTARTED": "0", "STOPPED": "0", "KEPT": "1"])
            let steps = capture.all.filter { $0.level == .debug && $0.fields["OUTCOME"] != nil }
            #expect(steps.map(\.message) == [
                "start timer:t: every 5ms",
                "start timer:a: after 1m", "start timer:b: after 1m", "start timer:c: after 1m",
                "stop timer:a", "stop timer:b", "stop timer:c",
            ])
            #expect(steps.map { $0.fields["OUTCOME"] ?? "" } == ["start", "start", "start", "start", "stop", "stop", "stop"])
            #expect(steps.allSatisfy { $0.fields["SUBSCRIPTION"] == $0.message.split(separator: " ")[1].split(separator: ":").prefix(2).joined(separator: ":") })
        }

        @Test func atTheDefaultLevelNothingIsLoggedPerReconcile() throws {
            let capture = CapturingHandler()
            _ = try runBurst(level: DaemonLogger().level, handler: capture)
            #expect(capture.all.filter { $0.level == .debug }.isEmpty)
            #expect(capture.all.filter { $0.message.hasPrefix("reconcile") || $0.fields["OUTCOME"] != nil }.isEmpty)
            // Four messages, four reconciles: the only line is the shutdown's.
            #expect(capture.all.count <= 1, "\(capture.all.map(\.message))")
        }

        @Test func aHandlerCanFilterAndForward() throws {
            let capture = CapturingHandler()
            _ = try runBurst(level: .debug, handler: Filter(next: capture) { $0.fields["OUTCOME"] == "stop" })
            #expect(capture.all.map(\.message) == ["stop timer:a", "stop timer:b", "stop timer:c"])
        }
    }
}
