import IndicatorCore
import Reconcile
import ReconcileTesting
import Testing

private let bus = BusAddress.address("unix:path=/run/test/bus")
private let path = ConnectivityService.path
private let iface = ConnectivityService.interface

private func model(_ state: ConnectivitySource.OperationalState, online: Bool, addresses: [String] = []) -> Indicator.Model {
    var m = Indicator.Model(settings: Settings())
    m.latest = .init(state: .init(state: state, online: online, defaultRoute: online,
                                  interfaces: [.init(name: "veth0", index: 2, state: state, addresses: addresses)], backend: .kernel),
                     changedAt: 0)
    return m
}

@Suite struct ConnectivityServiceTests {
    @Test func busTakesSystemUserOrAnAddress() throws {
        #expect(try parseArguments(["--bus", "system"], directory: "/").get().bus == .system)
        #expect(try parseArguments(["--bus=user"], directory: "/").get().bus == .user)
        #expect(try parseArguments(["--bus", "unix:path=/run/x/bus"], directory: "/").get().bus == .address("unix:path=/run/x/bus"))
        #expect(try parseArguments([], directory: "/").get().bus == nil)
        guard case .failure(let e) = parseArguments(["--bus", "nowhere"], directory: "/") else { Issue.record("accepted"); return }
        #expect(e.message.hasPrefix("bad value 'nowhere' for --bus"))
    }

    @Test func theServiceExportsTheIndicatorsStateAndAnnouncesOnlyWhatChanged() {
        var t = ProgramTester(ConnectivityService(bus: bus))
        let start = t.exportedObject(at: path, on: bus)
        #expect(start?.get(interface: iface, property: "State") == .success(.string("starting")))
        #expect(t.subscriptionIDs.contains(SubscriptionID(BusOwnedNameSource.self, key: BusOwnedNameSource.Configuration(bus: bus, name: ConnectivityService.name))))
        let first = t.propertiesChanged(by: .indicator(.init(model(.noCarrier, online: false))), at: path, on: bus)
        #expect(first.count == 1)
        #expect(first.first?.changed.map(\.name) == ["State", "Interfaces"])
        let online = t.propertiesChanged(by: .indicator(.init(model(.routable, online: true, addresses: ["10.0.0.1/24"]))), at: path, on: bus)
        #expect(online.first?.changed == [
            BusPropertyValue("State", .string("routable")), BusPropertyValue("Online", .boolean(true)),
            BusPropertyValue("Interfaces", .array(element: .structure([.string, .string, .array(.string)]),
                                                  [.structure([.string("veth0"), .string("routable"), .strings(["10.0.0.1/24"])])])),
        ])
        // The same state again (a redraw, another field): no signal.
        #expect(t.propertiesChanged(by: .indicator(.init(model(.routable, online: true, addresses: ["10.0.0.1/24"]))), at: path, on: bus) == [])
        var failing = Indicator.Model(settings: Settings())
        failing.failure = "netlink: gone"
        #expect(t.propertiesChanged(by: .indicator(.init(failing)), at: path, on: bus).first?.changed.first == BusPropertyValue("State", .string("unknown")))
    }

    @Test func refreshRereadsTheConfigAndAnswersTheStateNow() {
        let replies = BusReplyRecorder()
        var t = ProgramTester(ConnectivityService(bus: bus))
        t.send(.indicator(.init(model(.carrier, online: false))))
        let (call, commands) = t.call("Refresh", interface: iface, at: path, on: bus, replies: replies)
        guard let token = call.token else { Issue.record("refused: \(call)"); return }
        #expect(commands == [.refresh, .bus(.reply(token, [.string("carrier")]))])
        #expect(t.call("Refresh", interface: iface, at: path, on: bus, arguments: [.string("x")], replies: replies).0.error?.name == BusError.invalidArgs)
    }
}
