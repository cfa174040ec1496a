import Foundation
import Reconcile
import ReconcileTesting
import ReconcileTranscript
import Testing

/// A value exercising what synthesized `Codable` produces: nested enums with
/// associated values, optionals, arrays, dictionaries, every number type,
/// strings that need escaping.
struct Sample: Codable, Equatable {
    enum Kind: Codable, Equatable { case plain, tagged(String, count: Int), nested(Inner?) }
    struct Inner: Codable, Equatable { var values: [Int64]; var flag: Bool }
    var text: String
    var kinds: [Kind]
    var table: [String: Double]
    var byNumber: [Int: String]
    var i8: Int8
    var u16: UInt16
    var u64: UInt64
    var f: Float
    var missing: String?
    var empty: [String]
}

@Suite struct TranscriptTests {
    @Test func streamingEncoderOutputDecodesWithJSONDecoder() throws {
        let value = Sample(
            text: "quote \" backslash \\ newline \n tab \t bell \u{7} é 😀",
            kinds: [.plain, .tagged("t", count: -3), .nested(Sample.Inner(values: [Int64.min, 0, Int64.max], flag: true)), .nested(nil)],
            table: ["a": 0.1, "b": -2.5e-8, "c": 1e300], byNumber: [3: "three", -1: "minus"],
            i8: -128, u16: 65535, u64: UInt64.max, f: 0.1, missing: nil, empty: [])
        let encoder = StreamingJSONEncoder()
        try encoder.encode(value)
        let decoded = try JSONDecoder().decode(Sample.self, from: Data(encoder.out.bytes))
        #expect(decoded == value)
        #expect(!encoder.out.text.contains("missing"))
    }

    @Test func nonFiniteNumberIsRecordedAsAnErrorNotALostLine() throws {
        struct Reading: Program {
            enum Message: Codable { case value(Double) }
            func start() -> (Int, [Never]) { (0, []) }
            func update(_ model: inout Int, _ message: Message) -> [Never] { [] }
        }
        let runtime = Runtime(Reading(), driver: VirtualDriver())
        let buffer = TranscriptBuffer<Reading>()
        buffer.attach(to: runtime)
        try runtime.start()
        try runtime.send(.value(.nan))
        try runtime.send(.value(1.5))
        let messages = try Transcript(data: buffer.data).lines.filter { $0.type == "message" }
        #expect(messages.count == 2)
        #expect(messages[0].value["message"] == nil)
        #expect(messages[0].value["message_kind"]?.string == "value")
        #expect(messages[0].value["message_error"]?.string?.contains("nan") == true)
        #expect(messages[1].value["message"]?.description == "{\"value\":{\"_0\":1.5}}")
        #expect(throws: TranscriptError.notReplayable(index: 0, reason: "recorded without payload (\(messages[0].value["message_error"]!.string!))")) {
            try Replay.run(Reading(), try Transcript(data: buffer.data))
        }
    }

    @Test func messageThatIsNotCodableIsRecordedAsItsKindOnly() throws {
        final class Handle {}
        struct Opaque: Program {
            enum Message { case opened(Handle), closed }
            func start() -> (Int, [Never]) { (0, []) }
            func update(_ model: inout Int, _ message: Message) -> [Never] { [] }
        }
        let runtime = Runtime(Opaque(), driver: VirtualDriver())
        let buffer = TranscriptBuffer<Opaque>()
        buffer.attach(to: runtime)
        try runtime.start()
        try runtime.send(.opened(Handle()))
        try runtime.send(.closed)
        let messages = try Transcript(data: buffer.data).lines.filter { $0.type == "message" }
        #expect(messages.map { $0.value["message_kind"]?.string } == ["opened", "closed"])
        #expect(messages.allSatisfy { $0.value["message"] == nil && $0.value["commands"] == .array([]) })
    }

    @Test func readingErrorsAreOneLineEach() throws {
        let header = #"{"type":"header","format":"reconcile-transcript","version":1,"program":"P","started_at":"","started_at_us":0}"#
        func error(_ text: String, lineLimit: Int = Transcript.defaultLineLimit) -> TranscriptError? {
            do { _ = try Transcript(data: Data(text.utf8), lineLimit: lineLimit); return nil } catch { return error }
        }
        #expect(error("") == .empty)
        #expect(error("\u{0}\u{1}\u{2}garbage\n") == .notATranscript("line 1 is not a JSON object"))
        #expect(error("{\"type\":\"other\"}\n") == .notATranscript("line 1 is not a reconcile-transcript header"))
        #expect(error(String(header.prefix(30))) == .notATranscript("the first line is incomplete"))
        #expect(error(header.replacingOccurrences(of: "\"version\":1", with: "\"version\":2") + "\n") == .unsupportedVersion(2))
        #expect(error(header + "\n" + String(repeating: "y", count: 300) + "\n", lineLimit: 200) == .lineTooLong(line: 2, limit: 200))
        #expect(error(header + "\n{\"type\":\"mystery\"}\n") == .badLine(line: 2, reason: "unknown record type \"mystery\""))
        #expect(error(header + "\n{\"type\":\"plan\",\n") == .badLine(line: 2, reason: "not JSON (expected a key at byte 15)"))
        // A truncated last record is left out, not an error.
        let t = try Transcript(data: Data((header + "\n{\"type\":\"start\",\"time_us\":0,\"commands\":[]}\n{\"type\":\"mess").utf8))
        #expect(t.truncatedTail && t.lines.count == 1)
        for e in [TranscriptError.empty, .unsupportedVersion(2), .lineTooLong(line: 2, limit: 64)] {
            #expect(!"\(e)".contains("\n"))
        }
    }

    /// A transcript path that is missing, a directory or a FIFO is a
    /// one-line error with the system's reason; a FIFO is never waited on.
    @Test func unreadablePathsAreErrorsAndAFIFOIsNotWaitedOn() throws {
        let dir = NSTemporaryDirectory() + "transcript-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        func error(_ path: String) -> TranscriptError? {
            do { _ = try Transcript(contentsOf: path); return nil } catch { return error }
        }
        #expect(error(dir + "/missing") == .unreadable(dir + "/missing", reason: "No such file or directory"))
        #expect(error(dir) == .unreadable(dir, reason: "Is a directory"))
        #expect(mkfifo(dir + "/fifo", 0o600) == 0)
        #expect(error(dir + "/fifo") == .unreadable(dir + "/fifo", reason: "not a regular file"))
    }
}
