import Foundation
import Reconcile
import ReconcileSystemd
import Testing

/// A private dbus-daemon on a socket in a temporary directory (never the
/// system or session bus), killed and restarted by its PID.
///
/// `openToEveryUser` makes the socket's directory world-readable, lets every
/// user connect, and raises the limits high enough for a thousand callers.
final class PrivateBus {
    let directory: String
    let openToEveryUser: Bool
    private(set) var pid: pid_t = 0
    var address: String { "unix:path=\(directory)/bus" }
    var busAddress: BusAddress { .address(address) }

    init(openToEveryUser: Bool = false) throws {
        self.openToEveryUser = openToEveryUser
        directory = try makeTemporaryDirectory()
        if openToEveryUser { chmod(directory, 0o755) }
        let openLimits = openToEveryUser ? """
              <limit name="max_connections_per_user">100000</limit>
              <limit name="max_completed_connections">100000</limit>
              <limit name="max_incomplete_connections">10000</limit>
            """ : ""
        try writeFile(directory + "/bus.conf", """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>session</type>
              <listen>unix:path=\(directory)/bus</listen>
              <auth>EXTERNAL</auth>
              <limit name="max_replies_per_connection">50000</limit>
            \(openLimits)  <policy context="default">
                \(openToEveryUser ? "<allow user=\"*\"/>" : "")
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
                <allow own="*"/>
              </policy>
            </busconfig>
            """)
        try start()
    }

    /// Starts the daemon (again, after `kill`) on the same socket path.
    func start() throws {
        unlink(directory + "/bus")
        unlink(directory + "/pid")
        // The forked daemon keeps no pipe of ours open (its pid goes to a file).
        guard sh("dbus-daemon --config-file=\(directory)/bus.conf --fork --nopidfile --print-pid=3 3>\(directory)/pid </dev/null >/dev/null 2>&1"),
              let text = try? String(contentsOfFile: directory + "/pid", encoding: .utf8),
              let pid = pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw POSIXError(.ENOENT)
        }
        self.pid = pid
        // The socket is made by the daemon as root: let everyone connect.
        if openToEveryUser { chmod(directory + "/bus", 0o777) }
    }

    /// SIGKILLs the daemon by its PID and waits (bounded) until it is gone.
    func kill() {
        guard pid > 0 else { return }
        Glibc.kill(pid, SIGKILL)
        waitGone(pid)
        pid = 0
    }

    deinit {
        kill()
        removeTree(directory)
    }
}

/// Waits (at most 5 s) until process `pid` is gone (or a zombie).
func waitGone(_ pid: pid_t) {
    let deadline = ContinuousClock.now + .seconds(5)
    while ContinuousClock.now < deadline {
        if Glibc.kill(pid, 0) != 0 { return }
        if let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
           stat.split(separator: " ").dropFirst(2).first == "Z" { return }
        usleep(5_000)
    }
}

/// The python3-dbus stand-in service (scripts/bus-standin.py): owns a
/// name, serves a property and methods, emits what the test tells it to.
final class Standin {
    let process = Process()
    private let input = Pipe()
    private let output = LineReader()
    /// Its unique name on the bus.
    private(set) var unique = ""
    private var killed = false

    init(_ bus: PrivateBus, name: String = "org.example.Standin", state: String = "one",
         sourceLocation: SourceLocation = #_sourceLocation) throws {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [repositoryScript("bus-standin.py"), bus.address, name, state]
        process.standardInput = input
        process.standardOutput = output.pipe
        try process.run()
        let ready = output.line(matching: { $0.hasPrefix("ready ") }, timeout: .seconds(10))
        guard let ready else {
            Issue.record("the stand-in service did not start", sourceLocation: sourceLocation)
            throw POSIXError(.ETIMEDOUT)
        }
        unique = String(ready.dropFirst(6))
    }

    var pid: pid_t { process.processIdentifier }

