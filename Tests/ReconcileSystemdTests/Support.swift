import CSystemd
import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// A loop, a driver and a runtime for one test (the public `LoopTester`),
/// recording an issue when a wait times out.
final class Harness<P: Program> {
    let tester: LoopTester<P>
    var loop: EventLoop { tester.loop }
    var driver: SystemdDriver { tester.driver }
    var runtime: Runtime<P> { tester.runtime }

    init(_ program: P, loop: EventLoop? = nil, perform: @escaping (P.Command, Runtime<P>) -> Void = { _, _ in }) throws {
        tester = try LoopTester(program, loop: loop, perform: perform)
    }

    /// Runs the loop until `done` or the deadline; records an issue on timeout.
    @discardableResult
    func run(until done: () -> Bool, timeout: Duration = .seconds(5), sourceLocation: SourceLocation = #_sourceLocation) throws -> Bool {
        let ok = try tester.run(until: done, timeout: timeout)
        if !ok { Issue.record("timed out after \(timeout)", sourceLocation: sourceLocation) }
        return ok
    }

    /// Runs the loop for `duration` (to show that nothing more happens).
    func run(for duration: Duration) throws { try tester.run(for: duration) }
}

/// A fresh directory under the system's temporary directory.
func makeTemporaryDirectory() throws -> String {
    var template = Array((NSTemporaryDirectory() + "reconcile-XXXXXX").utf8CString)
    guard let p = mkdtemp(&template) else { throw POSIXError(.init(rawValue: errno)!) }
    return String(cString: p)
}

func removeTree(_ path: String) { try? FileManager.default.removeItem(atPath: path) }

func writeFile(_ path: String, _ text: String) throws {
    try text.write(toFile: path, atomically: false, encoding: .utf8)
}

/// Open file descriptors of this process.
func openDescriptors() -> Set<String> {
    Set((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [])
}

/// Resident set size in bytes.
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return -1 }
    let fields = text.split(separator: " ")
    return (Int(fields[1]) ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// The path of an executable built next to the test bundle.
func builtExecutable(_ name: String) -> String {
    let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    var candidate = bundle.appendingPathComponent(name).path
    if !FileManager.default.fileExists(atPath: candidate) {
        // `swift test` may run the bundle from inside `.xctest`.
        candidate = bundle.deletingLastPathComponent().appendingPathComponent(name).path
    }
    return candidate
}

/// A unix datagram socket a child process sends sd_notify messages to.
final class NotifySocket {
    let path: String
    let fd: Int32

    init(directory: String) throws {
        path = directory + "/notify.sock"
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            let bytes = Array(path.utf8)
            raw.copyBytes(from: bytes.prefix(raw.count - 1))
        }
        let r = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard r == 0 else { throw POSIXError(.init(rawValue: errno)!) }
    }

    /// The next datagram, or nil after `timeout`.
    func receive(timeout: Duration) -> String? {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, Int32(clamping: timeout.saturatingMicroseconds / 1000)) == 1 else { return nil }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = recv(fd, &buffer, buffer.count, 0)
        return n > 0 ? String(decoding: buffer[..<n], as: UTF8.self) : nil
    }

    /// Reads datagrams until one satisfies `match` (all of them returned).
    func receive(until match: (String) -> Bool, timeout: Duration) -> [String] {
        let deadline = ContinuousClock.now + timeout
        var seen: [String] = []
        while ContinuousClock.now < deadline {
            guard let m = receive(timeout: deadline - ContinuousClock.now) else { break }
            seen.append(m)
            if match(m) { break }
        }
        return seen
    }

    deinit {
        close(fd)
        unlink(path)
    }
}

/// A child process whose stdout and stderr are read line by line with deadlines.
final class Child {
    /// An address no bus can be at (a path under a file).
    static let noSystemBus = "unix:path=/dev/null/no-system-bus"
    let process = Process()
    private let output = LineReader()
    private let errors = LineReader()
    /// The child's standard input, when asked for (`input: true`).
    private var input: Pipe?

