/// A growing buffer of JSON text: the encoder's output and the transcript
/// writer's line buffer. Appending numbers and strings allocates nothing once
/// the buffer has grown.
public struct JSONOutput {
    /// The bytes written so far.
    public var bytes: [UInt8] = []

    /// An empty buffer with room for `capacity` bytes.
    public init(capacity: Int = 0) { bytes.reserveCapacity(capacity) }

    /// `s` as is (JSON punctuation, literals, keys already escaped).
    @inlinable public mutating func raw(_ s: StaticString) {
        s.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    /// One byte as is.
    @inlinable public mutating func byte(_ b: UInt8) { bytes.append(b) }

    /// A signed integer in decimal.
    @inlinable public mutating func int(_ v: Int64) {
        if v < 0 {
            bytes.append(UInt8(ascii: "-"))
            uint(v == .min ? UInt64(Int64.max) + 1 : UInt64(-v))
        } else {
            uint(UInt64(v))
        }
    }

    /// An unsigned integer in decimal.
    @inlinable public mutating func uint(_ v: UInt64) {
        if v < 10 { bytes.append(UInt8(truncatingIfNeeded: v) &+ 48); return }
        var digits: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)   // 32 bytes: room for 20 digits
        var n = 0
        var x = v
        withUnsafeMutableBytes(of: &digits) { d in
            while x > 0 {
                d[31 - n] = UInt8(truncatingIfNeeded: x % 10) &+ 48
                x /= 10
                n += 1
            }
            bytes.append(contentsOf: d[(32 - n)...])
        }
    }

    /// A JSON string literal (quotes and escapes included).
    public mutating func string(_ s: String) {
        bytes.append(UInt8(ascii: "\""))
        var s = s
        s.withUTF8 { u in
            var start = 0
            for i in 0..<u.count {
                let c = u[i]
                if c >= 0x20 && c != 0x22 && c != 0x5C { continue }
                if start < i { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: u[start..<i])) }
                start = i + 1
                switch c {
                case 0x22: raw("\\\"")
                case 0x5C: raw("\\\\")
                case 0x0A: raw("\\n")
                case 0x0D: raw("\\r")
                case 0x09: raw("\\t")
                default:
                    raw("\\u00")
                    let hex: StaticString = "0123456789abcdef"
                    hex.withUTF8Buffer { h in
                        bytes.append(h[Int(c >> 4)])
                        bytes.append(h[Int(c & 0xF)])
                    }
                }
            }
            if start < u.count { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: u[start...])) }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// A finite floating-point number (shortest form that reads back).
    public mutating func number(_ description: String) {
        var d = description
        d.withUTF8 { bytes.append(contentsOf: $0) }
    }

    /// The text written so far.
    public var text: String { String(decoding: bytes, as: UTF8.self) }
}
