import CSystemd
import Foundation
import Reconcile
@testable import ReconcileSystemd
import Synchronization
import Testing

/// What the descriptor, listener and process tests record.
enum IOMessage {
    case set(Bool)
    case descriptor(DescriptorSource.Event)
    case listener(ListenerSource.Event)
    case connection(UInt64, DescriptorSource.Event)
    case process(ProcessSource.Event)
}

/// Logs every event; while `on`, wants `wanted`'s subscriptions plus one
/// connection subscription per accepted connection still open.
struct IOProgram: Program {
    struct Model {
        var on = true
        var log: [IOMessage] = []
        var connections: [Connection] = []
    }
    var writeQueueLimit = DescriptorSource.defaultWriteQueueLimit
    let wanted: (Model) -> Subscriptions<IOMessage>

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: IOMessage) -> [Never] {
        model.log.append(message)
        switch message {
        case .set(let on): model.on = on
        case .listener(.accepted(let c)): model.connections.append(c)
        case .connection(let id, .endOfFile), .connection(let id, .closed), .connection(let id, .failed):
            model.connections.removeAll { $0.id == id }
        default: break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<IOMessage> {
        guard model.on else { return .none }
        let limit = writeQueueLimit
        return Subscriptions {
            wanted(model)
            model.connections.map { c in Subscription.connection(c, writeQueueLimit: limit) { .connection(c.id, $0) } }
        }
    }
}

extension IOProgram.Model {
    var descriptorEvents: [DescriptorSource.Event] { log.compactMap { if case .descriptor(let e) = $0 { e } else { nil } } }
    var processEvents: [ProcessSource.Event] { log.compactMap { if case .process(let e) = $0 { e } else { nil } } }
    var lines: [String] { descriptorEvents.compactMap { if case .line(let s) = $0 { s } else { nil } } }
    var accepted: Int { log.filter { if case .listener(.accepted) = $0 { true } else { false } }.count }
    var refusedTotal: Int { log.compactMap { if case .listener(.refused(let n)) = $0 { n } else { nil } }.max() ?? 0 }
    func output(_ stream: ProcessSource.Stream) -> [String] {
        processEvents.compactMap { if case .output(stream, let s) = $0 { s } else { nil } }
    }
    var ended: ProcessSource.Event? {
        processEvents.last { if case .exited = $0 { true } else if case .killed = $0 { true } else { false } }
    }
}

/// The processes whose parent is this one, and their states (`Z`: zombie),
/// from each thread's `/proc/self/task/*/children`.
func childProcesses() -> [(pid: Int32, state: Character)] {
    var found: [(Int32, Character)] = []
    for task in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? [] {
        let list = (try? String(contentsOfFile: "/proc/self/task/\(task)/children", encoding: .utf8)) ?? ""
        for entry in list.split(separator: " ") {
            guard let pid = Int32(entry) else { continue }
            // Under ThreadSanitizer and AddressSanitizer the runtime starts
            // llvm-symbolizer as a child of the test process: not ours.
            let comm = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)) ?? ""
            if comm.hasPrefix("llvm-symbolizer") { continue }
            let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
            let state = stat.lastIndex(of: ")").flatMap { stat[stat.index(after: $0)...].split(separator: " ").first?.first } ?? "?"
            found.append((pid, state))
        }
    }
    return found
}

/// Threads of this process.
func threadCount() -> Int { ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []).count }

/// A listening unix stream socket at `path` (backlog 4096).
func listeningUnixSocket(_ path: String) throws -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: Array(path.utf8).prefix($0.count - 1)) }
    let r = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard r == 0, listen(fd, 4096) == 0 else { throw POSIXError(.init(rawValue: errno)!) }
    return fd
}

/// A client connected (non-blocking) to the unix socket at `path`, or -1.
func connectUnix(_ path: String) -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: Array(path.utf8).prefix($0.count - 1)) }
    let r = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    if r != 0 { close(fd); return -1 }
    return fd
}

extension SystemdTests {
    @Suite struct Descriptors {
        @Test func aFIFOReaderGetsLinesInOrderAndThePartialLastLineAtEOF() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/fifo"
            #expect(mkfifo(path, 0o600) == 0)
            let reader = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
            let writer = open(path, O_WRONLY | O_CLOEXEC)
            let h = try Harness(IOProgram { _ in Subscriptions { Subscription.lines(reader, owned: true) { .descriptor($0) } } })
            let text = "first\nsecond\r\n\nthird without newline"
            #expect(write(writer, text, text.utf8.count) == text.utf8.count)
            close(writer)
            try h.run(until: { h.runtime.model.descriptorEvents.last == .endOfFile })
            #expect(h.runtime.model.descriptorEvents == [.line("first"), .line("second"), .line(""), .line("third without newline"), .endOfFile])
            // EPOLLHUP repeats until handled: after EOF the source is off, nothing more comes.
            try h.run(for: .milliseconds(50))
            #expect(h.runtime.model.descriptorEvents.count == 5)
        }

