import CSystemd
import Glibc
import Reconcile
import ReconcileSystemd
import ReconcileTesting

// bus-serve: method calls per second answered by an exported object through
// the runtime (the call a message, the reply a command) vs a hand-written
// sd_bus_add_object callback, on one private dbus-daemon in the same run;
// and what an unchanged commit costs an object of 100 properties.

private let benchPath = "/bench"
private let benchInterface = "org.example.Bench"

/// Answers Echo(s) with its argument, from `update`.
struct EchoService: Program {
    static let name = "org.example.BenchServe.Runtime"
    let bus: BusAddress
    enum Message { case call(BusObjectSource.Event), name(BusOwnedNameSource.Event) }

    func start() -> (Bool, [BusCommand]) { (false, []) }
    func update(_ m: inout Bool, _ message: Message) -> [BusCommand] {
        switch message {
        case .name(let e): m = e == .acquired
        case .call(.call(let c)): return [.reply(c.token, c.arguments)]
        case .call: break
        }
        return []
    }
    func subscriptions(_ m: Bool) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.ownName(bus: bus, name: Self.name) { .name($0) }
            Subscription.busObject(bus: bus, path: benchPath, interfaces: [
                BusInterface(benchInterface, methods: [
                    BusMethodDeclaration("Echo", inputs: [BusArgument("text", .string)], outputs: [BusArgument("text", .string)]),
                ]),
            ]) { .call($0) }
        }
    }
}

/// Calls Echo("x") on `destination`, `window` at a time, until `total` replies.
final class CallPump {
    let client: OpaquePointer
    let destination: String
    var total = 0, sent = 0, done = 0, errors = 0
    var window = 32

    init(client: OpaquePointer, destination: String) {
        self.client = client
        self.destination = destination
    }

    func start(_ count: Int) {
        total = sent + count
        while sent < total && sent - done < window { send() }
    }

    func send() {
        sent += 1
        var m: OpaquePointer?
        guard sd_bus_message_new_method_call(client, &m, destination, benchPath, benchInterface, "Echo") >= 0 else { fail("bus-serve: new call") }
        _ = "x".withCString { sd_bus_message_append_basic(m, CChar(UInt8(ascii: "s")), $0) }
        let r = sd_bus_call_async(client, nil, m, { reply, ud, _ in
            let pump = Unmanaged<CallPump>.fromOpaque(ud!).takeUnretainedValue()
            pump.done += 1
            if sd_bus_message_is_method_error(reply, nil) != 0 { pump.errors += 1 }
            if pump.sent < pump.total { pump.send() }
            return 0
        }, Unmanaged.passUnretained(self).toOpaque(), 0)
        sd_bus_message_unref(m)
        if r < 0 { fail("bus-serve: call_async (errno \(-r))") }
    }
}

enum ServeVariant: String, CaseIterable {
    case reconcile = "busObject subscription (update replies)"
    case raw = "hand-written sd_bus_add_object"
}

/// One round: `count` calls answered, the nanoseconds they took.
func serveRound(_ variant: ServeVariant, bus: BenchBus, count: Int) throws -> Double {
    let loop = try EventLoop()
    let client = benchConnection(bus.address, loop)
    defer { sd_bus_flush_close_unref(client) }
    var cleanup: () -> Void
    let destination: String
    switch variant {
    case .reconcile:
        let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
        let runtime = Runtime(EchoService(bus: .address(bus.address)), driver: driver) { [unowned driver] c, _ in driver.perform(c) }
        try runtime.start()
        destination = EchoService.name
        cleanup = { runtime.shutdown() }
    case .raw:
        let server = benchConnection(bus.address, loop)
        destination = "org.example.BenchServe.Raw"
        // Setup only (the measured part is the calls): a synchronous request.
        guard sd_bus_request_name(server, destination, 0) >= 0 else { fail("bus-serve: request name") }
        var slot: OpaquePointer?
        guard sd_bus_add_object(server, &slot, benchPath, { m, _, _ in
            guard sd_bus_message_is_method_call(m, benchInterface, "Echo") > 0 else { return 0 }
            var s: UnsafePointer<CChar>?
            guard sd_bus_message_read_basic(m, CChar(UInt8(ascii: "s")), &s) >= 0 else { return -EINVAL }
            var reply: OpaquePointer?
            guard sd_bus_message_new_method_return(m, &reply) >= 0 else { return -ENOMEM }
            sd_bus_message_append_basic(reply, CChar(UInt8(ascii: "s")), s)
            sd_bus_send(nil, reply, nil)
            sd_bus_message_unref(reply)
            return 1
        }, nil) >= 0 else { fail("bus-serve: add object") }
        cleanup = { sd_bus_slot_unref(slot); sd_bus_flush_close_unref(server) }
    }
    defer { cleanup() }
    let pump = CallPump(client: client, destination: destination)
    // Served once a call gets an answer that is not an error (the name may not be ours yet).
    var tries = 0
    repeat {
        tries += 1
        if tries > 500 { fail("bus-serve \(variant.rawValue): never answered") }
        let errors = pump.errors
        pump.start(1)
        _ = try loop.run(until: { pump.done == pump.sent }, timeout: .seconds(5))
        if pump.errors == errors { break }
        _ = try loop.run(until: { false }, timeout: .milliseconds(5))
    } while true
    let errors = pump.errors
    let start = monotonicNanos()
    pump.start(count)
    guard try loop.run(until: { pump.done == pump.total }, timeout: .seconds(120)) else {
        fail("bus-serve \(variant.rawValue): \(pump.done) of \(pump.total) calls answered")
    }
    let elapsed = Double(monotonicNanos() - start)
    if pump.errors != errors { fail("bus-serve \(variant.rawValue): \(pump.errors - errors) error replies") }
    return elapsed
}

