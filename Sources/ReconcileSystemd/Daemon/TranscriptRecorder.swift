import CSystemd
import Glibc
import Reconcile
import ReconcileTranscript
import Synchronization

/// Records a runtime's transcript to a JSON Lines file (Docs/Replay.md),
/// off the hot path.
///
/// The loop thread only encodes records into a memory buffer. Full buffers
/// (64 KiB), and whatever is pending when the loop goes idle (`flush()`, which
/// `Daemon` calls from an sd-event post source), are handed to a writer thread
/// that opens the file (mode 0600, created or truncated) and writes. The loop
/// never waits for the disk:
/// - past `sizeLimit` bytes recording stops with one notice and an `end`
///   record saying `size_limit`;
/// - a failed open or write stops recording with one error log;
/// - if more than `backlogLimit` bytes wait for the disk, recording stops
///   with one error log (`backlog`) rather than grow without bound.
/// The daemon keeps running in every case.
public final class TranscriptRecorder<P: Program> {
    /// The file written.
    public let path: String
    /// Bytes after which recording stops.
    public let sizeLimit: Int
    /// Bytes that may wait for the writer thread before recording stops.
    public let backlogLimit: Int
    /// Whether records are still being taken.
    public private(set) var isRecording = true
    /// Bytes encoded so far (header included).
    public private(set) var bytesRecorded = 0

    let encoder: TranscriptEncoder<P.Message, P.Command>
    let logger: Logger
    let shared: WriterShared
    let chunkSize = 1 << 16
    private var spare: [UInt8] = []
    private var lastTime: Duration = .zero
    private var thread: pthread_t?

    /// A recorder for programs of type `P` writing to `path`. Nothing is
    /// opened yet: the writer thread opens the file at the first hand-off.
    /// `arguments` go into the header (the command line, for replay tools).
    public init(path: String, sizeLimit: Int = 256 << 20, backlogLimit: Int = 64 << 20, arguments: [String]? = nil,
                logger: Logger = Logger()) {
        self.path = path
        self.sizeLimit = sizeLimit
        self.backlogLimit = backlogLimit
        self.logger = logger
        encoder = TranscriptEncoder(capacity: chunkSize * 2)
        shared = WriterShared(path: path, logger: logger)
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let micros = Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
        encoder.header(program: String(reflecting: P.self), startedAtMicros: micros, startedAt: rfc3339(ts), arguments: arguments)
        bytesRecorded = encoder.pendingBytes
    }

    /// Sets `runtime.transcript` to this recorder.
    public func attach(to runtime: Runtime<P>) {
        runtime.transcript = { [unowned self] in record($0) }
    }

    /// Takes one record (loop thread).
    public func record(_ record: TranscriptRecord<P.Message, P.Command>) {
        guard isRecording else { return }
        let mark = encoder.pendingBytes
        encoder.append(record)
        let added = encoder.pendingBytes - mark
        switch record {
        case .message(let m): lastTime = m.time
        case .start(let t, _), .plan(_, let t, _), .diagnostic(_, let t): lastTime = t
        }
        if bytesRecorded + added > sizeLimit {
            encoder.output.bytes.removeSubrange(mark...)
            logger.notice("transcript \(path): size limit of \(sizeLimit) bytes reached; recording stopped (the daemon keeps running)")
            finish(reason: "size_limit")
            return
        }
        bytesRecorded += added
        if encoder.pendingBytes >= chunkSize { handOff() }
    }

    /// Hands pending records to the writer thread (the loop went idle).
    public func flush() {
        guard isRecording, encoder.pendingBytes > 0 else { return }
        handOff()
    }

    /// Writes an `end` record with `reason`, hands everything to the writer
    /// and lets it finish; waits at most `timeout` for the disk.
    public func finish(reason: String = "shutdown", timeout: Duration = .seconds(2)) {
        guard isRecording else { return }
        encoder.end(reason: reason, time: lastTime)
        handOff()
        isRecording = false
        shared.close()
        if let thread {
            if !shared.waitDone(timeout: timeout) {
                logger.error("transcript \(path): the disk did not take the last records within \(timeout); some may be missing")
            } else {
                pthread_join(thread, nil)
            }
            self.thread = nil
        }
    }

    deinit { finish() }

    private func handOff() {
        let chunk = encoder.swapOutput(spare)
        switch shared.push(chunk, backlogLimit: backlogLimit) {
        case .queued(let recycled):
            spare = recycled
            if thread == nil { startThread() }
        case .stopped:
            isRecording = false
            if thread == nil { startThread() }
        case .backlog:
            logger.error("transcript \(path): the disk cannot keep up (over \(backlogLimit) bytes waiting); recording stopped (the daemon keeps running)")
            isRecording = false
            shared.close()
        }
    }

