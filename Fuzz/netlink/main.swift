// libFuzzer target for the rtnetlink parser (Sources/ReconcileSystemd/Connectivity/Netlink/NetlinkParser.swift).
// Built by `make fuzz` / `make test` with: swiftc -sanitize=fuzzer,address -parse-as-library
// The parser must never trap, read out of bounds or loop forever on any input.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzNetlink(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let envelopes = parseNetlink(UnsafeRawBufferPointer(start: data, count: size))
    // Touch what was decoded so nothing is optimised away.
    var total = 0
    for e in envelopes {
        switch e.message {
        case .link(let l, _): total &+= Int(l.index) &+ (l.name?.utf8.count ?? 0) &+ Int(l.family) &+ Int(l.master ?? 0)
        case .address(let a, _): total &+= a.address.count &+ formatAddressForFuzz(a.address).count
        case .route(let r, _):
            total &+= Int(r.destinationLength) &+ Int(r.priority ?? 0) &+ (r.preferredSource?.count ?? 0)
            for hop in r.nexthops { total &+= Int(hop.interface) &+ (hop.gateway?.count ?? 0) }
        case .done, .error, .other: total &+= 1
        }
    }
    return total == Int.min ? 1 : 0
}

/// Exercises address formatting shapes without the Reconcile module.
func formatAddressForFuzz(_ b: [UInt8]) -> String { b.map { String($0, radix: 16) }.joined(separator: ":") }
