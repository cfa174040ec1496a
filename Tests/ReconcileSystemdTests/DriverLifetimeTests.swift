import CSystemd
import Foundation
import Reconcile
@testable import ReconcileSystemd
import Testing

/// A timer and a file watch; counts what reaches `update`.
struct TimerAndWatch: Program {
    let path: String
    func start() -> (Int, [Never]) { (0, []) }
    func update(_ model: inout Int, _ message: Int) -> [Never] {
        model += 1
        return []
    }
    func subscriptions(_ model: Int) -> Subscriptions<Int> {
        Subscriptions {
            Subscription.every(.milliseconds(10), key: "t", leeway: .microseconds(1)) { _ in 1 }
            Subscription.watch(path) { _ in 2 }
        }
    }
}

/// A fixed set of subscriptions whose events are numbers (a child's pid,
/// 1 for any other event that counts, 0 for none); the model is the largest.
struct FixedSources: Program {
    let wanted: () -> Subscriptions<Int32>
    func start() -> (Int32, [Never]) { (0, []) }
    func update(_ model: inout Int32, _ message: Int32) -> [Never] {
        model = max(model, message)
        return []
    }
    func subscriptions(_ model: Int32) -> Subscriptions<Int32> { wanted() }
}

/// A started child's pid, else 0.
func startedPid(_ event: ProcessSource.Event) -> Int32 { if case .started(let pid) = event { pid } else { 0 } }

