import CSystemd
import Glibc
import Reconcile
import ReconcileTranscript
import Synchronization

/// Records a runtime's transcript to a JSON Lines file (Docs/Replay.md),
/// off the hot path.
///
/// When `P.Message` and `P.Command` are `Sendable` (and the recorder is made
/// where that is known), the loop thread only appends each record's values
/// (message, origin, time, commands) to a batch; the writer thread encodes
/// them. Plans, diagnostics and messages from tasks (whose IDs are not
/// `Sendable`) are encoded on the loop thread and slotted into the batch in
/// order. Otherwise the loop thread encodes every record into a memory buffer.
/// Full batches (1,024 records) or buffers (64 KiB), and whatever is pending
/// when the loop goes idle (`flush()`, which `Daemon` calls from an sd-event
/// post source), are handed to a writer thread that opens the file (mode
/// 0600, created or truncated), encodes what is not yet encoded and writes.
/// The loop never waits for the disk:
/// - past `sizeLimit` bytes recording stops with one notice and an `end`
///   record saying `size_limit`;
/// - a failed open or write stops recording with one error log;
/// - if more than `backlogLimit` bytes wait for the disk, recording stops
///   with one error log (`backlog`) rather than grow without bound (records
///   not yet encoded count as `TranscriptRecorder.estimatedRecordBytes` each).
/// The daemon keeps running in every case.
public final class TranscriptRecorder<P: Program> {
    /// The file written.
    public let path: String
    /// Bytes after which recording stops.
    public let sizeLimit: Int
    /// Bytes that may wait for the writer thread before recording stops.
    public let backlogLimit: Int
    /// Whether records are still being taken. With encoding on the writer
    /// thread, a size limit or write error it meets shows here at the next
    /// record or `flush()`.
    public var isRecording: Bool {
        if recording && shared.hasStopped { recording = false }
        return recording
    }
    /// Bytes encoded so far (header included); with encoding on the writer
    /// thread, those it has encoded.
    public var bytesRecorded: Int { offLoop ? shared.encodedBytes : loopBytes }
    /// Whether the writer thread encodes messages (`Sendable` types).
    public let encodesOffLoop: Bool
    /// What a record not yet encoded counts for the backlog limit.
    public static var estimatedRecordBytes: Int { 128 }

    /// Records not yet handed over (off-loop mode): `fast.count` of them
    /// at `pending`, room for `batchSize`; `fast.open` is `recording`.
    /// Manually allocated so the specialised message path pays no
    /// exclusivity checks or array growth.
    @usableFromInline let pending: UnsafeMutablePointer<TranscriptRecord<P.Message, P.Command>>
    @usableFromInline let fast: UnsafeMutablePointer<(count: Int, open: Bool)>
    private var recording: Bool {
        get { fast.pointee.open }
        set { fast.pointee.open = newValue }
    }
    private var loopBytes = 0
    private var offLoop: Bool { encodesOffLoop }
    /// Loop-encoded lines (off-loop mode) to slot in before the pending
    /// record at each position.
    private var inserts: [(at: Int, bytes: [UInt8], time: Duration)] = []
    /// The header line, handed over with the first batch (off-loop mode).
    private var header: [UInt8]?
    @usableFromInline let batchSize = 1024

    let encoder: TranscriptEncoder<P.Message, P.Command>
    let logger: DaemonLogger
    let shared: WriterShared
    let chunkSize = 1 << 16
    private var spare: [UInt8] = []
    private var lastTime: Duration = .zero
    private var thread: pthread_t?

    /// A recorder for programs of type `P` writing to `path`. Nothing is
    /// opened yet: the writer thread opens the file at the first hand-off.
    /// `arguments` go into the header (the command line, for replay tools).
    public convenience init(path: String, sizeLimit: Int = 256 << 20, backlogLimit: Int = 64 << 20, arguments: [String]? = nil,
                            logger: DaemonLogger = DaemonLogger()) {
        self.init(path: path, sizeLimit: sizeLimit, backlogLimit: backlogLimit, arguments: arguments, logger: logger, writer: nil)
    }

