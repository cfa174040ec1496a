/// The lines of one read batch (`DescriptorSource.Event.lines`), in order,
/// without their ends: a collection of `String`s kept as bytes.
///
/// The driver copies each read into the batch once and frames its lines
/// as places in that copy; a line becomes a `String` when it is read
/// (`batch[i]`, `for line in batch`), which is when
/// `DescriptorSource.Event.line` would have made it (invalid UTF-8 repaired
/// the same way). So a batch of a thousand lines is two arrays, not a
/// thousand strings alive at once, and each string a program makes is
/// freed while it is still in the cache. Reading a line twice decodes it
/// twice: keep `Array(batch)` to read the strings often. `utf8(at:)` gives
/// a line's bytes without a string.
public struct LineBatch: RandomAccessCollection, Hashable, Sendable, ExpressibleByArrayLiteral,
    CustomStringConvertible, CustomDebugStringConvertible {
    /// Where a line lies in `bytes`.
    @usableFromInline struct Span: Hashable, Sendable {
        @usableFromInline var start: Int
        @usableFromInline var end: Int
        @inlinable init(start: Int, end: Int) {
            self.start = start
            self.end = end
        }
    }

    /// The lines' bytes: the reads they were framed from (the driver
    /// copies a read once, its lines are spans of it) or each line's own,
    /// in `bytes[..<used]`; the rest is room (initialized, its contents
    /// left over), so a copy in is one `memcpy` (an array's
    /// `append(contentsOf:)` copies a byte at a time).
    @usableFromInline var bytes: [UInt8]
    /// How much of `bytes` is in use.
    @usableFromInline var used: Int
    /// The lines' own bytes together (what `used` also counts of line
    /// ends, skipped lines and a line's first part is not in it).
    @usableFromInline var lineBytes: Int
    /// Each line's place in `bytes`, in order.
    @usableFromInline var spans: [Span]

    /// No lines.
    public init() {
        bytes = []
        used = 0
        lineBytes = 0
        spans = []
    }

    /// `lines`, in order (each `String`'s UTF-8 as it is).
    public init<S: Sequence>(_ lines: S) where S.Element == String {
        self.init()
        for line in lines { append(line) }
    }

    /// `["a", "b"]`.
    public init(arrayLiteral lines: String...) { self.init(lines) }

    @inlinable public var startIndex: Int { 0 }
    @inlinable public var endIndex: Int { spans.count }

    /// Line `i` as text (made now; invalid UTF-8 repaired).
    @inlinable
    public subscript(i: Int) -> String {
        let span = spans[i]
        return bytes.withUnsafeBufferPointer { String(decoding: UnsafeBufferPointer(rebasing: $0[span.start..<span.end]), as: UTF8.self) }
    }

    /// Line `i`'s bytes, no string made: a view of the batch's storage
    /// (its indices are the storage's, not from 0: use `first`, a loop or
    /// `Array(_:)`; holding it holds the whole batch's storage).
    @inlinable
    public func utf8(at i: Int) -> ArraySlice<UInt8> {
        let span = spans[i]
        return bytes[span.start..<span.end]
    }

    /// `line` added at the end.
    public mutating func append(_ line: String) {
        var line = line
        line.withUTF8 { append(utf8: UnsafeRawBufferPointer($0)) }
    }

    /// A line of `utf8` added at the end, copied.
    @inlinable
    package mutating func append(utf8: UnsafeRawBufferPointer) {
        let start = appendRead(utf8)
        lineBytes &+= utf8.count
        spans.append(Span(start: start, end: used))
    }

    /// `read` copied in as no line yet (the driver's framing, once per
    /// read); returns where it starts in the batch's storage, for
    /// `appendLine(from:count:)`.
    @inlinable
    package mutating func appendRead(_ read: UnsafeRawBufferPointer) -> Int {
        let start = used
        guard !read.isEmpty else { return start }
        if bytes.count &- used < read.count { grow(toHold: read.count) }
        bytes.withUnsafeMutableBytes { UnsafeMutableRawBufferPointer(rebasing: $0[start..<start &+ read.count]).copyMemory(from: read) }
        used = start &+ read.count
        return start
    }

    /// Room for `more` bytes past `used` (at least twice the room there was).
    @usableFromInline
    mutating func grow(toHold more: Int) {
        let size = Swift.max(used + more, bytes.count * 2, 256)
        bytes.reserveCapacity(size)
        bytes.append(contentsOf: repeatElement(0, count: size - bytes.count))
    }

    /// A line of `count` bytes from `start` of what `appendRead` copied.
    @inlinable @inline(__always)
    package mutating func appendLine(from start: Int, count: Int) {
        assert(start >= 0 && count >= 0 && start + count <= used, "LineBatch.appendLine: a line outside what was read in")
        lineBytes &+= count
        spans.append(Span(start: start, end: start &+ count))
    }

    /// Every line removed; `keepingCapacity`: the storage kept for more
    /// (when something else holds it, the next copy in copies it first).
    package mutating func removeAll(keepingCapacity: Bool) {
        if !keepingCapacity { bytes = [] }
        used = 0
        lineBytes = 0
        spans.removeAll(keepingCapacity: keepingCapacity)
    }

    /// The same lines in storage of their own size (not shared): only
    /// the lines' bytes, one after another.
    package func copiedToSize() -> LineBatch {
        var copy = LineBatch()
        copy.bytes = Array(repeating: 0, count: lineBytes)
        copy.spans.reserveCapacity(spans.count)
        bytes.withUnsafeBytes { all in
            for span in spans { copy.append(utf8: UnsafeRawBufferPointer(rebasing: all[span.start..<span.end])) }
        }
        return copy
    }

    /// The lines' own bytes together (a `copiedToSize` batch's room).
    package var byteCount: Int { lineBytes }

    /// The lines and bytes there is room for without growing.
    package var capacity: (lines: Int, bytes: Int) { (spans.capacity, Swift.max(bytes.count, bytes.capacity)) }

    /// Every line removed, the storage made this batch's own for the
    /// next (copied when something else holds it: a program that kept the
    /// batch); true when it was already.
    package mutating func emptyForReuse() -> Bool {
        let before = bytes.withUnsafeBytes { $0.baseAddress }
        let after = bytes.withUnsafeMutableBytes { UnsafeRawPointer($0.baseAddress) }
        removeAll(keepingCapacity: true)
        return before == after
    }

    /// The same lines, as text (two invalid sequences that repair to the
    /// same text are equal).
    public static func == (a: LineBatch, b: LineBatch) -> Bool {
        guard a.count == b.count else { return false }
        for i in 0..<a.count where a.utf8(at: i) != b.utf8(at: i) && a[i] != b[i] { return false }
        return true
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(count)
        for line in self { hasher.combine(line) }
    }

    /// `["a", "b"]`, as an array of the lines shows.
    public var description: String { Array(self).description }
    public var debugDescription: String { Array(self).debugDescription }
}