/// An object of 100 properties; `.tick` changes only a field it does not export.
struct HundredProperties: Program {
    enum Variant: String, CaseIterable {
        case none = "no object (baseline)"
        case plain = "object rebuilt by subscriptions()"
        case grouped = "object in a memoized group"
    }
    static let names = (0..<100).map { "P\($0)" }
    let variant: Variant
    struct Model: Equatable {
        var values = [Int32](repeating: 7, count: 100)
        var ticks = 0
    }

    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ m: inout Model, _ message: Int) -> [Never] {
        m.ticks += 1
        return []
    }
    static func object(_ values: [Int32]) -> BusObject {
        var properties: [BusExportedProperty] = []
        properties.reserveCapacity(values.count)
        for (i, v) in values.enumerated() { properties.append(BusExportedProperty(names[i], .int32, .int32(v))) }
        return BusObject(bus: .system, path: benchPath, interfaces: [BusInterface(benchInterface, properties: properties)])
    }
    func subscriptions(_ m: Model) -> Subscriptions<Int> {
        switch variant {
        case .none: return Subscriptions([])
        case .plain: return Subscriptions([.busObject(Self.object(m.values)) { _ in 0 }])
        case .grouped:
            return Subscriptions.group("object", m.values) { (_: String, values: [Int32]) in
                Subscriptions([.busObject(HundredProperties.object(values)) { _ in 0 }])
            }
        }
    }
}

/// Nanoseconds per unchanged commit (a message, its reconcile) and the driver calls made.
func unchangedCommit(_ variant: HundredProperties.Variant, messages: Int) throws -> (Double, Int) {
    let driver = VirtualDriver()
    let runtime = Runtime(HundredProperties(variant: variant), driver: driver)
    try runtime.start()
    for i in 0..<1_000 { try runtime.send(i) }
    let calls = runtime.stats.starts + runtime.stats.stops + runtime.stats.retunes
    let start = monotonicNanos()
    for i in 0..<messages { try runtime.send(i) }
    let elapsed = Double(monotonicNanos() - start) / Double(messages)
    let after = runtime.stats.starts + runtime.stats.stops + runtime.stats.retunes
    runtime.shutdown()
    return (elapsed, after - calls)
}

func busServeBenchmark(count: Int, rounds: Int, into records: inout [Record]) throws {
    let bus = BenchBus()
    var times: [ServeVariant: [Double]] = [:]
    for v in ServeVariant.allCases { _ = try serveRound(v, bus: bus, count: count / 10) }   // warm-up
    for _ in 0..<rounds {
        for v in ServeVariant.allCases { times[v, default: []].append(try serveRound(v, bus: bus, count: count)) }
    }
    let raw = median(times[.raw]!) / Double(count)
    for v in ServeVariant.allCases {
        let perCall = median(times[v]!) / Double(count)
        records.append(Record(
            benchmark: "bus-serve", implementation: v.rawValue, size: count, churn: nil, unit: "call",
            runs: rounds, medianNanos: perCall, p99Nanos: p99(times[v]!) / Double(count), perSubscription: false,
            extra: [("calls_per_second", 1e9 / perCall), ("rate_over_hand_written", raw / perCall)]))
        progress("bus-serve \(v.rawValue): \(grouped(Int(1e9 / perCall))) calls/s")
    }
    // 100 properties, a commit that changes none of them.
    let messages = 200_000
    var commit: [HundredProperties.Variant: [Double]] = [:]
    var driverCalls: [HundredProperties.Variant: Int] = [:]
    for _ in 0..<rounds {
        for v in HundredProperties.Variant.allCases {
            let (nanos, calls) = try unchangedCommit(v, messages: messages)
            commit[v, default: []].append(nanos)
            driverCalls[v, default: 0] += calls
        }
    }
    let baseline = median(commit[.none]!)
    for v in HundredProperties.Variant.allCases {
        let m = median(commit[v]!)
        records.append(Record(
            benchmark: "bus-serve-properties", implementation: v.rawValue, size: 100, churn: nil, unit: "commit",
            runs: rounds, medianNanos: m, p99Nanos: p99(commit[v]!), perSubscription: false, driverCalls: Double(driverCalls[v] ?? 0),
            extra: [("over_baseline_nanos", m - baseline)]))
        progress("bus-serve properties \(v.rawValue): \(duration(m)) per commit, \(duration(m - baseline)) over the baseline, \(driverCalls[v] ?? 0) driver calls")
    }
}

func printBusServe(_ records: [Record]) {
    let calls = records.filter { $0.benchmark == "bus-serve" }
    if !calls.isEmpty {
        print("### bus-serve: method calls answered by an exported object on a private dbus-daemon (real loop, 32 in flight, medians over rounds)\n")
        printTable(["server", "calls", "per call", "calls/s", "rate vs hand-written"], calls.map {
            [$0.implementation, grouped($0.size), duration($0.medianNanos), grouped(Int($0.extra("calls_per_second") ?? 0)),
             significant($0.extra("rate_over_hand_written") ?? .nan) + "×"]
        })
    }
    let properties = records.filter { $0.benchmark == "bus-serve-properties" }
    if !properties.isEmpty {
        print("### bus-serve: a commit that changes no exported property, object of 100 properties (virtual driver, medians)\n")
        printTable(["program", "per commit", "over baseline", "driver calls (bus traffic)"], properties.map {
            [$0.implementation, duration($0.medianNanos), duration($0.extra("over_baseline_nanos") ?? .nan), grouped(Int($0.driverCalls ?? 0))]
        })
    }
}