    init(path: String, sizeLimit: Int, backlogLimit: Int, arguments: [String]?, logger: DaemonLogger, writer: BatchEncoding?) {
        encodesOffLoop = writer != nil
        pending = .allocate(capacity: 1024)
        fast = .allocate(capacity: 1)
        fast.initialize(to: (count: 0, open: true))
        self.path = path
        self.sizeLimit = sizeLimit
        self.backlogLimit = backlogLimit
        self.logger = logger
        encoder = TranscriptEncoder(capacity: chunkSize * 2)
        shared = WriterShared(path: path, logger: logger, sizeLimit: sizeLimit, batchEncoder: writer)
        let micros = wallClockMicroseconds()
        encoder.header(program: String(reflecting: P.self), startedAtMicros: micros, startedAt: Timestamp.rfc3339(micros: micros), arguments: arguments)
        loopBytes = encoder.pendingBytes
        if writer != nil {
            header = encoder.swapOutput([])
        }
    }

    /// Sets `runtime.transcript` (and, when the writer thread encodes,
    /// `runtime.transcriptMessage`) to this recorder.
    @inlinable public func attach(to runtime: Runtime<P>) {
        runtime.transcript = { [unowned self] in record($0) }
        if encodesOffLoop {
            // A strong capture (the recorder holds no runtime: no cycle), so
            // a call pays no unowned-to-strong retain and release.
            runtime.transcriptMessage = { self.recordMessage($0, $1, $2, $3, $4, $5) }
        }
    }

    /// Takes one message record (loop thread; off-loop mode): appends it to
    /// the pending batch. Inlinable, so it is specialised for `P`.
    @inlinable public func recordMessage(_ index: Int, _ message: P.Message, _ origin: MessageOrigin, _ time: Duration,
                                         _ round: Int, _ commands: [P.Command]) {
        let f = fast
        guard f.pointee.open else { return }
        if case .task = origin {
            record(.message(TranscriptMessage(index: index, message: message, origin: origin, time: time, round: round, commands: commands)))
            return
        }
        let n = f.pointee.count
        (pending + n).initialize(to: .message(TranscriptMessage(index: index, message: message, origin: origin, time: time,
                                                                round: round, commands: commands)))
        f.pointee.count = n &+ 1
        if n &+ 1 == batchSize { handOffBatch() }
    }

    /// Takes one record (loop thread).
    public func record(_ record: TranscriptRecord<P.Message, P.Command>) {
        if offLoop {
            guard recording else { return }
            switch record {
            case .message(let m):
                if case .task = m.origin { break }
                (pending + fast.pointee.count).initialize(to: record)
                fast.pointee.count += 1
                if fast.pointee.count == batchSize { handOffBatch() }
                return
            case .start:
                (pending + fast.pointee.count).initialize(to: record)
                fast.pointee.count += 1
                if fast.pointee.count == batchSize { handOffBatch() }
                return
            default: break
            }
            // Not Sendable (plans, diagnostics, task IDs): encoded here, in order.
            let time: Duration
            switch record {
            case .message(let m): time = m.time
            case .start(let t, _), .plan(_, let t, _), .diagnostic(_, let t): time = t
            }
            encoder.append(record)
            inserts.append((at: fast.pointee.count, bytes: encoder.swapOutput([]), time: time))
            return
        }
        guard isRecording else { return }
        let mark = encoder.pendingBytes
        encoder.append(record)
        let added = encoder.pendingBytes - mark
        switch record {
        case .message(let m): lastTime = m.time
        case .start(let t, _), .plan(_, let t, _), .diagnostic(_, let t): lastTime = t
        }
        if loopBytes + added > sizeLimit {
            encoder.output.bytes.removeSubrange(mark...)
            logger.notice("transcript \(path): size limit of \(sizeLimit) bytes reached; recording stopped (the daemon keeps running)")
            // Hand the end over and let the writer finish on its own: the
            // loop never waits for the disk (the writer is joined at shutdown).
            encoder.end(reason: "size_limit", time: lastTime)
            handOff()
            recording = false
            shared.close()
            return
        }
        loopBytes += added
        if encoder.pendingBytes >= chunkSize { handOff() }
    }

