import Foundation
import Reconcile
@testable import ReconcileSystemd
import Synchronization
import Testing

/// Runs `body` on a thread of its own that first moves into a new network
/// namespace (`unshare(CLONE_NEWNET)` affects only that thread; it holds
/// only `lo`), and returns what `body` returned.
func inNewNetworkNamespace<T: Sendable>(_ body: @escaping @Sendable () throws -> T) throws -> T {
    // unshare(2) is declared only under _GNU_SOURCE: found in libc by name.
    typealias Unshare = @convention(c) (Int32) -> Int32
    let unshare = unsafeBitCast(try #require(dlsym(UnsafeMutableRawPointer(bitPattern: 0), "unshare")), to: Unshare.self)
    let cloneNewNet: Int32 = 0x4000_0000
    let result = Mutex<Result<T, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    let thread = Thread {
        defer { done.signal() }
        guard unshare(cloneNewNet) == 0 else {
            result.withLock { $0 = .failure(POSIXError(.init(rawValue: errno) ?? .EPERM)) }
            return
        }
        result.withLock { $0 = Result { try body() } }
    }
    thread.start()
    done.wait()
    return try result.withLock { $0! }.get()
}

/// The flags of link `name` in the calling thread's network namespace
/// (SIOCGIFFLAGS), and, when `up` is given, sets IFF_UP first
/// (SIOCSIFFLAGS): the kernel's own answer, not the watcher's.
func linkFlags(_ name: String, settingUp up: Bool? = nil) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
    defer { close(fd) }
    // struct ifreq as bytes (the name, then the flags at offset 16): its
    // Swift import clashes between Glibc's and the kernel's headers here.
    var request = [UInt8](repeating: 0, count: 40)
    for (i, c) in name.utf8.prefix(15).enumerated() { request[i] = c }
    let get: UInt = 0x8913, set: UInt = 0x8914    // SIOCGIFFLAGS, SIOCSIFFLAGS
    func call(_ r: UInt) throws {
        guard request.withUnsafeMutableBytes({ ioctl(fd, r, $0.baseAddress!) }) == 0 else {
            throw POSIXError(.init(rawValue: errno) ?? .EIO)
        }
    }
    var flags: Int32 { request.withUnsafeBytes { Int32($0.load(fromByteOffset: 16, as: Int16.self)) } }
    try call(get)
    if let up {
        let new = Int16(truncatingIfNeeded: up ? flags | Int32(IFF_UP) : flags & ~Int32(IFF_UP))
        request.withUnsafeMutableBytes { $0.storeBytes(of: new, toByteOffset: 16, as: Int16.self) }
        try call(set)
        try call(get)
    }
    return flags
}

/// What a netlink watcher reported, in order: "table", or "failed
/// <operation> <errno>".
final class WatcherLog {
    var events: [String] = []
    var last: LinkTable?
    /// Stopped from its own failure event when `stopOnFailure`.
    private(set) var watcher: NetlinkWatcher?

    /// A watcher on `loop` reporting here, once its first table is in; nil
    /// when none came within 5 s. The caller stops it.
    static func start(on loop: EventLoop, stopOnFailure: Bool = false) throws -> (WatcherLog, NetlinkWatcher)? {
        let log = WatcherLog()
        let watcher = try NetlinkWatcher(
            receiveBuffer: nil, loop: loop, logger: DaemonLogger(level: .error, handler: .stderr),
            onTable: { log.events.append("table"); log.last = $0 },
            onFailure: {
                log.events.append("failed \($0.operation) \($0.code ?? 0)")
                if stopOnFailure { log.watcher?.stop() }
            })
        log.watcher = watcher
        guard try loop.run(until: { log.last != nil }, timeout: .seconds(5)) else {
            watcher.stop()
            log.watcher = nil
            return nil
        }
        return (log, watcher)
    }

    /// Breaks the watcher ↔ log cycle.
    func finish() {
        watcher?.stop()
        watcher = nil
    }
}

extension SystemdTests {
    /// The kernel backend's dumps, when asking for one fails.
    @Suite struct NetlinkResync {
        struct Outcome: Sendable {
            /// What the watcher reported after the failures were injected, in order.
            var events: [String] = []
            var linksAfter: [String] = []
            var retries = 0
            var recovered = false
        }