    private func startThread() {
        let context = Unmanaged.passRetained(shared).toOpaque()
        var t = pthread_t()
        let r = pthread_create(&t, nil, { ctx in
            let shared = Unmanaged<WriterShared>.fromOpaque(ctx!).takeRetainedValue()
            shared.run()
            return nil
        }, context)
        if r != 0 {
            Unmanaged<WriterShared>.fromOpaque(context).release()
            logger.error("transcript \(path): cannot start the writer thread (errno \(r)); recording stopped")
            isRecording = false
            return
        }
        thread = t
    }
}

/// What the loop and the writer thread share.
final class WriterShared: Sendable {
    enum Push { case queued(recycled: [UInt8]), stopped, backlog }

    private struct State {
        var chunks: [[UInt8]] = []
        var recycled: [[UInt8]] = []
        var queuedBytes = 0
        var closed = false
        var failed = false
    }

    let path: String
    let logger: Logger
    private let state = Mutex(State())
    private let wake = Semaphore()
    private let done = Semaphore()

    init(path: String, logger: Logger) {
        self.path = path
        self.logger = logger
    }

    /// Queues `chunk` unless writing failed (`.stopped`) or too much waits.
    func push(_ chunk: [UInt8], backlogLimit: Int) -> Push {
        let result: Push = state.withLock { s in
            if s.failed { return .stopped }
            if s.queuedBytes + chunk.count > backlogLimit { return .backlog }
            s.chunks.append(chunk)
            s.queuedBytes += chunk.count
            return .queued(recycled: s.recycled.popLast() ?? [])
        }
        if case .queued = result { wake.post() }
        return result
    }

    func close() {
        state.withLock { $0.closed = true }
        wake.post()
    }

    func waitDone(timeout: Duration) -> Bool { done.wait(timeout: timeout) }

    /// The writer thread: opens the file, then writes chunks until closed.
    func run() {
        defer { done.post() }
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0o600)
        var st = stat()
        if fd < 0 {
            fail("cannot open for writing: \(String(cString: strerror(errno)))")
        } else if fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, fchmod(fd, 0o600) != 0 {
            // An existing regular file keeps its old mode through O_CREAT: make
            // it private too (a device such as /dev/null is left alone).
            fail("cannot make it private (mode 0600): \(String(cString: strerror(errno)))")
        }
        defer { if fd >= 0 { Glibc.close(fd) } }
        var ok = fd >= 0 && !state.withLock { $0.failed }
        while true {
            let (chunks, closed): ([[UInt8]], Bool) = state.withLock { s in
                let c = s.chunks
                s.chunks = []
                return (c, s.closed)
            }
            for var chunk in chunks {
                if ok, let error = writeAll(fd, chunk) {
                    ok = false
                    fail("write failed: \(error)")
                }
                let written = chunk.count
                chunk.removeAll(keepingCapacity: true)
                let recycled = chunk
                state.withLock { s in
                    s.queuedBytes -= written
                    if s.recycled.count < 4 { s.recycled.append(recycled) }
                }
            }
            if chunks.isEmpty && closed { return }
            if chunks.isEmpty { wake.wait() }
        }
    }

    private func fail(_ reason: String) {
        let first = state.withLock { s in
            defer { s.failed = true }
            return !s.failed
        }
        if first {
            logger.error("transcript \(path): \(reason); recording stopped (the daemon keeps running)")
        }
    }

    private func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> String? {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return String(cString: strerror(errno))
            }
            offset += n
        }
        return nil
    }
}

/// A counting semaphore (`sem_t`) for the writer thread.
final class Semaphore: @unchecked Sendable {
    private let sem = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
    init() { sem_init(sem, 0, 0) }
    deinit {
        sem_destroy(sem)
        sem.deallocate()
    }
    func post() { sem_post(sem) }
    func wait() { while sem_wait(sem) != 0 && errno == EINTR {} }
    /// Waits up to `timeout`; false when it passed.
    func wait(timeout: Duration) -> Bool {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let (s, a) = timeout.components
        var nsec = Int(ts.tv_nsec) + Int(a / 1_000_000_000)
        ts.tv_sec += Int(s) + nsec / 1_000_000_000
        nsec %= 1_000_000_000
        ts.tv_nsec = nsec
        while true {
            if sem_timedwait(sem, &ts) == 0 { return true }
            if errno != EINTR { return false }
        }
    }
}

/// `2026-11-30T17:16:05.123456Z`.
func rfc3339(_ ts: timespec) -> String {
    var t = ts.tv_sec
    var tm = Glibc.tm()
    gmtime_r(&t, &tm)
    func pad(_ v: Int32, _ n: Int) -> String {
        let s = String(v)
        return String(repeating: "0", count: max(0, n - s.count)) + s
    }
    let micros = Int32(ts.tv_nsec / 1000)
    return "\(pad(tm.tm_year + 1900, 4))-\(pad(tm.tm_mon + 1, 2))-\(pad(tm.tm_mday, 2))T\(pad(tm.tm_hour, 2)):\(pad(tm.tm_min, 2)):\(pad(tm.tm_sec, 2)).\(pad(micros, 6))Z"
}
