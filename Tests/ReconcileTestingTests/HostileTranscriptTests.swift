import Foundation
import Reconcile
import ReconcileTesting
import Testing

/// Transcripts a user hands the program, built to break it (issue 19,
/// items 1–4): each is a one-line error naming the line, never a trap, a
/// hang or an unbounded allocation.
@Suite struct HostileTranscriptTests {
    static let header = #"{"type":"header","format":"reconcile-transcript","version":1,"program":"P","started_at":"","started_at_us":0}"#

    /// The error reading `lines` after the header gives (nil: none).
    func error(_ lines: [String]) -> TranscriptError? {
        let text = ([Self.header] + lines).joined(separator: "\n") + "\n"
        do { _ = try Transcript(data: Data(text.utf8)); return nil } catch { return error }
    }

    /// The reason the parser gives for line 2 holding `{"v": value}`, or
    /// nil when it is accepted.
    func rejection(_ value: String) -> String? {
        guard case .badLine(line: 2, let reason)? = error([#"{"type":"diagnostic","v":"# + value + "}"]) else { return nil }
        return reason
    }

    /// The value line 2's `v` reads as, when accepted.
    func accepted(_ value: String) throws -> JSONValue? {
        let text = Self.header + "\n" + #"{"type":"diagnostic","v":"# + value + "}\n"
        return try Transcript(data: Data(text.utf8)).lines.first?.value["v"]
    }

    /// Item 1: a high surrogate followed by a `\u` escape that is not a low
    /// one was a trap on arithmetic overflow; in the header too.
    @Test func aBadSurrogatePairIsAnErrorNotATrap() throws {
        #expect(rejection(#""\uD800\u0041""#)?.contains("high surrogate without a low one") == true)
        #expect(rejection(#""\uD800\uFFFF""#)?.contains("high surrogate without a low one") == true)
        #expect(rejection(#""\uD800x""#)?.contains("high surrogate without a low one") == true)
        #expect(rejection(#""\uDC00""#)?.contains("lone low surrogate") == true)
        let badHeader = Self.header.replacingOccurrences(of: #""program":"P""#, with: #""program":"\uD800\u0041""#)
        #expect(throws: TranscriptError.notATranscript("line 1 is not a JSON object")) {
            try Transcript(data: Data((badHeader + "\n").utf8))
        }
        // A real pair still reads.
        #expect(try accepted(#""\uD83D\uDE00""#) == .string("😀"))
    }

    /// Item 2: what RFC 8259 does not allow is refused: leading zeros, a
    /// fraction without digits, numbers that overflow to infinity, invalid
    /// UTF-8, duplicate keys (in the header too).
    @Test func numbersStringsAndKeysAreRFC8259Strict() throws {
        for bad in ["01", "-01", "00", "1.e5", "1.", ".5", "-", "1e", "1e+", "+1", "1e999", "-1e999", "0x10", "Infinity", "NaN"] {
            #expect(rejection(bad) != nil, "\(bad)")
        }
        #expect(rejection("1e999")?.contains("number out of range") == true)
        #expect(try accepted("0") == .int(0))
        #expect(try accepted("-0") == .int(0))
        #expect(try accepted("-9223372036854775808") == .int(.min))
        #expect(try accepted("18446744073709551615") == .uint(.max))
        #expect(try accepted("1.5e3") == .double(1500))
        #expect(try accepted("1E-2") == .double(0.01))
        #expect(try accepted("123456789012345678901234567890") == .double(Double("123456789012345678901234567890")!))
        // Invalid UTF-8 (a lone continuation byte, an overlong form, a
        // surrogate encoded directly) is refused, not replaced.
        for bytes: [UInt8] in [[0x80], [0xC0, 0xAF], [0xED, 0xA0, 0x80], [0xFF]] {
            var line = Array((Self.header + "\n" + #"{"type":"diagnostic","v":""#).utf8)
            line += bytes + Array("\"}\n".utf8)
            do {
                _ = try Transcript(data: Data(line))
                Issue.record("accepted \(bytes)")
            } catch {
                #expect(error == .badLine(line: 2, reason: "not JSON (invalid UTF-8 in string at byte 25)"))
            }
        }
        #expect(rejection(#"{"a":1,"a":2}"#)?.contains("duplicate key \"a\"") == true)
        let twice = Self.header.replacingOccurrences(of: #""program":"P""#, with: #""program":"P","program":"Q""#)
        #expect(throws: TranscriptError.notATranscript("line 1 is not a JSON object")) {
            try Transcript(data: Data((twice + "\n").utf8))
        }
        // Nesting is bounded.
        let deep = String(repeating: "[", count: 200) + String(repeating: "]", count: 200)
        #expect(rejection(deep)?.contains("nested deeper than") == true)
        let fine = String(repeating: "[", count: 100) + String(repeating: "]", count: 100)
        #expect(rejection(fine) == nil)
    }

    /// Item 3: a plan record without an integer round made replay spin for
    /// ever; it is an error naming the line, and the replay ends (bounded).
    @Test func aPlanWithoutAnIntegerRoundIsAnErrorAndReplayEnds() async throws {
        #expect(error([#"{"type":"plan"}"#]) == .badLine(line: 2, reason: "a plan record needs an integer round"))
        #expect(error([#"{"type":"start","time_us":0,"commands":[]}"#, #"{"type":"plan","round":"1"}"#])
            == .badLine(line: 3, reason: "a plan record needs an integer round"))
        #expect(error([#"{"type":"plan","round":1.5}"#]) == .badLine(line: 2, reason: "a plan record needs an integer round"))
    }

    /// Item 4: a sparse 64 GiB file is refused by its size before anything
    /// is read or reserved; a file over a given limit likewise.
    @Test func aHugeSparseFileIsRefusedBeforeItIsRead() throws {
        let dir = NSTemporaryDirectory() + "hostile-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/sparse.jsonl"
        let fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
        #expect(fd >= 0)
        #expect(ftruncate(fd, 64 << 30) == 0)
        close(fd)
        #expect(throws: TranscriptError.unreadable(path, reason: "too large (\(Int64(64) << 30) bytes, at most \(Transcript.defaultSizeLimit) bytes)")) {
            try Transcript(contentsOf: path)
        }
        let small = dir + "/small.jsonl"
        try Data((Self.header + "\n").utf8).write(to: URL(fileURLWithPath: small))
        #expect(throws: TranscriptError.unreadable(small, reason: "too large (\(Self.header.utf8.count + 1) bytes, at most 64 bytes)")) {
            try Transcript(contentsOf: small, sizeLimit: 64)
        }
        #expect(try Transcript(contentsOf: small).program == "P")
    }
}