    /// Hands pending records to the writer thread (the loop went idle).
    public func flush() {
        if offLoop {
            guard isRecording, fast.pointee.count > 0 || !inserts.isEmpty else { return }
            handOffBatch()
            return
        }
        guard isRecording, encoder.pendingBytes > 0 else { return }
        handOff()
    }

    /// Writes an `end` record with `reason`, hands everything to the writer
    /// and lets it finish; waits at most `timeout` for the disk.
    public func finish(reason: String = "shutdown", timeout: Duration = .seconds(2)) {
        guard isRecording else {
            shared.close()
            joinWriter(timeout: timeout)
            return
        }
        if offLoop {
            handOffBatch(end: reason)
        } else {
            encoder.end(reason: reason, time: lastTime)
            handOff()
        }
        recording = false
        shared.close()
        joinWriter(timeout: timeout)
    }

    private func joinWriter(timeout: Duration) {
        if let thread {
            if !shared.waitDone(timeout: timeout) {
                logger.error("transcript \(path): the disk did not take the last records within \(timeout); some may be missing")
                pthread_detach(thread)   // it ends by itself once the disk answers
            } else {
                pthread_join(thread, nil)
            }
            self.thread = nil
        }
    }

    deinit {
        finish()
        pending.deinitialize(count: fast.pointee.count)
        pending.deallocate()
        fast.deallocate()
    }

    /// Hands the pending records (and an `end` record with `end`) to the writer.
    @usableFromInline func handOffBatch(end: String? = nil) {
        if let header {
            self.header = nil
            inserts.insert((at: 0, bytes: header, time: .zero), at: 0)
        }
        let n = fast.pointee.count
        // Not `Array(unsafeUninitializedCapacity: 0)`: with no capacity it
        // hands out the runtime's shared empty-array storage and then writes
        // the count (0) into it — a store to a global every other thread
        // reads, which ThreadSanitizer rightly reports as a race.
        let records: [TranscriptRecord<P.Message, P.Command>] = n == 0 ? [] : .init(unsafeUninitializedCapacity: n) { buffer, count in
            buffer.baseAddress!.moveInitialize(from: pending, count: n)
            count = n
        }
        fast.pointee.count = 0
        let box = RecordBatch(records: records, inserts: inserts, end: end)
        inserts = []
        let estimate = box.records.count * Self.estimatedRecordBytes + box.inserts.reduce(0) { $0 + $1.bytes.count }
        _ = pushed(shared.push(.batch(box), bytes: estimate, backlogLimit: backlogLimit))
    }

    private func handOff() {
        let chunk = encoder.swapOutput(spare)
        if let recycled = pushed(shared.push(.bytes(chunk), bytes: chunk.count, backlogLimit: backlogLimit)) {
            spare = recycled
        }
    }

    /// Acts on the writer's answer to a hand-off; returns the buffer it gave
    /// back for reuse when it took the chunk.
    private func pushed(_ result: WriterShared.Push) -> [UInt8]? {
        switch result {
        case .queued(let recycled):
            if thread == nil { startThread() }
            return recycled
        case .stopped:
            recording = false
            if thread == nil { startThread() }
        case .backlog:
            logger.error("transcript \(path): the disk cannot keep up (over \(backlogLimit) bytes waiting); recording stopped (the daemon keeps running)")
            recording = false
            shared.close()
        }
        return nil
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
            recording = false
            return
        }
        thread = t
    }
}

