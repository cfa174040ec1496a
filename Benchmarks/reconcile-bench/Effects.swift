import Glibc
import Reconcile
import ReconcileSystemd

// effects: command -> task -> result message round trips on the real loop,
// through the task registry vs hand-rolled `Task` + `Sender`, in one run.

/// A chain: each result message asks for the next task until `count`.
struct ChainProgram: Program {
    let count: Int
    enum Message: Sendable { case done(Int) }
    enum Command { case next(Int) }
    func start() -> (Int, [Command]) { (0, [.next(0)]) }
    func update(_ model: inout Int, _ message: Message) -> [Command] {
        guard case .done(let i) = message else { return [] }
        model += 1
        return i + 1 < count ? [.next(i + 1)] : []
    }
}

enum EffectsVariant: String, CaseIterable {
    /// `runtime.tasks.run(id:)`: a task on the loop's executor, the result
    /// through the registry's unbounded lane.
    case registry
    /// The hand-rolled way: `Task { try sender.send(...) }` on the global executor.
    case rawTask = "raw Task + Sender"
    /// The same on the loop's task executor (`Task(executorPreference: loop.taskExecutor)`).
    case rawLoopTask = "raw loop Task + Sender"
}

/// One chain of `count` round trips; returns the nanoseconds it took.
func effectsChain(_ variant: EffectsVariant, count: Int) throws -> Double {
    let loop = try EventLoop()
    let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
    let executor = loop.taskExecutor
    let runtime = Runtime(ChainProgram(count: count), driver: driver) { command, rt in
        guard case .next(let i) = command else { return }
        switch variant {
        case .registry:
            rt.tasks.run(id: 0) { .done(i) }
        case .rawTask:
            let sender = rt.sender()
            Task {
                do { try sender.send(.done(i)) } catch { fatalError("raw send refused: \(error)") }
            }
        case .rawLoopTask:
            let sender = rt.sender()
            Task(executorPreference: executor) {
                do { try sender.send(.done(i)) } catch { fatalError("raw send refused: \(error)") }
            }
        }
    }
    defer { runtime.shutdown() }
    let start = monotonicNanos()
    try runtime.start()
    guard try loop.run(until: { runtime.model == count }, timeout: .seconds(120)) else {
        fail("effects \(variant.rawValue): \(runtime.model) of \(count) round trips")
    }
    return Double(monotonicNanos() - start)
}

func effectsBenchmark(count: Int, rounds: Int, into records: inout [Record]) throws {
    // EFFECTS_ONLY=registry|rawTask|rawLoopTask: one variant only (for strace -c / perf).
    if let only = getenv("EFFECTS_ONLY").map({ String(cString: $0) }), let v = EffectsVariant.allCases.first(where: { "\($0)" == only }) {
        for _ in 0..<rounds { _ = try effectsChain(v, count: count) }
        return
    }
    var times: [EffectsVariant: [Double]] = [:]
    _ = try effectsChain(.registry, count: count / 10)       // warm-up
    _ = try effectsChain(.rawTask, count: count / 10)
    for _ in 0..<rounds {
        for v in EffectsVariant.allCases { times[v, default: []].append(try effectsChain(v, count: count)) }
    }
    let registry = median(times[.registry]!) / Double(count)
    for v in EffectsVariant.allCases {
        let perTrip = median(times[v]!) / Double(count)
        records.append(Record(
            benchmark: "effects", implementation: v.rawValue, size: count, churn: nil, unit: "round trip",
            runs: rounds, medianNanos: perTrip, p99Nanos: p99(times[v]!) / Double(count), perSubscription: false,
            extra: [("round_trips_per_second", 1e9 / perTrip), ("ratio_registry_over_this", perTrip / registry)]))
        progress("effects \(v.rawValue): \(duration(perTrip)) per round trip")
    }
}

func printEffects(_ records: [Record]) {
    let effects = records.filter { $0.benchmark == "effects" }
    guard !effects.isEmpty else { return }
    print("### effects: command → task → result message round trips (real loop, sequential chain, medians over rounds)\n")
    printTable(["variant", "round trips", "per round trip", "round trips/s", "registry speed ×"], effects.map {
        [$0.implementation, grouped($0.size), duration($0.medianNanos), grouped(Int($0.extra("round_trips_per_second") ?? 0)),
         significant($0.extra("ratio_registry_over_this") ?? .nan) + "×"]
    })
}
