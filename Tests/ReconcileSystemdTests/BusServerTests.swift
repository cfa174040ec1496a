import Foundation
import Reconcile
@testable import ReconcileSystemd
import Testing

private let path = Served.path
private let iface = Served.iface

private func client(_ mode: String, _ bus: PrivateBus, _ args: String = "") -> String {
    "/usr/bin/python3 \(repositoryScript("bus-client.py")) \(mode) \(bus.address) \(Served.name) \(path) \(args)"
}

/// The unique names on the bus (`ListNames`, asked with busctl).
private func names(_ h: Harness<Served>, _ bus: PrivateBus) throws -> String {
    try h.client("busctl --address=\(bus.address) call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus ListNames")
}

extension SystemdTests {
    /// Serving: an object exported from the model, an owned name and tracked
    /// peers on a private dbus-daemon, checked with busctl, gdbus,
    /// dbus-monitor and python3-dbus.
    @Suite struct BusServer {
        @Test func clientsNoOneHereWroteSeeTheDeclaredMembersTheModelsValuesAndUpdatesReplies() throws {
            let bus = try PrivateBus(openToEveryUser: true)
            let h = try Harness.served(bus.busAddress)
            try h.run(until: { h.runtime.model.nameEvents == [.acquired] })

            let introspect = try h.client("busctl --address=\(bus.address) introspect \(Served.name) \(path)")
            for member in ["org.reconcile.Test1", ".Echo", ".Add", ".SetState", ".Later", ".Never", ".Privileged", ".Emit", ".State", ".Online",
                           ".Interfaces", ".Details", ".Anything", ".Big", ".Mode", ".Changed", "org.reconcile.Test1.Extra", ".Label",
                           "org.freedesktop.DBus.Properties"] {
                #expect(introspect.contains(member), "introspect lacks \(member)")
            }
            let lines = introspect.split(separator: "\n")
            func line(_ member: String) -> String { lines.first { $0.hasPrefix(member + " ") }.map(String.init) ?? "" }
            #expect(line(".Echo").contains("method") && line(".Echo").contains(" s "))
            #expect(line(".State").contains("property") && line(".State").contains("emits-change"))
            #expect(line(".Big").contains("emits-invalidation"))
            #expect(line(".Mode").contains("writable"))
            #expect(line(".Changed").contains("signal"))

            var got = try h.client("busctl --address=\(bus.address) get-property \(Served.name) \(path) \(iface) State")
            #expect(got == "s \"idle\"\n")
            got = try h.client("busctl --address=\(bus.address) get-property \(Served.name) \(path) \(iface) Interfaces")
            #expect(got == "as 1 \"lo\"\n")

            got = try h.client("gdbus call --address \(bus.address) --dest \(Served.name) --object-path \(path) --method \(iface).Echo 'hello'")
            #expect(got == "('hello',)\n")
            got = try h.client("gdbus call --address \(bus.address) --dest \(Served.name) --object-path \(path) --method \(iface).SetState 'busy'")
            #expect(got == "()\n")
            #expect(h.runtime.model.state == "busy")
            #expect(h.runtime.model.seen == ["Echo", "SetState"])
            got = try h.client("busctl --address=\(bus.address) get-property \(Served.name) \(path) \(iface) State")
            #expect(got == "s \"busy\"\n")

            // python3-dbus reads every property (arrays, dictionaries,
            // variants) with GetAll and Get, and calls every method.
            let props = try Spawned(client("props", bus, "\(iface) \(Served.extra)"))
            try h.finish(props)
            let json = props.json
            let main = json?[iface] as? [String: Any]
            #expect(main?["State"] as? String == "busy")
            #expect(main?["Online"] as? Bool == false)
            #expect(main?["Interfaces"] as? [String] == ["lo"])
            let details = main?["Details"] as? [String: Any]
            #expect((details?["state"] as? [String: Any])?["variant"] as? String == "busy")
            #expect((details?["online"] as? [String: Any])?["variant"] as? Bool == false)
            // A `v` property holds a variant: python sees two levels.
            #expect((main?["Anything"] as? [String: Any])?["variant"] as? Int == 4)
            #expect((main?["Anything"] as? [String: Any])?["level"] as? Int == 1)
            #expect(main?["Big"] as? [Int] == Array("busy".utf8).map(Int.init))
            #expect(main?["Mode"] as? String == "auto")
            #expect((json?[Served.extra] as? [String: Any])?["Label"] as? String == "label-busy")

            for (method, sig, args, reply) in [("Echo", "s", "[\"py\"]", "{\"reply\": [\"py\"]}"),
                                               ("Add", "ii", "[2, 40]", "{\"reply\": [42]}"),
                                               ("SetState", "s", "[\"py-state\"]", "{\"reply\": []}"),
                                               ("Privileged", "u", "[0]", "{\"reply\": [\"uid 0\"]}"),
                                               ("Emit", "s", "[\"x\"]", "{\"reply\": []}")] {
                let out = try h.client(client("call", bus, "\(iface) \(method) \(sig) '\(args)'"))
                #expect(out == reply + "\n", "\(method)")
            }
            #expect(h.runtime.model.state == "py-state")
            // Later is answered by a later message, Never when unexported.
            let later = try Spawned(client("call", bus, "\(iface) Later '' '[]'"))
            try h.run(until: { h.runtime.model.later.count == 1 })
            try h.runtime.send(.answerLater("at last"))
            try h.finish(later)
            #expect(later.output == "{\"reply\": [\"at last\"]}\n")
            let never = try Spawned(client("call", bus, "\(iface) Never '' '[]'"))
            try h.run(until: { h.runtime.model.never.count == 1 })
            try h.runtime.send(.exported(false))
            try h.finish(never)
            #expect(never.output == "{\"error\": \"org.freedesktop.DBus.Error.Failed\"}\n")
            // Unexported: the object is gone from the bus.
            got = try h.client("gdbus call --address \(bus.address) --dest \(Served.name) --object-path \(path) --method \(iface).Echo 'x' || true")
            #expect(got.contains("UnknownObject") || got.contains("UnknownMethod"), "\(got)")
            #expect(h.runtime.model.seen.filter { $0 == "Echo" }.count == 2)
            #expect(h.runtime.model.objectFailures.isEmpty)
        }

