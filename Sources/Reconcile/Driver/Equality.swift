/// Cheaper ways to find two values equal, for the comparisons the keep path
/// makes of every kept subscription (its key and its configuration, the
/// running one's against a freshly built one's).
///
/// Each answers `true` only when the values are equal; `false` means "not
/// shown equal this way": the caller then asks `==`.
///
/// Two values with the same bytes are the same value, so `==` holds for any
/// type whose equality is reflexive, as `Equatable` requires of keys and
/// configurations; that is how `HashableBox.sameBytes` answers most of them.
/// A value not equal to itself (a NaN, an `==` that answers `false` to ask
/// for a restart) may be found equal this way or not, by its bytes: whether
/// such a subscription is kept or restarted is unspecified. Values equal in
/// another representation (a string in another buffer, `-0.0` and `0.0`,
/// different padding) go on to `==`.
///
/// Padding bytes are read as they are (uninitialised ones too, which a
/// memory checker such as Valgrind's memcheck reports): different padding
/// only sends the comparison on to `==`.
enum Equality {
    /// Whether `a` and `b` hold the same UTF-8 bytes, else `==` (strings
    /// with different bytes may still be canonically equivalent).
    ///
    /// The standard library's `==` on two native strings in different
    /// buffers goes through four calls and a normalization check (~140
    /// instructions for a 33-byte path); equal bytes are found in ~30.
    static func strings(_ a: UnsafePointer<String>, _ b: UnsafePointer<String>) -> Bool {
        let same = a.pointee.utf8.withContiguousStorageIfAvailable { x in
            b.pointee.utf8.withContiguousStorageIfAvailable { y in
                x.count == y.count && bytesEqual(UnsafeRawPointer(x.baseAddress), UnsafeRawPointer(y.baseAddress), x.count)
            }
        }
        if same == true { return true }
        return a.pointee == b.pointee
    }

    /// Whether `a` and `b` have the same bytes (so are equal; see above),
    /// where the type is known: inlined, no call.
    @inline(__always) static func sameBytes<T>(_ a: T, _ b: T) -> Bool {
        withUnsafeBytes(of: a) { a in withUnsafeBytes(of: b) { b in bytesEqual(a.baseAddress, b.baseAddress, a.count) } }
    }

    /// `strings(_:_:)` on two values.
    static func strings(_ a: String, _ b: String) -> Bool {
        withUnsafePointer(to: a) { a in withUnsafePointer(to: b) { b in strings(a, b) } }
    }

    /// Whether the `count` bytes at `a` and `b` are the same: a word at a
    /// time, the last word overlapping the one before it (no byte loop for
    /// the tail); under a word, two overlapping halves the same way.
    @inline(__always)
    static func bytesEqual(_ a: UnsafeRawPointer?, _ b: UnsafeRawPointer?, _ count: Int) -> Bool {
        guard count > 0 else { return true }
        guard let a, let b else { return false }
        if count >= 8 {
            let last = count &- 8
            var i = 0
            while i < last {
                if a.loadUnaligned(fromByteOffset: i, as: UInt64.self) != b.loadUnaligned(fromByteOffset: i, as: UInt64.self) { return false }
                i &+= 8
            }
            return a.loadUnaligned(fromByteOffset: last, as: UInt64.self) == b.loadUnaligned(fromByteOffset: last, as: UInt64.self)
        }
        if count >= 4 {
            return a.loadUnaligned(as: UInt32.self) == b.loadUnaligned(as: UInt32.self)
                && a.loadUnaligned(fromByteOffset: count &- 4, as: UInt32.self) == b.loadUnaligned(fromByteOffset: count &- 4, as: UInt32.self)
        }
        if count >= 2 {
            return a.loadUnaligned(as: UInt16.self) == b.loadUnaligned(as: UInt16.self)
                && a.loadUnaligned(fromByteOffset: count &- 2, as: UInt16.self) == b.loadUnaligned(fromByteOffset: count &- 2, as: UInt16.self)
        }
        return a.load(as: UInt8.self) == b.load(as: UInt8.self)
    }
}
