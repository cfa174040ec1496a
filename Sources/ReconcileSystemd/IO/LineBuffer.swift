import Glibc

/// Cuts bytes into lines of at most `limit` bytes; a longer line is reported
/// once and its bytes are skipped up to the next newline (never buffered).
struct LineBuffer {
    /// A framed line (`Line`: what the caller made of its bytes, a
    /// `String` unless told otherwise), or a too-long one skipped.
    enum Item<Line> {
        case line(Line)
        case tooLong
    }

    let limit: Int
    private var pending: [UInt8] = []
    private var skipping = false

    init(limit: Int) { self.limit = max(1, limit) }

    /// Appends what `bytes` completes to `items`.
    mutating func feed(_ bytes: UnsafeRawBufferPointer, into items: inout [Item<String>]) {
        var start = 0
        while let item = next(bytes, from: &start) { items.append(item) }
    }

    /// The next item `bytes[start...]` completes, as a `String`.
    @inline(__always)
    mutating func next(_ bytes: UnsafeRawBufferPointer, from start: inout Int) -> Item<String>? {
        next(bytes, from: &start, Self.text)
    }

    /// The next item `bytes[start...]` completes, `start` moved past it;
    /// nil when the rest is used up (a line's first part waits in
    /// `pending`, or a too-long line's bytes were skipped). `make` gets
    /// the line's bytes (a `\r` before its end dropped) and makes the
    /// item's line of them, straight from `bytes` when the line lies whole
    /// in it; only a line's first part waits in `pending`.
    @inline(__always)
    mutating func next<Line>(_ bytes: UnsafeRawBufferPointer, from start: inout Int,
                             _ make: (UnsafeRawBufferPointer) -> Line) -> Item<Line>? {
        let end = bytes.count
        guard let base = bytes.baseAddress else { return nil }
        while start < end {
            // memchr: the scan is the hot part, and fast even unoptimized.
            guard let found = memchr(base + start, 10, end - start) else {
                defer { start = end }
                if skipping { return nil }
                if pending.count + (end - start) > limit {
                    skipping = true
                    pending.removeAll(keepingCapacity: false)
                    return .tooLong
                }
                pending.append(contentsOf: UnsafeRawBufferPointer(start: base + start, count: end - start))
                return nil
            }
            let newline = base.distance(to: UnsafeRawPointer(found))
            defer { start = newline + 1 }
            if skipping {
                skipping = false
                continue
            }
            if pending.count + (newline - start) > limit {
                if !pending.isEmpty { pending.removeAll(keepingCapacity: true) }
                return .tooLong
            }
            if pending.isEmpty {
                return .line(make(Self.trimmed(UnsafeRawBufferPointer(start: base + start, count: newline - start))))
            }
            pending.append(contentsOf: UnsafeRawBufferPointer(start: base + start, count: newline - start))
            let line = Item.line(pending.withUnsafeBytes { make(Self.trimmed($0)) })
            pending.removeAll(keepingCapacity: true)
            return line
        }
        return nil
    }

    /// Whether nothing waits: no line's first part, no long line skipped.
    var isClear: Bool { pending.isEmpty && !skipping }

    /// The lines that lie whole in `bytes[start...]`, from `start` (the
    /// buffer `isClear`), each given to `line` as its offset in `bytes` and
    /// its length (a `\r` before its end dropped), `start` moved past
    /// each; stops before a line longer than the limit or a last part with
    /// no newline, which `next` takes. What `next` would give, without its
    /// checks per line: the batch's framing.
    @inline(__always)
    mutating func wholeLines(_ bytes: UnsafeRawBufferPointer, from start: inout Int, _ line: (Int, Int) -> Void) {
        let end = bytes.count
        guard let base = bytes.baseAddress else { return }
        while start < end, let found = memchr(base + start, 10, end - start) {
            let length = base.distance(to: UnsafeRawPointer(found)) - start
            guard length <= limit else { return }
            line(start, Self.trimmed(UnsafeRawBufferPointer(start: base + start, count: length)).count)
            start += length + 1
        }
    }

    /// The end of input: a partial last line becomes a line.
    mutating func finish(into items: inout [Item<String>]) {
        if let last = finish() { items.append(last) }
    }

    /// The end of input: a partial last line, if any, as a `String`.
    mutating func finish() -> Item<String>? { finish(Self.text) }

    /// The end of input: a partial last line, if any, made by `make` (the
    /// buffer is empty after it).
    mutating func finish<Line>(_ make: (UnsafeRawBufferPointer) -> Line) -> Item<Line>? {
        defer {
            pending.removeAll(keepingCapacity: false)
            skipping = false
        }
        guard !skipping, !pending.isEmpty else { return nil }
        return .line(pending.withUnsafeBytes { make(Self.trimmed($0)) })
    }

    /// `bytes` without a `\r` at its end.
    @inline(__always)
    private static func trimmed(_ bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
        bytes.last == 13 ? UnsafeRawBufferPointer(rebasing: bytes.dropLast()) : bytes
    }

    /// The line's text (invalid UTF-8 repaired).
    private static func text(_ bytes: UnsafeRawBufferPointer) -> String {
        String(decoding: bytes, as: UTF8.self)
    }
}
