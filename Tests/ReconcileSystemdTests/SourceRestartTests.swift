import CSystemd
import Foundation
import Reconcile
@testable import ReconcileSystemd
import Testing

/// One process, listener or bus subscription with a restart policy,
/// recording each event with the time it arrived.
struct TimedRecorder<S: Source>: Program where S.Event: Sendable {
    struct Model { var events: [(S.Event, ContinuousClock.Instant)] = [] }
    enum Message { case event(S.Event) }
    let subscription: (@escaping (S.Event) -> Message) -> Subscription<Message>
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .event(let e): m.events.append((e, .now))
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> { Subscriptions { subscription { .event($0) } } }
}

/// Records bus events by key while `on`.
struct BusRestartWatcher: Program {
    struct Model { var events: [(String, String)] = [] }
    enum Message { case event(String, String) }
    let bus: BusAddress
    let fast: RestartPolicy
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .event(let key, let e): m.events.append((key, e))
        }
        return []
    }
    static func show(_ e: BusNameSource.Event) -> String {
        switch e {
        case .appeared: "appeared"
        case .vanished: "vanished"
        case .failed(let f): f.reason.contains("gave up") ? "gave up" : "failed"
        case .restarting(let n, let after): "restarting \(n) \(after)"
        }
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.busName(bus: bus, name: "org.example.Fast", restart: fast) { .event("fast", Self.show($0)) }
            Subscription.busName(bus: bus, name: "org.example.Never", restart: .never) { .event("never", Self.show($0)) }
            Subscription.busSignal(bus: bus, member: "Ping") { e in
                switch e {
                case .restarting(let n, let after): .event("signal", "restarting \(n) \(after)")
                case .failed: .event("signal", "failed")
                case .received: .event("signal", "received")
                }
            }
        }
    }
}

/// `count` bus names on one bus, each with the same restart policy.
struct ManyNames: Program {
    struct Model { var events: [BusNameSource.Event] = [] }
    enum Message { case event(BusNameSource.Event) }
    let bus: BusAddress
    let count: Int
    let restart: RestartPolicy
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .event(let e): m.events.append(e)
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions {
            for i in 0..<count { Subscription.busName(bus: bus, name: "org.example.N\(i)", restart: restart) { .event($0) } }
        }
    }
}

extension Child {
    /// The next line not starting with `prefix` (a retry's announcement).
    func line(skipping prefix: String, timeout: Duration = .seconds(10)) -> String? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            guard let l = line(timeout: deadline - ContinuousClock.now) else { return nil }
            if !l.hasPrefix(prefix) { return l }
        }
        return nil
    }
}

extension SystemdTests {
    @Suite struct SourceRestarts {
        typealias Recorder = TimedRecorder<ProcessSource>

        func processes(_ h: Harness<Recorder>) -> [ProcessSource.Event] { h.runtime.model.events.map(\.0) }

