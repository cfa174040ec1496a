import CSystemd
import Foundation
import Reconcile
@testable import ReconcileSystemd
import Testing

private let service = "org.example.Standin"
private let iface = "org.example.Standin"

private func stateProperty(_ bus: PrivateBus, type: BusType? = .string) -> BusPropertySource.Configuration {
    .init(bus: bus.busAddress, service: service, path: "/standin", interface: iface, property: "State", type: type)
}

extension SystemdTests {
    /// Bus sources on a private dbus-daemon, against a python3-dbus stand-in
    /// service and clients no one here wrote (busctl, gdbus).
    @Suite struct Bus {
        @Test func aSignalReachesUpdateAndTheSameSignalFromANonOwnerIsNeverDelivered() throws {
            let bus = try PrivateBus()
            let standin = try Standin(bus)
            let owned = BusSignalSource.Configuration(bus: bus.busAddress, sender: service, interface: iface, member: "Ping")
            // A broader match on the same connection lets the forgeries reach
            // sd-bus's local matcher (the trap the owner check closes).
            let any = BusSignalSource.Configuration(bus: bus.busAddress, interface: iface, member: "Ping")
            let h = try Harness(BusWatcher(wants: [.signal("owned", owned), .signal("any", any), .name(.init(bus: bus.busAddress, name: service))]))
            try h.run(until: { h.names == [.appeared(owner: standin.unique)] })
            try h.roundTrip(bus.busAddress)
            #expect(run("DBUS_SESSION_BUS_ADDRESS=\(bus.address) gdbus emit --session --object-path /standin --signal \(iface).Ping \"'forged-by-gdbus'\""))
            #expect(run("busctl --address=\(bus.address) emit /standin \(iface) Ping s forged-by-busctl"))
            standin.command("ping real")
            try h.run(until: { h.signals("any").count == 3 })
            let anyTexts = h.signals("any").compactMap { $0.signal?.arguments.first?.string }
            #expect(Set(anyTexts) == ["forged-by-gdbus", "forged-by-busctl", "real"])
            try h.run(for: .milliseconds(50))
            let ownedSignals = h.signals("owned")
            #expect(ownedSignals.map { $0.signal?.arguments } == [[.string("real")]])
            #expect(ownedSignals.first?.signal?.sender == standin.unique)
            #expect(ownedSignals.first?.signal?.member == "Ping")
            #expect(ownedSignals.first?.signal?.path == "/standin")
        }

        @Test func nameAndPropertyFollowTheOwnerKilledByPIDAndRestarted() throws {
            let bus = try PrivateBus()
            var standin = try Standin(bus, state: "one")
            let first = standin.unique
            let h = try Harness(BusWatcher(wants: [.name(.init(bus: bus.busAddress, name: service)), .property(stateProperty(bus))]))
            try h.run(until: { h.names.count == 1 && h.properties.count == 1 })
            #expect(h.names == [.appeared(owner: first)])
            #expect(h.properties == [.value(.string("one"))])
            standin.kill()
            try h.run(until: { h.names.count == 2 && h.properties.count == 2 })
            #expect(h.names.last == .vanished)
            #expect(h.properties.last == .vanished)
            standin = try Standin(bus, state: "two")
            try h.run(until: { h.names.count == 3 && h.properties.count == 3 })
            #expect(standin.unique != first)
            #expect(h.names == [.appeared(owner: first), .vanished, .appeared(owner: standin.unique)])
            #expect(h.properties == [.value(.string("one")), .vanished, .value(.string("two"))])
        }

        @Test func changedAndInvalidatedPropertiesBothYieldTheNewValueAndAWrongTypeIsAFailure() throws {
            let bus = try PrivateBus()
            let standin = try Standin(bus, state: "one")
            let h = try Harness(BusWatcher(wants: [.property(stateProperty(bus))]))
            try h.run(until: { h.properties == [.value(.string("one"))] })
            standin.command("state two")
            try h.run(until: { h.properties.count == 2 })
            #expect(h.properties.last == .value(.string("two")))
            standin.command("invalidate three")
            try h.run(until: { h.properties.count == 3 })
            #expect(h.properties.last == .value(.string("three")))
            standin.command("wrongtype")
            try h.run(until: { h.properties.count == 4 })
            guard case .failed(let f) = h.properties.last else {
                Issue.record("expected a failure, got \(h.properties)")
                return
            }
            #expect(f.reason == "the value is of type i, the program expects s")
            // Still followed after the failure.
            standin.command("state four")
            try h.run(until: { h.properties.count == 5 })
            #expect(h.properties.last == .value(.string("four")))
        }

