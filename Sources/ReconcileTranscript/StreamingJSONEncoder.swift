/// Encodes `Encodable` values straight into JSON text, without building a
/// tree: fast enough to run on the loop thread for every message.
///
/// The output reads back with Foundation's `JSONDecoder` (default
/// strategies): objects for keyed containers, arrays for unkeyed ones, nil
/// keys omitted by `encodeIfPresent`. Containers are written in the order
/// they are used; a container written to after a sibling was opened closes
/// that sibling first (synthesized `Codable` never does this). Non-finite
/// floating-point values throw, as in `JSONEncoder`.
public final class StreamingJSONEncoder {
    // One thread uses an encoder at a time (the loop's): the dynamic
    // exclusivity checks on these, paid per byte run written, are skipped.
    /// The text written so far.
    @exclusivity(unchecked) public var out: JSONOutput
    /// The closing byte of each open container, outermost first.
    @exclusivity(unchecked) var closers: [UInt8] = []
    /// Whether each open container has an element yet.
    @exclusivity(unchecked) var hasElement: [Bool] = []

    /// An encoder whose output starts with room for `capacity` bytes.
    public init(capacity: Int = 0) { out = JSONOutput(capacity: capacity) }

    /// Writes `value` at the current position.
    /// - Parameter value: The value to write.
    /// - Throws: `EncodingError.invalidValue` for a non-finite number or a
    ///   write to a closed container, or what `value.encode(to:)` throws;
    ///   the caller rolls `out` back.
    public func encode<T: Encodable>(_ value: T) throws {
        let level = closers.count
        let before = out.bytes.count
        do {
            try value.encode(to: Frame(core: self, level: level))
        } catch {
            closers.removeSubrange(level...)
            hasElement.removeSubrange(level...)
            throw error
        }
        close(to: level)
        if out.bytes.count == before { out.raw("{}") }
    }

    /// Drops the open-container state after an error (the caller rolls the
    /// output back).
    public func reset() {
        closers.removeAll(keepingCapacity: true)
        hasElement.removeAll(keepingCapacity: true)
    }

    func close(to level: Int) {
        while closers.count > level {
            out.byte(closers.removeLast())
            hasElement.removeLast()
        }
    }

    func open(_ opener: UInt8, _ closer: UInt8) {
        out.byte(opener)
        closers.append(closer)
        hasElement.append(false)
    }

    /// Prepares the next element of the container at `depth` (1-based).
    func element(at depth: Int, _ codingPath: [any CodingKey]) throws {
        close(to: depth)
        guard closers.count == depth else {
            throw EncodingError.invalidValue(0, .init(codingPath: codingPath, debugDescription: "a container was written to after it was closed"))
        }
        if hasElement[depth - 1] { out.byte(UInt8(ascii: ",")) } else { hasElement[depth - 1] = true }
    }

    func key(_ key: some CodingKey) {
        out.string(key.stringValue)
        out.byte(UInt8(ascii: ":"))
    }

    func double(_ v: Double, _ codingPath: [any CodingKey]) throws {
        guard v.isFinite else {
            throw EncodingError.invalidValue(v, .init(codingPath: codingPath, debugDescription: "\(v) is not a JSON number"))
        }
        out.number(v.description)
    }

    func float(_ v: Float, _ codingPath: [any CodingKey]) throws {
        guard v.isFinite else {
            throw EncodingError.invalidValue(v, .init(codingPath: codingPath, debugDescription: "\(v) is not a JSON number"))
        }
        out.number(v.description)
    }

    /// One value slot: the `Encoder` a value's `encode(to:)` sees.
    struct Frame: Encoder {
        let core: StreamingJSONEncoder
        let level: Int
        var codingPath: [any CodingKey] { [] }
        var userInfo: [CodingUserInfoKey: Any] { [:] }

        func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
            if !(core.closers.count == level + 1 && core.closers[level] == UInt8(ascii: "}")) {
                core.close(to: level)
                core.open(UInt8(ascii: "{"), UInt8(ascii: "}"))
            }
            return KeyedEncodingContainer(Keyed<Key>(core: core, depth: level + 1))
        }

        func unkeyedContainer() -> any UnkeyedEncodingContainer {
            if !(core.closers.count == level + 1 && core.closers[level] == UInt8(ascii: "]")) {
                core.close(to: level)
                core.open(UInt8(ascii: "["), UInt8(ascii: "]"))
            }
            return Unkeyed(core: core, depth: level + 1)
        }