        @Test func aFailingChildIsRespawnedOnTheScheduleWithANewPidUntilTheCapAndLeavesNoZombie() throws {
            let backoff = Backoff(initial: .milliseconds(20), factor: 2, maximum: .milliseconds(100), jitter: 0.2, attempts: 4, window: .seconds(60))
            let fds = openDescriptors()
            do {
                let h = try Harness(Recorder { tag in
                    Subscription.process(["/bin/sh", "-c", "echo x; exit 3"], key: "p", restart: .backoff(backoff), tag)
                })
                try h.run(until: {
                    if case .failed(let f) = h.runtime.model.events.last?.0 { f.reason.contains("gave up") } else { false }
                }, timeout: .seconds(10))
                // After giving up the source stays stopped: no child, no event.
                let count = h.runtime.model.events.count
                try h.run(for: .milliseconds(300))
                #expect(h.runtime.model.events.count == count)
                #expect(childProcesses().isEmpty, "\(childProcesses())")
                let events = h.runtime.model.events
                // Five children: each started, printed x, exited 3; four restarts between them.
                var pids: [Int32] = []
                var i = 0
                for attempt in 1...5 {
                    guard i + 3 < events.count, case .started(let pid) = events[i].0, events[i + 1].0 == .output(.stdout, "x"),
                          events[i + 2].0 == .exited(status: 3) else {
                        Issue.record("attempt \(attempt) at \(i): \(events.map(\.0))")
                        return
                    }
                    pids.append(pid)
                    if attempt < 5 {
                        guard case .restarting(let n, let after) = events[i + 3].0 else {
                            Issue.record("no restart after attempt \(attempt): \(events.map(\.0))")
                            return
                        }
                        #expect(n == attempt && backoff.bounds(forAttempt: n).contains(after))
                        // The timer honoured the delay (the next child's start came after it).
                        #expect(events[i + 4].1 - events[i + 3].1 >= after - .milliseconds(1), "attempt \(n + 1) came early")
                        i += 4
                    } else {
                        i += 3
                    }
                }
                #expect(Set(pids).count == 5, "\(pids)")
                #expect(i == events.count - 1)
                for pid in pids { #expect(!FileManager.default.fileExists(atPath: "/proc/\(pid)")) }
            }
            // The harness is gone: the descriptors are those before it.
            #expect(openDescriptors().subtracting(fds).isEmpty, "\(openDescriptors().subtracting(fds))")
            #expect(childProcesses().isEmpty)
        }

        @Test func aChildThatAlwaysFailsIsRespawnedFewerThan20TimesIn60SecondsUnderTheDefaultCap() throws {
            // The default policy's cap (10 in 60 s) with short delays, so the cap, not the delays, ends it.
            guard case .backoff(var backoff) = RestartPolicy.backoff() else { return }
            backoff.initial = .milliseconds(1)
            backoff.maximum = .milliseconds(5)
            let h = try Harness(Recorder { tag in
                Subscription.process(["/bin/sh", "-c", "exit 1"], key: "p", restart: .backoff(backoff), tag)
            })
            let start = ContinuousClock.now
            try h.run(until: {
                if case .failed(let f) = h.runtime.model.events.last?.0 { f.reason.contains("gave up after 10 restarts within 1m") } else { false }
            }, timeout: .seconds(10))
            #expect(ContinuousClock.now - start < .seconds(5))
            try h.run(for: .milliseconds(500))
            let started = processes(h).filter { if case .started = $0 { true } else { false } }.count
            #expect(started == 11 && started < 20, "\(started) children")
            #expect(childProcesses().isEmpty)
        }

        @Test func aCleanExitRestartsOnlyUnderAlways() throws {
            // systemd's Restart=on-failure against Restart=always, on real children:
            // `exit 0` and a SIGTERM are clean ends, so .onFailure leaves them ended.
            let backoff = Backoff(initial: .milliseconds(5), factor: 1, maximum: .milliseconds(5), jitter: 0, attempts: 2, window: .seconds(60))
            for (command, condition, children) in [("exit 0", ProcessSource.RestartCondition.onFailure, 1),
                                                     ("kill -TERM $$", .onFailure, 1),
                                                     ("exit 0", .always, 3),
                                                     ("kill -TERM $$", .always, 3)] {
                let h = try Harness(Recorder { tag in
                    Subscription.process(["/bin/sh", "-c", command], key: "p", restart: .backoff(backoff), restartOn: condition, tag)
                })
                let ends = { processes(h).filter { switch $0 { case .exited, .killed: true; default: false } }.count }
                try h.run(until: { ends() >= children }, timeout: .seconds(10))
                // Long enough for a restart the policy would make (5 ms) to have shown.
                try h.run(for: .milliseconds(300))
                let started = processes(h).filter { if case .started = $0 { true } else { false } }.count
                #expect(started == children, "\(command) \(condition): \(processes(h))")
                #expect(ends() == children, "\(command) \(condition): \(processes(h))")
                #expect(childProcesses().isEmpty)
            }
        }

        @Test func aListenerWhoseAddressIsTakenRetriesAndAcceptsOnceItIsFree() throws {
            // The holder: a listening socket on an ephemeral loopback port.
            let holder = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let bound = withUnsafeMutablePointer(to: &addr) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(holder, $0, length) == 0 && getsockname(holder, $0, &length) == 0 }
            }
            try #require(bound && listen(holder, 4) == 0)
            let port = UInt16(bigEndian: addr.sin_port)
            var holderOpen = true
            defer { if holderOpen { close(holder) } }

