import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// A client process started in the background (`/bin/sh -c`), its output in
/// a file; the test runs the loop until it ends. Killed by its PID.
final class Spawned {
    let pid: pid_t
    private let outputPath: String
    private(set) var status: Int32?

    init(_ command: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let directory = try makeTemporaryDirectory()
        outputPath = directory + "/out"
        var pid: pid_t = 0
        let line = "exec >\(outputPath) 2>&1 </dev/null; exec \(command)"
        let argv: [UnsafeMutablePointer<CChar>?] = ["/bin/sh", "-c", line].map { (s: String) in strdup(s) } + [nil]
        defer { argv.forEach { free($0) } }
        guard posix_spawn(&pid, "/bin/sh", nil, nil, argv, environ) == 0 else {
            Issue.record("cannot run \(command)", sourceLocation: sourceLocation)
            throw POSIXError(.EINVAL)
        }
        self.pid = pid
    }

    /// Whether it has ended (reaped here).
    var isDone: Bool {
        if status != nil { return true }
        var s: Int32 = 0
        if waitpid(pid, &s, WNOHANG) == pid { status = s }
        return status != nil
    }

    /// What it printed (stdout and stderr).
    var output: String { (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "" }

    /// Its output parsed as one JSON object.
    var json: [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(output.utf8))) as? [String: Any]
    }

    /// SIGKILL by PID, reaped.
    func kill() {
        guard !isDone else { return }
        Glibc.kill(pid, SIGKILL)
        var s: Int32 = 0
        while waitpid(pid, &s, 0) < 0 && errno == EINTR {}
        status = s
    }

    deinit {
        kill()
        removeTree((outputPath as NSString).deletingLastPathComponent)
    }
}

/// The driver a test's interpreter performs bus commands on (set after
/// the harness is made).
final class DriverRef {
    weak var driver: SystemdDriver?
}

/// A program serving one object with two interfaces, properties of every
/// kind the acceptance asks for (string, boolean, array, dictionary,
/// variant, a large one that invalidates, a writable one), methods that
/// answer at once, later, never, or only to root, and an owned name and
/// tracked peers while the model wants them.
struct Served: Program {
    static let path = "/org/reconcile/Test"
    static let iface = "org.reconcile.Test1"
    static let extra = "org.reconcile.Test1.Extra"
    static let name = "org.reconcile.Test"

    struct Model: Equatable {
        var state = "idle"
        var online = false
        var interfaces = ["lo"]
        var mode = "auto"
        var counter = 0
        var exported = true
        var owned = true
        var nameFlags: BusNameFlags = [.allowReplacement]
        var seen: [String] = []
        var later: [BusReplyToken] = []
        var never: [BusReplyToken] = []
        var nameEvents: [BusOwnedNameSource.Event] = []
        var objectFailures: [SourceFailure] = []
        var peers: Set<String> = []
        var left: [String] = []
    }

    enum Message: Sendable {
        case set(String)
        case online(Bool)
        case bump
        case exported(Bool)
        case owned(Bool)
        case answerLater(String)
        case object(BusObjectSource.Event)
        case name(BusOwnedNameSource.Event)
        case peers(BusPeersSource.Event)
    }

    enum Command { case bus(BusCommand) }

    let bus: BusAddress
    var flags: BusNameFlags = [.allowReplacement]

    func start() -> (Model, [Command]) {
        var m = Model()
        m.nameFlags = flags
        return (m, [])
    }

