import Foundation
import Glibc
import Reconcile
import ReconcileSystemd
import Synchronization
import Testing

/// A python3 unix-socket server: sends `<tag>\n` to each client and keeps
/// the connection open until it is killed.
private let lineServer = """
import os, socket, sys
path, tag = sys.argv[1], sys.argv[2]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(8)
print("ready", flush=True)
keep = []
while True:
    c, _ = s.accept()
    c.sendall((tag + "\\n").encode())
    keep.append(c)
"""

/// The lines a unix stream socket at `path` sends: a connect that fails
/// throws, the peer's close ends the sequence. The reading runs on a thread
/// of its own; the end of iteration shuts the socket down.
func socketLines(_ path: String) -> AsyncThrowingStream<String, any Error> {
    AsyncThrowingStream { continuation in
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: Array(path.utf8).prefix($0.count - 1)) }
        let r = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard r == 0 else {
            let e = errno
            close(fd)
            continuation.finish(throwing: POSIXError(POSIXErrorCode(rawValue: e) ?? .EIO))
            return
        }
        let owner = SocketOwner(fd)
        continuation.onTermination = { _ in owner.shutdown() }
        Thread.detachNewThread {
            var pending = Data()
            var chunk = [UInt8](repeating: 0, count: 1024)
            while true {
                let n = read(fd, &chunk, chunk.count)
                if n <= 0 { break }
                pending.append(contentsOf: chunk[..<n])
                while let nl = pending.firstIndex(of: 10) {
                    continuation.yield(String(decoding: pending[..<nl], as: UTF8.self))
                    pending.removeSubrange(...nl)
                }
            }
            owner.close()
            continuation.finish()
        }
    }
}

/// A descriptor closed once, shut down only while open.
private final class SocketOwner: Sendable {
    private let fd: Mutex<Int32>
    init(_ fd: Int32) { self.fd = Mutex(fd) }
    func shutdown() { fd.withLock { if $0 >= 0 { _ = Glibc.shutdown($0, Int32(SHUT_RDWR)) } } }
    func close() { fd.withLock { if $0 >= 0 { _ = Glibc.close($0); $0 = -1 } } }
}

/// One stream subscription, recording its events and when they came.
struct StreamRecorder<Element: Sendable>: Program {
    struct Model { var events: [(StreamSource<Element>.Event, ContinuousClock.Instant)] = [] }
    enum Message { case event(StreamSource<Element>.Event) }
    let restart: RestartPolicy
    let overflow: StreamSource<Element>.Overflow
    let make: @Sendable () -> AnyAsyncSequenceBox<Element>
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .event(let e): m.events.append((e, .now))
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions { Subscription.stream(key: "s", restart: restart, overflow: overflow, make) { .event($0) } }
    }
}

/// Any throwing sequence of `Element`, boxed (the recorder's factories differ).
struct AnyAsyncSequenceBox<Element: Sendable>: AsyncSequence, Sendable {
    let base: AsyncThrowingStream<Element, any Error>
    func makeAsyncIterator() -> AsyncThrowingStream<Element, any Error>.AsyncIterator { base.makeAsyncIterator() }
}

/// Counts a stream's elements and drops (constant work per message).
struct FloodCounter<S: AsyncSequence & Sendable>: Program where S.Element == Int, S: SendableMetatype {
    struct Model: CustomStringConvertible {
        var delivered = 0, dropped = 0, last = 0, finished = false, inOrder = true, failure: SourceFailure?
        var description: String { "\(delivered) delivered, \(dropped) dropped, last \(last), finished \(finished)" }
    }
    enum Message { case event(StreamSource<Int>.Event) }
    let overflow: StreamSource<Int>.Overflow
    let make: @Sendable () -> S
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .event(.element(let v)):
            if v <= m.last { m.inOrder = false }
            m.delivered += 1
            m.last = v
        case .event(.dropped(let d)): m.dropped += d
        case .event(.finished): m.finished = true
        case .event(.failed(let f)): m.failure = f
        case .event(.restarting): break
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions { Subscription.stream(key: "flood", overflow: overflow, make) { .event($0) } }
    }
}

