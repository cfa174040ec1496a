import FoundationEssentials
import Glibc
import Reconcile
import ReconcileTranscript

/// Reading a `JSONValue` with any `Decoder`, and writing it as JSON text.
extension JSONValue: Decodable, CustomStringConvertible {
    /// Reads any JSON value.
    /// - Throws: `DecodingError` when the input is not JSON.
    public init(from decoder: any Decoder) throws {
        if var a = try? decoder.unkeyedContainer() {
            var items: [JSONValue] = []
            while !a.isAtEnd { items.append(try a.decode(JSONValue.self)) }
            self = .array(items)
            return
        }
        if let o = try? decoder.container(keyedBy: AnyKey.self) {
            var fields: [String: JSONValue] = [:]
            for k in o.allKeys { fields[k.stringValue] = try o.decode(JSONValue.self, forKey: k) }
            self = .object(fields)
            return
        }
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int64.self) { self = .int(i) }
        else if let u = try? c.decode(UInt64.self) { self = .uint(u) }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else { self = .string(try c.decode(String.self)) }
    }

    /// Compact JSON text (object keys sorted).
    public var description: String {
        var o = JSONOutput()
        write(&o)
        return o.text
    }

    func write(_ o: inout JSONOutput) {
        switch self {
        case .null: o.raw("null")
        case .bool(let b): b ? o.raw("true") : o.raw("false")
        case .int(let i): o.int(i)
        case .uint(let u): o.uint(u)
        case .double(let d): o.number(d.description)
        case .string(let s): o.string(s)
        case .array(let a):
            o.byte(UInt8(ascii: "["))
            for (i, v) in a.enumerated() {
                if i > 0 { o.byte(UInt8(ascii: ",")) }
                v.write(&o)
            }
            o.byte(UInt8(ascii: "]"))
        case .object(let fields):
            o.byte(UInt8(ascii: "{"))
            for (i, k) in fields.keys.sorted().enumerated() {
                if i > 0 { o.byte(UInt8(ascii: ",")) }
                o.string(k)
                o.byte(UInt8(ascii: ":"))
                fields[k]!.write(&o)
            }
            o.byte(UInt8(ascii: "}"))
        }
    }

    struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }
}

/// Why a transcript cannot be read or replayed. Each says what is wrong in
/// one line.
public enum TranscriptError: Error, Equatable, CustomStringConvertible {
    /// The file cannot be read.
    case unreadable(String, reason: String)
    /// The file holds no complete line.
    case empty
    /// The first line is not a transcript header.
    case notATranscript(String)
    /// The header's version is not one this code reads.
    case unsupportedVersion(Int64)
    /// The transcript was recorded from another program type.
    case programMismatch(expected: String, found: String)
    /// Line `n` (1-based) is longer than the limit.
    case lineTooLong(line: Int, limit: Int)
    /// Line `n` (1-based) is not a valid record.
    case badLine(line: Int, reason: String)
    /// Message `index` cannot be fed back (no payload, or it does not decode).
    case notReplayable(index: Int, reason: String)

    /// One sentence for an error message (`transcript line 3 is not a valid record: …`).
    public var description: String {
        switch self {
        case .unreadable(let p, let r): "cannot read transcript \(p): \(r)"
        case .empty: "not a transcript: the file holds no complete line"
        case .notATranscript(let r): "not a transcript: \(r)"
        case .unsupportedVersion(let v): "unsupported transcript version \(v) (this build reads version \(TranscriptFormat.version))"
        case .programMismatch(let e, let f): "transcript of program \(f), not \(e)"
        case .lineTooLong(let n, let l): "transcript line \(n) is longer than \(l) bytes"
        case .badLine(let n, let r): "transcript line \(n) is not a valid record: \(r)"
        case .notReplayable(let i, let r): "message \(i) cannot be replayed: \(r)"
        }
    }
}

/// A transcript read from its JSON Lines file (Docs/Replay.md).
///
/// A last line without its newline (the daemon was killed while writing) is
/// left out and noted in `truncatedTail`; every other defect is an error.
public struct Transcript {
    /// One record line after the header.
    public struct Line {
        /// 1-based line number in the file.
        public let number: Int
        /// The record, parsed.
        public let value: JSONValue
        /// The line's bytes (payloads are decoded from these).
        public let bytes: Data
        /// `type`: `start`, `message`, `plan`, `diagnostic`, `end`.
        public var type: String { value["type"]?.string ?? "" }
    }

    /// The first line, parsed.
    public let header: JSONValue
    /// The program type the transcript was recorded from.
    public let program: String
    /// The command line noted in the header, if any.
    public var arguments: [String]? {
        guard case .array(let a)? = header["arguments"] else { return nil }
        return a.compactMap(\.string)
    }
    /// The wall-clock start, µs since the epoch.
    public let startedAtMicros: Int64
    /// The wall-clock start as RFC 3339 text.
    public let startedAt: String
    /// The records after the header, in order.
    public let lines: [Line]
    /// Whether an incomplete last line was left out.
    public let truncatedTail: Bool
    /// The `end` record's reason, when the recording ended cleanly.
    public var endReason: String? { lines.last { $0.type == "end" }?.value["reason"]?.string }

    /// The default longest line accepted (bytes).
    public static let defaultLineLimit = 1 << 20

    /// The default largest file read (bytes): four times the recorder's
    /// default size limit. A replay holds the file and its parsed records
    /// in memory.
    public static let defaultSizeLimit = 1 << 30

