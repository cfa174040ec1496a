import CSystemd
import Glibc
import Reconcile

/// Reading and writing `BusValue`s in sd-bus messages: a generic walker on
/// `sd_bus_message_peek_type` / `enter_container` for reading, and
/// `append_basic` / `open_container` for writing. Nothing else in the
/// project marshals bus messages.
enum BusMarshalling {
    /// Reads every remaining value of `m` (at its current position).
    /// -EBADMSG (invalid UTF-8, a malformed body) is thrown like any other
    /// error: the caller skips that message, it is not a fatal error.
    static func readAll(_ m: OpaquePointer) throws(SystemdError) -> [BusValue] {
        var out: [BusValue] = []
        while let v = try readNext(m) { out.append(v) }
        return out
    }

    /// The next value in the current container, nil at its end.
    static func readNext(_ m: OpaquePointer) throws(SystemdError) -> BusValue? {
        var type: CChar = 0
        var contents: UnsafePointer<CChar>?
        let r = try check("sd_bus_message_peek_type", sd_bus_message_peek_type(m, &type, &contents))
        if r == 0 { return nil }
        return try read(m, UInt8(bitPattern: type), contents)
    }

    private static func read(_ m: OpaquePointer, _ type: UInt8, _ contents: UnsafePointer<CChar>?) throws(SystemdError) -> BusValue {
        let t = CChar(bitPattern: type)
        switch type {
        case UInt8(ascii: "a"), UInt8(ascii: "r"), UInt8(ascii: "v"):
            guard let contents else { throw SystemdError("sd_bus_message_peek_type", errno: EBADMSG) }
            let signature = String(cString: contents)
            try check("sd_bus_message_enter_container", sd_bus_message_enter_container(m, t, contents))
            let value: BusValue
            switch type {
            case UInt8(ascii: "v"):
                guard let inner = try readNext(m) else { throw SystemdError("sd_bus_message_read (empty variant)", errno: EBADMSG) }
                value = .variant(inner)
            case UInt8(ascii: "r"):
                value = .structure(try readAll(m))
            default:
                value = try readArray(m, signature: signature)
            }
            try check("sd_bus_message_exit_container", sd_bus_message_exit_container(m))
            return value
        case UInt8(ascii: "s"), UInt8(ascii: "o"), UInt8(ascii: "g"):
            var p: UnsafePointer<CChar>?
            try check("sd_bus_message_read_basic", sd_bus_message_read_basic(m, t, &p))
            let text = p.map { String(cString: $0) } ?? ""
            switch type {
            case UInt8(ascii: "s"): return .string(text)
            case UInt8(ascii: "o"):
                guard let path = BusObjectPath(text) else { throw SystemdError("sd_bus_message_read_basic (object path)", errno: EBADMSG) }
                return .objectPath(path)
            default:
                guard let g = try? BusSignature(parsing: text) else { throw SystemdError("sd_bus_message_read_basic (signature)", errno: EBADMSG) }
                return .signature(g)
            }
        case UInt8(ascii: "y"): return .byte(try basic(m, t, UInt8(0)))
        case UInt8(ascii: "b"): return .boolean(try basic(m, t, Int32(0)) != 0)
        case UInt8(ascii: "n"): return .int16(try basic(m, t, Int16(0)))
        case UInt8(ascii: "q"): return .uint16(try basic(m, t, UInt16(0)))
        case UInt8(ascii: "i"): return .int32(try basic(m, t, Int32(0)))
        case UInt8(ascii: "u"): return .uint32(try basic(m, t, UInt32(0)))
        case UInt8(ascii: "x"): return .int64(try basic(m, t, Int64(0)))
        case UInt8(ascii: "t"): return .uint64(try basic(m, t, UInt64(0)))
        case UInt8(ascii: "d"): return .double(try basic(m, t, Double(0)))
        case UInt8(ascii: "h"):
            // The message owns the fd: the value gets its own duplicate.
            let fd = try basic(m, t, Int32(-1))
            let own = fcntl(fd, F_DUPFD_CLOEXEC, 3)
            try checkLibc("fcntl F_DUPFD_CLOEXEC", own)
            return .unixFD(BusFileDescriptor(own) { Glibc.close($0) })
        default:
            throw SystemdError("sd_bus_message_peek_type (type '\(Character(Unicode.Scalar(type)))')", errno: EBADMSG)
        }
    }