        @Test func dbusMonitorSeesOnePropertiesChangedPerChangedInterfaceOfABatchAndNoneForUnchangedCommits() throws {
            let bus = try PrivateBus(openToEveryUser: true)
            let h = try Harness.served(bus.busAddress)
            try h.run(until: { h.runtime.model.nameEvents == [.acquired] })
            let monitor = try Spawned("dbus-monitor --address \(bus.address) \"type='signal',member='PropertiesChanged'\" \"type='signal',member='Marker'\"")
            // The monitor is ready once it sees a marker.
            var ready = false
            let deadline = ContinuousClock.now + .seconds(10)
            while !ready, ContinuousClock.now < deadline {
                _ = try h.client("busctl --address=\(bus.address) emit /marker org.reconcile.Marker Marker")
                try h.run(for: .milliseconds(20))
                ready = monitor.output.contains("member=Marker")
            }
            #expect(ready)

            // Two messages in one batch: only the last model is sent.
            let sender = h.runtime.sender()
            try sender.send(.set("first-uncommitted"))
            try sender.send(.set("second"))
            try h.run(until: { h.runtime.model.state == "second" })
            // Unexported fields and unchanged values: no signal.
            try h.runtime.send(.bump)
            try h.runtime.send(.set("second"))
            // One property of one interface.
            try h.runtime.send(.online(true))
            #expect(h.runtime.stats.messages >= 5)
            try h.serverRoundTrip(bus.busAddress)
            _ = try h.client("busctl --address=\(bus.address) emit /marker org.reconcile.Marker Marker s end")
            try h.run(until: { monitor.output.contains("string \"end\"") })
            monitor.kill()

            let text = monitor.output
            let signals = text.components(separatedBy: "member=PropertiesChanged").dropFirst().map { $0.components(separatedBy: "member=Marker")[0] }
            #expect(signals.count == 3, "\(text)")
            #expect(!text.contains("first-uncommitted"))
            guard signals.count == 3 else { return }
            // The batch: one signal per interface, only the changed properties;
            // Big is invalidated, not sent.
            #expect(signals[0].contains("string \"org.reconcile.Test1\"") && signals[0].contains("string \"second\""))
            for p in ["\"State\"", "\"Details\"", "\"Anything\"", "\"Big\""] { #expect(signals[0].contains(p), "\(p)") }
            for p in ["\"Online\"", "\"Interfaces\"", "\"Mode\""] { #expect(!signals[0].contains(p), "\(p)") }
            #expect(!signals[0].contains("array of bytes"))
            #expect(signals[1].contains("string \"org.reconcile.Test1.Extra\"") && signals[1].contains("label-second"))
            #expect(signals[2].contains("\"Online\"") && signals[2].contains("boolean true") && !signals[2].contains("\"State\""))
        }

        @Test func theOwnedNameIsLostToAReplacingProcessAndReleasedWhenTheSubscriptionGoesAndAtShutdown() throws {
            let bus = try PrivateBus(openToEveryUser: true)
            let h = try Harness.served(bus.busAddress)
            try h.run(until: { h.runtime.model.nameEvents == [.acquired] })
            #expect(try names(h, bus).contains(Served.name))
            // Dropped from the subscriptions: released.
            try h.runtime.send(.owned(false))
            try h.serverRoundTrip(bus.busAddress)
            #expect(!(try names(h, bus).contains(Served.name)))
            try h.runtime.send(.owned(true))
            try h.run(until: { h.runtime.model.nameEvents == [.acquired, .acquired] })

            // Another process takes it (we allow replacement): lost.
            let other = try Spawned("/usr/bin/python3 \(repositoryScript("bus-client.py")) own \(bus.address) \(Served.name) 30")
            try h.run(until: { h.runtime.model.nameEvents.count == 3 })
            #expect(h.runtime.model.nameEvents.last == .lost(.replaced))
            // The bus tells us before the client has printed its reply's result.
            try h.run(until: { other.output.contains("owned") }, timeout: .seconds(5))
            other.kill()

            // Shutdown releases it (the second harness's name is queued behind nothing).
            let h2 = try Harness.served(.address(bus.address))
            try h2.run(until: { h2.runtime.model.nameEvents == [.acquired] })
            _ = h2.tester.shutdown()
            // busctl runs on the first harness's loop (h2's loop is finished).
            try h.run(until: { h.runtime.model.nameEvents.count >= 3 }, timeout: .milliseconds(10))
            #expect(!(try names(h, bus).contains(Served.name)))
        }

        @Test func wrongArgumentTypesAreInvalidArgsBeforeUpdateAndAHungUpCallerAndAThousandCallersCostNothing() throws {
            let bus = try PrivateBus(openToEveryUser: true)
            let h = try Harness.served(bus.busAddress)
            try h.run(until: { h.runtime.model.nameEvents == [.acquired] })
            let descriptors = openDescriptors().count

            var out = try h.client("busctl --address=\(bus.address) call \(Served.name) \(path) \(iface) Echo i 5 || true")
            #expect(out.contains("InvalidArgs") || out.contains("takes (s)"), "\(out)")
            out = try h.client(client("call", bus, "\(iface) Add si '[\"2\", 3]'"))
            #expect(out == "{\"error\": \"org.freedesktop.DBus.Error.InvalidArgs\"}\n")
            out = try h.client(client("call", bus, "\(iface) Nope '' '[]'"))
            #expect(out == "{\"error\": \"org.freedesktop.DBus.Error.UnknownMethod\"}\n")
            // A property of the wrong type, a read-only one.
            out = try h.client("busctl --address=\(bus.address) set-property \(Served.name) \(path) \(iface) Mode i 3 || true")
            #expect(out.contains("InvalidArgs") || out.contains("type s"), "\(out)")
            out = try h.client("busctl --address=\(bus.address) set-property \(Served.name) \(path) \(iface) State s x || true")
            #expect(out.contains("read-only") || out.contains("PropertyReadOnly"), "\(out)")
            #expect(h.runtime.model.seen.isEmpty)

            // A caller that hangs up at once: its call is dropped when its
            // credentials can no longer be asked, else answered into the void.
            let gone = try Spawned(client("hangup", bus, "\(iface) Later now"))
            try h.finish(gone)
            #expect(gone.output.hasPrefix("sent :"))
            try h.serverRoundTrip(bus.busAddress)
            try h.run(until: { h.driver.busPendingCalls(bus.busAddress) == 0 })
            // A caller that hangs up after `update` saw its call: tracked, it
            // leaves; the late reply goes nowhere and nothing breaks.
            #expect(h.runtime.model.later.count <= 1)
            try h.runtime.send(.answerLater("into the void"))
            try h.run(until: { h.runtime.model.left.count == h.runtime.model.seen.count })
            let before = h.runtime.model.left.count
            let hangup = try Spawned(client("hangup", bus, "\(iface) Later sync"))
            try h.finish(hangup)
            try h.run(until: { h.runtime.model.later.count == 1 && h.runtime.model.left.count == before + 1 })
            #expect(hangup.output.hasPrefix("sent :"))
            #expect(h.runtime.model.left.last == String(hangup.output.dropFirst(5)).trimmingCharacters(in: .whitespacesAndNewlines))
            try h.runtime.send(.answerLater("too late"))
            #expect(h.runtime.model.later.isEmpty)

            // A thousand callers at once, one connection each.
            let many = try Spawned(client("concurrent", bus, "\(iface) 1000"))
            try h.finish(many, timeout: .seconds(60))
            #expect(many.output == "ok 1000\n", "\(many.output)")
            #expect(h.runtime.model.seen.filter { $0 == "Echo" }.count == 1001)
            try h.run(for: .milliseconds(50))
            #expect(h.driver.busPendingCalls(bus.busAddress) == 0)
            #expect(openDescriptors().count <= descriptors + 1)
        }

        @Test func aPrivilegedMethodCalledAsNobodyIsAccessDeniedBeforeUpdateAndRootSucceeds() throws {
            let bus = try PrivateBus(openToEveryUser: true)
            let h = try Harness.served(bus.busAddress)
            try h.run(until: { h.runtime.model.nameEvents == [.acquired] })
            let nobody = "setpriv --reuid nobody --regid nogroup --clear-groups"
            // The body claims uid 0: the bus's credentials decide.
            var out = try h.client("\(nobody) busctl --address=\(bus.address) call \(Served.name) \(path) \(iface) Privileged u 0 || true")
            #expect(out.contains("not permitted") || out.contains("Access denied"), "\(out)")
            out = try h.client("\(nobody) \(client("call", bus, "\(iface) Privileged u '[0]'"))")
            #expect(out == "{\"error\": \"org.freedesktop.DBus.Error.AccessDenied\"}\n", "\(out)")
            out = try h.client("\(nobody) busctl --address=\(bus.address) set-property \(Served.name) \(path) \(iface) Mode s manual || true")
            #expect(out.contains("not permitted") || out.contains("Access denied"), "\(out)")
            #expect(h.runtime.model.seen.isEmpty)
            #expect(h.runtime.model.mode == "auto")
            // Nobody may still call what anyone may, and read.
            out = try h.client("\(nobody) busctl --address=\(bus.address) call \(Served.name) \(path) \(iface) Echo s hi")
            #expect(out == "s \"hi\"\n")
            // Root may.
            out = try h.client("busctl --address=\(bus.address) call \(Served.name) \(path) \(iface) Privileged u 12345")
            #expect(out == "s \"uid 0\"\n")
            out = try h.client("busctl --address=\(bus.address) set-property \(Served.name) \(path) \(iface) Mode s manual")
            #expect(h.runtime.model.mode == "manual")
            #expect(h.runtime.model.seen == ["Echo", "Privileged", "set Mode"])
        }
    }
}

extension SystemdTests.BusServer {
    @Test func aQueuedRequestIsLostQueuedThenAcquiredAndATakenNameWithoutQueueIsAFailure() throws {
        let bus = try PrivateBus(openToEveryUser: true)
        let other = try Spawned("/usr/bin/python3 \(repositoryScript("bus-client.py")) own \(bus.address) \(Served.name) 30")
        defer { other.kill() }
        let deadline = ContinuousClock.now + .seconds(10)
        while !other.output.contains("owned"), ContinuousClock.now < deadline { usleep(10_000) }
        let queued = try Harness.served(bus.busAddress, flags: [.queue])
        try queued.run(until: { queued.runtime.model.nameEvents == [.lost(.queued)] })
        let taken = try Harness.served(.address(bus.address), flags: [])
        try taken.run(until: { !taken.runtime.model.nameEvents.isEmpty })
        guard case .failed(let f) = taken.runtime.model.nameEvents.first else {
            Issue.record("expected a failure, got \(taken.runtime.model.nameEvents)")
            return
        }
        #expect(f.code == EEXIST)
        // The owner goes: the queued one gets it.
        other.kill()
        try queued.run(until: { queued.runtime.model.nameEvents == [.lost(.queued), .acquired] })
    }

