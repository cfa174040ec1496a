// Parsing rtnetlink datagrams. Pure Swift with no imports, so the fuzz target
// (Fuzz/) compiles this file on its own. Never traps on any input: every read
// is bounds-checked and malformed messages end the parse with what was read.

/// Constants from <linux/netlink.h> and <linux/rtnetlink.h>.
enum NL {
    static let noop: UInt16 = 1, error: UInt16 = 2, done: UInt16 = 3, overrun: UInt16 = 4
    static let newLink: UInt16 = 16, delLink: UInt16 = 17, getLink: UInt16 = 18
    static let newAddr: UInt16 = 20, delAddr: UInt16 = 21, getAddr: UInt16 = 22
    static let newRoute: UInt16 = 24, delRoute: UInt16 = 25, getRoute: UInt16 = 26
    static let fRequest: UInt16 = 0x1, fDumpIntr: UInt16 = 0x10, fDump: UInt16 = 0x300
    /// On an RTM_NEWROUTE notification: the route replaced an existing one
    /// (which gets no RTM_DELROUTE).
    static let fReplace: UInt16 = 0x100
    static let afInet: UInt8 = 2, afBridge: UInt8 = 7, afInet6: UInt8 = 10
    static let headerSize = 16
}

/// One decoded netlink message.
enum NetlinkMessage: Equatable {
    /// RTM_NEWLINK / RTM_DELLINK.
    case link(LinkMessage, deleted: Bool)
    /// RTM_NEWADDR / RTM_DELADDR.
    case address(AddressMessage, deleted: Bool)
    /// RTM_NEWROUTE / RTM_DELROUTE.
    case route(RouteMessage, deleted: Bool)
    /// NLMSG_DONE ending a dump.
    case done
    /// NLMSG_ERROR (errno 0 is an acknowledgement).
    case error(errno: Int32)
    /// Anything else (ignored).
    case other(type: UInt16)
}

/// A message with its header fields.
struct NetlinkEnvelope: Equatable {
    var message: NetlinkMessage
    var sequence: UInt32
    var flags: UInt16
    /// The sender port id in the header (0 for the kernel; not proof: the
    /// socket address is what counts).
    var portID: UInt32
}

struct LinkMessage: Equatable {
    var index: Int32
    var flags: UInt32
    var name: String?
    var operState: UInt8?
    var master: UInt32?
    /// `ifi_family`: AF_UNSPEC for the link itself; AF_BRIDGE for a bridge
    /// port's notifications (its RTM_DELLINK means "left the bridge").
    var family: UInt8 = 0
}

struct AddressMessage: Equatable {
    var family: UInt8
    var prefixLength: UInt8
    var flags: UInt32
    var scope: UInt8
    var index: UInt32
    var address: [UInt8]
}

struct RouteMessage: Equatable {
    var family: UInt8
    var destinationLength: UInt8
    var table: UInt32
    var type: UInt8
    var outputInterface: UInt32?
    var gateway: [UInt8]?
    var destination: [UInt8]?
    var sourceLength: UInt8 = 0
    var tos: UInt8 = 0
    /// `rtm_flags` (RTNH_F_DEAD, RTNH_F_LINKDOWN... for a single nexthop).
    var flags: UInt32 = 0
    /// RTA_PRIORITY: the metric.
    var priority: UInt32?
    /// RTA_SRC (source-specific IPv6 routes).
    var source: [UInt8]?
    /// RTA_PREFSRC: the preferred source address.
    var preferredSource: [UInt8]?
    /// RTA_NH_ID: the route uses a nexthop object.
    var nexthopID: UInt32?
    /// RTA_MULTIPATH: one entry per nexthop (empty for a single nexthop).
    var nexthops: [RouteNexthop] = []
}

/// One `rtnexthop` of an RTA_MULTIPATH route.
struct RouteNexthop: Equatable {
    var flags: UInt8
    var interface: UInt32
    /// RTA_GATEWAY, or the address of RTA_VIA.
    var gateway: [UInt8]?
}

/// Bounds-checked little helpers over a byte buffer.
struct ByteReader {
    let bytes: UnsafeRawBufferPointer

