import Reconcile
import ReconcileTesting
import Testing

/// Answers each line of a connection with a child's first output line.
private struct Runner: Program {
    struct Model: Equatable {
        var connections: [Connection] = []
        var jobs: [String] = []
        var ended: [UInt64] = []
    }
    enum Message { case listener(ListenerSource.Event), connection(Connection, DescriptorSource.Event), job(String, ProcessSource.Event) }
    enum Command: Equatable { case reply(UInt64, String) }

    func start() -> (Model, [Command]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .listener(.accepted(let c)) where c.credentials?.uid == 0 || c.credentials == nil:
            model.connections.append(c)
        case .connection(_, .line(let line)):
            model.jobs.append(line)
        case .connection(_, .lines(let lines)):
            model.jobs += lines
        case .connection(let c, .endOfFile):
            model.connections.removeAll { $0 == c }
            model.ended.append(c.id)
        case .job(let line, .exited(let status)):
            model.jobs.removeAll { $0 == line }
            return model.connections.first.map { [.reply($0.id, "\(line): exit \(status)")] } ?? []
        default: break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.listen(3, name: "ctl") { .listener($0) }
            model.connections.map { c in Subscription.connection(c) { .connection(c, $0) } }
            model.jobs.map { line in Subscription.process(["/bin/true", line], key: line) { .job(line, $0) } }
        }
    }
}

@Suite struct IOInjectionTests {
    @Test func injectedConnectionsLinesAndExitsDriveTheProgramLikeTheRealSources() throws {
        var t = ProgramTester(Runner())
        let listener = try #require(t.subscription(ListenerSource.self, key: "ctl"))
        t.accept(.testing(id: 7), on: listener)
        // A unix peer that is not root is refused by the program.
        t.accept(.testing(id: 8, credentials: PeerCredentials(pid: 9, uid: 65534, gid: 65534)), on: listener)
        #expect(t.model.connections.map(\.id) == [7])
        let connection = try #require(t.subscription(DescriptorSource.self, key: UInt64(7)))
        t.lines(["a", "b"], from: connection)
        #expect(t.model.jobs == ["a", "b"])
        let job = try #require(t.subscription(ProcessSource.self, key: "a"))
        #expect(t.exit(3, output: ["ignored"], from: job) == [.reply(7, "a: exit 3")])
        #expect(t.model.jobs == ["b"])
        t.lines([], endOfFile: true, from: connection)
        #expect(t.model.ended == [7] && t.model.connections.isEmpty)
    }

    @Test func injectedBatchedLinesAreOneLinesEvent() throws {
        var t = ProgramTester(Runner())
        let listener = try #require(t.subscription(ListenerSource.self, key: "ctl"))
        t.accept(.testing(id: 7), on: listener)
        let connection = try #require(t.subscription(DescriptorSource.self, key: UInt64(7)))
        t.lines(["a", "b", "c"], batched: true, from: connection)
        #expect(t.model.jobs == ["a", "b", "c"])
        let driver = VirtualDriver()
        let rt = Runtime(Runner(), driver: driver)
        try rt.start()
        #expect(driver.accept(.testing(id: 1), on: try #require(driver.subscription(ListenerSource.self, key: "ctl"))))
        let c = try #require(driver.subscription(DescriptorSource.self, key: UInt64(1)))
        #expect(driver.lines(["x", "y"], batched: true, to: c))
        #expect(rt.model.jobs == ["x", "y"])
    }

    @Test func theVirtualDriverDeliversInjectedLinesAndExitsToRunningSources() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Runner(), driver: driver)
        try rt.start()
        let listener = try #require(driver.subscription(ListenerSource.self, key: "ctl"))
        #expect(driver.accept(.testing(id: 1), on: listener))
        let connection = try #require(driver.subscription(DescriptorSource.self, key: UInt64(1)))
        #expect(driver.lines(["x"], to: connection))
        let job = try #require(driver.subscription(ProcessSource.self, key: "x"))
        #expect(driver.exit(0, from: job))
        #expect(rt.model.jobs.isEmpty)
        #expect(driver.lines([], endOfFile: true, to: connection))
        #expect(rt.model.connections.isEmpty)
    }
}