    func update(_ m: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .set(let s): m.state = s
        case .online(let o): m.online = o
        case .bump: m.counter += 1
        case .exported(let e): m.exported = e
        case .owned(let o): m.owned = o
        case .answerLater(let text):
            let tokens = m.later
            m.later = []
            return tokens.map { .bus(.reply($0, [.string(text)])) }
        case .name(let e): m.nameEvents.append(e)
        case .peers(.left(let p)):
            m.left.append(p)
            m.peers.remove(p)
        case .peers(.failed): break
        case .object(.failed(let f)): m.objectFailures.append(f)
        case .object(.write(let w)):
            m.seen.append("set \(w.property)")
            m.mode = w.value.string ?? m.mode
            return [.bus(.reply(w.token))]
        case .object(.call(let c)):
            m.seen.append(c.member)
            let arg = c.arguments.first
            switch c.member {
            case "Echo": return [.bus(.reply(c.token, [arg ?? .string("")]))]
            case "Add": return [.bus(.reply(c.token, [.int32((c.arguments[0].int.map(Int32.init) ?? 0) &+ (c.arguments[1].int.map(Int32.init) ?? 0))]))]
            case "SetState":
                m.state = arg?.string ?? ""
                return [.bus(.reply(c.token))]
            case "Later":
                m.later.append(c.token)
                m.peers.insert(c.caller.uniqueName)
            case "Never": m.never.append(c.token)
            case "Privileged":
                return [.bus(.reply(c.token, [.string("uid \(c.caller.uid.map(String.init) ?? "?")")]))]
            case "Unexport":
                // The object goes in the reconcile that follows, inside its own callback.
                m.exported = false
                return [.bus(.reply(c.token))]
            case "BadReply":
                return [.bus(.reply(c.token, [.int32(1)]))]
            case "Emit":
                return [.bus(.emitSignal(bus: bus, path: Self.path, interface: Self.iface, member: "Changed", values: [arg ?? .string("")])),
                        .bus(.reply(c.token))]
            default: return [.bus(.fail(c.token, "org.reconcile.Error.Unknown", "no such method"))]
            }
        }
        return []
    }

    func object(_ m: Model) -> BusObject {
        BusObject(bus: bus, path: Self.path, interfaces: [
            BusInterface(Self.iface, methods: [
                BusMethodDeclaration("Echo", inputs: [BusArgument("text", .string)], outputs: [BusArgument("text", .string)]),
                BusMethodDeclaration("Add", inputs: [BusArgument("a", .int32), BusArgument("b", .int32)], outputs: [BusArgument("sum", .int32)]),
                BusMethodDeclaration("SetState", inputs: [BusArgument("state", .string)]),
                BusMethodDeclaration("Later", outputs: [BusArgument("text", .string)]),
                BusMethodDeclaration("Never"),
                BusMethodDeclaration("Privileged", inputs: [BusArgument("claimed_uid", .uint32)], outputs: [BusArgument("who", .string)],
                                     access: .root),
                BusMethodDeclaration("Emit", inputs: [BusArgument("text", .string)]),
                BusMethodDeclaration("Unexport"),
                BusMethodDeclaration("BadReply", outputs: [BusArgument("text", .string)]),
            ], properties: [
                BusExportedProperty("State", .string(m.state)),
                BusExportedProperty("Online", .boolean(m.online)),
                BusExportedProperty("Interfaces", .strings(m.interfaces)),
                BusExportedProperty("Details", .dictionary(["state": .variant(.string(m.state)), "online": .variant(.boolean(m.online))])),
                BusExportedProperty("Anything", .variant, .variant(.int32(Int32(m.state.count)))),
                BusExportedProperty("Big", .bytes(Array(m.state.utf8)), change: .invalidates),
                BusExportedProperty("Mode", .string(m.mode), write: .root),
            ], signals: [BusSignalDeclaration("Changed", arguments: [BusArgument("text", .string)])]),
            BusInterface(Self.extra, properties: [BusExportedProperty("Label", .string("label-\(m.state)"))]),
        ])
    }

    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        var subs: [Subscription<Message>] = []
        if m.exported { subs.append(.busObject(object(m)) { .object($0) }) }
        if m.owned { subs.append(.ownName(bus: bus, name: Self.name, flags: m.nameFlags) { .name($0) }) }
        if !m.peers.isEmpty { subs.append(.trackPeers(bus: bus, peers: m.peers, key: "callers") { .peers($0) }) }
        return Subscriptions(subs)
    }
}

extension Harness where P == Served {
    /// A harness whose interpreter performs bus commands on its driver.
    static func served(_ bus: BusAddress, flags: BusNameFlags? = nil) throws -> Harness<Served> {
        let ref = DriverRef()
        var program = Served(bus: bus)
        if let flags { program.flags = flags }
        let h = try Harness(program) { command, _ in
            if case .bus(let b) = command { ref.driver?.perform(b) }
        }
        ref.driver = h.driver
        return h
    }

    /// A round trip to the bus daemon on the driver's connection: what the
    /// driver sent before has reached the daemon when it returns.
    func serverRoundTrip(_ bus: BusAddress, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let caller = driver.bus
        let done = Flag()
        Task(executorPreference: loop.taskExecutor) {
            _ = try? await caller.call(bus: bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetId")
            done.set()
        }
        try run(until: { done.isSet }, sourceLocation: sourceLocation)
    }

    /// Runs the loop until `client` ends; records an issue if it does not.
    func finish(_ client: Spawned, timeout: Duration = .seconds(20), sourceLocation: SourceLocation = #_sourceLocation) throws {
        try run(until: { client.isDone }, timeout: timeout, sourceLocation: sourceLocation)
    }

    /// Runs `command` in the background while the loop runs; its output.
    func client(_ command: String, timeout: Duration = .seconds(20), sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let c = try Spawned(command, sourceLocation: sourceLocation)
        try finish(c, timeout: timeout, sourceLocation: sourceLocation)
        return c.output
    }
}