    func u8(_ at: Int) -> UInt8? { at >= 0 && at < bytes.count ? bytes[at] : nil }
    func u16(_ at: Int) -> UInt16? {
        guard at >= 0, at + 2 <= bytes.count else { return nil }
        return bytes.loadUnaligned(fromByteOffset: at, as: UInt16.self)
    }
    func u32(_ at: Int) -> UInt32? {
        guard at >= 0, at + 4 <= bytes.count else { return nil }
        return bytes.loadUnaligned(fromByteOffset: at, as: UInt32.self)
    }
    func slice(_ at: Int, _ count: Int) -> [UInt8]? {
        guard at >= 0, count >= 0, at <= bytes.count - count else { return nil }
        return Array(bytes[at..<(at + count)])
    }
}

@inline(__always) func align4(_ n: Int) -> Int { (n + 3) & ~3 }

/// Decodes every complete message in `datagram`.
func parseNetlink(_ datagram: UnsafeRawBufferPointer) -> [NetlinkEnvelope] {
    let r = ByteReader(bytes: datagram)
    var out: [NetlinkEnvelope] = []
    var offset = 0
    while offset + NL.headerSize <= datagram.count {
        guard let len32 = r.u32(offset), let type = r.u16(offset + 4), let flags = r.u16(offset + 6),
              let seq = r.u32(offset + 8), let pid = r.u32(offset + 12) else { break }
        let length = Int(len32)
        guard length >= NL.headerSize, length <= datagram.count - offset else { break }
        let body = offset + NL.headerSize
        let end = offset + length
        let message: NetlinkMessage?
        switch type {
        case NL.newLink, NL.delLink: message = parseLink(r, body, end).map { .link($0, deleted: type == NL.delLink) }
        case NL.newAddr, NL.delAddr: message = parseAddress(r, body, end).map { .address($0, deleted: type == NL.delAddr) }
        case NL.newRoute, NL.delRoute: message = parseRoute(r, body, end).map { .route($0, deleted: type == NL.delRoute) }
        case NL.done: message = .done
        case NL.error: message = r.u32(body).map { .error(errno: 0 &- Int32(bitPattern: $0)) }
        default: message = .other(type: type)
        }
        if let message { out.append(NetlinkEnvelope(message: message, sequence: seq, flags: flags, portID: pid)) }
        let next = offset + align4(length)
        guard next > offset else { break }
        offset = next
    }
    return out
}

/// Calls `body(type, payloadStart, payloadLength)` for each attribute in [start, end).
private func attributes(_ r: ByteReader, _ start: Int, _ end: Int, _ body: (UInt16, Int, Int) -> Void) {
    var at = start
    let limit = min(end, r.bytes.count)
    while at + 4 <= limit {
        guard let len16 = r.u16(at), let type = r.u16(at + 2) else { return }
        let len = Int(len16)
        guard len >= 4, at + len <= limit else { return }
        body(type & 0x3fff, at + 4, len - 4)
        at += align4(len)
    }
}

private func string(_ r: ByteReader, _ at: Int, _ count: Int) -> String? {
    guard let raw = r.slice(at, count) else { return nil }
    let bytes = raw.prefix { $0 != 0 }
    return String(decoding: bytes, as: UTF8.self)
}

private func parseLink(_ r: ByteReader, _ body: Int, _ end: Int) -> LinkMessage? {
    guard body + 16 <= end, let family = r.u8(body), let index = r.u32(body + 4), let flags = r.u32(body + 8) else { return nil }
    var m = LinkMessage(index: Int32(bitPattern: index), flags: flags, family: family)
    attributes(r, body + 16, end) { type, at, len in
        switch type {
        case 3: m.name = string(r, at, len)                      // IFLA_IFNAME
        case 16: if len >= 1 { m.operState = r.u8(at) }           // IFLA_OPERSTATE
        case 10: if len >= 4 { m.master = r.u32(at) }             // IFLA_MASTER
        default: break
        }
    }
    return m
}