        @Test func aKilledAndRestartedBusDaemonIsOneFailurePerSourceThenEverythingRecovers() throws {
            let bus = try PrivateBus()
            var standin = try Standin(bus)
            let owned = BusSignalSource.Configuration(bus: bus.busAddress, sender: service, interface: iface, member: "Ping")
            let h = try Harness(BusWatcher(wants: [.signal("owned", owned), .name(.init(bus: bus.busAddress, name: service)),
                                                   .property(stateProperty(bus))]))
            try h.run(until: { h.names.count == 1 && h.properties.count == 1 })
            let before = h.events.count
            bus.kill()
            standin.kill()
            try h.run(until: { h.events[before...].filter(\.isFailure).count >= 3 })
            // Down for a while: several reconnects are refused (each a
            // `.restarting`), no more failures.
            try h.run(for: .milliseconds(800))
            let failures = h.events[before...].filter(\.isFailure)
            #expect(failures.count == 3, "\(failures)")
            #expect(h.names.filter(\.isRestarting).count >= 2)
            #expect(h.signals("owned").filter(\.isFailure).count == 1)
            #expect(h.names.filter { if case .failed = $0 { true } else { false } }.count == 1)
            #expect(h.properties.filter { if case .failed = $0 { true } else { false } }.count == 1)
            if case .failed(let f) = h.names.last(where: { !$0.isRestarting }) {
                #expect(f.reason == "lost the connection to the \(bus.address) bus (Disconnected)")
            }
            try bus.start()
            standin = try Standin(bus, state: "again")
            try h.run(until: { h.names.last == .appeared(owner: standin.unique) && h.properties.last == .value(.string("again")) },
                      timeout: .seconds(10))
            try h.roundTrip(bus.busAddress)
            standin.command("ping after")
            try h.run(until: { h.signals("owned").last?.signal?.arguments == [.string("after")] })
        }

        @Test func aBusMissingAtStartIsAFailureNotACrashAndIsConnectedWhenItAppears() throws {
            let bus = try PrivateBus()
            bus.kill()
            let h = try Harness(BusWatcher(wants: [.name(.init(bus: bus.busAddress, name: service))]))
            try h.run(until: { !h.names.isEmpty })
            guard case .failed(let f) = h.names.first else { Issue.record("\(h.names)"); return }
            #expect(f.operation == "sd_bus_start")
            try h.run(for: .milliseconds(400))
            // One failure; each refused reconnect is a `.restarting`.
            #expect(h.names.filter { !$0.isRestarting }.count == 1)
            #expect(h.names.filter(\.isRestarting).count >= 2)
            try bus.start()
            try h.run(until: { h.names.filter { !$0.isRestarting }.count == 2 }, timeout: .seconds(10))
            #expect(h.names.last == .vanished)
        }