        @Test func aTenMebibyteLineIsRefusedWithAnEventAndTheNextLineStillArrives() throws {
            var fds: [Int32] = [0, 0]
            #expect(CSystemd_pipe_cloexec(&fds) == 0)
            let h = try Harness(IOProgram { _ in Subscriptions { Subscription.lines(fds[0], maxLineLength: 4096, owned: true) { .descriptor($0) } } })
            let writer = fds[1]
            let thread = Thread {
                let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 1 << 20)
                for _ in 0..<10 { var off = 0; while off < chunk.count { let n = chunk[off...].withUnsafeBytes { write(writer, $0.baseAddress, $0.count) }; if n <= 0 { return }; off += n } }
                let tail = "\nafter\n"
                _ = write(writer, tail, tail.utf8.count)
                close(writer)
            }
            thread.start()
            try h.run(until: { h.runtime.model.descriptorEvents.last == .endOfFile }, timeout: .seconds(10))
            #expect(h.runtime.model.descriptorEvents == [.lineTooLong(limit: 4096), .line("after"), .endOfFile])
        }

        @Test func stoppingWhileAWriterIsBlockedLeavesNoThreadOrDescriptor() throws {
            signal(SIGPIPE, SIG_IGN)
            let fds = openDescriptors()
            let threads = threadCount()
            var p: [Int32] = [0, 0]
            #expect(CSystemd_pipe_cloexec(&p) == 0)
            let reader = p[0], writer = p[1]
            final class Flag: Sendable { let value = Mutex(false) }
            let flag = Flag()
            let thread = Thread {
                let chunk = [UInt8]((String(repeating: "y", count: 99) + "\n").utf8)
                while chunk.withUnsafeBytes({ write(writer, $0.baseAddress, $0.count) }) > 0 {}
                close(writer)
                flag.value.withLock { $0 = true }
            }
            do {
                let h = try Harness(IOProgram { _ in Subscriptions { Subscription.lines(reader, owned: true) { .descriptor($0) } } })
                thread.start()
                try h.run(until: { h.runtime.model.lines.count > 1000 })
                try h.runtime.send(.set(false))
            }
            // The reader's close ends the blocked write (EPIPE); nothing of ours waits on it.
            let deadline = ContinuousClock.now + .seconds(5)
            while !flag.value.withLock({ $0 }), ContinuousClock.now < deadline { usleep(1000) }
            #expect(flag.value.withLock { $0 })
            while threadCount() > threads, ContinuousClock.now < deadline { usleep(1000) }
            // No thread left behind (another test's thread may end meanwhile:
            // under ASan the count once went from 7 to 6).
            #expect(threadCount() <= threads)
            #expect(openDescriptors().subtracting(fds).isEmpty)
        }

        @Test func devNullAndRegularFilesAreAClearFailureAndTheOwnedDescriptorIsClosed() throws {
            let fds = openDescriptors()
            do {
                let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
                let h = try Harness(IOProgram { _ in Subscriptions { Subscription.lines(null, owned: true) { .descriptor($0) } } })
                try h.run(until: { !h.runtime.model.descriptorEvents.isEmpty })
                guard case .failed(let failure) = h.runtime.model.descriptorEvents.first else {
                    Issue.record("expected a failure, got \(h.runtime.model.descriptorEvents)")
                    return
                }
                #expect(failure.code == EPERM)
                #expect(failure.reason.contains("/dev/null"))
            }
            #expect(openDescriptors().subtracting(fds).isEmpty)
        }
    }

    @Suite struct Processes {
        func run(_ arguments: [String], grace: Duration = .seconds(5)) throws -> Harness<IOProgram> {
            try Harness(IOProgram { _ in Subscriptions { Subscription.process(arguments, key: "p", grace: grace) { .process($0) } } })
        }

        /// A child's lines of one read are one batch: `update` for each,
        /// one reconcile after them (one reconcile per line before).
        @Test func aChattyChildsLinesAreBatchedOneReconcileAPipeRead() throws {
            let h = try run(["/bin/sh", "-c", "seq 1 20000; exit 0"])
            try h.run(until: { h.runtime.model.ended != nil })
            let out = h.runtime.model.output(.stdout)
            #expect(out.count == 20_000)
            #expect(out.first == "1" && out.last == "20000")
            #expect(h.runtime.model.processEvents.last == .exited(status: 0))
            // 20,000 lines are about 110 KB: a few reads of at most 64 KiB
            // (and the pipe's 64 KiB at a time), each a batch.
            let reconciles = h.runtime.stats.reconciles
            print("chatty child: \(out.count) lines, \(h.runtime.stats.messages) messages, \(reconciles) reconciles")
            #expect(reconciles < 200)
        }

        @Test func aShellChildsStdoutAndStderrLinesArriveInOrderThenExit3() throws {
            let h = try run(["/bin/sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2; printf partial; exit 3"])
            try h.run(until: { h.runtime.model.ended != nil })
            let events = h.runtime.model.processEvents
            guard case .started(let pid) = events.first else { Issue.record("no .started first: \(events)"); return }
            #expect(pid > 0)
            #expect(h.runtime.model.output(.stdout) == ["out1", "out2", "partial"])
            #expect(h.runtime.model.output(.stderr) == ["err1", "err2"])
            #expect(events.last == .exited(status: 3))
            #expect(!childProcesses().contains { $0.pid == pid })
        }

        @Test func theChildGetsNoDescriptorItWasNotMeantToHave() throws {
            // A descriptor of ours without close-on-exec.
            let leaky = open("/dev/null", O_RDONLY)
            defer { close(leaky) }
            let h = try run(["/bin/sh", "-c", "ls /proc/self/fd"])
            try h.run(until: { h.runtime.model.ended != nil })
            // 0, 1, 2 and the one `ls` opens to list the directory.
            #expect(!h.runtime.model.output(.stdout).contains("\(leaky)"))
            #expect(h.runtime.model.output(.stdout).count <= 4)
        }

        @Test func aChildIgnoringSIGTERMIsKilledAfterTheGraceAndReaped() throws {
            let h = try run(["/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.02; done"], grace: .milliseconds(300))
            try h.run(until: { h.runtime.model.output(.stdout) == ["ready"] })
            guard case .started(let pid) = h.runtime.model.processEvents.first else { Issue.record("not started"); return }
            let stoppedAt = ContinuousClock.now
            try h.runtime.send(.set(false))
            try h.run(for: .milliseconds(150))
            // SIGTERM ignored: still alive within the grace.
            #expect(childProcesses().contains { $0.pid == pid && $0.state != "Z" })
            try h.run(until: { !childProcesses().contains { $0.pid == pid } })
            #expect(ContinuousClock.now - stoppedAt >= .milliseconds(300))
            // Stopped: its exit is not reported.
            #expect(h.runtime.model.ended == nil)
        }

        @Test func aThousandSpawnStopCyclesLeaveDescriptorsFlatAndNoZombie() throws {
            let h = try run(["/bin/sleep", "10"])
            try h.runtime.send(.set(false))
            try h.run(until: { childProcesses().isEmpty })
            try h.run(for: .milliseconds(10))
            let fds = openDescriptors()
            let live = EventSourceAccounting.live
            for i in 0..<1_000 {
                try h.runtime.send(.set(true))
                try h.runtime.send(.set(false))
                if i % 100 == 99 { try h.run(until: { childProcesses().isEmpty }, timeout: .seconds(10)) }
            }
            try h.run(until: { childProcesses().isEmpty }, timeout: .seconds(10))
            try h.run(for: .milliseconds(10))
            #expect(h.runtime.stats.starts == 1_001)
            #expect(childProcesses().isEmpty)
            #expect(openDescriptors().subtracting(fds).isEmpty)
            #expect(EventSourceAccounting.live == live)
        }

        @Test func detachingWithChildrenRunningReapsThemAll() throws {
            var pids: [Int32] = []
            do {
                let h = try Harness(IOProgram { _ in Subscriptions {
                    for i in 0..<5 { Subscription.process(["/bin/sleep", "30"], key: i) { .process($0) } }
                } })
                try h.run(until: { h.runtime.model.processEvents.count == 5 })
                pids = childProcesses().map(\.pid)
                #expect(pids.count == 5)
            }
            // The harness shut the runtime down: every child is gone, none a zombie.
            #expect(childProcesses().isEmpty)
            for pid in pids { #expect(!FileManager.default.fileExists(atPath: "/proc/\(pid)")) }
        }

        @Test func aOneOffCommandRunsToCompletionWithItsOutputCollected() async throws {
            let result = try await ProcessRun.run(["/bin/sh", "-c", "echo a; echo oops >&2; printf b; exit 5"])
            #expect(result.status == 5 && result.signal == nil)
            #expect(result.lines == ["a", "b"])
            #expect(result.stderr == Array("oops\n".utf8))
            #expect(!childProcesses().contains { $0.state == "Z" })
        }

        @Test func cancellingAOneOffCommandTerminatesAndReapsIt() async throws {
            let started = ContinuousClock.now
            let task = Task { try await ProcessRun.run(["/bin/sleep", "30"]) }
            try await Task.sleep(for: .milliseconds(100))
            task.cancel()
            let result = try await task.value
            #expect(result.signal == SIGTERM)
            #expect(ContinuousClock.now - started < .seconds(5))
            #expect(childProcesses().isEmpty)
        }

        @Test func aProgramThatDoesNotExistIsAFailureEvent() throws {
            let h = try run(["/nonexistent/program"])
            try h.run(until: { !h.runtime.model.processEvents.isEmpty })
            guard case .failed(let f) = h.runtime.model.processEvents.first else { Issue.record("\(h.runtime.model.processEvents)"); return }
            #expect(f.code == ENOENT)
        }
    }
}