    @Test func anObjectUnexportedFromInsideItsOwnCallAnswersAndABadReplyIsAnErrorNotALie() throws {
        let bus = try PrivateBus(openToEveryUser: true)
        let h = try Harness.served(bus.busAddress)
        try h.run(until: { h.runtime.model.nameEvents == [.acquired] })
        var out = try h.client(client("call", bus, "\(iface) BadReply '' '[]'"))
        #expect(out == "{\"error\": \"org.freedesktop.DBus.Error.Failed\"}\n")
        out = try h.client("gdbus call --address \(bus.address) --dest \(Served.name) --object-path \(path) --method \(iface).Unexport")
        #expect(out == "()\n")
        #expect(!h.runtime.model.exported)
        out = try h.client("gdbus call --address \(bus.address) --dest \(Served.name) --object-path \(path) --method \(iface).Echo x")
        #expect(out.contains("UnknownObject"), "\(out)")
        try h.runtime.send(.exported(true))
        out = try h.client("gdbus call --address \(bus.address) --dest \(Served.name) --object-path \(path) --method \(iface).Echo x")
        #expect(out == "('x',)\n")
    }

    @Test func callsUnansweredAtShutdownGetAnErrorReply() throws {
        let bus = try PrivateBus(openToEveryUser: true)
        let h = try Harness.served(bus.busAddress)
        try h.run(until: { h.runtime.model.nameEvents == [.acquired] })
        let never = try Spawned(client("call", bus, "\(iface) Never '' '[]'"))
        try h.run(until: { h.runtime.model.never.count == 1 })
        _ = h.tester.shutdown()
        let deadline = ContinuousClock.now + .seconds(20)
        while !never.isDone, ContinuousClock.now < deadline { usleep(10_000) }
        // Ours (Failed) when it left before the connection closed, else the daemon's (NoReply).
        #expect(never.output == "{\"error\": \"org.freedesktop.DBus.Error.Failed\"}\n"
                || never.output == "{\"error\": \"org.freedesktop.DBus.Error.NoReply\"}\n", "\(never.output)")
    }

