// libFuzzer target for the transcript parser (Sources/ReconcileTranscript/JSONParser.swift, with
// JSONValue.swift). Built by `make fuzz` / `make test` with: swiftc -sanitize=fuzzer,address -parse-as-library
// The input is split into lines as a transcript is; each line is parsed. The parser must never
// trap, read out of bounds, loop forever or allocate without bound on any input, and what it
// accepts must hold what RFC 8259 allows: finite numbers, nesting within JSONParser.maxDepth.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTranscript(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeBufferPointer(start: data, count: size)
    var start = 0
    var total = 0
    while start <= size {
        var stop = start
        while stop < size && bytes[stop] != 0x0A { stop += 1 }
        if let value = try? JSONParser.parse(UnsafeBufferPointer(rebasing: bytes[start..<stop])) {
            total &+= check(value, depth: 0)
        }
        start = stop + 1
    }
    return total == Int.min ? 1 : 0
}

/// Walks what was accepted, trapping on what the parser must refuse.
func check(_ v: JSONValue, depth: Int) -> Int {
    switch v {
    case .null, .bool: return 1
    case .int(let i): return Int(truncatingIfNeeded: i)
    case .uint(let u):
        precondition(u > UInt64(Int64.max), "a .uint that fits Int64")
        return Int(truncatingIfNeeded: u)
    case .double(let d):
        precondition(d.isFinite, "a number that is not finite")
        return Int(d.sign == .minus ? 1 : 2)
    case .string(let s): return s.utf8.count
    case .array(let a):
        precondition(depth < JSONParser.maxDepth, "nested deeper than maxDepth")
        return a.reduce(1) { $0 &+ check($1, depth: depth + 1) }
    case .object(let o):
        precondition(depth < JSONParser.maxDepth, "nested deeper than maxDepth")
        return o.reduce(2) { $0 &+ $1.key.utf8.count &+ check($1.value, depth: depth + 1) }
    }
}