            let policy = RestartPolicy.backoff(initial: .milliseconds(10), factor: 2, maximum: .milliseconds(50), jitter: 0, attempts: 1000)
            let h = try Harness(TimedRecorder<ListenerSource> { tag in
                Subscription.listen(address: "127.0.0.1:\(port)", name: "web", restart: policy, tag)
            })
            func restarts() -> [Duration] {
                h.runtime.model.events.compactMap { if case .restarting(_, let d) = $0.0 { d } else { nil } }
            }
            try h.run(until: { restarts().count >= 3 })
            let failures = h.runtime.model.events.compactMap { if case .failed(let f) = $0.0 { f } else { nil } }
            #expect(!failures.isEmpty && failures.allSatisfy { $0.code == EADDRINUSE }, "\(failures)")
            #expect(Array(restarts().prefix(3)) == [.milliseconds(10), .milliseconds(20), .milliseconds(40)])
            close(holder)
            holderOpen = false
            // Once bound again, it accepts: a client's connection is an event
            // (refused connects before that, each on a socket of its own).
            var clients: [Int32] = []
            defer { clients.forEach { close($0) } }
            var connected = false
            try h.run(until: {
                if !connected {
                    let c = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                    clients.append(c)
                    connected = withUnsafePointer(to: &addr) { p in
                        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(c, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
                    }
                }
                return h.runtime.model.events.contains { if case .accepted = $0.0 { true } else { false } }
            }, timeout: .seconds(5))
            #expect(connected)
        }

        @Test func theKernelBackendsResyncAnnouncesEachRetryAndUnderNeverRetriesNoMore() throws {
            final class Log {
                var tables = 0
                var events: [String] = []
            }
            let outcome = try inNewNetworkNamespace { () throws -> [String] in
                var seen: [String] = []
                for (policy, up) in [(RestartPolicy.backoff(Backoff(initial: .milliseconds(30), maximum: .seconds(1))), true), (.never, false)] {
                    let loop = try EventLoop()
                    let log = Log()
                    let watcher = try NetlinkWatcher(
                        receiveBuffer: nil, loop: loop, logger: DaemonLogger(level: .error, handler: .stderr), restart: policy,
                        onTable: { _ in log.tables += 1 }, onFailure: { log.events.append("failed \($0.code ?? 0)") },
                        onRestarting: { log.events.append("restarting \($0) \($1)") })
                    _ = try loop.run(until: { log.tables > 0 }, timeout: .seconds(5))
                    let tables = log.tables
                    // The read of the next notification (lo going up, then down) fails.
                    watcher.injectedReceiveErrors = [ENOMEM]
                    _ = try linkFlags("lo", settingUp: up)
                    _ = try loop.run(until: { log.events.count >= 2 && log.tables > tables }, timeout: .milliseconds(600))
                    seen.append("\(policy == .never ? "never" : "backoff"): \(log.events.joined(separator: ", ")); retries \(watcher.retries)")
                    watcher.stop()
                }
                return seen
            }
            #expect(outcome == ["backoff: failed \(ENOMEM), restarting 1 0.03 seconds; retries 1", "never: failed \(ENOMEM); retries 0"])
        }

