import CSystemd
import Glibc
import Reconcile
import ReconcileSystemd

// bus: signals per second from an emitter to `update` through a bus signal
// subscription, vs a hand-written sd-bus match callback, on one private
// dbus-daemon in the same run.

/// A private dbus-daemon in a temporary directory, ended by its PID.
final class BenchBus {
    let directory: String
    let pid: pid_t
    var address: String { "unix:path=\(directory)/bus" }

    init() {
        let tmp = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
        var template = Array("\(tmp)/reconcile-bench-bus-XXXXXX".utf8CString)
        guard let p = mkdtemp(&template) else { fail("bus: mkdtemp failed") }
        directory = String(cString: p)
        let config = """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig><type>session</type><listen>unix:path=\(directory)/bus</listen><auth>EXTERNAL</auth>
            <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
            </busconfig>
            """
        guard let f = fopen(directory + "/bus.conf", "w") else { fail("bus: cannot write the config") }
        fputs(config, f)
        fclose(f)
        let command = "dbus-daemon --config-file=\(directory)/bus.conf --fork --nopidfile --print-pid=3 3>\(directory)/pid </dev/null >/dev/null 2>&1"
        var child: pid_t = 0
        let argv: [UnsafeMutablePointer<CChar>?] = ["/bin/sh", "-c", command].map { (s: String) in strdup(s) } + [nil]
        defer { argv.forEach { free($0) } }
        guard posix_spawn(&child, "/bin/sh", nil, nil, argv, Glibc.environ) == 0 else { fail("bus: cannot run dbus-daemon") }
        var status: Int32 = 0
        while waitpid(child, &status, 0) < 0 && errno == EINTR {}
        var buffer = [CChar](repeating: 0, count: 32)
        guard let pf = fopen(directory + "/pid", "r"), fgets(&buffer, 32, pf) != nil else { fail("bus: dbus-daemon did not start") }
        fclose(pf)
        pid = pid_t(atoi(buffer))
        guard pid > 0 else { fail("bus: dbus-daemon did not start") }
    }

    deinit {
        kill(pid, SIGKILL)
        for name in ["bus", "bus.conf", "pid"] { unlink(directory + "/" + name) }
        rmdir(directory)
    }
}

/// A raw connection on `loop` (the emitter, or the hand-written receiver).
func benchConnection(_ address: String, _ loop: EventLoop) -> OpaquePointer {
    var b: OpaquePointer?
    guard sd_bus_new(&b) >= 0, sd_bus_set_address(b, address) >= 0, sd_bus_set_bus_client(b, 1) >= 0,
          sd_bus_start(b) >= 0, sd_bus_attach_event(b, loop.handle, 0) >= 0 else { fail("bus: cannot connect to \(address)") }
    return b!
}

/// Emits `count` Tick(s) signals from `emitter`.
func emitTicks(_ emitter: OpaquePointer, _ count: Int) {
    for _ in 0..<count {
        var m: OpaquePointer?
        guard sd_bus_message_new_signal(emitter, &m, "/bench", "org.example.Bench", "Tick") >= 0 else { fail("bus: new signal") }
        _ = "tick".withCString { sd_bus_message_append_basic(m, CChar(UInt8(ascii: "s")), $0) }
        guard sd_bus_send(emitter, m, nil) >= 0 else { fail("bus: send") }
        sd_bus_message_unref(m)
    }
}

/// Counts Tick signals in `update`.
struct TickCounter: Program {
    let bus: BusAddress
    func start() -> (Int, [Never]) { (0, []) }
    func update(_ m: inout Int, _ event: BusSignalSource.Event) -> [Never] {
        if case .received(let s) = event, s.arguments.first?.string == "tick" { m += 1 }
        return []
    }
    func subscriptions(_ m: Int) -> Subscriptions<BusSignalSource.Event> {
        Subscriptions { Subscription.busSignal(bus: bus, interface: "org.example.Bench", member: "Tick") { $0 } }
    }
}

final class SignalCounter { var count = 0 }