extension SystemdTests {
    @Suite struct Sockets {
        @Test(arguments: [false, true])
        func bindingAUnixPathReplacesAStaleSocketFileButNotALiveOne(datagram: Bool) throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/s.sock"
            let first = try SocketActivation.bind(path, datagram: datagram)
            // A live socket is bound there: a second bind is refused, and the
            // first socket still owns the file.
            var refused: SystemdError?
            do throws(SystemdError) { close(try SocketActivation.bind(path, datagram: datagram)) } catch { refused = error }
            #expect(refused?.errno == EADDRINUSE, "\(String(describing: refused))")
            var st = stat()
            #expect(lstat(path, &st) == 0)
            var bound = sockaddr_un(), length = socklen_t(MemoryLayout<sockaddr_un>.size)
            _ = withUnsafeMutablePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(first, $0, &length) } }
            let boundPath = withUnsafeBytes(of: bound.sun_path) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            #expect(boundPath == path)
            // Once it is closed the file is stale: the next bind replaces it.
            close(first)
            let second = try SocketActivation.bind(path, datagram: datagram)
            close(second)
        }

        /// A listener's connection is read without an `fcntl` (its reader
        /// relies on `accept4`'s `SOCK_NONBLOCK`); one handed over whole
        /// (`Accept=yes`) may be blocking, and its reader makes it not.
        @Test func aConnectionHandedOverBlockingIsMadeNonBlockingAndAnAcceptedOneIsNonBlockingFromItsAccept() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/s.sock"
            let listener = try listeningUnixSocket(path)
            var pair: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
            defer { close(pair[1]) }
            #expect(fcntl(pair[0], F_GETFL) & O_NONBLOCK == 0)
            let handed = SocketActivation.connection(ActivatedSocket(fd: pair[0], name: "handed", kind: .connected))
            let h = try Harness(IOProgram { _ in
                Subscriptions {
                    Subscription.listen(listener, name: "t", owned: true) { .listener($0) }
                    Subscription.connection(handed) { .connection(handed.id, $0) }
                }
            })
            let client = connectUnix(path)
            defer { close(client) }
            try h.run(until: { h.runtime.model.connections.count == 1 })
            let accepted = h.runtime.model.connections[0]
            try h.run(until: { h.driver.ioState?.reader(of: accepted.id) != nil && h.driver.ioState?.reader(of: handed.id) != nil })
            #expect(fcntl(handed.fd, F_GETFL) & O_NONBLOCK != 0)
            #expect(fcntl(accepted.fd, F_GETFL) & O_NONBLOCK != 0)
            // Both are read, each its own line.
            func lines(_ id: UInt64) -> [String] {
                h.runtime.model.log.compactMap { if case .connection(id, .line(let s)) = $0 { s } else { nil } }
            }
            #expect(write(pair[1], "one\n", 4) == 4)
            #expect(write(client, "two\n", 4) == 4)
            try h.run(until: { lines(handed.id) == ["one"] && lines(accepted.id) == ["two"] })
        }

        @Test func aGreetingWrittenInTheUpdateThatSawTheAcceptIsSentFirst() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/s.sock"
            let listener = try listeningUnixSocket(path)
            let h = try Harness(IOProgram { _ in Subscriptions { Subscription.listen(listener, name: "t", owned: true) { .listener($0) } } })
            // After the update that saw `.accepted`, before the reconcile that
            // starts the connection's subscription (as a command would).
            var outcomes: [SystemdDriver.WriteOutcome] = []
            h.runtime.didCommit = { model in
                guard outcomes.isEmpty, let c = model.connections.first else { return }
                outcomes.append(h.driver.write(Array("hello\n".utf8), to: c))
                outcomes.append(h.driver.write([UInt8](repeating: 0, count: 64 << 10), to: c))
            }
            let client = connectUnix(path)
            defer { close(client) }
            try h.run(until: { !outcomes.isEmpty })
            // Kept (not yet sent), and the one past the 64 KiB limit refused.
            #expect(outcomes == [.queued(bytes: 6), .closed])
            var received: [UInt8] = []
            try h.run(until: {
                var buffer = [UInt8](repeating: 0, count: 256)
                let n = recv(client, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                if n > 0 { received += buffer[..<n] }
                return received.count >= 6
            })
            #expect(String(decoding: received, as: UTF8.self) == "hello\n")
            // Then writes go through the running subscription.
            let c = h.runtime.model.connections[0]
            #expect(h.driver.write(Array("again\n".utf8), to: c) == .sent)
        }

        @Test func aPeerThatNeverReadsHasWritesQueuedToTheLimitThenIsClosedWithAnEvent() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/s.sock"
            let listener = try listeningUnixSocket(path)
            var program = IOProgram { _ in Subscriptions { Subscription.listen(listener, name: "t", owned: true) { .listener($0) } } }
            program.writeQueueLimit = 256 << 10
            let h = try Harness(program)
            let client = connectUnix(path)
            defer { close(client) }
            try h.run(until: { h.runtime.model.connections.count == 1 })
            let connection = h.runtime.model.connections[0]
            // Its subscription starts with the reconcile after the accept's
            // batch (the next pump): writes go to a connection it reads.
            try h.run(until: { h.driver.ioState?.reader(of: connection.id) != nil })
            let chunk = [UInt8](repeating: 7, count: 64 << 10)
            var outcomes: [SystemdDriver.WriteOutcome] = []
            for _ in 0..<200 {
                let outcome = h.driver.write(chunk, to: connection)
                outcomes.append(outcome)
                if outcome == .closed { break }
                try h.run(for: .milliseconds(1))
            }
            #expect(outcomes.contains(.sent))
            #expect(outcomes.contains { if case .queued = $0 { true } else { false } })
            #expect(outcomes.last == .closed)
            try h.run(until: { h.runtime.model.connections.isEmpty })
            let closed = h.runtime.model.log.contains {
                if case .connection(connection.id, .closed(.writeQueueFull(let n))) = $0 { n > 256 << 10 } else { false }
            }
            #expect(closed)
            #expect(h.driver.write([1], to: connection) == .closed)
        }

        @Test func twoThousandClientsAtAListenerLimitedTo256Get256ServedTheRestRefusedAndCounted() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/s.sock"
            let fds = openDescriptors()
            do {
                let listener = try listeningUnixSocket(path)
                let h = try Harness(IOProgram { _ in Subscriptions {
                    Subscription.listen(listener, name: "l", connectionLimit: 256, owned: true) { .listener($0) }
                } })
                let clients = (0..<2_000).map { _ in connectUnix(path) }
                #expect(clients.allSatisfy { $0 >= 0 })
                try h.run(until: { h.runtime.model.accepted + h.runtime.model.refusedTotal == 2_000 }, timeout: .seconds(10))
                #expect(h.runtime.model.accepted == 256)
                #expect(h.runtime.model.refusedTotal == 1_744)
                #expect(h.runtime.model.connections.count == 256)
                for c in clients { close(c) }
                try h.run(until: { h.runtime.model.connections.isEmpty })
            }
            #expect(openDescriptors().subtracting(fds).isEmpty)
        }

        @Test func aUnixPeerRunningAsNobodyIsSeenWithItsUid() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            chmod(dir, 0o755)
            let path = dir + "/s.sock"
            let listener = try listeningUnixSocket(path)
            chmod(path, 0o777)
            let h = try Harness(IOProgram { _ in Subscriptions { Subscription.listen(listener, name: "u", owned: true) { .listener($0) } } })
            let nobody = try #require(getpwnam("nobody")).pointee.pw_uid
            let client = try Child("/usr/bin/setpriv", ["--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                                                        "/usr/bin/python3", "-c",
                                                        "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)", path])
            try h.run(until: { h.runtime.model.connections.count == 1 })
            let credentials = h.runtime.model.connections.first?.credentials
            #expect(credentials?.uid == nobody)
            #expect(credentials?.pid == client.pid)
            try h.runtime.send(.set(false))
            // A connection no subscription took yet is closed after the
            // reconcile that stopped its listener, from the loop.
            try h.run(until: { !client.process.isRunning })
            #expect(client.wait() == 0)
        }
    }
}

