import Foundation
import Reconcile
import ReconcileSystemd
import ReconcileTesting
import Synchronization
import Testing

/// A program whose every message is a string it answers with nothing.
struct Echo: Program {
    enum Message: Codable { case text(String) }
    func start() -> (Int, [Never]) { (0, []) }
    func update(_ model: inout Int, _ message: Message) -> [Never] {
        model += 1
        return []
    }
}

/// Log records kept in memory.
final class RecordedLog: Sendable {
    let records = Mutex<[LogRecord]>([])
    var logger: DaemonLogger { DaemonLogger(level: .debug, handler: LogSink { r in self.records.withLock { $0.append(r) } }) }
    func messages(_ level: LogLevel) -> [String] { records.withLock { $0.filter { $0.level == level }.map(\.message) } }
}

/// A program whose set of timers follows its messages (plans, a duplicate
/// identity when asked) and that answers notes with a command.
struct RecordedTimers: Program {
    enum Message: Codable, Sendable { case set(Int, duplicate: Bool), note(Int), tick(Int) }
    enum Command: Codable, Sendable { case log(Int) }
    struct Model { var timers = 0; var duplicate = false }
    func start() -> (Model, [Command]) { (Model(), [.log(-1)]) }
    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .set(let n, let duplicate):
            model.timers = n
            model.duplicate = duplicate
            return []
        case .note(let i): return i % 7 == 0 ? [.log(i), .log(i + 1)] : []
        case .tick: return []
        }
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        var timers = (0..<model.timers).map { key in Subscription<Message>.every(.seconds(3600 + key), key: key) { _ in .tick(key) } }
        if model.duplicate, model.timers > 0 { timers.append(Subscription<Message>.every(.seconds(1), key: 0) { _ in .tick(0) }) }
        return Subscriptions(timers)
    }
}