        @Test func aDumpRequestThatFailsIsAFailureThenAResyncWithBackoff() throws {
            let outcome = try inNewNetworkNamespace { () throws -> Outcome in
                let loop = try EventLoop()
                guard let (seen, watcher) = try WatcherLog.start(on: loop) else { return Outcome() }
                defer { seen.finish() }
                // The next two dump requests fail (as sendto would with
                // ENOBUFS) when an overrun's resync asks for them.
                seen.events = []
                seen.last = nil
                watcher.injectedSendErrors = [ENOBUFS, ENOBUFS]
                watcher.resync()
                var o = Outcome()
                // Failure now, retries after 100 and 200 ms, the third works.
                o.recovered = try loop.run(until: { seen.last != nil }, timeout: .seconds(5))
                o.events = seen.events
                o.linksAfter = seen.last.map { $0.links.values.map(\.name).sorted() } ?? []
                o.retries = watcher.retries
                return o
            }
            #expect(outcome.recovered)
            // Each failure reaches the program; no stale table in between.
            let failed = "failed sendto(netlink dump) \(ENOBUFS)"
            #expect(outcome.events == [failed, failed, "table"])
            #expect(outcome.retries == 2)
            // The namespace's ground truth: only `lo`.
            #expect(outcome.linksAfter == ["lo"])
        }
        @Test func aDumpThatKeepsFailingAfterOneThatWorksBacksOffFurtherEachTime() throws {
            let delays = try inNewNetworkNamespace { () throws -> [UInt64] in
                let loop = try EventLoop()
                guard let (seen, watcher) = try WatcherLog.start(on: loop) else { return [] }
                defer { seen.finish() }
                // Each resync: the link dump works (0), the address dump fails.
                watcher.injectedSendErrors = [0, ENOBUFS, 0, ENOBUFS, 0, ENOBUFS]
                watcher.resync()
                var delays: [UInt64] = []
                for n in 1...3 {
                    guard try loop.run(until: { watcher.retries >= n }, timeout: .seconds(5)) else { break }
                    delays.append(watcher.lastRetryDelay)
                }
                return delays
            }
            // Doubling: a link dump that completes is not a resync that does.
            #expect(delays == [100_000, 200_000, 400_000])
        }

        @Test func aProgramThatStopsTheWatcherOnItsFailureGetsNoRetryAndNoFurtherReads() throws {
            let outcome = try inNewNetworkNamespace { () throws -> (events: [String], retries: Int) in
                let loop = try EventLoop()
                guard let (seen, watcher) = try WatcherLog.start(on: loop, stopOnFailure: true) else { return ([], -1) }
                defer { seen.finish() }
                seen.events = []
                watcher.injectedSendErrors = [ENOBUFS]
                watcher.resync()
                // Past the first retry's delay: nothing more may happen.
                _ = try loop.run(until: { false }, timeout: .milliseconds(300))
                return (seen.events, watcher.retries)
            }
            #expect(outcome.events == ["failed sendto(netlink dump) \(ENOBUFS)"])
            #expect(outcome.retries == 0)
        }
        @Test func aReadThatFailsIsAFailureThenAResyncThatSeesWhatItMissed() throws {
            struct Seen2: Sendable { var events: [String] = []; var loUp = false; var kernelSaysUp = false; var lastDelay: UInt64 = 0; var retries = 0 }
            let outcome = try inNewNetworkNamespace { () throws -> Seen2 in
                let loop = try EventLoop()
                guard let (seen, watcher) = try WatcherLog.start(on: loop) else { return Seen2() }
                defer { seen.finish() }
                seen.events = []
                // The next two reads fail (as recvmsg would with ENOMEM):
                // the first on the notification that lo went up, the second
                // after the first resync.
                watcher.injectedReceiveErrors = [ENOMEM, ENOMEM]
                let kernelFlags = try linkFlags("lo", settingUp: true)
                let isUp = { (t: LinkTable?) in t?.links.values.contains { $0.name == "lo" && $0.flags & UInt32(IFF_UP) != 0 } ?? false }
                _ = try loop.run(until: { seen.events.filter { $0.hasPrefix("failed") }.count == 2 && isUp(seen.last) }, timeout: .seconds(5))
                // Nothing more comes while nothing changes (no spinning on an error).
                let settled = seen.events.count
                _ = try loop.run(until: { seen.events.count > settled }, timeout: .milliseconds(300))
                return Seen2(events: seen.events, loUp: isUp(seen.last), kernelSaysUp: kernelFlags & Int32(IFF_UP) != 0,
                             lastDelay: watcher.lastRetryDelay, retries: watcher.retries)
            }
            #expect(outcome.kernelSaysUp)
            // The ground truth reached the program after the failures ...
            #expect(outcome.loUp)
            // ... each failure once, as a failure event, with no table from
            // the stale state in between, then the resynced table.
            // (The second read may be of either socket: the notifications
            // left unread or the resync's dump answer.)
            #expect(outcome.events.count >= 2 && outcome.events.prefix(2).allSatisfy { $0.hasPrefix("failed recvmsg(netlink") && $0.hasSuffix(" \(ENOMEM)") })
            #expect(outcome.events.dropFirst(2).allSatisfy { $0 == "table" } && outcome.events.count >= 3)
            #expect(outcome.retries == 2)
            #expect(outcome.lastDelay == 200_000)   // the default policy: 100 ms doubling
        }
    }
}
