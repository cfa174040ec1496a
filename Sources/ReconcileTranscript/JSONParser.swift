/// The transcript format's reader (its writer is `TranscriptEncoder`, in
/// this module too; package-internal, used by `ReconcileReplay`).
/// A small JSON parser for transcript lines (faster than decoding into
/// `JSONValue` through `JSONDecoder`, and exact for 64-bit integers),
/// strict to RFC 8259: numbers in its grammar only (no leading zeros, no
/// `1.e5`, none that overflow to infinity), strings of valid UTF-8 with
/// `\u` escapes whose surrogates pair, no duplicate keys in an object, and
/// at most `maxDepth` nested arrays and objects. The input's length is
/// bounded by the caller (a transcript line, `Transcript.defaultLineLimit`).
package struct JSONParser {
    /// The deepest nesting of arrays and objects accepted.
    package static let maxDepth = 128

    package struct Failure: Error, CustomStringConvertible {
        package let offset: Int
        package let reason: String
        package var description: String { "\(reason) at byte \(offset)" }
    }

    let bytes: UnsafeBufferPointer<UInt8>
    var i = 0
    var depth = 0

    /// Parses one JSON value that must fill `bytes` (surrounding spaces allowed).
    package static func parse(_ bytes: some Collection<UInt8>) throws(Failure) -> JSONValue {
        let array = Array(bytes)
        do {
            return try array.withUnsafeBufferPointer { buffer in
                var p = JSONParser(bytes: buffer)
                let v = try p.value()
                p.skipSpace()
                guard p.i == buffer.count else { throw p.fail("trailing characters") }
                return v
            }
        } catch let f as Failure {
            throw f
        } catch {
            throw Failure(offset: 0, reason: "\(error)")
        }
    }

    func fail(_ reason: String) -> Failure { Failure(offset: i, reason: reason) }

    mutating func skipSpace() {
        while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x09 || bytes[i] == 0x0A || bytes[i] == 0x0D { i += 1 }
    }

    mutating func literal(_ s: StaticString, _ v: JSONValue) throws(Failure) -> JSONValue {
        let n = s.utf8CodeUnitCount
        guard i + n <= bytes.count else { throw fail("bad literal") }
        for k in 0..<n where bytes[i + k] != s.utf8Start[k] { throw fail("bad literal") }
        i += n
        return v
    }

    mutating func value() throws(Failure) -> JSONValue {
        skipSpace()
        guard i < bytes.count else { throw fail("unexpected end") }
        switch bytes[i] {
        case UInt8(ascii: "{"):
            depth += 1
            guard depth <= Self.maxDepth else { throw fail("nested deeper than \(Self.maxDepth)") }
            defer { depth -= 1 }
            i += 1
            var fields: [String: JSONValue] = [:]
            skipSpace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "}") { i += 1; return .object(fields) }
            while true {
                skipSpace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { throw fail("expected a key") }
                let k = try string()
                skipSpace()
                guard fields[k] == nil else { throw fail("duplicate key \"\(k)\"") }
                guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                i += 1
                fields[k] = try value()
                skipSpace()
                guard i < bytes.count else { throw fail("unexpected end") }
                if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
                if bytes[i] == UInt8(ascii: "}") { i += 1; return .object(fields) }
                throw fail("expected ',' or '}'")
            }
        case UInt8(ascii: "["):
            depth += 1
            guard depth <= Self.maxDepth else { throw fail("nested deeper than \(Self.maxDepth)") }
            defer { depth -= 1 }
            i += 1
            var items: [JSONValue] = []
            skipSpace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
            while true {
                items.append(try value())
                skipSpace()
                guard i < bytes.count else { throw fail("unexpected end") }
                if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
                if bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
                throw fail("expected ',' or ']'")
            }
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): return try literal("true", .bool(true))
        case UInt8(ascii: "f"): return try literal("false", .bool(false))
        case UInt8(ascii: "n"): return try literal("null", .null)
        default: return try number()
        }
    }

    /// A number as RFC 8259 writes it: `-? (0 | [1-9][0-9]*) (. [0-9]+)?
    /// ([eE] [+-]? [0-9]+)?`; an integer that fits `Int64` or `UInt64` is
    /// exact, any other number must be a finite `Double`.
    mutating func number() throws(Failure) -> JSONValue {
        let start = i
        func isDigit(_ k: Int) -> Bool { k < bytes.count && bytes[k] >= 0x30 && bytes[k] <= 0x39 }
        if i < bytes.count, bytes[i] == UInt8(ascii: "-") { i += 1 }
        guard isDigit(i) else { throw fail("unexpected character") }
        if bytes[i] == 0x30 {
            i += 1
            guard !isDigit(i) else { throw Failure(offset: start, reason: "bad number (leading zero)") }
        } else {
            while isDigit(i) { i += 1 }
        }
        var isInteger = true
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            isInteger = false
            i += 1
            guard isDigit(i) else { throw Failure(offset: start, reason: "bad number (no digit after '.')") }
            while isDigit(i) { i += 1 }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            isInteger = false
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            guard isDigit(i) else { throw Failure(offset: start, reason: "bad number (no digit in the exponent)") }
            while isDigit(i) { i += 1 }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<i]), as: UTF8.self)
        if isInteger {
            if let v = Int64(text) { return .int(v) }
            if let v = UInt64(text) { return .uint(v) }
        }
        guard let d = Double(text), d.isFinite else { throw Failure(offset: start, reason: "number out of range") }
        return .double(d)
    }

    /// A string: valid UTF-8, no control character, escapes as RFC 8259
    /// has them (a `\u` high surrogate must be followed by a `\u` low one;
    /// a lone surrogate is an error).
    mutating func string() throws(Failure) -> String {
        let start = i
        i += 1   // opening quote
        var out: [UInt8] = []
        while true {
            guard i < bytes.count else { throw fail("unterminated string") }
            let c = bytes[i]
            i += 1
            switch c {
            case UInt8(ascii: "\""):
                guard let s = String(validating: out, as: UTF8.self) else {
                    throw Failure(offset: start, reason: "invalid UTF-8 in string")
                }
                return s
            case UInt8(ascii: "\\"):
                guard i < bytes.count else { throw fail("unterminated escape") }
                let e = bytes[i]
                i += 1
                switch e {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xDC00..<0xE000).contains(scalar) { throw fail("lone low surrogate in \\u escape") }
                    if (0xD800..<0xDC00).contains(scalar) {
                        guard i + 1 < bytes.count, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") else {
                            throw fail("high surrogate without a low one in \\u escape")
                        }
                        i += 2
                        let low = try hex4()
                        guard (0xDC00..<0xE000).contains(low) else { throw fail("high surrogate without a low one in \\u escape") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    }
                    guard let u = Unicode.Scalar(scalar) else { throw fail("bad \\u escape") }
                    out.append(contentsOf: String(Character(u)).utf8)
                default: throw fail("bad escape")
                }
            default:
                guard c >= 0x20 else { throw fail("control character in string") }
                out.append(c)
            }
        }
    }

    mutating func hex4() throws(Failure) -> UInt32 {
        guard i + 4 <= bytes.count else { throw fail("bad \\u escape") }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[i]
            i += 1
            let d: UInt32
            switch c {
            case 0x30...0x39: d = UInt32(c - 0x30)
            case 0x41...0x46: d = UInt32(c - 0x41 + 10)
            case 0x61...0x66: d = UInt32(c - 0x61 + 10)
            default: throw fail("bad \\u escape")
            }
            v = v << 4 | d
        }
        return v
    }
}