    /// Sends one command and waits for its `ok`.
    func command(_ line: String, sourceLocation: SourceLocation = #_sourceLocation) {
        input.fileHandleForWriting.write(Data((line + "\n").utf8))
        if output.line(matching: { $0 == "ok" }, timeout: .seconds(10)) == nil {
            Issue.record("the stand-in service did not do \(line)", sourceLocation: sourceLocation)
        }
    }

    /// SIGKILL by PID.
    func kill() {
        guard !killed else { return }
        killed = true
        Glibc.kill(pid, SIGKILL)
        waitGone(pid)   // bounded (Process's own wait needs SIGCHLD, which tests may block)
    }

    deinit { kill() }
}

/// Runs a client command to its end (posix_spawn and waitpid: no Foundation
/// process monitor, which needs SIGCHLD that signal tests may block).
func run(_ command: String, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
    sh(command + " </dev/null >/dev/null", sourceLocation: sourceLocation)
}

/// What a bus test program records.
enum BusEvent: Hashable {
    case signal(String, BusSignalSource.Event)
    case name(BusNameSource.Event)
    case property(BusPropertySource.Event)
}

/// Subscribes to what it is given while `on`; records every event.
struct BusWatcher: Program {
    enum Want { case signal(String, BusSignalSource.Configuration), name(BusNameSource.Configuration), property(BusPropertySource.Configuration) }
    struct Model { var on = true; var events: [BusEvent] = [] }
    enum Message { case on(Bool), event(BusEvent) }
    let wants: [Want]

    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .on(let on): m.on = on
        case .event(let e): m.events.append(e)
        }
        return []
    }
    func subscriptions(_ m: Model) -> Subscriptions<Message> {
        guard m.on else { return Subscriptions {} }
        return Subscriptions(wants.map { want -> Subscription<Message> in
            switch want {
            case .signal(let key, let c): Subscription.busSignal(c, key: key) { .event(.signal(key, $0)) }
            case .name(let c): Subscription.busName(bus: c.bus, name: c.name) { .event(.name($0)) }
            case .property(let c):
                Subscription.busProperty(bus: c.bus, service: c.service, path: c.path, interface: c.interface,
                                         property: c.property, type: c.type) { .event(.property($0)) }
            }
        })
    }
}

extension Harness where P == BusWatcher {
    var events: [BusEvent] { runtime.model.events }
    func signals(_ key: String) -> [BusSignalSource.Event] {
        events.compactMap { if case .signal(key, let e) = $0 { e } else { nil } }
    }
    var names: [BusNameSource.Event] { events.compactMap { if case .name(let e) = $0 { e } else { nil } } }
    var properties: [BusPropertySource.Event] { events.compactMap { if case .property(let e) = $0 { e } else { nil } } }

    /// A round trip to the bus daemon on the driver's connection: every
    /// AddMatch sent before it has been applied when it returns.
    func roundTrip(_ bus: BusAddress, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let caller = driver.bus
        let done = Flag()
        Task(executorPreference: loop.taskExecutor) {
            _ = try? await caller.call(bus: bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetId")
            done.set()
        }
        try run(until: { done.isSet }, sourceLocation: sourceLocation)
    }
}

/// A flag set from a task, read on the loop.
final class Flag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}

/// A result box filled by a task.
final class Box<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: T?
    func set(_ v: T) { lock.withLock { stored = v } }
    var value: T? { lock.withLock { stored } }
}

extension BusSignalSource.Event {
    var signal: BusSignal? { if case .received(let s) = self { s } else { nil } }
    var isFailure: Bool { if case .failed = self { true } else { false } }
}

extension BusNameSource.Event {
    var isRestarting: Bool { if case .restarting = self { true } else { false } }
}

extension BusEvent {
    /// A `.failed` of any of the three kinds.
    var isFailure: Bool {
        switch self {
        case .signal(_, .failed), .name(.failed), .property(.failed): true
        default: false
        }
    }
}
