import Reconcile
import ReconcileTesting
import Testing

/// A state with `addresses` on one interface.
private func state(_ op: ConnectivitySource.OperationalState, online: Bool = false, route: Bool? = false,
                   addresses: [String] = [], backend: ConnectivitySource.Backend = .kernel) -> ConnectivitySource.State {
    .init(state: op, online: online, defaultRoute: route,
          interfaces: [.init(name: "eth0", index: 2, state: op, addresses: addresses)], backend: backend)
}

/// Follows connectivity at a granularity the model chooses.
private struct Watcher: Program {
    struct Model: Equatable { var granularity = ConnectivitySource.Granularity.online; var events = 0 }
    enum Message { case granularity(ConnectivitySource.Granularity), net(ConnectivitySource.Event) }
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .granularity(let g): model.granularity = g
        case .net: model.events += 1
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.connectivity(.init(backend: .kernel, granularity: model.granularity), key: "net") { .net($0) }
        }
    }
}

@Suite struct ConnectivitySourceTests {
    @Test func onlineGranularitySeesOnlyTheVerdict() {
        let g = ConnectivitySource.Granularity.online
        #expect(!g.distinguishes(state(.carrier), state(.routable, addresses: ["10.0.0.1/24"])))
        #expect(!g.distinguishes(state(.routable, online: true, route: true, addresses: ["10.0.0.1/24"]),
                                 state(.routable, online: true, route: true, addresses: ["10.0.0.1/24", "10.0.0.5/24"])))
        #expect(g.distinguishes(state(.routable, online: true, route: true), state(.routable, route: false)))
    }

    @Test func overallGranularitySeesStateRouteAndVerdictButNotInterfaces() {
        let g = ConnectivitySource.Granularity.overall
        #expect(!g.distinguishes(state(.routable, addresses: ["10.0.0.1/24"]), state(.routable, addresses: ["10.0.0.2/24"])))
        #expect(g.distinguishes(state(.carrier), state(.routable)))
        #expect(g.distinguishes(state(.routable, route: false), state(.routable, route: true)))
        #expect(g.distinguishes(state(.routable, route: nil), state(.routable, route: false)))
        #expect(g.distinguishes(state(.routable), state(.routable, backend: .networkd)))
        #expect(g.distinguishes(state(.routable), state(.routable, online: true)))
    }

    @Test func fullGranularitySeesEveryChange() {
        let g = ConnectivitySource.Granularity.full
        #expect(g.distinguishes(state(.routable, addresses: ["10.0.0.1/24"]), state(.routable, addresses: ["10.0.0.2/24"])))
        #expect(!g.distinguishes(state(.routable, addresses: ["10.0.0.1/24"]), state(.routable, addresses: ["10.0.0.1/24"])))
    }

    @Test func finerGranularitySeesEverythingACoarserOneSees() {
        // Over a small space of states: online ⊆ overall ⊆ full.
        let states = [ConnectivitySource.OperationalState.off, .carrier, .routable].flatMap { op in
            [false, true].flatMap { online in [nil, false, true].flatMap { route in
                [[], ["10.0.0.1/24"]].map { state(op, online: online, route: route, addresses: $0) } } }
        }
        for a in states {
            for b in states {
                if ConnectivitySource.Granularity.online.distinguishes(a, b) { #expect(ConnectivitySource.Granularity.overall.distinguishes(a, b)) }
                if ConnectivitySource.Granularity.overall.distinguishes(a, b) { #expect(ConnectivitySource.Granularity.full.distinguishes(a, b)) }
            }
        }
    }

    @Test func defaultGranularityIsFullDetail() {
        #expect(ConnectivitySource.Configuration().granularity == .full)
        #expect(ConnectivitySource.Configuration(granularity: .online).description == "backend auto granularity online")
    }

    @Test func changingGranularityRetunesTheSameActivation() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Watcher(), driver: driver)
        try rt.start()
        let id = try #require(rt.activeIDs.first)
        try rt.send(.granularity(.full))
        try rt.send(.granularity(.overall))
        guard case .start(_, let activation) = driver.log.first else {
            Issue.record("no start: \(driver.log)")
            return
        }
        #expect(driver.log == [.start(id, activation), .retune(id, activation), .retune(id, activation)])
        #expect(driver.starts(of: id) == 1 && driver.stops(of: id) == 0)
        #expect(rt.stats.retunes == 2 && rt.stats.restarts == 0)
        // A backend change is a restart, not a retune.
        #expect(!ConnectivitySource.canRetune(from: .init(backend: .kernel), to: .init(backend: .networkd)))
        #expect(ConnectivitySource.canRetune(from: .init(granularity: .online), to: .init(granularity: .full)))
    }
}
