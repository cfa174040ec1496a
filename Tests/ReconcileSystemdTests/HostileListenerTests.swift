import Foundation
import Reconcile
@testable import ReconcileSystemd
import Testing

/// The listener that binds its own address, and the accept batch, attacked:
/// many start/stop cycles, a stop decided by the accept it reports, a peer
/// gone before its greeting is sent.
extension SystemdTests {
    @Suite struct HostileListener {
        @Test func tenThousandStartStopCyclesOfABindingListenerLeaveDescriptorsFlat() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/s.sock"
            let h = try Harness(IOProgram { m in
                m.on ? Subscriptions { Subscription.listen(address: path, name: "t") { .listener($0) } } : .none
            })
            let before = openDescriptors().count
            for cycle in 0..<10_000 {
                try h.runtime.send(.set(cycle % 2 == 1))
                if cycle % 1_000 == 0 { try h.run(for: .zero) }
            }
            try h.runtime.send(.set(true))
            // Still a working listener at the end: a client is accepted.
            let client = connectUnix(path)
            defer { close(client) }
            try h.run(until: { h.runtime.model.accepted == 1 })
            #expect(h.runtime.stats.failures == 0, "\(h.runtime.model.log.suffix(3))")
            try h.runtime.send(.set(false))
            try h.run(for: .milliseconds(10))
            // The listener's socket and the accepted connection are closed.
            #expect(openDescriptors().count <= before, "\(openDescriptors().count) descriptors, \(before) before")
        }

        @Test func aListenerStoppedByTheAcceptItReportsKeepsTheConnectionsItAccepted() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/s.sock"
            let listener = try listeningUnixSocket(path)
            // Listens until the first accept, then only reads what it accepted.
            let h = try Harness(IOProgram { m in
                m.accepted == 0 ? Subscriptions { Subscription.listen(listener, name: "t", owned: true) { .listener($0) } } : .none
            })
            // Several peers in the backlog: one dispatch accepts them together.
            let clients = (0..<5).map { _ in connectUnix(path) }
            defer { clients.forEach { close($0) } }
            try h.run(until: { h.runtime.model.accepted > 0 })
            let accepted = h.runtime.model.accepted
            for c in clients where c >= 0 { _ = Glibc.write(c, "x\n", 2) }
            // Every accepted connection reads its line: none was closed by the
            // listener's stop in the reconcile that started them.
            let lines = { h.runtime.model.log.filter { if case .connection(_, .line("x")) = $0 { true } else { false } }.count }
            try h.run(until: { lines() == accepted })
            let closed = h.runtime.model.log.filter { if case .connection(_, .closed) = $0 { true } else { false } }
            #expect(closed.isEmpty, "\(closed)")
            #expect(h.runtime.model.connections.count == accepted)
        }

        @Test func aGreetingToAPeerThatIsAlreadyGoneIsAWriteFailureNotACrash() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let path = dir + "/s.sock"
            let listener = try listeningUnixSocket(path)
            let h = try Harness(IOProgram { _ in Subscriptions { Subscription.listen(listener, name: "t", owned: true) { .listener($0) } } })
            let before = openDescriptors().count
            var outcome: SystemdDriver.WriteOutcome?
            h.runtime.didCommit = { model in
                guard outcome == nil, let c = model.connections.first else { return }
                outcome = h.driver.write([UInt8](repeating: 1, count: 60 << 10), to: c)
            }
            // The peer connects and is gone (RST on close: unread data) before it is read.
            let client = connectUnix(path)
            _ = Glibc.write(client, "bye\n", 4)
            close(client)
            try h.run(until: { outcome != nil })
            #expect(outcome == .queued(bytes: 60 << 10))
            // The connection ends with an event the program sees, and its descriptor goes.
            try h.run(until: { h.runtime.model.connections.isEmpty })
            let ended = h.runtime.model.log.contains {
                switch $0 {
                case .connection(_, .closed), .connection(_, .endOfFile), .connection(_, .failed): true
                default: false
                }
            }
            #expect(ended)
            try h.run(for: .milliseconds(10))
            #expect(openDescriptors().count <= before, "\(openDescriptors().count) descriptors, \(before) before")
        }
    }
}