        @Test func busSourcesSeeTheRestartingEventsWhenTheirDaemonIsKilledAndRestarted() throws {
            let bus = try PrivateBus()
            let fast = RestartPolicy.backoff(initial: .milliseconds(20), factor: 2, maximum: .milliseconds(80), jitter: 0, attempts: 1000)
            let h = try Harness(BusRestartWatcher(bus: bus.busAddress, fast: fast))
            func of(_ key: String) -> [String] { h.runtime.model.events.filter { $0.0 == key }.map(\.1) }
            try h.run(until: { of("fast") == ["vanished"] && of("never") == ["vanished"] })
            bus.kill()
            try h.run(until: { of("fast").count >= 5 }, timeout: .seconds(5))
            // One failure, then one restart per refused reconnect, after the
            // shortest delay any source on the connection asks for (the fast name's).
            #expect(Array(of("fast").prefix(5)) == ["vanished", "failed", "restarting 1 0.02 seconds", "restarting 2 0.04 seconds",
                                                    "restarting 3 0.08 seconds"])
            // The signal (default policy) counts its own attempts at the same, actual delays.
            #expect(Array(of("signal").prefix(3)) == ["failed", "restarting 1 0.02 seconds", "restarting 2 0.04 seconds"])
            // `.never`: one failure, and it stays failed.
            #expect(of("never") == ["vanished", "failed"])
            try bus.start()
            try h.run(until: { of("fast").last == "vanished" }, timeout: .seconds(5))
            try h.run(for: .milliseconds(200))
            #expect(of("never") == ["vanished", "failed"])
            #expect(!of("signal").contains("failed") || of("signal").filter { $0 == "failed" }.count == 1)
        }

        @Test func aRestartingListenersAcceptsOfOneDispatchAreOneBatchAndOneReconcile() throws {
            let directory = try makeTemporaryDirectory()
            defer { removeTree(directory) }
            let path = directory + "/sock"
            let policy = RestartPolicy.backoff(initial: .milliseconds(10), jitter: 0, attempts: 1000)
            let h = try Harness(TimedRecorder<ListenerSource> { tag in
                Subscription.listen(address: path, name: "web", restart: policy, tag)
            })
            try h.run(until: { access(path, F_OK) == 0 })
            // Eight clients queue in the backlog before the loop runs again:
            // one dispatch accepts them all, on the restart attempt's ticket.
            var clients: [Int32] = []
            defer { clients.forEach { close($0) } }
            for _ in 0..<8 {
                let c = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                var addr = sockaddr_un()
                addr.sun_family = sa_family_t(AF_UNIX)
                withUnsafeMutableBytes(of: &addr.sun_path) { b in
                    for (i, byte) in path.utf8.enumerated() { b[i] = byte }
                }
                let ok = withUnsafePointer(to: &addr) { p in
                    p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(c, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0 }
                }
                try #require(ok)
                clients.append(c)
            }
            let before = h.runtime.stats.reconciles
            func accepted() -> Int { h.runtime.model.events.filter { if case .accepted = $0.0 { true } else { false } }.count }
            try h.run(until: { accepted() == 8 && h.runtime.stats.reconciles > before })
            try h.run(for: .milliseconds(50))
            #expect(accepted() == 8)
            // One reconcile for the eight (one per accept before the attempt's ticket took batches).
            #expect(h.runtime.stats.reconciles - before == 1)
            #expect(!h.runtime.model.events.contains { if case .failed = $0.0 { true } else { false } })
        }

        @Test func oneReconnectAttemptOfFiftyBusSourcesOnOneConnectionIsOneReconcile() throws {
            let bus = try PrivateBus()
            let every = RestartPolicy.backoff(initial: .milliseconds(150), factor: 1, maximum: .milliseconds(150), jitter: 0, attempts: 1000)
            let h = try Harness(ManyNames(bus: bus.busAddress, count: 50, restart: every))
            func count(_ match: (BusNameSource.Event) -> Bool) -> Int { h.runtime.model.events.filter(match).count }
            func restarting(_ n: Int) -> Int { count { if case .restarting(n, _) = $0 { true } else { false } } }
            try h.run(until: { count { $0 == .vanished } == 50 })
            // Killed by its PID: each source fails once, then every refused
            // reconnect is one `.restarting` on each of the 50.
            bus.kill()
            try h.run(until: { restarting(1) == 50 })
            try h.run(for: .milliseconds(30))
            var reconciles: [Int] = []
            for attempt in 2...4 {
                let before = h.runtime.stats.reconciles
                try h.run(until: { restarting(attempt) == 50 && h.runtime.stats.reconciles > before })
                try h.run(for: .milliseconds(30))
                #expect(restarting(attempt + 1) == 0, "the settle overran the next attempt")
                reconciles.append(h.runtime.stats.reconciles - before)
            }
            #expect(reconciles == [1, 1, 1], "reconciles per reconnect attempt of 50 sources")
            #expect(count { if case .failed = $0 { true } else { false } } == 50)
            // Back: every name is followed again (no owner: `.vanished`).
            try bus.start()
            try h.run(until: { count { $0 == .vanished } == 100 }, timeout: .seconds(5))
        }
    }
}

extension SystemdTests {
    /// The core names Linux's signal numbers without Glibc (`LinuxSignal`):
    /// they are Glibc's.
    @Suite struct SignalNumbers {
        @Test func theCoresSignalNumbersAreGlibcs() {
            #expect(LinuxSignal.hangup == SIGHUP)
            #expect(LinuxSignal.interrupt == SIGINT)
            #expect(LinuxSignal.brokenPipe == SIGPIPE)
            #expect(LinuxSignal.terminate == SIGTERM)
            #expect(ProcessSource.cleanSignals == [SIGHUP, SIGINT, SIGPIPE, SIGTERM])
        }
    }
}
