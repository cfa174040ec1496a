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

    /// Calls `body` with each item `bytes` completes, in order. A line that
    /// lies whole in `bytes` is decoded from it directly (one copy: the
    /// `String`); only a line's first part waits in `pending`.
    @inline(__always)
    mutating func feed(_ bytes: UnsafeRawBufferPointer, _ body: (Item) -> Void) {
        var start = 0
        let end = bytes.count
        guard end > 0, let base = bytes.baseAddress else { return }
        while start < end {
            // memchr: the scan is the hot part, and fast even unoptimized.
            if let found = memchr(base + start, 10, end - start) {
                let newline = base.distance(to: UnsafeRawPointer(found))
                if skipping {
                    skipping = false
                } else if pending.count + (newline - start) > limit {
                    body(.tooLong)
                } else if pending.isEmpty {
                    body(.line(Self.text(UnsafeRawBufferPointer(start: base + start, count: newline - start))))
                } else {
                    pending.append(contentsOf: UnsafeRawBufferPointer(start: base + start, count: newline - start))
                    body(.line(pending.withUnsafeBytes { Self.text($0) }))
                }
                if !pending.isEmpty { pending.removeAll(keepingCapacity: true) }
                start = newline + 1
            } else {
                if !skipping {
                    if pending.count + (end - start) > limit {
                        body(.tooLong)
                        skipping = true
                        pending.removeAll(keepingCapacity: false)
                    } else {
                        pending.append(contentsOf: UnsafeRawBufferPointer(start: base + start, count: end - start))
                    }
                }
                start = end
            }
        }
    }

    /// The end of input: a partial last line becomes a line.
    mutating func finish(into items: inout [Item]) {
        finish { items.append($0) }
    }

    /// The end of input: a partial last line is handed to `body`.
    mutating func finish(_ body: (Item) -> Void) {
        if !skipping, !pending.isEmpty { body(.line(pending.withUnsafeBytes { Self.text($0) })) }
        pending.removeAll(keepingCapacity: false)
        skipping = false
    }

    /// The line's text, a `\r` before its end dropped (invalid UTF-8 repaired).
    private static func text(_ bytes: UnsafeRawBufferPointer) -> String {
        if bytes.last == 13 { return String(decoding: UnsafeRawBufferPointer(rebasing: bytes.dropLast()), as: UTF8.self) }
        return String(decoding: bytes, as: UTF8.self)
    }
}
