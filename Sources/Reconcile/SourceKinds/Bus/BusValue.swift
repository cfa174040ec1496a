import Synchronization

/// A D-Bus value: every basic type, arrays, dictionaries, structs and
/// variants, object paths and signatures, and unix file descriptors as an
/// opaque handle.
///
/// Values compare and hash by content. Accessors see through variants
/// (`value.string` of `v` holding `s` is the string), so a property read as
/// a variant reads as its content. Build values by hand in tests:
/// `.dictionary(["State": .variant(.string("on"))])`.
public enum BusValue: Hashable, Sendable {
    /// `y`.
    case byte(UInt8)
    /// `b`.
    case boolean(Bool)
    /// `n`.
    case int16(Int16)
    /// `q`.
    case uint16(UInt16)
    /// `i`.
    case int32(Int32)
    /// `u`.
    case uint32(UInt32)
    /// `x`.
    case int64(Int64)
    /// `t`.
    case uint64(UInt64)
    /// `d`.
    case double(Double)
    /// `s`.
    case string(String)
    /// `o`.
    case objectPath(BusObjectPath)
    /// `g`.
    case signature(BusSignature)
    /// `h`: a descriptor the value owns (see `BusFileDescriptor`).
    case unixFD(BusFileDescriptor)
    /// `aT`: elements all of type `element` (which an empty array still has).
    case array(element: BusType, [BusValue])
    /// `a{KV}`: entries in wire order, keys of basic type `key`.
    case dictionary(key: BusType, value: BusType, [BusDictionaryEntry])
    /// `(...)`: one or more fields.
    case structure([BusValue])
    /// `v`: a value with its own type.
    indirect case variant(BusValue)

    /// The value's complete type.
    public var type: BusType {
        switch self {
        case .byte: .byte
        case .boolean: .boolean
        case .int16: .int16
        case .uint16: .uint16
        case .int32: .int32
        case .uint32: .uint32
        case .int64: .int64
        case .uint64: .uint64
        case .double: .double
        case .string: .string
        case .objectPath: .objectPath
        case .signature: .signature
        case .unixFD: .unixFD
        case .array(let e, _): .array(e)
        case .dictionary(let k, let v, _): .dictionary(key: k, value: v)
        case .structure(let fields): .structure(fields.map(\.type))
        case .variant: .variant
        }
    }

    /// `a{sv}` from `entries` (keys sorted, so equal dictionaries make equal values).
    public static func dictionary(_ entries: [String: BusValue]) -> BusValue {
        .dictionary(key: .string, value: .variant,
                    entries.sorted { $0.key < $1.key }.map { BusDictionaryEntry(.string($0.key), .variant($0.value.variantContent)) })
    }

    /// `as` from `strings`.
    public static func strings(_ strings: [String]) -> BusValue {
        .array(element: .string, strings.map { .string($0) })
    }

    /// `ay` from `bytes`.
    public static func bytes(_ bytes: [UInt8]) -> BusValue {
        .array(element: .byte, bytes.map { .byte($0) })
    }

    /// The value inside any number of variants (itself when it is none).
    public var variantContent: BusValue {
        var v = self
        while case .variant(let inner) = v { v = inner }
        return v
    }
}

/// One entry of a D-Bus dictionary.
public struct BusDictionaryEntry: Hashable, Sendable {
    /// The key (a basic type).
    public var key: BusValue
    /// The value.
    public var value: BusValue

    /// The entry `key` → `value`.
    public init(_ key: BusValue, _ value: BusValue) {
        self.key = key
        self.value = value
    }
}

/// A D-Bus object path (`/org/freedesktop/network1`), validated: `/`, or
/// `/`-separated non-empty elements of `[A-Za-z0-9_]`, no trailing `/`.
public struct BusObjectPath: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The path text.
    public let text: String

    /// The root path `/`.
    public static let root = BusObjectPath(valid: "/")

    /// `text` as an object path, or nil when it is not a valid one.
    public init?(_ text: String) {
        guard BusObjectPath.isValid(text) else { return nil }
        self.text = text
    }

    private init(valid: String) { text = valid }

    /// Whether `text` is a valid object path.
    public static func isValid(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard bytes.first == UInt8(ascii: "/") else { return false }
        if bytes.count == 1 { return true }
        guard bytes.last != UInt8(ascii: "/") else { return false }
        var previousSlash = true
        for b in bytes.dropFirst() {
            if b == UInt8(ascii: "/") {
                if previousSlash { return false }
                previousSlash = true
            } else {
                guard isBusNameByte(b) else { return false }
                previousSlash = false
            }
        }
        return true
    }

    /// Orders paths by their text.
    public static func < (a: BusObjectPath, b: BusObjectPath) -> Bool { a.text < b.text }
    /// The path text.
    public var description: String { text }
}