    /// Reads the transcript at `path`.
    /// - Parameters:
    ///   - path: the file (a regular file; a FIFO or device is refused).
    ///   - lineLimit: the longest line accepted (bytes).
    ///   - sizeLimit: the largest file accepted (bytes); a larger one
    ///     (a sparse one included) is refused before anything is read.
    /// - Throws: `TranscriptError` when the file cannot be read, is too
    ///   large, or is not a valid transcript.
    public init(contentsOf path: String, lineLimit: Int = Transcript.defaultLineLimit,
                sizeLimit: Int = Transcript.defaultSizeLimit) throws(TranscriptError) {
        try self.init(data: try readTranscriptFile(path, sizeLimit: sizeLimit), lineLimit: lineLimit)
    }

    /// Reads a transcript from `data`.
    public init(data: Data, lineLimit: Int = Transcript.defaultLineLimit) throws(TranscriptError) {
        var ranges: [Range<Int>] = []
        var start = data.startIndex
        var truncated = false
        while start < data.endIndex {
            let end = data[start...].firstIndex(of: 0x0A)
            let stop = end ?? data.endIndex
            if stop - start > lineLimit { throw .lineTooLong(line: ranges.count + 1, limit: lineLimit) }
            if end == nil { truncated = true; break }
            ranges.append(start..<stop)
            start = stop + 1
        }
        guard let first = ranges.first else {
            if truncated { throw .notATranscript("the first line is incomplete") }
            throw .empty
        }
        guard let header = try? JSONParser.parse(data[first]), case .object = header else {
            throw .notATranscript("line 1 is not a JSON object")
        }
        guard header["type"]?.string == "header", header["format"]?.string == TranscriptFormat.name else {
            throw .notATranscript("line 1 is not a \(TranscriptFormat.name) header")
        }
        guard let version = header["version"]?.int else { throw .notATranscript("the header has no version") }
        guard version == Int64(TranscriptFormat.version) else { throw .unsupportedVersion(version) }
        guard let program = header["program"]?.string else { throw .notATranscript("the header names no program") }
        self.program = program
        self.header = header
        startedAtMicros = header["started_at_us"]?.int ?? 0
        startedAt = header["started_at"]?.string ?? ""
        var lines: [Line] = []
        lines.reserveCapacity(ranges.count - 1)
        for (i, r) in ranges.enumerated().dropFirst() {
            let bytes = data[r]
            let value: JSONValue
            do { value = try JSONParser.parse(bytes) } catch { throw .badLine(line: i + 1, reason: "not JSON (\(error))") }
            guard case .object = value else { throw .badLine(line: i + 1, reason: "not a JSON object") }
            let line = Line(number: i + 1, value: value, bytes: Data(bytes))
            switch line.type {
            case "start", "diagnostic", "end": break
            case "plan":
                // Replay groups records by round: a plan without an integer
                // one could not be placed (issue 19).
                guard value["round"]?.int != nil else { throw .badLine(line: i + 1, reason: "a plan record needs an integer round") }
            case "message":
                guard value["index"]?.int != nil, value["round"]?.int != nil, value["time_us"]?.int != nil else {
                    throw .badLine(line: i + 1, reason: "a message record needs index, round and time_us")
                }
            default:
                throw .badLine(line: i + 1, reason: "unknown record type \(value["type"].map(\.description) ?? "(none)")")
            }
            lines.append(line)
        }
        self.lines = lines
        truncatedTail = truncated
    }
}

/// Records a runtime's transcript in memory, in the file format, for tests
/// (the daemon's recorder writes the same lines to a file).
public final class TranscriptBuffer<P: Program> {
    let encoder = TranscriptEncoder<P.Message, P.Command>()

    /// A buffer with its header line written (`startedAtMicros` is the
    /// wall-clock start to note; tests may leave it 0).
    public init(startedAtMicros: Int64 = 0) {
        encoder.header(program: String(reflecting: P.self), startedAtMicros: startedAtMicros, startedAt: "")
    }

    /// Sets `runtime.transcript` to record here.
    public func attach(to runtime: Runtime<P>) {
        runtime.transcript = { [unowned self] in encoder.append($0) }
    }

    /// The lines recorded so far.
    public var data: Data { Data(encoder.output.bytes) }
}

/// The bytes of the regular file at `path` (`open`, `fstat`, `read`; the
/// reason of a failure is the system's sentence for its errno). A FIFO or a
/// device is refused, never waited on; a file larger than `sizeLimit`
/// (by its size, or grown while read) is refused, and no more than that is
/// ever reserved.
func readTranscriptFile(_ path: String, sizeLimit: Int = Transcript.defaultSizeLimit) throws(TranscriptError) -> Data {
    func tooLarge(_ what: String) -> TranscriptError { .unreadable(path, reason: "too large (\(what), at most \(sizeLimit) bytes)") }
    func failure(_ code: Int32) -> TranscriptError { .unreadable(path, reason: String(cString: strerror(code))) }
    let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
    guard fd >= 0 else { throw failure(errno) }
    defer { close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0 else { throw failure(errno) }
    guard st.st_mode & S_IFMT == S_IFREG else {
        throw .unreadable(path, reason: st.st_mode & S_IFMT == S_IFDIR ? String(cString: strerror(EISDIR)) : "not a regular file")
    }
    guard st.st_size >= 0, st.st_size <= Int64(sizeLimit) else { throw tooLarge("\(st.st_size) bytes") }
    var bytes: [UInt8] = []
    bytes.reserveCapacity(Int(st.st_size))
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        guard bytes.count <= sizeLimit else { throw tooLarge("more than \(sizeLimit) bytes") }
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            throw failure(errno)
        }
        if n == 0 { break }
        bytes.append(contentsOf: chunk[..<n])
    }
    guard bytes.count <= sizeLimit else { throw tooLarge("more than \(sizeLimit) bytes") }
    return Data(bytes)
}