private func parseAddress(_ r: ByteReader, _ body: Int, _ end: Int) -> AddressMessage? {
    guard body + 8 <= end, let family = r.u8(body), let prefix = r.u8(body + 1), let flags = r.u8(body + 2),
          let scope = r.u8(body + 3), let index = r.u32(body + 4) else { return nil }
    var m = AddressMessage(family: family, prefixLength: prefix, flags: UInt32(flags), scope: scope, index: index, address: [])
    var local: [UInt8]?, address: [UInt8]?
    attributes(r, body + 8, end) { type, at, len in
        switch type {
        case 1: address = r.slice(at, len)                        // IFA_ADDRESS
        case 2: local = r.slice(at, len)                          // IFA_LOCAL
        case 8: if len >= 4, let f = r.u32(at) { m.flags = f }    // IFA_FLAGS
        default: break
        }
    }
    // IFA_LOCAL is the interface's own address on point-to-point links.
    m.address = local ?? address ?? []
    guard m.address.count == 4 || m.address.count == 16 else { return nil }
    return m
}

private func parseRoute(_ r: ByteReader, _ body: Int, _ end: Int) -> RouteMessage? {
    guard body + 12 <= end, let family = r.u8(body), let dstLen = r.u8(body + 1), let srcLen = r.u8(body + 2),
          let tos = r.u8(body + 3), let table = r.u8(body + 4), let type = r.u8(body + 7),
          let flags = r.u32(body + 8) else { return nil }
    var m = RouteMessage(family: family, destinationLength: dstLen, table: UInt32(table), type: type,
                         sourceLength: srcLen, tos: tos, flags: flags)
    attributes(r, body + 12, end) { t, at, len in
        switch t {
        case 1: m.destination = r.slice(at, len)                       // RTA_DST
        case 2: m.source = r.slice(at, len)                            // RTA_SRC
        case 4: if len >= 4 { m.outputInterface = r.u32(at) }          // RTA_OIF
        case 5: m.gateway = r.slice(at, len)                           // RTA_GATEWAY
        case 6: if len >= 4 { m.priority = r.u32(at) }                 // RTA_PRIORITY
        case 7: m.preferredSource = r.slice(at, len)                   // RTA_PREFSRC
        case 9: m.nexthops = parseMultipath(r, at, at + len)           // RTA_MULTIPATH
        case 15: if len >= 4, let t32 = r.u32(at) { m.table = t32 }    // RTA_TABLE
        case 18: if len > 2 { m.gateway = r.slice(at + 2, len - 2) }   // RTA_VIA (family, address)
        case 30: if len >= 4 { m.nexthopID = r.u32(at) }               // RTA_NH_ID
        default: break
        }
    }
    return m
}

/// The `rtnexthop` entries of an RTA_MULTIPATH attribute in [start, end).
private func parseMultipath(_ r: ByteReader, _ start: Int, _ end: Int) -> [RouteNexthop] {
    var out: [RouteNexthop] = []
    var at = start
    let limit = min(end, r.bytes.count)
    while at + 8 <= limit {
        guard let len16 = r.u16(at), let flags = r.u8(at + 2), let index = r.u32(at + 4) else { break }
        let len = Int(len16)
        guard len >= 8, at + len <= limit else { break }
        var hop = RouteNexthop(flags: flags, interface: index)
        attributes(r, at + 8, at + len) { t, a, l in
            switch t {
            case 5: hop.gateway = r.slice(a, l)                        // RTA_GATEWAY
            case 18: if l > 2 { hop.gateway = r.slice(a + 2, l - 2) }  // RTA_VIA
            default: break
            }
        }
        out.append(hop)
        at += align4(len)
    }
    return out
}

/// Builds a dump request (`RTM_GET*` with NLM_F_REQUEST|NLM_F_DUMP).
func dumpRequest(type: UInt16, sequence: UInt32) -> [UInt8] {
    var b: [UInt8] = []
    func put32(_ v: UInt32) { withUnsafeBytes(of: v) { b.append(contentsOf: $0) } }
    func put16(_ v: UInt16) { withUnsafeBytes(of: v) { b.append(contentsOf: $0) } }
    // Family header: rtgenmsg padded to the largest request body we need (ifinfomsg, 16 bytes).
    put32(UInt32(NL.headerSize + 16))
    put16(type)
    put16(NL.fRequest | NL.fDump)
    put32(sequence)
    put32(0)
    b.append(contentsOf: [UInt8](repeating: 0, count: 16))   // AF_UNSPEC, all zero
    return b
}
