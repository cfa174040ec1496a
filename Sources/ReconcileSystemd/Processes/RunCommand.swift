import CSystemd
import Glibc
import Reconcile
import Synchronization

/// What a command run to completion (`ProcessRun.run`) came to.
public struct ProcessResult: Equatable, Sendable {
    /// The exit status; nil when it was killed by a signal.
    public var status: Int32?
    /// The signal that killed it; nil when it exited.
    public var signal: Int32?
    /// Its standard output (at most the limit).
    public var stdout: [UInt8]
    /// Its standard error (at most the limit).
    public var stderr: [UInt8]
    /// Whether either stream was longer than the limit (the rest was read and dropped).
    public var truncated: Bool

    /// The standard output's lines (a last line without a newline included).
    public var lines: [String] {
        var text = String(decoding: stdout, as: UTF8.self)
        if text.hasSuffix("\n") { text.removeLast() }
        return text.isEmpty ? [] : text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }
}

/// A command run to completion with its output collected: an owned task
/// (`tasks.run(id:) { try await ProcessRun.run([...]) }`), for one-off work
/// where a `Subscription.process` would be too much.
public enum ProcessRun {
    /// Runs `arguments` as a child (the same spawn as `ProcessSource`: stdin
    /// `/dev/null`, no stray descriptor, a process group of its own) and
    /// returns its status and output once it has exited and been reaped.
    /// Cancelling the task sends SIGTERM to its process group, then SIGKILL
    /// after `grace`. The waiting is done by a thread of its own, never by
    /// the loop; it reaps only this child (`waitpid(pid)`).
    ///
    /// - Parameters:
    ///   - arguments: the program (searched in `PATH` without a slash) and its arguments.
    ///   - environment: `NAME=value` strings; nil: this process's environment.
    ///   - directory: the working directory; nil: this process's.
    ///   - outputLimit: the bytes kept of each stream.
    ///   - grace: the time between SIGTERM and SIGKILL when cancelled.
    /// - Returns: the exit status or signal, and the output.
    /// - Throws: `SourceFailure` when the child cannot be spawned.
    public static func run(_ arguments: [String], environment: [String]? = nil, directory: String? = nil,
                           outputLimit: Int = 1 << 20, grace: Duration = ProcessSource.defaultGrace) async throws -> ProcessResult {
        let spawned = try spawnChild(arguments, environment: environment, directory: directory)
        let waiter = Waiter(pid: spawned.pid, out: spawned.out, err: spawned.err, limit: outputLimit, grace: grace)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<ProcessResult, Never>) in
                waiter.start { continuation.resume(returning: $0) }
            }
        } onCancel: {
            waiter.cancel()
        }
    }
}

/// The thread that reads a one-off child's pipes and reaps it.
private final class Waiter: @unchecked Sendable {
    let pid: Int32
    let out: Int32
    let err: Int32
    let limit: Int
    let grace: Duration
    var done: ((ProcessResult) -> Void)?
    /// Written by `cancel` (any thread), read by the waiting thread.
    let cancelledAt = AtomicDeadline()

    init(pid: Int32, out: Int32, err: Int32, limit: Int, grace: Duration) {
        self.pid = pid
        self.out = out
        self.err = err
        self.limit = limit
        self.grace = grace
    }

    func start(_ done: @escaping (ProcessResult) -> Void) {
        self.done = done
        var thread = pthread_t()
        let r = pthread_create(&thread, nil, { arg in
            Unmanaged<Waiter>.fromOpaque(arg!).takeRetainedValue().main()
            return nil
        }, Unmanaged.passRetained(self).toOpaque())
        if r == 0 { pthread_detach(thread) } else { main() }
    }

    func cancel() {
        if cancelledAt.set() { kill(-pid, SIGTERM) }
    }

    private func main() {
        var result = ProcessResult(status: nil, signal: nil, stdout: [], stderr: [], truncated: false)
        var fds = [pollfd(fd: out, events: Int16(POLLIN), revents: 0), pollfd(fd: err, events: Int16(POLLIN), revents: 0)]
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        var exited = false
        var status: Int32 = 0
        var killed = false
        while true {
            if !exited, waitpid(pid, &status, WNOHANG) == pid { exited = true }
            if !killed, let since = cancelledAt.elapsed(), since >= grace {
                kill(-pid, SIGKILL)
                killed = true
            }
            let open = fds.filter { $0.fd >= 0 }.count
            if open == 0 && exited { break }
            if open == 0 {
                // Output closed, still running: wait for it (or the grace).
                usleep(10_000)
                continue
            }
            _ = poll(&fds, nfds_t(fds.count), exited ? 0 : 50)
            var progressed = false
            for i in fds.indices where fds[i].fd >= 0 && (fds[i].revents != 0 || exited) {
                let n = buffer.withUnsafeMutableBytes { read(fds[i].fd, $0.baseAddress, $0.count) }
                if n > 0 {
                    progressed = true
                    let room = max(0, limit - (i == 0 ? result.stdout.count : result.stderr.count))
                    if n > room { result.truncated = true }
                    if i == 0 { result.stdout += buffer[..<min(n, room)] } else { result.stderr += buffer[..<min(n, room)] }
                } else if n == 0 || (errno != EAGAIN && errno != EINTR) {
                    close(fds[i].fd)
                    fds[i].fd = -1
                }
                fds[i].revents = 0
            }
            // Exited, and what is left in the pipes is read: a grandchild
            // holding them open does not keep this waiting.
            if exited && !progressed {
                for i in fds.indices where fds[i].fd >= 0 { close(fds[i].fd); fds[i].fd = -1 }
            }
        }
        if status & 0x7f == 0 { result.status = (status >> 8) & 0xff } else { result.signal = status & 0x7f }
        done?(result)
        done = nil
    }
}

/// When a one-off run was cancelled, set once from any thread.
private final class AtomicDeadline: Sendable {
    private let at = Mutex<ContinuousClock.Instant?>(nil)

    /// Records now; false when already set.
    func set() -> Bool {
        at.withLock { at in
            guard at == nil else { return false }
            at = .now
            return true
        }
    }

    /// The time since `set`, or nil.
    func elapsed() -> Duration? { at.withLock { $0 }.map { ContinuousClock.now - $0 } }
}