        @Test func methodCallsReturnValuesErrorsTimeOutAndAreDroppedWhenCancelled() throws {
            let bus = try PrivateBus()
            let standin = try Standin(bus)
            defer { withExtendedLifetime(standin) {} }
            let loop = try EventLoop()
            let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
            defer { driver.detach() }
            let caller = driver.bus
            let address = bus.busAddress
            func result(_ call: @escaping @Sendable () async throws -> [BusValue]) throws -> Result<[BusValue], any Error>? {
                let box = Box<Result<[BusValue], any Error>>()
                Task(executorPreference: loop.taskExecutor) {
                    do { box.set(.success(try await call())) } catch { box.set(.failure(error)) }
                }
                _ = try loop.run(until: { box.value != nil }, timeout: .seconds(5))
                return box.value
            }
            let echo = try result { try await caller.call(bus: address, service, "/standin", iface, "Echo", ["hello"]) }
            #expect(try echo?.get() == [.string("hello")])
            let state = try result { [try await caller.property(bus: address, service, "/standin", iface, "State")] }
            #expect(try state?.get() == [.string("one")])
            let failed = try result { try await caller.call(bus: address, service, "/standin", iface, "Fail") }
            #expect(throws: BusError("org.example.Error.Failed", "it failed on purpose")) { try failed?.get() }
            let started = ContinuousClock.now
            let hung = try result { try await caller.call(bus: address, service, "/standin", iface, "Hang", timeout: .milliseconds(300)) }
            #expect(throws: BusError(BusError.noReply, "Method call timed out")) { try hung?.get() }
            #expect(ContinuousClock.now - started < .seconds(2))
            let unsendable = try result { try await caller.call(bus: address, service, "/standin", iface, "Echo", [.string("a\u{0}b")]) }
            #expect { try unsendable?.get() } throws: { ($0 as? BusError)?.name == BusError.invalidArgs }
            #expect(driver.busPendingCalls(address) == 0)

            // Cancelled with its task while waiting for the reply: CancellationError,
            // the slot released. 10 batches of 1,000 calls the peer never answers.
            final class Counter: @unchecked Sendable {
                let lock = NSLock(); var n = 0
                func add() { lock.withLock { n += 1 } }
                var value: Int { lock.withLock { n } }
            }
            let ended = Counter()
            let fds = openDescriptors()
            for batch in 1...10 {
                let tasks = (0..<1_000).map { _ in
                    Task(executorPreference: loop.taskExecutor) {
                        do { _ = try await caller.call(bus: address, service, "/standin", iface, "Hang") } catch is CancellationError { ended.add() } catch {}
                    }
                }
                _ = try loop.run(until: { driver.busPendingCalls(address) == 1_000 }, timeout: .seconds(10))
                #expect(driver.busPendingCalls(address) == 1_000)
                for t in tasks { t.cancel() }
                _ = try loop.run(until: { ended.value == batch * 1_000 }, timeout: .seconds(10))
                #expect(driver.busPendingCalls(address) == 0)
            }
            #expect(ended.value == 10_000)
            #expect(openDescriptors().subtracting(fds).isEmpty)
            // Cancelled before it started: never sent.
            let early = Task(executorPreference: loop.taskExecutor) { () -> Bool in
                withUnsafeCurrentTask { $0?.cancel() }
                do { _ = try await caller.call(bus: address, service, "/standin", iface, "Echo", ["x"]); return false } catch { return error is CancellationError }
            }
            let earlyBox = Box<Bool>()
            Task(executorPreference: loop.taskExecutor) { earlyBox.set(await early.value) }
            _ = try loop.run(until: { earlyBox.value != nil }, timeout: .seconds(5))
            #expect(earlyBox.value == true)
            // One started and then cancelled while it waits.
            let waiting = Task(executorPreference: loop.taskExecutor) {
                try await caller.call(bus: address, service, "/standin", iface, "Hang")
            }
            _ = try loop.run(until: { driver.busPendingCalls(address) == 1 }, timeout: .seconds(5))
            waiting.cancel()
            _ = try loop.run(until: { driver.busPendingCalls(address) == 0 }, timeout: .seconds(5))
            #expect(driver.busPendingCalls(address) == 0)
        }

        @Test func hostileSignalsAreDecodedOrAFailureNeverACrashOrAHang() throws {
            let bus = try PrivateBus()
            let standin = try Standin(bus)
            let hostile = BusSignalSource.Configuration(bus: bus.busAddress, sender: service, interface: iface, member: "Hostile")
            let h = try Harness(BusWatcher(wants: [.signal("h", hostile), .name(.init(bus: bus.busAddress, name: service))]))
            try h.run(until: { h.names.count == 1 })
            try h.roundTrip(bus.busAddress)
            for kind in ["args", "array", "deep", "big"] { standin.command("hostile \(kind)") }
            // The 255-argument signal (the signature limit: 10,000 top-level
            // arguments cannot be expressed) goes out on the wire (dbus-monitor
            // shows it) but sd-bus drops it before any callback: no event.
            try h.run(until: { h.signals("h").count == 3 }, timeout: .seconds(10))
            try h.run(for: .milliseconds(50))
            let summary = h.signals("h").map { e -> String in
                switch e {
                case .received(let s): "\(s.arguments.count) args, first \(s.arguments.first?.type.description ?? "-")"
                case .failed(let f): "failed \(f)"
                case .restarting(let n, _): "restarting \(n)"
                }
            }
            #expect(summary == ["1 args, first as", "1 args, first v", "1 args, first s"])
            let got = h.signals("h").compactMap(\.signal)
            guard got.count == 3 else { return }
            #expect(got[0].arguments.first?.elements?.count == 10_000)
            var depth = 0
            var v = got[1].arguments.first
            while case .variant(let inner)? = v { depth += 1; v = inner }
            #expect(depth == 64)
            #expect(v == .string("deep"))
            #expect(got[2].arguments.first?.string?.utf8.count == 1 << 20)
        }