/// A listener, its connections (lines counted), and a 10 ms timer whose
/// ticks are timed.
struct FloodProgram: Program {
    final class Clock { var ticks: [(sequence: UInt64, at: ContinuousClock.Instant)] = [] }
    struct Model { var connections: [Connection] = []; var lines = 0 }
    enum Message { case listener(ListenerSource.Event), connection(UInt64, DescriptorSource.Event), tick(TimerSource.Event) }
    let listener: Int32
    let clock: Clock
    /// The connections' lines batched (`connection(c, batched: true)`).
    var batched = false

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .listener(.accepted(let c)): model.connections.append(c)
        case .connection(_, .line): model.lines += 1
        case .connection(_, .lines(let lines)): model.lines += lines.count
        case .tick(.tick(let t)): clock.ticks.append((t.sequence, .now))
        default: break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.listen(listener, name: "flood", owned: true) { .listener($0) }
            Subscription.every(.milliseconds(10), key: "timer") { .tick($0) }
            model.connections.map { c in Subscription.connection(c, batched: batched) { .connection(c.id, $0) } }
        }
    }
}

extension SystemdTests.Sockets {
    /// Per line and batched (`batched`).
    @Test(arguments: [false, true])
    func aTimerIsNotStarvedWhile100ConnectionsFlood(batched: Bool) throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/flood.sock"
        let clock = FloodProgram.Clock()
        let h = try Harness(FloodProgram(listener: try listeningUnixSocket(path), clock: clock, batched: batched))
        let clients = (0..<100).map { _ in connectUnix(path) }
        defer { for c in clients { close(c) } }
        try h.run(until: { h.runtime.model.connections.count == 100 })
        final class Stop: Sendable { let value = Mutex(false) }
        let stop = Stop()
        // The flooder ends before the clients' descriptors are closed (their
        // numbers may be another test's then).
        let ended = DispatchSemaphore(value: 0)
        let flooder = Thread {
            let block = [UInt8]((0..<64).flatMap { _ in Array(String(repeating: "z", count: 63).utf8) + [10] })
            while !stop.value.withLock({ $0 }) {
                for c in clients { _ = block.withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) } }
            }
            ended.signal()
        }
        flooder.start()
        defer {
            stop.value.withLock { $0 = true }
            ended.wait()
        }
        let before = clock.ticks.count
        try h.run(for: .seconds(1))
        stop.value.withLock { $0 = true }
        let ticks = Array(clock.ticks[before...])
        let first = try #require(ticks.first)
        // Each due time's lateness: when the first tick at or after it came
        // (a tick that covers missed ones serves them late).
        var worst = Duration.zero
        for (a, b) in zip(ticks, ticks.dropFirst()) {
            let due = first.at + .milliseconds(10) * Int(a.sequence + 1 - first.sequence)
            worst = max(worst, b.at - due)
        }
        print("flood (batched: \(batched)): \(h.runtime.model.lines) lines from 100 connections in 1 s; \(ticks.count) ticks, worst lateness \(worst)")
        #expect(h.runtime.model.lines > 10_000)
        // One dispatch's lines are one batch for update, a round over the
        // busy connections reconciles once, and the timers' sources run
        // ahead of the descriptors (`TimerQueue.timerPriority`). The
        // issue's bound (under 10 ms) is measured in a release build
        // (`reconcile-bench io`, its io-flood case: 0.2-0.4 ms worst); this
        // debug build on a shared 2-core machine measured 100 ticks and
        // 0.2-3.7 ms worst (49-97 ticks before the priority), so it asserts
        // what that leaves room for (Docs/IO.md).
        #expect(ticks.count >= 75)
        #expect(worst < .milliseconds(40))
    }
}