    @Test func aLostBusIsOneFailureAndTheObjectAndNameComeBackWithTheBus() throws {
        let bus = try PrivateBus()
        let h = try Harness.served(bus.busAddress)
        try h.run(until: { h.runtime.model.nameEvents == [.acquired] })
        bus.kill()
        func nameFailed() -> Bool { h.runtime.model.nameEvents.contains { if case .failed = $0 { true } else { false } } }
        try h.run(until: { h.runtime.model.objectFailures.count == 1 && nameFailed() })
        try bus.start()
        try h.run(until: { h.runtime.model.nameEvents.last == .acquired }, timeout: .seconds(10))
        #expect(h.runtime.model.objectFailures.count == 1)
        var out = try h.client("busctl --address=\(bus.address) get-property \(Served.name) \(path) \(iface) State")
        #expect(out == "s \"idle\"\n")
        // The next change is a retune (its PropertiesChanged is sent), not a restart.
        let (retunes, restarts) = (h.runtime.stats.retunes, h.runtime.stats.restarts)
        try h.runtime.send(.set("back"))
        #expect(h.runtime.stats.retunes == retunes + 1 && h.runtime.stats.restarts == restarts)
        out = try h.client("busctl --address=\(bus.address) get-property \(Served.name) \(path) \(iface) State")
        #expect(out == "s \"back\"\n")
    }
}