        @Test func tenThousandStartStopCyclesRemoveEveryMatchTheyAddWithDescriptorsAndMemoryFlat() throws {
            let bus = try PrivateBus()
            let standin = try Standin(bus)
            defer { withExtendedLifetime(standin) {} }
            let c = BusSignalSource.Configuration(bus: bus.busAddress, sender: service, interface: iface, member: "Ping")
            let h = try Harness(BusWatcher(wants: [.signal("s", c)]))
            try h.roundTrip(bus.busAddress)
            // The daemon's own count of match rules (Debug.Stats, asked with busctl).
            func daemonMatchRules() -> Int? {
                guard let text = output("busctl --address=\(bus.address) call org.freedesktop.DBus /org/freedesktop/DBus "
                                        + "org.freedesktop.DBus.Debug.Stats GetStats") else { return nil }
                let words = text.split(separator: " ")
                guard let i = words.firstIndex(of: "\"MatchRules\""), i + 2 < words.count else { return nil }
                return Int(words[i + 2])
            }
            let cycles = 10_000
            /// `n` cycles, the loop run every 256 (so the bus's replies wait
            /// in sd-bus's queue meanwhile), then a round trip.
            func cycle(_ n: Int) throws {
                for i in 0..<n {
                    try h.runtime.send(.on(false))
                    try h.runtime.send(.on(true))
                    if i % 256 == 0 { _ = try h.loop.runOnce(timeout: .zero) }
                }
                try h.roundTrip(bus.busAddress)
            }
            // A client no one here wrote counts the AddMatch and RemoveMatch
            // calls on the bus (dbus-monitor, a monitor connection).
            let monitorLog = bus.directory + "/monitor.log"
            let monitor = Process()
            monitor.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-monitor")
            monitor.arguments = ["--address", bus.address,
                                 "type='method_call',interface='org.freedesktop.DBus',member='AddMatch'",
                                 "type='method_call',interface='org.freedesktop.DBus',member='RemoveMatch'"]
            _ = FileManager.default.createFile(atPath: monitorLog, contents: nil)
            let logHandle = try FileHandle(forWritingTo: URL(fileURLWithPath: monitorLog))
            monitor.standardOutput = logHandle
            monitor.standardError = FileHandle.nullDevice
            try monitor.run()
            defer { kill(monitor.processIdentifier, SIGKILL); waitGone(monitor.processIdentifier) }
            func monitorText() -> String { (try? String(contentsOfFile: monitorLog, encoding: .utf8)) ?? "" }
            /// The calls to `member` the monitor has written (from `sender`, when given).
            func monitored(_ member: String, from sender: String? = nil) -> Int {
                monitorText().split(separator: "\n").filter { line in
                    line.hasSuffix("member=\(member)") && (sender.map { line.contains("sender=\($0) ") } ?? true)
                }.count
            }
            /// Waits (bounded) until the monitor has written everything sent
            /// before now: an AddMatch from busctl with a rule naming `tag`,
            /// sent after our last round trip (so after all of our calls),
            /// is written after them.
            func sentinel(_ tag: String) -> Bool {
                _ = output("busctl --address=\(bus.address) call org.freedesktop.DBus /org/freedesktop/DBus "
                           + "org.freedesktop.DBus AddMatch s \"type='signal',member='\(tag)'\"")
                let deadline = ContinuousClock.now + .seconds(20)
                while !monitorText().contains("member='\(tag)'"), ContinuousClock.now < deadline { usleep(20_000) }
                return monitorText().contains("member='\(tag)'")
            }
            // The monitor is in place once it has seen an AddMatch: send one
            // (and its RemoveMatch) until it has, bounded.
            let monitorDeadline = ContinuousClock.now + .seconds(10)
            while monitored("AddMatch") == 0, ContinuousClock.now < monitorDeadline {
                try h.runtime.send(.on(false))
                try h.runtime.send(.on(true))
                try h.roundTrip(bus.busAddress)
                usleep(20_000)
            }
            #expect(monitored("AddMatch") > 0)
            // Our connection's unique name, from the monitor's first AddMatch of ours.
            let ours = monitorText().split(separator: "\n").first { $0.hasSuffix("member=AddMatch") }
                .flatMap { $0.split(separator: " ").first { $0.hasPrefix("sender=") } }.map { String($0.dropFirst(7)) }
            #expect(ours != nil)
            // Warm-up, the same cycles with the monitor there (it slows the
            // bus daemon, so more of our calls wait in sd-bus's queues): the
            // allocator's high-water mark for that backlog (3-4 MiB here) and
            // the driver's spare runners are reached. Measured over 100,000
            // cycles with a round trip every 10,000, RSS then stays within
            // 0.3 MiB: no leak per cycle.
            try cycle(cycles)
            #expect(sentinel("WarmedUp"))
            let seenBefore = (add: monitored("AddMatch", from: ours), remove: monitored("RemoveMatch", from: ours))
            let rulesBefore = try #require(daemonMatchRules())
            let fds = openDescriptors()
            let rssBefore = residentBytes()
            let startsBefore = h.runtime.stats.starts
            let counted = h.driver.busMatchCounts(bus.busAddress)
            let clock = ContinuousClock()
            let elapsed = try clock.measure { try cycle(cycles) }
            // Measured before the test reads the monitor's log (its text is large).
            let rssGrowth = residentBytes() - rssBefore
            let after = h.driver.busMatchCounts(bus.busAddress)
            // Each cycle: the signal match and the owner's NameOwnerChanged match.
            #expect(after.added - counted.added == 2 * cycles)
            #expect(after.removed - counted.removed == 2 * cycles)
            let rulesAfter = daemonMatchRules()
            print("bus: \(cycles) start/stop cycles in \(elapsed); daemon match rules \(rulesBefore) -> \(rulesAfter ?? -1)")
            #expect(rulesAfter == rulesBefore)
            #expect(openDescriptors().subtracting(fds).isEmpty)
            // Flat: 10,000 more cycles leave less than 2 MiB behind (a leak of
            // one match slot or message per cycle would be several MiB).
            #expect(rssGrowth < 2 << 20, "RSS grew by \(rssGrowth) bytes")
            // dbus-monitor saw each cycle's two AddMatch and two RemoveMatch.
            #expect(sentinel("Measured"))
            let expected = (add: seenBefore.add + 2 * cycles, remove: seenBefore.remove + 2 * cycles)
            let seen = (add: monitored("AddMatch", from: ours), remove: monitored("RemoveMatch", from: ours))
            print("bus: dbus-monitor saw \(seen.add - seenBefore.add) AddMatch and \(seen.remove - seenBefore.remove) RemoveMatch; RSS +\(rssGrowth) bytes")
            #expect(seen == expected)
            #expect(h.runtime.stats.starts == startsBefore + cycles)
            withExtendedLifetime(logHandle) {}
        }
    }
}