/// A listener whose connections are read batched, each connection's lines
/// kept in order.
struct BatchedConnectionsProgram: Program {
    struct Model { var open: [Connection] = []; var lines: [UInt64: [String]] = [:]; var ended = 0 }
    enum Message { case listener(ListenerSource.Event), connection(UInt64, DescriptorSource.Event) }
    let listener: Int32

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .listener(.accepted(let c)): model.open.append(c)
        case .connection(let id, .lines(let lines)): model.lines[id, default: []] += lines
        case .connection(let id, .line(let line)): model.lines[id, default: []].append(line)
        case .connection(let id, .endOfFile):
            model.open.removeAll { $0.id == id }
            model.ended += 1
        default: break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.listen(listener, name: "batched", owned: true) { .listener($0) }
            model.open.map { c in Subscription.connection(c, maxLineLength: 300, batched: true) { .connection(c.id, $0) } }
        }
    }
}

extension SystemdTests.Sockets {
    /// Eight python3 clients at once, each sending 5,000 numbered lines in
    /// odd-sized pieces (`\r\n` ends on some) and shutting down mid-way
    /// through its last line: every accepted connection's batches give its
    /// own lines, whole and in order, the partial last one at its end.
    @Test func batchedConnectionsFromPython3ClientsGetEachClientsLinesInOrder() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/batched.sock"
        let h = try Harness(BatchedConnectionsProgram(listener: try listeningUnixSocket(path)))
        try writeFile(dir + "/client.py", """
            import socket, sys
            n = int(sys.argv[2])
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sys.argv[1])
            data = b''.join(b'client %d line %d %s%s' % (n, i, b'p' * (i % 97), b'\\r\\n' if i % 3 == 0 else b'\\n') for i in range(5000))
            data += b'client %d partial' % n
            i, step = 0, 1
            while i < len(data):
                s.sendall(data[i:i + step])
                i += step
                step = step * 7 % 9973 + 1
            s.shutdown(socket.SHUT_WR)
            s.recv(1)
            """)
        let clients = try (0..<8).map { try Spawned("/usr/bin/python3 \(dir)/client.py \(path) \($0)") }
        try h.run(until: { h.runtime.model.ended == 8 }, timeout: .seconds(30))
        let m = h.runtime.model
        #expect(m.lines.count == 8)
        for lines in m.lines.values {
            let n = try #require(lines.first.flatMap { $0.split(separator: " ").dropFirst().first }.flatMap { Int($0) })
            let expected = (0..<5000).map { "client \(n) line \($0) " + String(repeating: "p", count: $0 % 97) } + ["client \(n) partial"]
            #expect(lines == expected)
        }
        h.runtime.shutdown()
        let deadline = ContinuousClock.now + .seconds(5)
        while !clients.allSatisfy(\.isDone), ContinuousClock.now < deadline { usleep(1000) }
        let allDone = clients.allSatisfy(\.isDone)
        #expect(allDone)
    }
}