extension TranscriptRecorder where P.Message: Sendable, P.Command: Sendable {
    /// A recorder for programs of type `P` writing to `path`, whose writer
    /// thread encodes the messages and commands (they are `Sendable`): the
    /// loop thread only appends each record to a batch. Nothing is opened yet.
    public convenience init(path: String, sizeLimit: Int = 256 << 20, backlogLimit: Int = 64 << 20, arguments: [String]? = nil,
                            logger: DaemonLogger = DaemonLogger()) {
        self.init(path: path, sizeLimit: sizeLimit, backlogLimit: backlogLimit, arguments: arguments, logger: logger,
                  writer: RecordBatchEncoder<P.Message, P.Command>())
    }
}

/// Records handed from the loop to the writer thread, with the lines the
/// loop encoded itself slotted in before the record at each `at`, and the
/// `end` record's reason when it is the last batch.
final class RecordBatch<Message, Command>: @unchecked Sendable {
    // Unchecked: built on the loop thread and not touched there after the
    // hand-off; the records' Message and Command are Sendable (see the
    // constrained TranscriptRecorder.init), and the rest is loop-encoded.
    let records: [TranscriptRecord<Message, Command>]
    let inserts: [(at: Int, bytes: [UInt8], time: Duration)]
    let end: String?
    init(records: [TranscriptRecord<Message, Command>], inserts: [(at: Int, bytes: [UInt8], time: Duration)], end: String?) {
        self.records = records
        self.inserts = inserts
        self.end = end
    }
}

/// Encodes batches on the writer thread (only there, after `start`).
class BatchEncoding: @unchecked Sendable {
    // Unchecked: `encode` runs only on the writer thread.
    /// Bytes encoded so far (header included).
    var bytes = 0
    /// Appends `batch` to `out`; false when `sizeLimit` was reached (then
    /// `out` ends with an `end` record saying `size_limit`).
    func encode(_ batch: AnyObject, into out: inout [UInt8], sizeLimit: Int) -> Bool { fatalError("abstract") }
}

final class RecordBatchEncoder<Message, Command>: BatchEncoding, @unchecked Sendable {
    let encoder = TranscriptEncoder<Message, Command>(capacity: 1 << 17)
    var lastTime: Duration = .zero

    override func encode(_ object: AnyObject, into out: inout [UInt8], sizeLimit: Int) -> Bool {
        let batch = unsafeDowncast(object, to: RecordBatch<Message, Command>.self)
        encoder.output.bytes = out
        defer { out = encoder.swapOutput([]) }
        var next = 0
        var i = 0
        while i <= batch.records.count {
            while next < batch.inserts.count && batch.inserts[next].at == i {
                let insert = batch.inserts[next]
                next += 1
                // The first line (the header) is kept whatever the limit, as
                // when the loop encodes: the file stays a transcript.
                if bytes > 0 && bytes + insert.bytes.count > sizeLimit { return stop() }
                encoder.output.bytes.append(contentsOf: insert.bytes)
                bytes += insert.bytes.count
                lastTime = insert.time
            }
            if i == batch.records.count { break }
            let record = batch.records[i]
            let mark = encoder.pendingBytes
            encoder.append(record)
            let added = encoder.pendingBytes - mark
            if bytes + added > sizeLimit {
                encoder.output.bytes.removeSubrange(mark...)
                return stop()
            }
            bytes += added
            switch record {
            case .message(let m): lastTime = m.time
            case .start(let t, _), .plan(_, let t, _), .diagnostic(_, let t): lastTime = t
            }
            i += 1
        }
        if let end = batch.end { encoder.end(reason: end, time: lastTime) }
        return true
    }

    private func stop() -> Bool {
        encoder.end(reason: "size_limit", time: lastTime)
        return false
    }
}

/// What the loop and the writer thread share.
final class WriterShared: Sendable {
    enum Push { case queued(recycled: [UInt8]), stopped, backlog }
    /// Encoded lines, or a batch of records the writer encodes.
    enum Chunk: @unchecked Sendable {
        // Unchecked: a batch is RecordBatch, itself @unchecked Sendable.
        case bytes([UInt8])
        case batch(AnyObject)
    }

