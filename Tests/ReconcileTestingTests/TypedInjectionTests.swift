import Reconcile
import ReconcileTesting
import Testing

/// A program whose subscriptions use a key type private to this file, as a
/// daemon's would be private to its module.
struct Watcher: Program {
    fileprivate struct WatchKey: Hashable, Sendable { let n: Int }
    struct Model: Equatable { var events: [String] = []; var online: Bool? }
    enum Message { case file(FileWatchSource.Event), net(ConnectivitySource.Event), ignored }

    func start() -> (Model, [Never]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .file(let e): model.events.append("\(e)")
        case .net(.changed(let c)): model.online = c.state.online
        case .net(.failed): model.online = nil
        case .net(.restarting), .ignored: break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription(FileWatchSource.self, key: WatchKey(n: 1), configuration: .init(path: "/etc/x.conf")) { .file($0) }
            Subscription.connectivity(key: "net") { .net($0) }
            Subscription.every(.seconds(1), key: "t") { _ in .ignored }
        }
    }
}

@Suite struct TypedInjectionTests {
    @Test func untypedEmitOfTheWrongEventTypeSaysSo() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Watcher(), driver: driver)
        try rt.start()
        let timer = SubscriptionID(TimerSource.self, key: "t")
        #expect(!driver.emit(FileWatchSource.Event.modified, to: timer))
        #expect(rt.model.events.isEmpty && rt.stats.droppedEvents == 1)
    }

    @Test func runningSourceWithAPrivateKeyTypeIsFoundByKind() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Watcher(), driver: driver)
        try rt.start()
        let watch = try #require(driver.subscription(FileWatchSource.self))
        #expect(driver.emit(.modified, to: watch))
        #expect(driver.emit(.replaced, to: watch))
        #expect(rt.model.events == ["modified", "replaced"])
        let net = try #require(driver.subscription(ConnectivitySource.self, key: "net"))
        driver.emit(.online(via: "wlan0"), to: net)
        #expect(rt.model.online == true)
        #expect(driver.emit(.offline(), to: ConnectivitySource.self, key: "net"))
        #expect(rt.model.online == false)
        driver.fail(net, .init(operation: "GetNameOwner", reason: "networkd is not running"))
        #expect(rt.model.online == nil)
    }

    @Test func testerFindsDesiredSubscriptionsByKindOrKey() throws {
        var t = ProgramTester(Watcher())
        let watch = try #require(t.subscription(FileWatchSource.self, where: { "\($0)".contains("n: 1") }))
        t.event(.created, from: watch)
        t.event(.offline(), from: ConnectivitySource.self, key: "net")
        #expect(t.model.events == ["created"] && t.model.online == false)
        let timer = try #require(t.subscription(TimerSource.self, key: "t"))
        #expect(t.message(for: .tick(.init(sequence: 1, missed: 0)), from: timer) != nil)
        #expect(TypedSubscriptionID<TimerSource>(watch.id) == nil)
    }

    @Test func missingSubscriptionIsARecordedIssue() {
        let t = ProgramTester(Watcher())
        withKnownIssue {
            _ = t.subscription(SignalSource.self, key: SignalSource.Signal.hangup)
        }
        withKnownIssue {
            _ = t.debounce("none")
        }
    }

    @Test func connectivityBuildersMakeTheFullSnapshot() {
        let built = ConnectivitySource.Event.online(via: "wlan0", at: 5)
        let long = ConnectivitySource.Event.changed(.init(
            state: .init(state: .routable, online: true, defaultRoute: true,
                         interfaces: [.init(name: "wlan0", index: 2, state: .routable, addresses: ["10.0.0.1/24"])],
                         backend: .kernel),
            changedAt: 5))
        #expect(built == long)
        let off = ConnectivitySource.State.offline(.degraded, links: ["eth0", "wlan0"])
        #expect(!off.online && off.state == .degraded && off.interfaces.map(\.index) == [2, 3])
        #expect(off.interfaces.allSatisfy { $0.state == .degraded })
    }
}

@Suite struct LastPlanTests {
    /// The same messages through the tester and the runtime give the same
    /// `lastPlan` after each one.
    @Test func testerAndRuntimeAgreeOnTheLastPlan() throws {
        let messages: [Ticks.Message] = [
            .interval(.milliseconds(20)), .interval(.milliseconds(20)), .running(false), .running(false), .running(true),
        ]
        var t = ProgramTester(Ticks())
        let rt = Runtime(Ticks(), driver: VirtualDriver())
        try rt.start()
        #expect(rt.lastPlan == t.lastPlan)
        for m in messages {
            t.send(m)
            try rt.send(m)
            #expect(rt.lastPlan == t.lastPlan, "after \(m)")
        }
        #expect(t.lastPlan.steps.map(\.description) == ["start timer:t: every 20ms"])
    }
}
