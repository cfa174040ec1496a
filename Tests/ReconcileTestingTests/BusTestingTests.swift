import Reconcile
import ReconcileTesting
import Testing

/// A daemon that pauses while the machine sleeps (logind's PrepareForSleep
/// from the name's owner), follows a peer's State property, and asks the
/// peer for a report when it wakes.
struct SleepAware: Program {
    struct Model: Equatable {
        var sleeping = false
        var peerState: String?
        var report: String?
        var problem: String?
    }
    enum Message: Sendable {
        case sleep(BusSignalSource.Event)
        case peer(BusPropertySource.Event)
        case reported(Result<String, BusError>)
    }
    enum Command: Equatable, Sendable { case askReport }

    static let login1 = "org.freedesktop.login1"

    func start() -> (Model, [Command]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .sleep(.received(let s)):
            guard let going = s.arguments.first?.bool else { return [] }
            m.sleeping = going
            return going ? [] : [.askReport]
        case .sleep(.failed(let f)), .peer(.failed(let f)):
            m.problem = f.reason
        case .peer(.value(let v)):
            m.peerState = v.string
        case .peer(.vanished):
            m.peerState = nil
        case .sleep(.restarting), .peer(.restarting):
            break
        case .reported(.success(let r)):
            m.report = r
        case .reported(.failure(let e)):
            m.problem = e.name
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.busSignal(bus: .system, sender: Self.login1, path: "/org/freedesktop/login1",
                                   interface: "org.freedesktop.login1.Manager", member: "PrepareForSleep") { .sleep($0) }
            Subscription.busProperty(bus: .system, service: "org.example.Peer", path: "/peer", interface: "org.example.Peer",
                                     property: "State", type: .string) { .peer($0) }
        }
    }
}

func interpretSleepAware(_ command: SleepAware.Command, _ context: some CommandContext<SleepAware.Message>, bus: some BusCaller) {
    switch command {
    case .askReport:
        context.tasks.run(id: "report") {
            let reply = try await bus.call(bus: .system, "org.example.Peer", "/peer", "org.example.Peer", "Report")
            return .reported(.success(reply.first?.string ?? ""))
        } failure: { error in
            .reported(.failure(error as? BusError ?? BusError("cancelled", "\(error)")))
        }
    }
}

@Suite struct BusTestingTests {
    @Test func injectedSignalsReachOnlyMatchingSubscriptionsAndCallsAreAnsweredByTheTest() throws {
        let bus = BusCallRecorder()
        var t = ProgramTester(SleepAware()) { interpretSleepAware($0, $1, bus: bus) }
        let sleep = try #require(t.subscription(BusSignalSource.self))
        t.event(.received(BusSignal(sender: ":1.7", path: "/org/freedesktop/login1", interface: "org.freedesktop.login1.Manager",
                                    member: "PrepareForSleep", arguments: [.boolean(true)])), from: sleep)
        #expect(t.model.sleeping)
        t.event(.received(BusSignal(sender: ":1.7", path: "/org/freedesktop/login1", interface: "org.freedesktop.login1.Manager",
                                    member: "PrepareForSleep", arguments: [.boolean(false)])), from: sleep)
        #expect(t.commands == [.askReport])
        _ = t.perform(task: "report")
        #expect(bus.pending.map(\.method) == ["Report"])
        #expect(bus.reply(with: [.string("all good")]))
        t.runUntilIdle()
        #expect(t.model.report == "all good")
        #expect(bus.pending.isEmpty && bus.calls.count == 1)
    }

    @Test func anErrorAnswerIsABusErrorAndACancelledCallLeavesNothingPending() throws {
        let bus = BusCallRecorder()
        var t = ProgramTester(SleepAware()) { interpretSleepAware($0, $1, bus: bus) }
        let sleep = try #require(t.subscription(BusSignalSource.self))
        let wake = BusSignal(sender: ":1.7", path: "/org/freedesktop/login1", interface: "org.freedesktop.login1.Manager",
                             member: "PrepareForSleep", arguments: [.boolean(false)])
        t.event(.received(wake), from: sleep)
        _ = t.perform(task: "report")
        #expect(bus.fail(with: BusError("org.example.Error.Busy", "busy")))
        t.runUntilIdle()
        #expect(t.model.problem == "org.example.Error.Busy")
        t.event(.received(wake), from: sleep)
        _ = t.perform(task: "report")
        #expect(bus.pending.count == 1)
        t.effects.tasks.cancel(id: "report")
        t.runUntilIdle()
        #expect(bus.pending.isEmpty && bus.cancelledCount == 1)
    }

    @Test func theVirtualDriverDeliversSignalsByRuleAndNamesAndPropertiesByService() throws {
        let driver = VirtualDriver()
        let rt = Runtime(SleepAware(), driver: driver)
        try rt.start()
        let wake = BusSignal(sender: ":1.7", path: "/org/freedesktop/login1", interface: "org.freedesktop.login1.Manager",
                             member: "PrepareForSleep", arguments: [.boolean(true)])
        // Not the owner of login1: not delivered.
        #expect(driver.emit(busSignal: wake, on: .system) == 0)
        #expect(driver.emit(busSignal: wake, on: .system, owner: ":1.7") == 1)
        #expect(rt.model.sleeping)
        var other = wake
        other.member = "PrepareForShutdown"
        #expect(driver.emit(busSignal: other, on: .system, owner: ":1.7") == 0)
        #expect(driver.busProperty("State", of: "org.example.Peer", at: "/peer", service: "org.example.Peer", on: .system,
                                   is: .variant(.string("ready"))) == 1)
        #expect(rt.model.peerState == "ready")
        driver.busProperty("State", of: "org.example.Peer", at: "/peer", service: "org.example.Peer", on: .system, is: .int32(3))
        #expect(rt.model.problem == "the value is of type i, the program expects s")
        #expect(driver.busName("org.example.Peer", on: .system, owner: nil) == 1)
        #expect(rt.model.peerState == nil)
    }
}
