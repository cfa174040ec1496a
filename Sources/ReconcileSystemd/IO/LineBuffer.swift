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
        var start = 0
        let end = bytes.count
        guard end > 0 else { return }
        while start < end {
            // memchr: the scan is the hot part, and fast even unoptimized.
            let found = memchr(bytes.baseAddress! + start, 10, end - start)
            if let found {
                let newline = bytes.baseAddress!.distance(to: UnsafeRawPointer(found))
                if skipping {
                    skipping = false
                } else if pending.count + (newline - start) > limit {
                    items.append(.tooLong)
                } else {
                    pending.append(contentsOf: bytes[start..<newline])
                    items.append(.line(Self.text(pending)))
                }
                pending.removeAll(keepingCapacity: true)
                start = newline + 1
            } else {
                if !skipping {
                    if pending.count + (end - start) > limit {
                        items.append(.tooLong)
                        skipping = true
                        pending.removeAll(keepingCapacity: false)
                    } else {
                        pending.append(contentsOf: bytes[start..<end])
                    }
                }
                start = end
            }
        }
    }

    /// The end of input: a partial last line becomes a line.
    mutating func finish(into items: inout [Item]) {
        if !skipping, !pending.isEmpty { items.append(.line(Self.text(pending))) }
        pending.removeAll(keepingCapacity: false)
        skipping = false
    }

    private static func text(_ bytes: [UInt8]) -> String {
        if bytes.last == 13 { return String(decoding: bytes.dropLast(), as: UTF8.self) }
        return String(decoding: bytes, as: UTF8.self)
    }
}