enum BusVariant: String, CaseIterable {
    case reconcile = "busSignal subscription"
    case raw = "hand-written sd-bus match"
}

/// One round: `count` signals emitted, the nanoseconds until the last reached its receiver.
func busRound(_ variant: BusVariant, bus: BenchBus, count: Int) throws -> Double {
    let loop = try EventLoop()
    let emitter = benchConnection(bus.address, loop)
    defer { sd_bus_flush_close_unref(emitter) }
    var received: () -> Int
    var cleanup: () -> Void
    switch variant {
    case .reconcile:
        let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
        let runtime = Runtime(TickCounter(bus: .address(bus.address)), driver: driver)
        try runtime.start()
        received = { runtime.model }
        cleanup = { runtime.shutdown() }
    case .raw:
        let receiver = benchConnection(bus.address, loop)
        let counter = SignalCounter()
        var slot: OpaquePointer?
        guard sd_bus_add_match(receiver, &slot, "type='signal',interface='org.example.Bench',member='Tick'", { m, ud, _ in
            var s: UnsafePointer<CChar>?
            if sd_bus_message_read_basic(m, CChar(UInt8(ascii: "s")), &s) >= 0, let s, strcmp(s, "tick") == 0 {
                Unmanaged<SignalCounter>.fromOpaque(ud!).takeUnretainedValue().count += 1
            }
            return 0
        }, Unmanaged.passUnretained(counter).toOpaque()) >= 0 else { fail("bus: add match") }
        received = { counter.count }
        cleanup = { sd_bus_slot_unref(slot); sd_bus_flush_close_unref(receiver) }
    }
    defer { cleanup() }
    // The match is in place once a tick gets through.
    var warm = 0
    while received() == 0 {
        emitTicks(emitter, 1)
        warm += 1
        _ = try loop.run(until: { received() > 0 }, timeout: .milliseconds(20))
        if warm > 500 { fail("bus \(variant.rawValue): the match never took a signal") }
    }
    _ = try loop.run(until: { received() >= warm }, timeout: .seconds(5))
    let base = received()
    let start = monotonicNanos()
    emitTicks(emitter, count)
    guard try loop.run(until: { received() - base >= count }, timeout: .seconds(120)) else {
        fail("bus \(variant.rawValue): \(received() - base) of \(count) signals arrived")
    }
    return Double(monotonicNanos() - start)
}

func busBenchmark(count: Int, rounds: Int, into records: inout [Record]) throws {
    let bus = BenchBus()
    var times: [BusVariant: [Double]] = [:]
    for v in BusVariant.allCases { _ = try busRound(v, bus: bus, count: count / 10) }   // warm-up
    for _ in 0..<rounds {
        for v in BusVariant.allCases { times[v, default: []].append(try busRound(v, bus: bus, count: count)) }
    }
    let raw = median(times[.raw]!) / Double(count)
    for v in BusVariant.allCases {
        let perSignal = median(times[v]!) / Double(count)
        records.append(Record(
            benchmark: "bus", implementation: v.rawValue, size: count, churn: nil, unit: "signal",
            runs: rounds, medianNanos: perSignal, p99Nanos: p99(times[v]!) / Double(count), perSubscription: false,
            extra: [("signals_per_second", 1e9 / perSignal), ("rate_over_hand_written", raw / perSignal)]))
        progress("bus \(v.rawValue): \(grouped(Int(1e9 / perSignal))) signals/s")
    }
}

func printBus(_ records: [Record]) {
    let bus = records.filter { $0.benchmark == "bus" }
    guard !bus.isEmpty else { return }
    print("### bus: signals from an emitter to their receiver on a private dbus-daemon (real loop, medians over rounds)\n")
    printTable(["receiver", "signals", "per signal", "signals/s", "rate vs hand-written"], bus.map {
        [$0.implementation, grouped($0.size), duration($0.medianNanos), grouped(Int($0.extra("signals_per_second") ?? 0)),
         significant($0.extra("rate_over_hand_written") ?? .nan) + "×"]
    })
}