/// A unix file descriptor received in (or to be sent with) a D-Bus message:
/// an opaque handle that owns its descriptor.
///
/// The driver gives each received descriptor its own duplicate (close-on-exec)
/// and a way to close it; the descriptor is closed when the last copy of the
/// value goes, unless someone took it first with `take()`. Two handles are
/// equal only when they are the same handle.
public final class BusFileDescriptor: Hashable, Sendable, CustomStringConvertible {
    /// The descriptor number while this handle owns it, else -1.
    public var rawValue: Int32 { owned.load(ordering: .acquiring) }
    private let owned: Atomic<Int32>
    private let close: (@Sendable (Int32) -> Void)?

    /// A handle on `descriptor`; `close` (when given) releases it when the
    /// handle goes without a `take()`. A handle without `close` borrows the
    /// descriptor: the caller keeps it open while the value is in use.
    public init(_ descriptor: Int32, close: (@Sendable (Int32) -> Void)? = nil) {
        owned = Atomic(descriptor)
        self.close = close
    }

    /// Takes the descriptor out: the caller now owns it (and closes it);
    /// later calls return nil.
    public func take() -> Int32? {
        let fd = owned.exchange(-1, ordering: .acquiringAndReleasing)
        return fd >= 0 ? fd : nil
    }

    deinit {
        let fd = owned.load(ordering: .acquiring)
        if fd >= 0 { close?(fd) }
    }

    /// Identity: the same handle.
    public static func == (a: BusFileDescriptor, b: BusFileDescriptor) -> Bool { a === b }
    /// Hashes the handle's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
    /// `fd 7` (or `fd taken`).
    public var description: String { rawValue >= 0 ? "fd \(rawValue)" : "fd taken" }
}

// MARK: - Typed accessors (through variants)

extension BusValue {
    /// The string of an `s` (also `o` and `g` as text); nil otherwise.
    public var string: String? {
        switch variantContent {
        case .string(let s): s
        case .objectPath(let p): p.text
        case .signature(let g): g.description
        default: nil
        }
    }

    /// The boolean of a `b`; nil otherwise.
    public var bool: Bool? {
        if case .boolean(let b) = variantContent { return b }
        return nil
    }

    /// Any integer type's value as an `Int64` when it fits; nil otherwise.
    public var int64: Int64? {
        switch variantContent {
        case .byte(let v): Int64(v)
        case .int16(let v): Int64(v)
        case .uint16(let v): Int64(v)
        case .int32(let v): Int64(v)
        case .uint32(let v): Int64(v)
        case .int64(let v): v
        case .uint64(let v): Int64(exactly: v)
        default: nil
        }
    }

    /// Any integer type's value as an `Int` when it fits; nil otherwise.
    public var int: Int? { int64.flatMap { Int(exactly: $0) } }

    /// Any unsigned or non-negative integer as a `UInt64`; nil otherwise.
    public var uint64: UInt64? {
        if case .uint64(let v) = variantContent { return v }
        return int64.flatMap { UInt64(exactly: $0) }
    }

    /// A `d` (or any integer, converted); nil otherwise.
    public var double: Double? {
        if case .double(let d) = variantContent { return d }
        if case .uint64(let v) = variantContent { return Double(v) }
        return int64.map { Double($0) }
    }

    /// The object path of an `o`; nil otherwise.
    public var objectPath: BusObjectPath? {
        if case .objectPath(let p) = variantContent { return p }
        return nil
    }

    /// The handle of an `h`; nil otherwise.
    public var fileDescriptor: BusFileDescriptor? {
        if case .unixFD(let fd) = variantContent { return fd }
        return nil
    }

    /// The elements of an array, the fields of a struct; nil otherwise.
    public var elements: [BusValue]? {
        switch variantContent {
        case .array(_, let e): e
        case .structure(let f): f
        default: nil
        }
    }

    /// The entries of a dictionary; nil otherwise.
    public var entries: [BusDictionaryEntry]? {
        if case .dictionary(_, _, let e) = variantContent { return e }
        return nil
    }

    /// The value under string key `key` of a dictionary with string keys
    /// (variants unwrapped: `a{sv}`'s `"State"` reads as its content); nil
    /// when this is not such a dictionary or has no such key.
    public subscript(key: String) -> BusValue? {
        guard let entries else { return nil }
        for entry in entries where entry.key.string == key { return entry.value.variantContent }
        return nil
    }

    /// The element or field at `index`; nil when out of range or not a container.
    public subscript(index: Int) -> BusValue? {
        guard let elements, elements.indices.contains(index) else { return nil }
        return elements[index]
    }
}

