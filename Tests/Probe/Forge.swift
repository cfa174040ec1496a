import CSystemd
import Glibc

/// Sends a fake RTM_NEWLINK (a link with carrier) from a user socket to the
/// netlink port `port`: a forgery the connectivity source must drop.
func forgeNetlink(to port: UInt32) -> Int32 {
    let fd = socket(AF_NETLINK, Int32(SOCK_RAW.rawValue), NETLINK_ROUTE)
    guard fd >= 0 else { return 1 }
    defer { close(fd) }
    var b: [UInt8] = []
    func put32(_ v: UInt32) { withUnsafeBytes(of: v) { b.append(contentsOf: $0) } }
    func put16(_ v: UInt16) { withUnsafeBytes(of: v) { b.append(contentsOf: $0) } }
    let name = Array("forged0".utf8) + [0]
    let attrLen = 4 + name.count
    let total = 16 + 16 + ((attrLen + 3) & ~3) + 8
    put32(UInt32(total)); put16(16); put16(0); put32(0); put32(UInt32(getpid()))   // nlmsghdr RTM_NEWLINK
    b.append(0); b.append(0); put16(1); put32(999); put32(0x1 | 0x40 | 0x10000); put32(0)  // ifinfomsg
    put16(UInt16(attrLen)); put16(3); b.append(contentsOf: name)                            // IFLA_IFNAME
    while b.count % 4 != 0 { b.append(0) }
    put16(5); put16(16); b.append(6); b.append(contentsOf: [0, 0, 0])                      // IFLA_OPERSTATE UP
    var to = sockaddr_nl()
    to.nl_family = sa_family_t(AF_NETLINK)
    to.nl_pid = port
    let r = withUnsafePointer(to: &to) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, &b, b.count, 0, $0, socklen_t(MemoryLayout<sockaddr_nl>.size)) }
    }
    return r == b.count ? 0 : 1
}