    /// Inside an entered array whose element signature is `signature`: its
    /// elements, or its entries when the signature is a `{KV}`.
    private static func readArray(_ m: OpaquePointer, signature: String) throws(SystemdError) -> BusValue {
        guard let type = try? BusType(parsing: "a" + signature) else {
            throw SystemdError("array signature a\(signature)", errno: EBADMSG)
        }
        switch type {
        case .dictionary(let key, let value):
            var entries: [BusDictionaryEntry] = []
            let inner = String(signature.dropFirst().dropLast())
            while true {
                let r = try check("sd_bus_message_enter_container",
                                  inner.withCString { sd_bus_message_enter_container(m, CChar(UInt8(ascii: "e")), $0) })
                if r == 0 { break }
                guard let k = try readNext(m), let v = try readNext(m) else {
                    throw SystemdError("sd_bus_message_read (dictionary entry)", errno: EBADMSG)
                }
                entries.append(BusDictionaryEntry(k, v))
                try check("sd_bus_message_exit_container", sd_bus_message_exit_container(m))
            }
            return .dictionary(key: key, value: value, entries)
        case .array(let element):
            return .array(element: element, try readAll(m))
        default:
            throw SystemdError("array signature a\(signature)", errno: EBADMSG)
        }
    }

    private static func basic<T>(_ m: OpaquePointer, _ type: CChar, _ initial: T) throws(SystemdError) -> T {
        var v = initial
        try check("sd_bus_message_read_basic", withUnsafeMutablePointer(to: &v) { sd_bus_message_read_basic(m, type, $0) })
        return v
    }
}

extension BusMarshalling {
    /// Appends `values` to `m`, after `BusValue.checkSendable` (an oversized
    /// or too-deep message would make the daemon drop the whole connection).
    static func append(_ m: OpaquePointer, _ values: [BusValue]) throws(SystemdError) {
        do { try BusValue.checkSendable(values) } catch { throw SystemdError("BusValue.checkSendable: \(error.reason)", errno: EINVAL) }
        for v in values { try append(m, v) }
    }

    private static func append(_ m: OpaquePointer, _ value: BusValue) throws(SystemdError) {
        switch value {
        case .byte(let v): try basic(m, "y", v)
        case .boolean(let v): try basic(m, "b", Int32(v ? 1 : 0))
        case .int16(let v): try basic(m, "n", v)
        case .uint16(let v): try basic(m, "q", v)
        case .int32(let v): try basic(m, "i", v)
        case .uint32(let v): try basic(m, "u", v)
        case .int64(let v): try basic(m, "x", v)
        case .uint64(let v): try basic(m, "t", v)
        case .double(let v): try basic(m, "d", v)
        case .unixFD(let fd): try basic(m, "h", fd.rawValue)   // sd-bus sends a duplicate
        case .string(let s): try text(m, "s", s)
        case .objectPath(let p): try text(m, "o", p.text)
        case .signature(let g): try text(m, "g", g.description)
        case .array(let element, let items):
            try container(m, "a", element.description) { () throws(SystemdError) in for i in items { try append(m, i) } }
        case .dictionary(let key, let valueType, let entries):
            let entry = "\(key)\(valueType)"
            try container(m, "a", "{\(entry)}") { () throws(SystemdError) in
                for e in entries {
                    try container(m, "e", entry) { () throws(SystemdError) in
                        try append(m, e.key)
                        try append(m, e.value)
                    }
                }
            }
        case .structure(let fields):
            try container(m, "r", fields.map(\.type.description).joined()) { () throws(SystemdError) in
                for f in fields { try append(m, f) }
            }
        case .variant(let inner):
            try container(m, "v", inner.type.description) { () throws(SystemdError) in try append(m, inner) }
        }
    }

    private static func basic<T>(_ m: OpaquePointer, _ code: Unicode.Scalar, _ v: T) throws(SystemdError) {
        var v = v
        try check("sd_bus_message_append_basic", withUnsafePointer(to: &v) { sd_bus_message_append_basic(m, CChar(code.value), $0) })
    }

    private static func text(_ m: OpaquePointer, _ code: Unicode.Scalar, _ s: String) throws(SystemdError) {
        try check("sd_bus_message_append_basic", s.withCString { sd_bus_message_append_basic(m, CChar(code.value), $0) })
    }

    private static func container(_ m: OpaquePointer, _ code: Unicode.Scalar, _ contents: String,
                                  _ body: () throws(SystemdError) -> Void) throws(SystemdError) {
        try check("sd_bus_message_open_container", contents.withCString { sd_bus_message_open_container(m, CChar(code.value), $0) })
        try body()
        try check("sd_bus_message_close_container", sd_bus_message_close_container(m))
    }
}

/// An error reply's name and message (nil for a method return).
func busMethodError(_ reply: OpaquePointer?) -> BusError? {
    guard sd_bus_message_is_method_error(reply, nil) != 0 else { return nil }
    let e = sd_bus_message_get_error(reply)
    let name = e?.pointee.name.map { String(cString: $0) } ?? ""
    return BusError(name, e?.pointee.message.map { String(cString: $0) } ?? (name.isEmpty ? "method call failed" : name))
}