        func singleValueContainer() -> any SingleValueEncodingContainer { Single(core: core, level: level) }
    }

    struct Keyed<Key: CodingKey>: KeyedEncodingContainerProtocol {
        let core: StreamingJSONEncoder
        let depth: Int
        var codingPath: [any CodingKey] { [] }

        func slot(_ key: Key) throws {
            try core.element(at: depth, codingPath)
            core.key(key)
        }
        mutating func encodeNil(forKey key: Key) throws { try slot(key); core.out.raw("null") }
        mutating func encode(_ value: Bool, forKey key: Key) throws { try slot(key); value ? core.out.raw("true") : core.out.raw("false") }
        mutating func encode(_ value: String, forKey key: Key) throws { try slot(key); core.out.string(value) }
        mutating func encode(_ value: Double, forKey key: Key) throws { try slot(key); try core.double(value, codingPath) }
        mutating func encode(_ value: Float, forKey key: Key) throws { try slot(key); try core.float(value, codingPath) }
        mutating func encode(_ value: Int, forKey key: Key) throws { try slot(key); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int8, forKey key: Key) throws { try slot(key); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int16, forKey key: Key) throws { try slot(key); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int32, forKey key: Key) throws { try slot(key); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int64, forKey key: Key) throws { try slot(key); core.out.int(value) }
        mutating func encode(_ value: UInt, forKey key: Key) throws { try slot(key); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt8, forKey key: Key) throws { try slot(key); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt16, forKey key: Key) throws { try slot(key); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt32, forKey key: Key) throws { try slot(key); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt64, forKey key: Key) throws { try slot(key); core.out.uint(value) }
        mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws { try slot(key); try core.encode(value) }

        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
            try? slot(key)
            core.open(UInt8(ascii: "{"), UInt8(ascii: "}"))
            return KeyedEncodingContainer(Keyed<NestedKey>(core: core, depth: depth + 1))
        }
        mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
            try? slot(key)
            core.open(UInt8(ascii: "["), UInt8(ascii: "]"))
            return Unkeyed(core: core, depth: depth + 1)
        }
        mutating func superEncoder() -> any Encoder {
            try? core.element(at: depth, codingPath)
            core.out.raw("\"super\":")
            return Frame(core: core, level: depth)
        }
        mutating func superEncoder(forKey key: Key) -> any Encoder {
            try? slot(key)
            return Frame(core: core, level: depth)
        }
    }

    struct Unkeyed: UnkeyedEncodingContainer {
        let core: StreamingJSONEncoder
        let depth: Int
        var count = 0
        var codingPath: [any CodingKey] { [] }

        init(core: StreamingJSONEncoder, depth: Int) {
            self.core = core
            self.depth = depth
        }

        mutating func slot() throws {
            try core.element(at: depth, codingPath)
            count += 1
        }
        mutating func encodeNil() throws { try slot(); core.out.raw("null") }
        mutating func encode(_ value: Bool) throws { try slot(); value ? core.out.raw("true") : core.out.raw("false") }
        mutating func encode(_ value: String) throws { try slot(); core.out.string(value) }
        mutating func encode(_ value: Double) throws { try slot(); try core.double(value, codingPath) }
        mutating func encode(_ value: Float) throws { try slot(); try core.float(value, codingPath) }
        mutating func encode(_ value: Int) throws { try slot(); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int8) throws { try slot(); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int16) throws { try slot(); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int32) throws { try slot(); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int64) throws { try slot(); core.out.int(value) }
        mutating func encode(_ value: UInt) throws { try slot(); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt8) throws { try slot(); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt16) throws { try slot(); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt32) throws { try slot(); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt64) throws { try slot(); core.out.uint(value) }
        mutating func encode<T: Encodable>(_ value: T) throws { try slot(); try core.encode(value) }

        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
            try? slot()
            core.open(UInt8(ascii: "{"), UInt8(ascii: "}"))
            return KeyedEncodingContainer(Keyed<NestedKey>(core: core, depth: depth + 1))
        }
        mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
            try? slot()
            core.open(UInt8(ascii: "["), UInt8(ascii: "]"))
            return Unkeyed(core: core, depth: depth + 1)
        }
        mutating func superEncoder() -> any Encoder {
            try? slot()
            return Frame(core: core, level: depth)
        }
    }

    struct Single: SingleValueEncodingContainer {
        let core: StreamingJSONEncoder
        let level: Int
        var codingPath: [any CodingKey] { [] }

        func slot() { core.close(to: level) }
        mutating func encodeNil() throws { slot(); core.out.raw("null") }
        mutating func encode(_ value: Bool) throws { slot(); value ? core.out.raw("true") : core.out.raw("false") }
        mutating func encode(_ value: String) throws { slot(); core.out.string(value) }
        mutating func encode(_ value: Double) throws { slot(); try core.double(value, codingPath) }
        mutating func encode(_ value: Float) throws { slot(); try core.float(value, codingPath) }
        mutating func encode(_ value: Int) throws { slot(); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int8) throws { slot(); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int16) throws { slot(); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int32) throws { slot(); core.out.int(Int64(value)) }
        mutating func encode(_ value: Int64) throws { slot(); core.out.int(value) }
        mutating func encode(_ value: UInt) throws { slot(); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt8) throws { slot(); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt16) throws { slot(); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt32) throws { slot(); core.out.uint(UInt64(value)) }
        mutating func encode(_ value: UInt64) throws { slot(); core.out.uint(value) }
        mutating func encode<T: Encodable>(_ value: T) throws { slot(); try core.encode(value) }
    }
}
