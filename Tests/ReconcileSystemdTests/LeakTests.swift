import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// One subscription switched on and off by each message.
struct Toggle: Program {
    let subscription: (Bool) -> Subscription<Bool>?
    func start() -> (Bool, [Never]) { (false, []) }
    func update(_ m: inout Bool, _ on: Bool) -> [Never] { m = on; return [] }
    func subscriptions(_ m: Bool) -> Subscriptions<Bool> { Subscriptions { subscription(m) } }
}

extension SystemdTests {
    @Suite struct Leaks {
        static let cycles = 100_000

        func cycle(_ program: Toggle, label: String) throws {
            let h = try Harness(program)
            // Warm up allocator pools and caches before measuring.
            for _ in 0..<1_000 { try h.runtime.send(true); try h.runtime.send(false) }
            let fds = openDescriptors()
            let rss = residentBytes()
            let live = EventSourceAccounting.live
            let clock = ContinuousClock()
            let elapsed = try clock.measure {
                for _ in 0..<Self.cycles {
                    try h.runtime.send(true)
                    try h.runtime.send(false)
                }
            }
            let grown = residentBytes() - rss
            print("leaks \(label): \(Self.cycles) start/stop cycles in \(elapsed), fds \(fds.count) -> \(openDescriptors().count), rss +\(grown / 1024) KiB")
            #expect(h.runtime.stats.starts == Self.cycles + 1_000)
            #expect(h.runtime.stats.stops == Self.cycles + 1_000)
            // No descriptor opened by the cycles is left open.
            #expect(openDescriptors().subtracting(fds).isEmpty)
            #expect(EventSourceAccounting.live == live)
            // Bound: 4 MiB for 100,000 cycles, i.e. < 42 bytes per cycle.
            #expect(grown < 4 << 20, "resident memory grew by \(grown) bytes")
        }

        @Test func timerStartStopCyclesLeaveDescriptorsAndMemoryFlat() throws {
            try cycle(Toggle { on in on ? Subscription.every(.seconds(1), key: "t") { _ in false } : nil }, label: "timers")
        }

        @Test func fileWatchStartStopCyclesLeaveDescriptorsAndMemoryFlat() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            try writeFile(dir + "/f", "x")
            let path = dir + "/f"
            try cycle(Toggle { on in on ? Subscription.watch(path) { _ in false } : nil }, label: "file watches")
        }
    }
}
