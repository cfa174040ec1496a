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
final class LogSink: Sendable {
    let records = Mutex<[LogRecord]>([])
    var logger: Logger { Logger(level: .debug, handler: LogHandler { r in self.records.withLock { $0.append(r) } }) }
    func messages(_ level: LogLevel) -> [String] { records.withLock { $0.filter { $0.level == level }.map(\.message) } }
}

@Suite struct TranscriptRecorderTests {
    @Test func sizeLimitStopsRecordingWithOneNoticeAndTheRunGoesOn() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/t.jsonl"
        let log = LogSink()
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

    @Test func existingFileIsTruncatedAndMadePrivate() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/t.jsonl"
        try writeFile(path, String(repeating: "old\n", count: 1000))
        chmod(path, 0o644)
        let recorder = TranscriptRecorder<Echo>(path: path, logger: LogSink().logger)
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
        let log = LogSink()
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
        let log = LogSink()
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
