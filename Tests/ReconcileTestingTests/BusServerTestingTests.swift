import Reconcile
import ReconcileTesting
import Testing

/// A counter served on the bus: `Count` is a property, `Increment(u)` adds
/// to it, `Slow()` is answered after an owned task, `Reset()` is root only.
struct CounterService: Program {
    static let path = "/org/example/Counter"
    static let iface = "org.example.Counter1"

    struct Model: Equatable {
        var count: UInt32 = 0
        var note = ""
        var waiting: [BusReplyToken] = []
        var seen: [String] = []
    }
    enum Message: Sendable {
        case bus(BusObjectSource.Event)
        case noted(String)
        case slowDone
    }
    enum Command: Equatable, Sendable {
        case bus(BusCommand)
        case slowWork
    }

    func start() -> (Model, [Command]) { (Model(), []) }

    func update(_ m: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .noted(let n): m.note = n
        case .slowDone:
            defer { m.waiting = [] }
            return m.waiting.map { .bus(.reply($0, [.uint32(m.count)])) }
        case .bus(.failed): break
        case .bus(.write(let w)):
            m.seen.append("set \(w.property)")
            return [.bus(.fail(w.token, "org.example.Error.No", "no"))]
        case .bus(.call(let c)):
            m.seen.append(c.member)
            switch c.member {
            case "Increment":
                m.count += c.arguments.first?.uint64.flatMap(UInt32.init(exactly:)) ?? 0
                return [.bus(.reply(c.token, [.uint32(m.count)])),
                        .bus(.emitSignal(bus: .system, path: Self.path, interface: Self.iface, member: "Bumped", values: [.uint32(m.count)]))]
            case "Slow":
                m.waiting.append(c.token)
                return [.slowWork]
            case "Reset":
                m.count = 0
                return [.bus(.reply(c.token))]
            default:
                return [.bus(.fail(c.token, "org.example.Error.Unknown", c.member))]
            }
        }
        return []
    }

    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.busObject(bus: .system, path: Self.path, interfaces: [
                BusInterface(Self.iface, methods: [
                    BusMethodDeclaration("Increment", inputs: [BusArgument("by", .uint32)], outputs: [BusArgument("count", .uint32)]),
                    BusMethodDeclaration("Slow", outputs: [BusArgument("count", .uint32)]),
                    BusMethodDeclaration("Reset", access: .root),
                ], properties: [
                    BusExportedProperty("Count", .uint32(m.count)),
                    BusExportedProperty("Note", .string(m.note), write: .anyone),
                ], signals: [BusSignalDeclaration("Bumped", arguments: [BusArgument("count", .uint32)])]),
            ]) { .bus($0) }
        }
    }
}

@Suite struct BusServerTestingTests {
    @Test func theTesterCallsAMethodAndTheReplyIsACommandThroughTheToken() {
        let replies = BusReplyRecorder()
        let signals = BusSignalRecorder()
        var t = ProgramTester(CounterService()) { command, _ in
            if case .bus(let b) = command { b.perform(emitter: signals) }
        }
        #expect(t.exportedObject(at: CounterService.path, on: .system)?.get(interface: CounterService.iface, property: "Count") == .success(.uint32(0)))
        let (call, commands) = t.call("Increment", interface: CounterService.iface, at: CounterService.path, on: .system,
                                      arguments: [.uint32(5)], replies: replies)
        guard let token = call.token else { Issue.record("refused: \(call)"); return }
        #expect(commands.first == .bus(.reply(token, [.uint32(5)])))
        #expect(replies.reply(for: token) == .success([.uint32(5)]))
        #expect(signals.signals == [BusSignalEmission(bus: .system, path: CounterService.path, interface: CounterService.iface,
                                                      member: "Bumped", values: [.uint32(5)])])
        #expect(t.exportedObject(at: CounterService.path, on: .system)?.get(interface: CounterService.iface, property: "Count") == .success(.uint32(5)))
        // A second reply to the same call is refused.
        #expect(!token.replier.reply(token, with: .success([])))
        #expect(replies.refusedReplies == 1)
    }

    @Test func wrongArgumentsAndRefusedCallersNeverReachUpdate() {
        let replies = BusReplyRecorder()
        var t = ProgramTester(CounterService())
        let (wrong, none) = t.call("Increment", interface: CounterService.iface, at: CounterService.path, on: .system,
                                   arguments: [.string("5")], replies: replies)
        #expect(wrong.error?.name == BusError.invalidArgs)
        #expect(none.isEmpty)
        let (denied, _) = t.call("Reset", interface: CounterService.iface, at: CounterService.path, on: .system, replies: replies)
        #expect(denied.error?.name == BusError.accessDenied)
        let root = BusCredentials(uniqueName: ":1.1", uid: 0, pid: 1)
        let (allowed, _) = t.call("Reset", interface: CounterService.iface, at: CounterService.path, on: .system, caller: root, replies: replies)
        #expect(allowed.token != nil)
        #expect(t.model.seen == ["Reset"])
    }

    @Test func theTesterShowsThePropertiesChangedATransitionEmits() {
        var t = ProgramTester(CounterService())
        #expect(t.propertiesChanged(by: .noted("hello"), at: CounterService.path, on: .system) == [
            BusPropertiesChanged(path: CounterService.path, interface: CounterService.iface, changed: [BusPropertyValue("Note", .string("hello"))]),
        ])
        #expect(t.propertiesChanged(by: .noted("hello"), at: CounterService.path, on: .system) == [])
    }

    @Test func theVirtualDriverDeliversCallsAndALaterReplyAfterAnOwnedTask() throws {
        let driver = VirtualDriver()
        let replies = BusReplyRecorder()
        let signals = BusSignalRecorder()
        let rt = Runtime(CounterService(), driver: driver) { command, rt in
            switch command {
            case .bus(let b): b.perform(emitter: signals)
            case .slowWork: try? rt.send(.slowDone)
            }
        }
        try rt.start()
        var changes = driver.propertiesChanged(at: CounterService.path, on: .system) {
            #expect(driver.call("Increment", interface: CounterService.iface, at: CounterService.path, on: .system,
                                arguments: [.uint32(2)], replies: replies).token != nil)
        }
        #expect(changes == [BusPropertiesChanged(path: CounterService.path, interface: CounterService.iface,
                                                 changed: [BusPropertyValue("Count", .uint32(2))])])
        changes = driver.propertiesChanged(at: CounterService.path, on: .system) {
            let slow = driver.call("Slow", interface: CounterService.iface, at: CounterService.path, on: .system, replies: replies)
            #expect(slow.token.flatMap(replies.reply(for:)) == .success([.uint32(2)]))
        }
        #expect(changes == [])
        let write = driver.write("Note", interface: CounterService.iface, at: CounterService.path, on: .system, value: .string("x"), replies: replies)
        #expect(write.token.flatMap(replies.reply(for:)) == .failure(BusError("org.example.Error.No", "no")))
        #expect(driver.write("Count", interface: CounterService.iface, at: CounterService.path, on: .system, value: .uint32(1),
                             replies: replies).error?.name == BusError.propertyReadOnly)
        #expect(replies.unanswered == 0)
        #expect(rt.model.seen == ["Increment", "Slow", "set Note"])
    }
}