    private struct State {
        var chunks: [(Chunk, Int)] = []
        var recycled: [[UInt8]] = []
        var queuedBytes = 0
        var closed = false
        var failed = false
    }

    let path: String
    let logger: DaemonLogger
    let sizeLimit: Int
    let batchEncoder: BatchEncoding?
    private let state = Mutex(State())
    private let wake = Semaphore()
    private let done = Semaphore()
    private let stopped = Atomic<Bool>(false)
    private let encoded = Atomic<Int>(0)

    init(path: String, logger: DaemonLogger, sizeLimit: Int = .max, batchEncoder: BatchEncoding? = nil) {
        self.path = path
        self.logger = logger
        self.sizeLimit = sizeLimit
        self.batchEncoder = batchEncoder
    }

    /// Whether the writer stopped (size limit, open or write error).
    var hasStopped: Bool { stopped.load(ordering: .relaxed) }
    /// Bytes the writer thread encoded (header included).
    var encodedBytes: Int { encoded.load(ordering: .relaxed) }

    /// Queues `chunk` (counted as `bytes`) unless writing stopped (`.stopped`) or too much waits.
    func push(_ chunk: Chunk, bytes: Int, backlogLimit: Int) -> Push {
        let result: Push = state.withLock { s in
            if s.failed { return .stopped }
            if s.queuedBytes + bytes > backlogLimit { return .backlog }
            s.chunks.append((chunk, bytes))
            s.queuedBytes += bytes
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
        var scratch: [UInt8] = []
        while true {
            let (chunks, closed): ([(Chunk, Int)], Bool) = state.withLock { s in
                let c = s.chunks
                s.chunks = []
                return (c, s.closed)
            }
            for (chunk, counted) in chunks {
                var bytes: [UInt8]
                var recycle = true
                switch chunk {
                case .bytes(let b): bytes = b
                case .batch(let batch):
                    recycle = false
                    scratch.removeAll(keepingCapacity: true)
                    bytes = scratch
                    scratch = []
                    if ok, let encoder = batchEncoder {
                        if !encoder.encode(batch, into: &bytes, sizeLimit: sizeLimit) {
                            logger.notice("transcript \(path): size limit of \(sizeLimit) bytes reached; recording stopped (the daemon keeps running)")
                            if let error = writeAll(fd, bytes) { fail("write failed: \(error)") } else { stop() }
                            ok = false
                            bytes.removeAll(keepingCapacity: true)
                        }
                        encoded.store(encoder.bytes, ordering: .relaxed)
                    }
                }
                if ok, let error = writeAll(fd, bytes) {
                    ok = false
                    fail("write failed: \(error)")
                }
                bytes.removeAll(keepingCapacity: true)
                let recycled = bytes
                if !recycle { scratch = recycled }
                state.withLock { s in
                    s.queuedBytes -= counted
                    if recycle && s.recycled.count < 4 { s.recycled.append(recycled) }
                }
            }
            if chunks.isEmpty && closed { return }
            if chunks.isEmpty { wake.wait() }
        }
    }

    /// Stops taking chunks without an error (the size limit).
    private func stop() {
        state.withLock { $0.failed = true }
        stopped.store(true, ordering: .relaxed)
    }

    private func fail(_ reason: String) {
        let first = state.withLock { s in
            defer { s.failed = true }
            return !s.failed
        }
        stopped.store(true, ordering: .relaxed)
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
    /// Waits up to `timeout` (through the checked conversion; the deadline
    /// is on the realtime clock, as `sem_timedwait` takes it); false when it
    /// passed.
    func wait(timeout: Duration) -> Bool {
        let deadline = usecAdd(clockMicroseconds(CLOCK_REALTIME), usec(timeout))
        var ts = timespec()
        ts.tv_sec = Int(clamping: deadline / 1_000_000)
        ts.tv_nsec = Int(deadline % 1_000_000) * 1000
        while true {
            if sem_timedwait(sem, &ts) == 0 { return true }
            if errno != EINTR { return false }
        }
    }
}