extension SystemdTests {
    /// What a driver leaves on its loop when the runtime does not shut down.
    @Suite struct DriverLifetime {
        @Test func aDriverDetachedWithoutShutdownStopsEverySourceItStillOwns() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let before = EventSourceAccounting.live
            let loop = try EventLoop()
            let capture = CapturingHandler()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .warning, handler: capture))
            let runtime = Runtime(TimerAndWatch(path: dir + "/f"), driver: driver)
            try runtime.start()
            #expect(driver.runningCount == 2)
            // The timer fires while attached.
            #expect(try loop.run(until: { runtime.model >= 2 }, timeout: .seconds(5)))

            driver.detach()
            #expect(driver.runningCount == 0)
            #expect(EventSourceAccounting.live == before)
            #expect(capture.all.contains { $0.level == .warning && $0.message.contains("stopped 2 source(s)") })
            // Nothing is armed: the timer is due every 10 ms and the file
            // changes, yet an iteration of 100 ms dispatches nothing.
            let seen = runtime.model
            try writeFile(dir + "/f", "x")
            #expect(try loop.runOnce(timeout: .milliseconds(100)) == false)
            #expect(runtime.model == seen)
            // A shutdown afterwards stops nothing twice.
            let report = runtime.shutdown()
            #expect(report.stopped.count == 2)
            #expect(EventSourceAccounting.live == before)
        }

        @Test func aRuntimeDroppedWithoutShutdownLeavesNothingArmedOnTheLoop() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let before = EventSourceAccounting.live
            let loop = try EventLoop()
            weak var gone: SystemdDriver?
            do {
                let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
                gone = driver
                let runtime = Runtime(TimerAndWatch(path: dir + "/f"), driver: driver)
                try runtime.start()
                #expect(try loop.run(until: { runtime.model >= 2 }, timeout: .seconds(5)))
                #expect(EventSourceAccounting.live > before)
            }
            // The runtime and its driver are gone, without a shutdown.
            #expect(gone == nil)
            #expect(EventSourceAccounting.live == before)
            try writeFile(dir + "/f", "x")
            #expect(try loop.runOnce(timeout: .milliseconds(100)) == false)
        }

        @Test func aSourceWhoseTicketGoesAwayIsStoppedWhileTheDriverLives() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            do {
                let runtime = Runtime(Timers(initial: .init(names: ["a", "b"], interval: .milliseconds(10))), driver: driver)
                try runtime.start()
                #expect(driver.runningCount == 2)
            }
            // The timers' tickets went with the runtime; the driver, kept
            // here, stopped their sources.
            #expect(driver.runningCount == 0)
            #expect(try loop.runOnce(timeout: .milliseconds(100)) == false)
        }

        /// A runtime that goes on after its driver detached (a host pumping
        /// its inbox itself) gets a failure for a new source, and nothing is
        /// armed on the loop that nobody would stop.
        @Test func aDetachedDriverStartsNothing() throws {
            let before = EventSourceAccounting.live
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            let runtime = Runtime(Timers(initial: .init(names: ["a"], interval: .milliseconds(10))), driver: driver)
            try runtime.start()
            #expect(driver.runningCount == 1)
            driver.detach()
            #expect(driver.runningCount == 0)
            try runtime.send(.set(["a", "b"]))
            runtime.pumpInbox()
            #expect(driver.runningCount == 0)
            #expect(EventSourceAccounting.live == before)
            #expect(try loop.runOnce(timeout: .milliseconds(100)) == false)
            withExtendedLifetime(runtime) {}
        }

        /// The same for a file watch (its runner once held its ticket
        /// strongly: a cycle that left the watch armed while the driver lived).
        @Test func aWatchWhoseTicketGoesAwayIsStoppedWhileTheDriverLives() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let before = EventSourceAccounting.live
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            do {
                let runtime = Runtime(TimerAndWatch(path: dir + "/f"), driver: driver)
                try runtime.start()
                #expect(driver.runningCount == 2)
                #expect(try loop.run(until: { runtime.model >= 1 }, timeout: .seconds(5)))
            }
            #expect(driver.runningCount == 0)
            // A change to the watched path wakes nothing.
            try writeFile(dir + "/f", "x")
            #expect(try loop.runOnce(timeout: .milliseconds(100)) == false)
            driver.detach()
            #expect(EventSourceAccounting.live == before)
        }

        /// The same while the watch's flush is armed (its start reported
        /// that the file exists, and no loop iteration ran yet): the flushes'
        /// guard holds its note weakly, so the runner still goes with its
        /// ticket and stops, and the loop runs no flush into the freed
        /// ticket (under AddressSanitizer, `make sanitize`, a use after free).
        @Test func aWatchWhoseTicketGoesAwayWithItsFlushArmedIsStopped() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            try writeFile(dir + "/f", "x")
            let before = EventSourceAccounting.live
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            do {
                let runtime = Runtime(FixedSources { Subscriptions { Subscription.watch(dir + "/f", reportExisting: true) { _ in 1 } } }, driver: driver)
                try runtime.start()
                #expect(driver.runningCount == 1)
                #expect(driver.flushGuard.count == 1)
                #expect(runtime.model == 0)
            }
            #expect(driver.runningCount == 0)
            // The note is over: the next iteration's check lets it go, and
            // nothing is dispatched (no flush, no event).
            #expect(try loop.runOnce(timeout: .milliseconds(100)) == false)
            #expect(driver.flushGuard.count == 0)
            try writeFile(dir + "/f", "y")
            #expect(try loop.runOnce(timeout: .milliseconds(100)) == false)
            driver.detach()
            #expect(EventSourceAccounting.live == before)
        }

        /// The same for descriptors, listeners and processes (their runners
        /// held their tickets strongly, a cycle through the ticket's driver
        /// state: dropped without a shutdown, the runtime left a listener
        /// accepting, a descriptor read and a child running while the driver
        /// lived).
        @Test func descriptorsListenersAndProcessesWhoseTicketsGoAwayAreStopped() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            var pair: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
            defer { close(pair[1]) }
            let path = dir + "/kept.sock"
            let before = EventSourceAccounting.live
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            var pid: Int32 = 0
            do {
                let runtime = Runtime(FixedSources { [listener = try listeningUnixSocket(path), descriptor = pair[0]] in
                    Subscriptions {
                        Subscription.lines(descriptor, owned: true) { _ in 0 }
                        Subscription.listen(listener, name: "kept", owned: true) { _ in 0 }
                        Subscription.process(["/bin/sleep", "30"], key: "sleeper") { startedPid($0) }
                    }
                }, driver: driver)
                try runtime.start()
                #expect(driver.runningCount == 3)
                #expect(try loop.run(until: { runtime.model > 0 }, timeout: .seconds(5)))
                pid = runtime.model
            }
            #expect(driver.runningCount == 0)
            // The child was told to end (SIGTERM) and is reaped on the loop:
            // then its pid names nothing (no zombie either).
            #expect(try loop.run(until: { kill(pid, 0) != 0 }, timeout: .seconds(5)))
            // The descriptor (owned) is closed: its peer reads the end (not
            // EAGAIN: the peer does not block).
            _ = fcntl(pair[1], F_SETFL, fcntl(pair[1], F_GETFL) | O_NONBLOCK)
            var byte: UInt8 = 0
            #expect(read(pair[1], &byte, 1) == 0)
            driver.detach()
            #expect(EventSourceAccounting.live == before)
        }

        /// The same for a source under a restart policy (its supervisor
        /// and its attempt held the subscription's ticket strongly).
        @Test func aRestartingSourceWhoseTicketGoesAwayIsStopped() throws {
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            var pid: Int32 = 0
            do {
                let runtime = Runtime(FixedSources {
                    Subscriptions { Subscription.process(["/bin/sleep", "30"], key: "sleeper", restart: .backoff(), restartOn: .always) { startedPid($0) } }
                }, driver: driver)
                try runtime.start()
                #expect(driver.runningCount == 2)    // the supervisor and its attempt
                #expect(try loop.run(until: { runtime.model > 0 }, timeout: .seconds(5)))
                pid = runtime.model
            }
            #expect(driver.runningCount == 0)
            #expect(try loop.run(until: { kill(pid, 0) != 0 }, timeout: .seconds(5)))
            driver.detach()
        }

        /// The same for connectivity (kernel backend, and with no restart
        /// policy: its reporter held the subscription's ticket strongly).
        @Test(arguments: [false, true])
        func aConnectivitySourceWhoseTicketGoesAwayIsStopped(restarting: Bool) throws {
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            do {
                let configuration = restarting ? ConnectivitySource.Configuration(backend: .kernel)
                    : ConnectivitySource.Configuration(backend: .kernel, restart: .never)
                let runtime = Runtime(FixedSources { Subscriptions { Subscription.connectivity(configuration, key: "c") { _ in 1 } } }, driver: driver)
                try runtime.start()
                #expect(driver.runningCount >= 1)
                #expect(try loop.run(until: { runtime.model > 0 }, timeout: .seconds(5)))
            }
            #expect(driver.runningCount == 0)
            driver.detach()
        }

        /// A stopped watch's runner is kept for the next watch with its
        /// flush source (off): started again it still reports changes, and
        /// the driver releases the kept source when it detaches.
        @Test func aDriverReleasesTheSourcesOfStoppedWatchesItKeptAtDetach() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let before = EventSourceAccounting.live
            let h = try Harness(SwitchedWatch(path: dir + "/f"))
            try h.runtime.send(.on(true))
            #expect(h.driver.runningCount == 1)
            try h.runtime.send(.on(false))
            #expect(h.driver.runningCount == 0)
            // Stopped: a change wakes nothing.
            try writeFile(dir + "/f", "x")
            #expect(try h.loop.runOnce(timeout: .milliseconds(100)) == false)
            #expect(h.runtime.model.changes == 0)
            // Started again on the kept runner: its flush source delivers.
            try h.runtime.send(.on(true))
            try writeFile(dir + "/f", "y")
            try h.run(until: { h.runtime.model.changes >= 1 })
            try h.runtime.send(.on(false))
            #expect(EventSourceAccounting.live > before)
            // The kept runner's source goes at detach, while the driver lives.
            _ = h.runtime.shutdown()
            #expect(EventSourceAccounting.live == before)
        }
    }
}

/// A file watch switched on and off by messages; counts its events.
struct SwitchedWatch: Program {
    struct Model { var on = false; var changes = 0 }
    enum Message: Sendable { case on(Bool), changed }
    let path: String
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .on(let on): model.on = on
        case .changed: model.changes += 1
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions { model.on ? Subscription.watch(path) { _ in .changed } : nil }
    }
}
