/// One complete D-Bus type: a basic type, an array, a dictionary, a struct
/// or a variant (the D-Bus specification's "single complete type").
public indirect enum BusType: Hashable, Sendable, CustomStringConvertible {
    /// `y`: an unsigned 8-bit integer.
    case byte
    /// `b`: a boolean.
    case boolean
    /// `n`: a signed 16-bit integer.
    case int16
    /// `q`: an unsigned 16-bit integer.
    case uint16
    /// `i`: a signed 32-bit integer.
    case int32
    /// `u`: an unsigned 32-bit integer.
    case uint32
    /// `x`: a signed 64-bit integer.
    case int64
    /// `t`: an unsigned 64-bit integer.
    case uint64
    /// `d`: an IEEE 754 double.
    case double
    /// `s`: a UTF-8 string without NUL.
    case string
    /// `o`: an object path.
    case objectPath
    /// `g`: a signature.
    case signature
    /// `h`: a unix file descriptor.
    case unixFD
    /// `aT`: an array of `T`.
    case array(BusType)
    /// `a{KV}`: a dictionary from the basic type `K` to `V`.
    case dictionary(key: BusType, value: BusType)
    /// `(T...)`: a struct of one or more fields.
    case structure([BusType])
    /// `v`: a variant (a value carrying its own type).
    case variant

    /// Whether this is a basic type (may be a dictionary key).
    public var isBasic: Bool {
        switch self {
        case .array, .dictionary, .structure, .variant: false
        default: true
        }
    }

    /// The type code of a basic type or a variant (`s`, `v`), nil for containers.
    var code: Character? {
        switch self {
        case .byte: "y"
        case .boolean: "b"
        case .int16: "n"
        case .uint16: "q"
        case .int32: "i"
        case .uint32: "u"
        case .int64: "x"
        case .uint64: "t"
        case .double: "d"
        case .string: "s"
        case .objectPath: "o"
        case .signature: "g"
        case .unixFD: "h"
        case .variant: "v"
        case .array, .dictionary, .structure: nil
        }
    }

    /// The basic type (or variant) with type code `c`.
    static func basic(_ c: Character) -> BusType? {
        switch c {
        case "y": .byte
        case "b": .boolean
        case "n": .int16
        case "q": .uint16
        case "i": .int32
        case "u": .uint32
        case "x": .int64
        case "t": .uint64
        case "d": .double
        case "s": .string
        case "o": .objectPath
        case "g": .signature
        case "h": .unixFD
        case "v": .variant
        default: nil
        }
    }

    /// The type's signature text (`a{sv}`, `(ii)`).
    public var description: String {
        switch self {
        case .array(let element): "a\(element)"
        case .dictionary(let key, let value): "a{\(key)\(value)}"
        case .structure(let fields): "(\(fields.map(\.description).joined()))"
        default: String(code!)
        }
    }

    /// How deeply arrays nest in this type (`aai` is 2).
    var arrayDepth: Int {
        switch self {
        case .array(let e): 1 + e.arrayDepth
        case .dictionary(let k, let v): 1 + max(k.arrayDepth, v.arrayDepth)
        case .structure(let f): f.map(\.arrayDepth).max() ?? 0
        default: 0
        }
    }

    /// How deeply structs (and dictionary entries) nest in this type.
    var structDepth: Int {
        switch self {
        case .array(let e): e.structDepth
        case .dictionary(let k, let v): 1 + max(k.structDepth, v.structDepth)
        case .structure(let f): 1 + (f.map(\.structDepth).max() ?? 0)
        default: 0
        }
    }
}

/// Why a signature text is not a valid D-Bus signature.
public struct BusSignatureError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The text that was parsed.
    public var text: String
    /// What is wrong with it.
    public var reason: String

    /// `invalid D-Bus signature "a{vs}": ...`.
    public var description: String { "invalid D-Bus signature \"\(text)\": \(reason)" }
}

/// A D-Bus signature: zero or more complete types (`sa{sv}as` is three),
/// validated as the specification says (at most 255 bytes, arrays and
/// structs each nested at most 32 deep, dictionary keys basic, dictionary
/// entries only directly in arrays, no empty struct).
public struct BusSignature: Hashable, Sendable, CustomStringConvertible {
    /// The complete types in order.
    public let types: [BusType]

    /// The signature of `types`.
    public init(_ types: [BusType]) { self.types = types }

    /// Parses and validates `text`.
    /// - Parameter text: The signature text (`a{sv}`).
    /// - Throws: `BusSignatureError` saying what is wrong.
    public init(parsing text: String) throws(BusSignatureError) {
        let chars = Array(text)
        guard text.utf8.count <= 255 else { throw BusSignatureError(text: text, reason: "longer than 255 bytes") }
        var parser = SignatureParser(chars: chars, text: text)
        var types: [BusType] = []
        while parser.index < chars.count { types.append(try parser.complete(arrays: 0, structs: 0)) }
        self.types = types
    }

    /// The signature text (`sa{sv}`).
    public var description: String { types.map(\.description).joined() }

    /// Whether this is exactly one complete type (a variant may hold it).
    public var isSingleType: Bool { types.count == 1 }
}

private struct SignatureParser {
    let chars: [Character]
    let text: String
    var index = 0

    func fail(_ reason: String) -> BusSignatureError { BusSignatureError(text: text, reason: reason) }

    mutating func complete(arrays: Int, structs: Int) throws(BusSignatureError) -> BusType {
        guard index < chars.count else { throw fail("ends inside a type") }
        let c = chars[index]
        index += 1
        if let basic = BusType.basic(c) { return basic }
        switch c {
        case "a":
            guard arrays < 32 else { throw fail("arrays nested deeper than 32") }
            if index < chars.count, chars[index] == "{" {
                index += 1
                guard structs < 32 else { throw fail("structs nested deeper than 32") }
                let key = try complete(arrays: arrays + 1, structs: structs + 1)
                guard key.isBasic else { throw fail("dictionary key \(key) is not a basic type") }
                guard index < chars.count, chars[index] != "}" else { throw fail("dictionary entry has not exactly two types") }
                let value = try complete(arrays: arrays + 1, structs: structs + 1)
                guard index < chars.count, chars[index] == "}" else { throw fail("dictionary entry has not exactly two types") }
                index += 1
                return .dictionary(key: key, value: value)
            }
            return .array(try complete(arrays: arrays + 1, structs: structs))
        case "(":
            guard structs < 32 else { throw fail("structs nested deeper than 32") }
            var fields: [BusType] = []
            while index < chars.count, chars[index] != ")" {
                fields.append(try complete(arrays: arrays, structs: structs + 1))
            }
            guard index < chars.count else { throw fail("struct is not closed") }
            index += 1
            guard !fields.isEmpty else { throw fail("empty struct") }
            return .structure(fields)
        case "{":
            throw fail("dictionary entry outside an array")
        default:
            throw fail("unknown type code '\(c)'")
        }
    }
}

extension BusType {
    /// Parses `text` as exactly one complete type.
    /// - Parameter text: One complete type's signature (`a{sv}`).
    /// - Throws: `BusSignatureError` when it is not exactly one valid type.
    public init(parsing text: String) throws(BusSignatureError) {
        let signature = try BusSignature(parsing: text)
        guard signature.types.count == 1 else {
            throw BusSignatureError(text: text, reason: "is \(signature.types.count) complete types, not one")
        }
        self = signature.types[0]
    }
}