/// `FloodProgram`'s listener and connections, and a watch on a file whose
/// events are timed.
struct WatchUnderFloodProgram: Program {
    final class Clock { var events: [(FileWatchSource.Event, ContinuousClock.Instant)] = [] }
    struct Model { var connections: [Connection] = []; var lines = 0 }
    enum Message { case listener(ListenerSource.Event), connection(UInt64, DescriptorSource.Event), watch(FileWatchSource.Event) }
    let listener: Int32
    let path: String
    let clock: Clock

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .listener(.accepted(let c)): model.connections.append(c)
        case .connection(_, .line): model.lines += 1
        case .watch(let e): clock.events.append((e, .now))
        default: break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.listen(listener, name: "flood", owned: true) { .listener($0) }
            Subscription.watch(path) { .watch($0) }
            model.connections.map { c in Subscription.connection(c) { .connection(c.id, $0) } }
        }
    }
}

extension SystemdTests.Sockets {
    /// A file watch's events reach `update` while 100 connections flood:
    /// the watch's flush runs after the loop's ready descriptors, and a
    /// flood that keeps some descriptor ready at every poll does not hold
    /// it back for longer than its bound.
    @Test func aFileWatchIsNotStarvedWhile100ConnectionsFlood() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/flood.sock"
        let watched = dir + "/watched"
        let clock = WatchUnderFloodProgram.Clock()
        let h = try Harness(WatchUnderFloodProgram(listener: try listeningUnixSocket(path), path: watched, clock: clock))
        let clients = (0..<100).map { _ in connectUnix(path) }
        defer { for c in clients { close(c) } }
        try h.run(until: { h.runtime.model.connections.count == 100 })
        final class Shared: Sendable { let stop = Mutex(false); let wrote = Mutex<ContinuousClock.Instant?>(nil) }
        let shared = Shared()
        // The flooder ends before the clients' descriptors are closed and
        // the directory removed.
        let ended = DispatchSemaphore(value: 0)
        let flooder = Thread {
            let block = [UInt8]((0..<64).flatMap { _ in Array(String(repeating: "z", count: 63).utf8) + [10] })
            let began = ContinuousClock.now
            while !shared.stop.withLock({ $0 }) {
                for c in clients { _ = block.withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) } }
                if shared.wrote.withLock({ $0 }) == nil, ContinuousClock.now - began > .milliseconds(300) {
                    let fd = open(watched, O_CREAT | O_WRONLY, 0o644)
                    close(fd)
                    shared.wrote.withLock { $0 = .now }
                }
            }
            ended.signal()
        }
        flooder.start()
        defer {
            shared.stop.withLock { $0 = true }
            ended.wait()
        }
        try h.run(for: .seconds(1))
        let linesAtEnd = h.runtime.model.lines
        shared.stop.withLock { $0 = true }
        let wrote = try #require(shared.wrote.withLock { $0 })
        let created = clock.events.first { if case .created = $0.0 { true } else { false } }
        print("watch under flood: \(linesAtEnd) lines; events \(clock.events.map { "\($0.0)" }); created after \(created.map { $0.1 - wrote }.map { "\($0)" } ?? "never")")
        // Under a sanitizer (`make sanitize`) a dispatch is slower: fewer
        // lines, a later dispatch; a watch passed over still sees nothing
        // for the 0.7 s the flood goes on after the write.
        let sanitized = ProcessInfo.processInfo.environment["RECONCILE_SANITIZER"] != nil
        #expect(linesAtEnd > (sanitized ? 1_000 : 10_000))
        let seen = try #require(created, "the file's creation was not seen while the flood went on")
        // 1 ms passed over (`FileWatchRunner.flushStarvationBound`), then
        // the next dispatch: 5-6 ms in a debug build, each dispatch of the
        // flood's lines a few milliseconds; before the bound, never while
        // the flood lasted (0.9 s after it began, once it ended).
        #expect(seen.1 - wrote < .milliseconds(sanitized ? 600 : 250))
    }
}

