/// Why a D-Bus value could not be decoded into the Swift type asked for.
public struct BusDecodingError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The type that was expected (`s`, `String`).
    public var expected: String
    /// The type of the value found.
    public var found: BusType
    /// Where in the value (`[2]`, `["State"]`), outermost first.
    public var path: String

    /// A mismatch: `expected`, but a value of type `found` at `path`.
    public init(expected: String, found: BusType, path: String = "") {
        self.expected = expected
        self.found = found
        self.path = path
    }

    /// `expected String, found i at ["State"]`.
    public var description: String {
        "expected \(expected), found \(found)" + (path.isEmpty ? "" : " at \(path)")
    }

    func at(_ element: String) -> BusDecodingError {
        BusDecodingError(expected: expected, found: found, path: element + path)
    }
}

/// A Swift type that a D-Bus value decodes into (`value.decode(as: [String: Int32].self)`).
/// Variants are seen through.
public protocol BusDecodable {
    /// Decodes `value`.
    /// - Parameter value: The D-Bus value.
    /// - Throws: `BusDecodingError` when its type does not fit.
    init(bus value: BusValue) throws(BusDecodingError)
}

/// A Swift type with one D-Bus type (`String` is `s`): what a source checks
/// a property's or argument's type against.
public protocol BusTyped {
    /// The D-Bus type of every value of this Swift type.
    static var busType: BusType { get }
}

extension BusValue {
    /// This value decoded as `T` (variants seen through).
    /// - Parameter type: The Swift type.
    /// - Throws: `BusDecodingError` when the value's type does not fit.
    public func decode<T: BusDecodable>(as type: T.Type = T.self) throws(BusDecodingError) -> T {
        try T(bus: self)
    }
}

extension BusValue: BusDecodable {
    /// The value itself (a variant stays a variant).
    public init(bus value: BusValue) throws(BusDecodingError) { self = value }
}

extension String: BusDecodable, BusTyped {
    /// An `s`, `o` or `g`'s text.
    public init(bus value: BusValue) throws(BusDecodingError) {
        guard let s = value.string else { throw BusDecodingError(expected: "String", found: value.variantContent.type) }
        self = s
    }
    /// `s`.
    public static var busType: BusType { .string }
}

extension Bool: BusDecodable, BusTyped {
    /// A `b`.
    public init(bus value: BusValue) throws(BusDecodingError) {
        guard let b = value.bool else { throw BusDecodingError(expected: "Bool", found: value.variantContent.type) }
        self = b
    }
    /// `b`.
    public static var busType: BusType { .boolean }
}

extension Double: BusDecodable, BusTyped {
    /// A `d` (or an integer, converted).
    public init(bus value: BusValue) throws(BusDecodingError) {
        guard let d = value.double else { throw BusDecodingError(expected: "Double", found: value.variantContent.type) }
        self = d
    }
    /// `d`.
    public static var busType: BusType { .double }
}

/// Integers decode from any D-Bus integer type whose value fits.
private func integer<T: FixedWidthInteger>(_ value: BusValue, _ type: T.Type) throws(BusDecodingError) -> T {
    let content = value.variantContent
    if case .uint64(let u) = content, let v = T(exactly: u) { return v }
    if let i = content.int64, let v = T(exactly: i) { return v }
    throw BusDecodingError(expected: "\(T.self)", found: content.type)
}

extension UInt8: BusDecodable, BusTyped {
    /// An integer that fits.
    public init(bus value: BusValue) throws(BusDecodingError) { self = try integer(value, UInt8.self) }
    /// `y`.
    public static var busType: BusType { .byte }
}
extension Int16: BusDecodable, BusTyped {
    /// An integer that fits.
    public init(bus value: BusValue) throws(BusDecodingError) { self = try integer(value, Int16.self) }
    /// `n`.
    public static var busType: BusType { .int16 }
}
extension UInt16: BusDecodable, BusTyped {
    /// An integer that fits.
    public init(bus value: BusValue) throws(BusDecodingError) { self = try integer(value, UInt16.self) }
    /// `q`.
    public static var busType: BusType { .uint16 }
}
extension Int32: BusDecodable, BusTyped {
    /// An integer that fits.
    public init(bus value: BusValue) throws(BusDecodingError) { self = try integer(value, Int32.self) }
    /// `i`.
    public static var busType: BusType { .int32 }
}
extension UInt32: BusDecodable, BusTyped {
    /// An integer that fits.
    public init(bus value: BusValue) throws(BusDecodingError) { self = try integer(value, UInt32.self) }
    /// `u`.
    public static var busType: BusType { .uint32 }
}
extension Int64: BusDecodable, BusTyped {
    /// An integer that fits.
    public init(bus value: BusValue) throws(BusDecodingError) { self = try integer(value, Int64.self) }
    /// `x`.
    public static var busType: BusType { .int64 }
}
extension UInt64: BusDecodable, BusTyped {
    /// An integer that fits.
    public init(bus value: BusValue) throws(BusDecodingError) { self = try integer(value, UInt64.self) }
    /// `t`.
    public static var busType: BusType { .uint64 }
}
extension Int: BusDecodable {
    /// An integer that fits.
    public init(bus value: BusValue) throws(BusDecodingError) { self = try integer(value, Int.self) }
}

extension BusObjectPath: BusDecodable, BusTyped {
    /// An `o`.
    public init(bus value: BusValue) throws(BusDecodingError) {
        guard let p = value.objectPath else { throw BusDecodingError(expected: "BusObjectPath", found: value.variantContent.type) }
        self = p
    }
    /// `o`.
    public static var busType: BusType { .objectPath }
}

extension Array: BusDecodable where Element: BusDecodable {
    /// An array (or a struct's fields), each element decoded.
    public init(bus value: BusValue) throws(BusDecodingError) {
        guard let elements = value.elements else {
            throw BusDecodingError(expected: "[\(Element.self)]", found: value.variantContent.type)
        }
        var out: [Element] = []
        out.reserveCapacity(elements.count)
        for (i, e) in elements.enumerated() {
            do { out.append(try Element(bus: e)) } catch { throw error.at("[\(i)]") }
        }
        self = out
    }
}

extension Array: BusTyped where Element: BusTyped {
    /// `aT`.
    public static var busType: BusType { .array(Element.busType) }
}

extension Dictionary: BusDecodable where Key: BusDecodable, Value: BusDecodable {
    /// A dictionary, each key and value decoded (a later duplicate key wins).
    public init(bus value: BusValue) throws(BusDecodingError) {
        guard let entries = value.entries else {
            throw BusDecodingError(expected: "[\(Key.self): \(Value.self)]", found: value.variantContent.type)
        }
        var out: [Key: Value] = [:]
        for e in entries {
            let k = try Key(bus: e.key)
            do { out[k] = try Value(bus: e.value) } catch { throw error.at("[\(e.key.string.map { "\"\($0)\"" } ?? "\(e.key)")]") }
        }
        self = out
    }
}

extension Dictionary: BusTyped where Key: BusTyped, Value: BusTyped {
    /// `a{KV}`.
    public static var busType: BusType { .dictionary(key: Key.busType, value: Value.busType) }
}

// MARK: - Building values from Swift values

extension BusValue: ExpressibleByStringLiteral, ExpressibleByBooleanLiteral {
    /// An `s`.
    public init(stringLiteral value: String) { self = .string(value) }
    /// A `b`.
    public init(booleanLiteral value: Bool) { self = .boolean(value) }
}