extension SystemdTests.Bus {
    /// Invalid UTF-8 in a string: the generic reader throws (sd-bus's
    /// -EBADMSG) instead of trapping; sent through the daemon, the daemon
    /// drops the raw sender and the subscription goes on.
    @Test func invalidUTF8IsAnErrorForTheReaderAndNeverReachesOrStopsASubscription() throws {
        let bus = try PrivateBus()
        let standin = try Standin(bus)
        defer { withExtendedLifetime(standin) {} }
        let any = BusSignalSource.Configuration(bus: bus.busAddress, interface: iface)
        let h = try Harness(BusWatcher(wants: [.signal("any", any)]))
        try h.roundTrip(bus.busAddress)

        // A raw sender: its own sd-bus connection, a string with bytes 0xff 0xfe.
        var raw: OpaquePointer?
        #expect(sd_bus_new(&raw) >= 0)
        defer { sd_bus_flush_close_unref(raw) }
        #expect(sd_bus_set_address(raw, bus.address) >= 0)
        #expect(sd_bus_set_bus_client(raw, 1) >= 0)
        #expect(sd_bus_start(raw) >= 0)
        func invalid() -> OpaquePointer? {
            var m: OpaquePointer?
            guard sd_bus_message_new_signal(raw, &m, "/standin", iface, "Ping") >= 0 else { return nil }
            var p: UnsafeMutablePointer<CChar>?
            guard sd_bus_message_append_string_space(m, 4, &p) >= 0, let p else { return nil }
            for (i, b) in [0x61, 0xff, 0xfe, 0x62].enumerated() { p[i] = CChar(bitPattern: UInt8(b)) }
            return m
        }
        let local = try #require(invalid())
        defer { sd_bus_message_unref(local) }
        #expect(sd_bus_message_seal(local, 1, 0) >= 0)
        #expect(sd_bus_message_rewind(local, 1) >= 0)
        #expect(throws: SystemdError("sd_bus_message_read_basic", errno: EBADMSG)) { try BusMarshalling.readAll(local) }

        let sent = try #require(invalid())
        defer { sd_bus_message_unref(sent) }
        _ = sd_bus_send(raw, sent, nil)
        _ = sd_bus_flush(raw)
        standin.command("ping valid")
        try h.run(until: { !h.signals("any").isEmpty })
        try h.run(for: .milliseconds(50))
        #expect(h.signals("any").map { $0.signal?.arguments } == [[.string("valid")]])
    }
}