/// Watches `paths`, each reporting that it exists; counts the events.
struct ManyWatchesProgram: Program {
    let paths: [String]
    func start() -> (Int, [Never]) { (0, []) }
    func update(_ model: inout Int, _ message: FileWatchSource.Event) -> [Never] {
        if case .exists = message { model += 1 }
        return []
    }
    func subscriptions(_ model: Int) -> Subscriptions<FileWatchSource.Event> {
        Subscriptions(paths.map { Subscription.watch($0, reportExisting: true) { $0 } })
    }
}

extension SystemdTests.Sockets {
    /// 300 watches armed at once (each start reports the file exists):
    /// the flushes' guard holds a note of each, and none once every flush
    /// ran (nothing left to look at between floods); the same for one
    /// change, whose flush runs before its note is first looked at.
    @Test func flushesArmedAtOnceAreNotedThenLetGo() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let paths = (0..<300).map { "\(dir)/f\($0)" }
        for p in paths { close(open(p, O_CREAT | O_WRONLY, 0o644)) }
        let h = try Harness(ManyWatchesProgram(paths: paths))
        #expect(h.driver.flushGuard.count == 300)
        try h.run(until: { h.runtime.model == 300 })
        // The notes of flushes that ran are dropped at the next check.
        try h.run(for: .milliseconds(20))
        #expect(h.driver.flushGuard.count == 0)
        // One change: its flush runs at once, its note is dropped too.
        let fd = open(paths[0], O_WRONLY | O_APPEND)
        _ = write(fd, "x", 1)
        close(fd)
        try h.run(until: { h.driver.flushGuard.count == 1 })
        try h.run(for: .milliseconds(20))
        #expect(h.driver.flushGuard.count == 0)
    }
}

