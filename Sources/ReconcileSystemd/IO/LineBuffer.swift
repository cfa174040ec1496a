import Glibc

/// Cuts bytes into lines of at most `limit` bytes; a longer line is reported
/// once and its bytes are skipped up to the next newline (never buffered).
struct LineBuffer {
    enum Item {
        case line(String)
        case tooLong
    }

    let limit: Int
    private var pending: [UInt8] = []
    private var skipping = false

    init(limit: Int) { self.limit = max(1, limit) }

    /// Appends what `bytes` completes to `items`.
    mutating func feed(_ bytes: UnsafeRawBufferPointer, into items: inout [Item]) {
        feed(bytes) { items.append($0) }
    }

    /// Calls `body` with each item `bytes` completes, in order, moved in
    /// (a borrowed item cost each line's string a retain and a release).
    @inline(__always)
    mutating func feed(_ bytes: UnsafeRawBufferPointer, _ body: (consuming Item) -> Void) {
        var start = 0
        while let item = next(bytes, from: &start) { body(item) }
    }

    /// The next item `bytes[start...]` completes, `start` moved past it;
    /// nil when the rest is used up (a line's first part waits in
    /// `pending`, or a too-long line's bytes were skipped). A line that lies
    /// whole in `bytes` is decoded from it directly (one copy: the
    /// `String`); only a line's first part waits in `pending`.
    @inline(__always)
    mutating func next(_ bytes: UnsafeRawBufferPointer, from start: inout Int) -> Item? {
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
                return .line(Self.text(UnsafeRawBufferPointer(start: base + start, count: newline - start)))
            }
            pending.append(contentsOf: UnsafeRawBufferPointer(start: base + start, count: newline - start))
            let line = Item.line(pending.withUnsafeBytes { Self.text($0) })
            pending.removeAll(keepingCapacity: true)
            return line
        }
        return nil
    }

    /// The end of input: a partial last line becomes a line.
    mutating func finish(into items: inout [Item]) {
        if let last = finish() { items.append(last) }
    }

    /// The end of input: a partial last line, if any (the buffer is empty
    /// after it).
    mutating func finish() -> Item? {
        defer {
            pending.removeAll(keepingCapacity: false)
            skipping = false
        }
        guard !skipping, !pending.isEmpty else { return nil }
        return .line(pending.withUnsafeBytes { Self.text($0) })
    }

    /// The line's text, a `\r` before its end dropped (invalid UTF-8 repaired).
    private static func text(_ bytes: UnsafeRawBufferPointer) -> String {
        if bytes.last == 13 { return String(decoding: UnsafeRawBufferPointer(rebasing: bytes.dropLast()), as: UTF8.self) }
        return String(decoding: bytes, as: UTF8.self)
    }
}