extension SystemdTests {
    @Suite struct Restarts {
        @Test func aStreamWhoseServerIsKilledAndRestartedReconnects() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/lines.sock"
            let first = try Child("/usr/bin/python3", ["-c", lineServer, path, "first"])
            #expect(first.line(timeout: .seconds(5)) == "ready")
            let policy = RestartPolicy.backoff(initial: .milliseconds(20), factor: 2, maximum: .milliseconds(200), jitter: 0.2, attempts: 50)
            let h = try Harness(StreamRecorder<String>(restart: policy, overflow: .unbuffered) { AnyAsyncSequenceBox(base: socketLines(path)) })
            func lines() -> [String] {
                h.runtime.model.events.compactMap { if case .element(let s) = $0.0 { s } else { nil } }
            }
            try h.run(until: { lines() == ["first"] })
            first.signal(SIGKILL)
            _ = first.wait(timeout: .seconds(5))
            // The end, then failed connects (the socket file stays, nobody listens), each followed by a restart.
            try h.run(until: {
                h.runtime.model.events.filter { if case .restarting = $0.0 { true } else { false } }.count >= 3
            })
            let second = try Child("/usr/bin/python3", ["-c", lineServer, path, "second"])
            #expect(second.line(timeout: .seconds(5)) == "ready")
            try h.run(until: { lines() == ["first", "second"] })
            let kinds = h.runtime.model.events.map { e -> String in
                switch e.0 {
                case .element: "element"
                case .finished: "finished"
                case .failed: "failed"
                case .restarting: "restarting"
                case .dropped: "dropped"
                }
            }
            #expect(Array(kinds.prefix(3)) == ["element", "finished", "restarting"])
            #expect(kinds.last == "element" && kinds.dropLast().last == "restarting")
            // Every restart waited within its bounds (measured on the real timers, with slack for the loop).
            guard case .backoff(let b) = policy else { return }
            let events = h.runtime.model.events
            for (i, e) in events.enumerated() {
                guard case .restarting(let n, let after) = e.0, i + 1 < events.count else { continue }
                #expect(b.bounds(forAttempt: n).contains(after))
                #expect(events[i + 1].1 - e.1 >= after - .milliseconds(1), "attempt \(n) came early")
            }
            second.signal(SIGKILL)
            _ = second.wait(timeout: .seconds(5))
        }

        @Test func aSourceThatAlwaysFailsIsCappedOnRealTimersAndThenStaysStopped() throws {
            // Ten restarts in the window, then no more: fewer than 20 in 60 s
            // however fast the source fails (the schedule itself: RestartSchedules).
            let backoff = Backoff(initial: .milliseconds(10), factor: 1.5, maximum: .milliseconds(100), jitter: 0.2, attempts: 10, window: .seconds(60))
            let made = Mutex<[ContinuousClock.Instant]>([])
            let h = try Harness(StreamRecorder<String>(restart: .backoff(backoff), overflow: .unbuffered) {
                made.withLock { $0.append(.now) }
                return AnyAsyncSequenceBox(base: AsyncThrowingStream { $0.finish(throwing: POSIXError(.ECONNREFUSED)) })
            })
            let start = ContinuousClock.now
            try h.run(until: {
                if case .failed(let f) = h.runtime.model.events.last?.0 { f.reason.contains("gave up") } else { false }
            }, timeout: .seconds(10))
            let took = ContinuousClock.now - start
            try h.run(for: .milliseconds(300))
            let starts = made.withLock { $0 }
            #expect(starts.count == 11, "\(starts.count) attempts")
            // The delays, one per restart, each within its bounds and honoured by the timer.
            let delays = h.runtime.model.events.compactMap { e -> (Int, Duration)? in
                if case .restarting(let n, let d) = e.0 { (n, d) } else { nil }
            }
            #expect(delays.map(\.0) == Array(1...10))
            for (i, (n, d)) in delays.enumerated() where i + 1 < starts.count {
                #expect(backoff.bounds(forAttempt: n).contains(d))
                #expect(starts[i + 1] - starts[i] >= d - .milliseconds(1))
            }
            // The sum of the ten delays is at most 0.6 s; the loop adds little.
            #expect(took < .seconds(3), "\(took)")
        }

        @Test func aFloodOfAMillionUnderKeepLatestEndsWithTheLastValueAndADropCount() throws {
            // A tenth under a sanitizer (`make sanitize`): the assertions are
            // the same, a million took TSan 46-60 s of the 60 s bound.
            let n = ProcessInfo.processInfo.environment["RECONCILE_SANITIZER"] == nil ? 1_000_000 : 100_000
            // A sequence that never suspends, iterated off the loop as fast as
            // a thread can: the loop's delivery cannot keep up.
            let h = try Harness(FloodCounter(overflow: .keepLatest) { CountingSequence(limit: n) })
            let start = ContinuousClock.now
            try h.run(until: { h.runtime.model.finished }, timeout: .seconds(60))
            let took = ContinuousClock.now - start
            let m = h.runtime.model
            #expect(m.last == n && m.delivered + m.dropped == n && m.dropped > 0 && m.inOrder, "\(m) in \(took)")
            print("keep-latest flood: \(n) produced, \(m.delivered) delivered, \(m.dropped) dropped in \(took)")
        }
    }
}

/// 1...limit, never suspending.
struct CountingSequence: AsyncSequence, Sendable {
    let limit: Int
    struct AsyncIterator: AsyncIteratorProtocol {
        var next = 0
        let limit: Int
        mutating func next() async -> Int? {
            guard next < limit else { return nil }
            next += 1
            return next
        }
    }
    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(limit: limit) }
}