/// 600 timers of 1 ms (more than the loop serves: each tick reconciles
/// 601 subscriptions) and a descriptor read as lines.
struct TimerOverloadProgram: Program {
    struct Model { var ticks = 0; var lineAt: ContinuousClock.Instant? }
    enum Message { case tick, line }
    let fd: Int32

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .tick: model.ticks += 1
        case .line: model.lineAt = model.lineAt ?? .now
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            (0..<600).map { Subscription.every(.milliseconds(1), key: $0, leeway: .microseconds(1)) { _ in .tick } }
            Subscription.lines(fd) { _ in .line }
        }
    }
}

extension SystemdTests.Sockets {
    /// Timers the loop cannot keep up with do not hold a descriptor back:
    /// a queue still behind after a full dispatch (256 timers) drops from
    /// its priority ahead of the others to theirs until it catches up
    /// (`TimerQueue.dispatch`); before, it was due again at every iteration
    /// and a line written meanwhile waited for as long as the overload.
    @Test func timersTheLoopCannotKeepUpWithDoNotStarveADescriptor() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        let h = try Harness(TimerOverloadProgram(fd: pair[0]))
        // Behind: more ticks delivered than one dispatch serves.
        try h.run(until: { h.runtime.model.ticks > 300 })
        let wrote = ContinuousClock.now
        #expect(write(pair[1], "hello\n", 6) == 6)
        let ticksAtWrite = h.runtime.model.ticks
        try h.run(until: { h.runtime.model.lineAt != nil }, timeout: .seconds(5))
        let at = try #require(h.runtime.model.lineAt, "the line never reached update while the timers were behind")
        let sanitized = ProcessInfo.processInfo.environment["RECONCILE_SANITIZER"] != nil
        print("timer overload: line after \(at - wrote), \(h.runtime.model.ticks - ticksAtWrite) ticks meanwhile")
        // One timer dispatch at most before it (under 0.1 s in a debug
        // build; before the change, not within the 5 s waited).
        #expect(at - wrote < .seconds(sanitized ? 3 : 1))
    }
}