// MARK: - Limits checked before a message is sent

/// Why a value cannot be sent: the bus daemon would drop the whole
/// connection (it answers an oversized or too-deep message by disconnecting
/// the sender), or sd-bus would refuse it.
public struct BusValueError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What is wrong.
    public var reason: String
    /// A failure saying `reason`.
    public init(_ reason: String) { self.reason = reason }
    /// The reason.
    public var description: String { reason }
}

/// The limits of the D-Bus specification that a sender must respect.
public enum BusLimits {
    /// Arrays nest at most 32 deep (dbus-daemon drops a 33-deep sender).
    public static let arrayDepth = 32
    /// Structs nest at most 32 deep.
    public static let structDepth = 32
    /// All containers (arrays, structs, variants) nest at most 64 deep.
    public static let totalDepth = 64
    /// One array holds at most 64 MiB.
    public static let arrayBytes = 64 << 20
    /// One message holds at most 128 MiB (libdbus's default).
    public static let messageBytes = 128 << 20
}

extension BusValue {
    /// Checks that `values` can be sent in one message: every array's
    /// elements of its element type, every dictionary key basic, nesting and
    /// sizes within `BusLimits`, strings without NUL.
    /// - Throws: `BusValueError` naming the first problem.
    public static func checkSendable(_ values: [BusValue]) throws(BusValueError) {
        var total = 0
        for v in values { total += try v.check(arrays: 0, structs: 0, depth: 0) }
        guard total <= BusLimits.messageBytes else {
            throw BusValueError("the message would be \(total) bytes, over D-Bus's \(BusLimits.messageBytes)-byte limit")
        }
    }

    /// Checks this value and returns its approximate marshalled size.
    private func check(arrays: Int, structs: Int, depth: Int) throws(BusValueError) -> Int {
        guard depth <= BusLimits.totalDepth else { throw BusValueError("containers nested deeper than \(BusLimits.totalDepth)") }
        switch self {
        case .byte: return 1
        case .boolean, .int32, .uint32, .unixFD: return 4
        case .int16, .uint16: return 2
        case .int64, .uint64, .double: return 8
        case .string(let s):
            guard !s.utf8.contains(0) else { throw BusValueError("a string contains a NUL byte") }
            return 5 + s.utf8.count
        case .objectPath(let p): return 5 + p.text.utf8.count
        case .signature(let g):
            let n = g.description.utf8.count
            guard n <= 255 else { throw BusValueError("a signature is longer than 255 bytes") }
            return 2 + n
        case .array(let element, let items):
            guard arrays < BusLimits.arrayDepth, arrays + element.arrayDepth < BusLimits.arrayDepth else {
                throw BusValueError("arrays nested deeper than \(BusLimits.arrayDepth)")
            }
            var size = 8
            for item in items {
                guard item.type == element else { throw BusValueError("an array of \(element) holds a \(item.type)") }
                size += try item.check(arrays: arrays + 1, structs: structs, depth: depth + 1)
            }
            guard size <= BusLimits.arrayBytes else { throw BusValueError("an array of \(size) bytes is over D-Bus's 64 MiB limit") }
            return size
        case .dictionary(let key, let value, let entries):
            guard key.isBasic else { throw BusValueError("a dictionary key of type \(key) is not basic") }
            guard arrays < BusLimits.arrayDepth else { throw BusValueError("arrays nested deeper than \(BusLimits.arrayDepth)") }
            guard structs < BusLimits.structDepth else { throw BusValueError("structs nested deeper than \(BusLimits.structDepth)") }
            var size = 8
            for e in entries {
                guard e.key.type == key, e.value.type == value else {
                    throw BusValueError("a dictionary a{\(key)\(value)} holds an entry {\(e.key.type)\(e.value.type)}")
                }
                size += 8 + (try e.key.check(arrays: arrays + 1, structs: structs + 1, depth: depth + 2))
                size += try e.value.check(arrays: arrays + 1, structs: structs + 1, depth: depth + 2)
            }
            guard size <= BusLimits.arrayBytes else { throw BusValueError("a dictionary of \(size) bytes is over D-Bus's 64 MiB limit") }
            return size
        case .structure(let fields):
            guard !fields.isEmpty else { throw BusValueError("an empty struct") }
            guard structs < BusLimits.structDepth else { throw BusValueError("structs nested deeper than \(BusLimits.structDepth)") }
            var size = 8
            for f in fields { size += try f.check(arrays: arrays, structs: structs + 1, depth: depth + 1) }
            return size
        case .variant(let inner):
            return 3 + (try inner.check(arrays: arrays, structs: structs, depth: depth + 1))
        }
    }
}