    init(_ executable: String, _ arguments: [String], environment: [String: String] = [:], input: Bool = false) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        // Never this machine's own system bus (the indicator follows logind
        // on it): a test that wants a bus passes its private one.
        env["DBUS_SYSTEM_BUS_ADDRESS"] = Child.noSystemBus
        for (k, v) in environment { env[k] = v }
        process.environment = env
        process.standardOutput = output.pipe
        process.standardError = errors.pipe
        if input {
            let pipe = Pipe()
            process.standardInput = pipe
            self.input = pipe
        }
        try process.run()
    }

    /// Writes `line` and a newline to the child's standard input (`input: true`).
    func send(_ line: String) {
        guard let fd = input?.fileHandleForWriting.fileDescriptor else { return }
        var bytes = Array((line + "\n").utf8)
        _ = write(fd, &bytes, bytes.count)
    }

    var pid: Int32 { process.processIdentifier }

    /// The next line of standard output, or nil after `timeout` or at its end.
    func line(timeout: Duration = .seconds(10)) -> String? { output.line(timeout: timeout) }

    /// Reads output lines until one satisfies `match`; returns it or nil.
    func line(matching match: (String) -> Bool, timeout: Duration = .seconds(10)) -> String? {
        output.line(matching: match, timeout: timeout)
    }

    /// Reads standard error lines until one satisfies `match`.
    func errorLine(matching match: (String) -> Bool, timeout: Duration = .seconds(10)) -> String? {
        errors.line(matching: match, timeout: timeout)
    }

    func signal(_ s: Int32) { kill(pid, s) }

    /// Waits for exit; returns the status, or nil (and kills) after `timeout`.
    func wait(timeout: Duration = .seconds(10)) -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning && ContinuousClock.now < deadline { usleep(10_000) }
        if process.isRunning {
            process.terminate()
            return nil
        }
        return process.terminationStatus
    }

    deinit { if process.isRunning { kill(pid, SIGKILL) } }
}

/// Lines from a pipe, with deadlines.
final class LineReader {
    let pipe = Pipe()
    private var buffer = Data()

    func line(timeout: Duration) -> String? {
        let deadline = ContinuousClock.now + timeout
        let fd = pipe.fileHandleForReading.fileDescriptor
        while true {
            if let nl = buffer.firstIndex(of: 10) {
                let line = String(decoding: buffer[buffer.startIndex..<nl], as: UTF8.self)
                buffer.removeSubrange(buffer.startIndex...nl)
                return line
            }
            let left = deadline - ContinuousClock.now
            guard left > .zero else { return nil }
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, Int32(clamping: max(1, left.saturatingMicroseconds / 1000))) == 1 else { return nil }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 { return nil }
            buffer.append(contentsOf: chunk[..<n])
        }
    }

    func line(matching match: (String) -> Bool, timeout: Duration) -> String? {
        let deadline = ContinuousClock.now + timeout
        while let l = line(timeout: deadline - ContinuousClock.now) {
            if match(l) { return l }
        }
        return nil
    }
}

/// The namespace a process is in (`net:[4026531840]`), or nil once it is gone.
private func namespace(_ kind: String, of pid: String) -> String? {
    var buffer = [CChar](repeating: 0, count: 64)
    let n = readlink("/proc/\(pid)/ns/\(kind)", &buffer, buffer.count - 1)
    return n > 0 ? String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : nil
}

/// `nsenter -t pid <flags> <command>`, but only into namespaces the child has
/// already left ours for. `unshare -n x` is a process that is still in our
/// namespaces for a moment after it starts: an `ip link add` sent then would
/// change this machine's own network. So this waits (bounded) until each
/// namespace named by `flags` (`-n` net, `-m` mnt, `-U` user) differs from
/// ours; if it never does, it records an issue and gives a command that fails
/// without doing anything.
func nsenter(_ pid: Int32, _ flags: String, _ command: String,
             timeout: Duration = .seconds(10), sourceLocation: SourceLocation = #_sourceLocation) -> String {
    let kinds = flags.split(separator: " ").compactMap { ["-n": "net", "-m": "mnt", "-U": "user"][String($0)] }
    let deadline = ContinuousClock.now + timeout
    for kind in kinds {
        guard let ours = namespace(kind, of: "self") else { continue }
        while true {
            guard let theirs = namespace(kind, of: String(pid)) else {
                Issue.record("process \(pid) is gone before entering its \(kind) namespace", sourceLocation: sourceLocation)
                return "false"
            }
            if theirs != ours { break }
            if ContinuousClock.now >= deadline {
                Issue.record("process \(pid) still shares our \(kind) namespace after \(timeout); not entering it", sourceLocation: sourceLocation)
                return "false"
            }
            usleep(1_000)
        }
    }
    return "nsenter -t \(pid) \(flags) \(command)"
}

extension SystemdTests {
    @Suite struct TestNamespaces {
        /// The guard holds: our own PID never leaves our namespaces, so
        /// nothing is entered and the issue says why.
        @Test func nsenterRefusesAProcessStillInOurNamespaces() {
            withKnownIssue {
                #expect(nsenter(getpid(), "-n", "ip link add veth9 type dummy", timeout: .milliseconds(50)) == "false")
            }
        }
    }
}