@Suite struct TranscriptRecorderTests {
    /// Messages go to the writer thread as values (Sendable types), plans and
    /// diagnostics as lines encoded on the loop: the file holds exactly the
    /// lines the loop-encoding `TranscriptBuffer` writes, in the same order,
    /// across several batch hand-offs.
    @Test func writerThreadEncodingWritesTheSameLinesInOrder() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/t.jsonl"
        func run(_ attach: (Runtime<RecordedTimers>) -> Void, flush: () -> Void) throws {
            let driver = VirtualDriver()
            let runtime = Runtime(RecordedTimers(), driver: driver)
            attach(runtime)
            try runtime.start()
            for i in 0..<3_000 {
                if i % 400 == 0 { try runtime.send(.set(i / 400 % 4, duplicate: i % 1200 == 0)) }
                try runtime.send(.note(i))
                if i % 900 == 0 { driver.advance(by: .milliseconds(5)); flush() }
            }
        }
        let buffer = TranscriptBuffer<RecordedTimers>()
        try run({ buffer.attach(to: $0) }, flush: {})
        let recorder = TranscriptRecorder<RecordedTimers>(path: path, logger: RecordedLog().logger)
        #expect(recorder.encodesOffLoop)
        try run({ recorder.attach(to: $0) }, flush: { recorder.flush() })
        // What is written is the question here, not how soon: under a
        // sanitizer with the other suites running the writer took longer
        // than `finish`'s default 2 s once (the file cut short).
        recorder.finish(timeout: .seconds(60))
        let expected = String(decoding: buffer.data, as: UTF8.self).split(separator: "\n").dropFirst()
        let written = String(decoding: try Data(contentsOf: URL(fileURLWithPath: path)), as: UTF8.self).split(separator: "\n")
        #expect(written.last?.hasPrefix("{\"type\":\"end\"") == true)
        let body = written.dropFirst().dropLast()
        #expect(body.count == expected.count)
        #expect(body.filter { $0.hasPrefix("{\"type\":\"plan\"") }.count >= 5)
        #expect(body.contains { $0.contains("duplicate_identity") })
        let got = Array(body), want = Array(expected)
        let firstDifference = got.indices.first { $0 < want.count && got[$0] != want[$0] }
        #expect(firstDifference == nil, "line \(firstDifference ?? 0): \(firstDifference.map { "\(got[$0]) vs \(want[$0])" } ?? "")")
    }

    /// A size limit below the header's size keeps the header (and the
    /// `end` record) in both modes (issue 19, item 6): the file is a
    /// transcript that says `size_limit`, never an `end` record alone.
    @Test func aSizeLimitBelowTheHeaderKeepsTheHeaderInBothModes() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        func loopEncoding<Q: Program>(_ program: Q, _ path: String, _ logger: DaemonLogger) -> TranscriptRecorder<Q> {
            TranscriptRecorder<Q>(path: path, sizeLimit: 10, logger: logger)
        }
        for offLoop in [true, false] {
            let path = dir + "/t-\(offLoop).jsonl"
            let log = RecordedLog()
            let recorder = offLoop ? TranscriptRecorder<Echo>(path: path, sizeLimit: 10, logger: log.logger)
                                   : loopEncoding(Echo(), path, log.logger)
            #expect(recorder.encodesOffLoop == offLoop)
            let runtime = Runtime(Echo(), driver: VirtualDriver())
            recorder.attach(to: runtime)
            try runtime.start()
            try runtime.send(.text("over the limit"))
            recorder.flush()
            let deadline = ContinuousClock.now + .seconds(10)
            while recorder.isRecording && ContinuousClock.now < deadline { usleep(1_000) }
            #expect(!recorder.isRecording)
            recorder.finish()
            let transcript = try Transcript(contentsOf: path)
            #expect(transcript.program == String(reflecting: Echo.self), "offLoop \(offLoop)")
            #expect(transcript.endReason == "size_limit", "offLoop \(offLoop)")
            #expect(transcript.lines.map(\.type) == ["end"], "offLoop \(offLoop)")
        }
    }

    @Test func sizeLimitStopsRecordingWithOneNoticeAndTheRunGoesOn() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/t.jsonl"
        let log = RecordedLog()
        let recorder = TranscriptRecorder<Echo>(path: path, sizeLimit: 4_000, logger: log.logger)
        let runtime = Runtime(Echo(), driver: VirtualDriver())
        recorder.attach(to: runtime)
        try runtime.start()
        for i in 0..<200 { try runtime.send(.text("message number \(i)")) }
        // The writer thread encodes (Echo's messages are Sendable): it meets
        // the limit once the records are handed over.
        #expect(recorder.encodesOffLoop)
        recorder.flush()
        let deadline = ContinuousClock.now + .seconds(10)
        while recorder.isRecording && ContinuousClock.now < deadline { usleep(1_000) }
        #expect(!recorder.isRecording)
        #expect(runtime.model == 200)
        recorder.finish()
        #expect(log.messages(.notice).count == 1)
        #expect(log.messages(.notice).first?.contains("size limit of 4000 bytes reached") == true)
        let bytes = try Data(contentsOf: URL(fileURLWithPath: path))
        let transcript = try Transcript(data: bytes)
        #expect(transcript.endReason == "size_limit")
        #expect(!transcript.truncatedTail)
        #expect(bytes.count - (transcript.lines.last.map { $0.bytes.count + 1 } ?? 0) <= 4_000)
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    /// A daemon of a program with `Sendable` messages and commands gets a
    /// recorder whose writer thread encodes; made in generic code (where that
    /// is not known), the loop encodes.
    @Test func daemonOfSendableTypesEncodesOnTheWriterThread() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        var options = Daemon<Echo>.Options()
        options.recordPath = dir + "/t.jsonl"
        let daemon = try Daemon(Echo(), options: options)
        #expect(daemon.recorder?.encodesOffLoop == true)
        daemon.recorder?.finish()
        func generic<Q: Program>(_ program: Q) throws -> Bool? {
            var options = Daemon<Q>.Options()
            options.recordPath = dir + "/u.jsonl"
            let daemon = try Daemon(program, options: options)
            defer { daemon.recorder?.finish() }
            return daemon.recorder?.encodesOffLoop
        }
        #expect(try generic(Echo()) == false)
    }

    @Test func existingFileIsTruncatedAndMadePrivate() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/t.jsonl"
        try writeFile(path, String(repeating: "old\n", count: 1000))
        chmod(path, 0o644)
        let recorder = TranscriptRecorder<Echo>(path: path, logger: RecordedLog().logger)
        let runtime = Runtime(Echo(), driver: VirtualDriver())
        recorder.attach(to: runtime)
        try runtime.start()
        try runtime.send(.text("hello"))
        recorder.finish()
        let transcript = try Transcript(contentsOf: path)
        #expect(transcript.lines.map(\.type) == ["start", "message", "end"])
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    @Test func writeErrorStopsRecordingWithOneErrorLog() throws {
        let log = RecordedLog()
        // Every write to /dev/full fails with ENOSPC.
        let recorder = TranscriptRecorder<Echo>(path: "/dev/full", logger: log.logger)
        let runtime = Runtime(Echo(), driver: VirtualDriver())
        recorder.attach(to: runtime)
        try runtime.start()
        let deadline = ContinuousClock.now + .seconds(10)
        var sent = 0
        while recorder.isRecording && ContinuousClock.now < deadline {
            try runtime.send(.text(String(repeating: "x", count: 1000)))
            recorder.flush()
            sent += 1
        }
        #expect(!recorder.isRecording)
        for _ in 0..<100 { try runtime.send(.text("after")) }
        #expect(runtime.model == sent + 100)
        recorder.finish()
        let errors = log.messages(.error)
        #expect(errors.count == 1)
        #expect(errors.first?.contains("write failed: No space left on device; recording stopped") == true)
    }

    @Test func unopenablePathStopsRecordingWithOneErrorLog() throws {
        let log = RecordedLog()
        let recorder = TranscriptRecorder<Echo>(path: "/nonexistent-directory-for-reconcile/t.jsonl", logger: log.logger)
        let runtime = Runtime(Echo(), driver: VirtualDriver())
        recorder.attach(to: runtime)
        try runtime.start()
        try runtime.send(.text("one"))
        recorder.flush()
        recorder.finish()
        #expect(runtime.model == 1)
        #expect(log.messages(.error).count == 1)
        #expect(log.messages(.error).first?.contains("cannot open for writing: No such file or directory") == true)
    }
}
