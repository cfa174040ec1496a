import Foundation
import TestSupport
import Reconcile
import ReconcileTesting
import ReconcileTranscript
import Testing

/// A source the tests drive by hand: events and failures are injected.
enum Probe: Source {
    static let name = "probe"
    typealias Configuration = Int
    enum Event { case value(Int), failed(SourceFailure) }
    static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
    /// Even to even (or odd to odd) retunes; a parity change restarts.
    static func canRetune(from old: Int, to new: Int) -> Bool { old % 2 == new % 2 }
}

/// A program whose desired set is whatever the last `.set` said: timers and
/// probes, keyed and configured at random; it answers some messages with
/// commands, so replays compare commands as well as plans.
struct Churn: Program {
    struct Entry: Codable, Equatable, Sendable {
        var key: Int
        var isTimer: Bool
        var setting: Int
    }
    struct Model: Equatable {
        var entries: [Entry] = []
        var phase = Phase()
        var ticks = 0
        var values: [Int] = []
        var failures = 0
        var stale = 0
    }
    enum Message: Codable, Equatable, Sendable {
        case set([Entry])
        case tick(Phase, key: Int, sequence: UInt64)
        case value(Phase, key: Int, Int)
        case failed(key: Int, reason: String)
        case note(String)
    }
    enum Command: Codable, Equatable, Sendable {
        case log(String)
        case fetch(key: Int)
    }

    /// A deliberately changed program: from `breakAt` values on, the fetch
    /// command names another key.
    var breakAt: Int?

    func start() -> (Model, [Command]) { (Model(), [.log("started")]) }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .set(let e):
            model.entries = e
            model.phase.advance()
            return e.isEmpty ? [.log("idle")] : []
        case .tick(let p, _, _):
            guard model.phase.isCurrent(p) else { model.stale += 1; return [] }
            model.ticks += 1
            return []
        case .value(let p, let key, let v):
            guard model.phase.isCurrent(p) else { model.stale += 1; return [] }
            model.values.append(v)
            if let breakAt, model.values.count >= breakAt { return [.fetch(key: key + 1)] }
            return v % 3 == 0 ? [.fetch(key: key)] : []
        case .failed(let key, let reason):
            model.failures += 1
            return [.log("probe \(key): \(reason)")]
        case .note(let s):
            return [.log(s)]
        }
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        let phase = model.phase
        return Subscriptions(model.entries.map { e in
            let key = e.key
            if e.isTimer {
                return Subscription.every(.milliseconds(10 * (1 + e.setting % 3)), key: key) { event in
                    if case .tick(let t) = event { return .tick(phase, key: key, sequence: t.sequence) }
                    return .note("timer \(key) failed")
                }
            }
            return Subscription(Probe.self, key: key, configuration: e.setting) { event in
                switch event {
                case .value(let v): .value(phase, key: key, v)
                case .failed(let f): .failed(key: key, reason: f.reason)
                }
            }
        })
    }
}

/// Runs `steps` random steps of `Churn` on a virtual driver with a transcript
/// buffer attached: sets, time, probe events (on the loop and from posters),
/// failures, messages from a `Sender` and from the host.
func recordChurn(seed: UInt64, steps: Int, program: Churn = Churn()) throws -> (Runtime<Churn>, VirtualDriver, Data) {
    var rng = SplitMix64(seed: seed)
    let driver = VirtualDriver()
    let runtime = Runtime(program, driver: driver, inboxCapacity: 1 << 20)
    let buffer = TranscriptBuffer<Churn>()
    buffer.attach(to: runtime)
    try runtime.send(.note("before start"))
    try runtime.start()
    let sender = runtime.sender()
    for _ in 0..<steps {
        let running = driver.running.keys.filter { $0.kind == SourceKind(Probe.self) }.sorted { $0.description < $1.description }
        switch Int.random(in: 0..<20, using: &rng) {
        case 0..<5:
            var entries: [Churn.Entry] = []
            for _ in 0..<Int.random(in: 0..<12, using: &rng) {
                entries.append(.init(key: Int.random(in: 0..<16, using: &rng), isTimer: Bool.random(using: &rng),
                                     setting: Int.random(in: 0..<4, using: &rng)))
            }
            try runtime.send(.set(entries))
        case 5..<9:
            driver.advance(by: .milliseconds(Int64.random(in: 1...25, using: &rng)))
        case 9..<13:
            if let id = running.randomElement(using: &rng) { driver.emit(Probe.Event.value(Int.random(in: 0..<100, using: &rng)), to: id) }
        case 13..<15:
            // Events from another thread, taken in one pump with whatever
            // else waits: a batch of several messages in one round.
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                if let id = running.randomElement(using: &rng), let poster = driver.poster(for: id) {
                    poster.post(Probe.Event.value(Int.random(in: 0..<100, using: &rng)))
                }
            }
            if Bool.random(using: &rng) { try sender.send(.note("from a thread")) }
            if Bool.random(using: &rng) {
                try sender.send(.set([.init(key: Int.random(in: 0..<16, using: &rng), isTimer: false, setting: 1)]))
            }
            driver.runUntilIdle()
        case 15:
            if let id = running.randomElement(using: &rng) {
                driver.fail(id, SourceFailure(operation: "probe", code: 5, reason: "input/output error"))
            }
        default:
            try runtime.send(.note("host \(Int.random(in: 0..<1000, using: &rng))"))
        }
    }
    return (runtime, driver, buffer.data)
}

@Suite struct ReplayTests {
    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func randomRunsReplayToTheSamePlansCommandsAndModel(seed: UInt64) throws {
        let (live, liveDriver, data) = try recordChurn(seed: seed, steps: 10_000)
        let transcript = try Transcript(data: data)
        #expect(transcript.lines.filter { $0.type == "message" }.count == live.stats.messages)
        let outcome = try Replay.run(Churn(), transcript)
        #expect(outcome.divergence == nil, "\(outcome.divergence.map(String.init(describing:)) ?? "")")
        #expect(outcome.messages == live.stats.messages)
        #expect(outcome.runtime.model == live.model)
        #expect(outcome.runtime.activeIDs == live.activeIDs)
        #expect(Set(outcome.driver.running.keys) == Set(liveDriver.running.keys))
        #expect(outcome.runtime.stats.restarts == live.stats.restarts)
        #expect(outcome.runtime.stats.retunes == live.stats.retunes)
        // The run had every kind of origin and failures.
        #expect(live.stats.failures > 0 && live.stats.restarts > 0 && live.stats.retunes > 0)
        let origins = Set(transcript.lines.compactMap { $0.value["origin"]?["kind"]?.string })
        #expect(origins == ["host", "sender", "source"])
    }

    @Test func changedProgramDivergesAtTheFirstDifferentCommand() throws {
        let (live, _, data) = try recordChurn(seed: 7, steps: 3_000)
        let transcript = try Transcript(data: data)
        // The message at which the changed program first answers differently:
        // the fifth value message (its command names another key, or there
        // was no command).
        let values = transcript.lines.filter { $0.type == "message" && $0.value["message"]?["value"] != nil }
        let fifth = try #require(values.dropFirst(4).first)
        let outcome = try Replay.run(Churn(breakAt: 5), transcript, programName: String(reflecting: Churn.self))
        let d = try #require(outcome.divergence)
        #expect(d.index == Int(fifth.value["index"]!.int!))
        #expect(d.what == "commands")
        #expect(d.message == fifth.value["message"]!.description)
        #expect(d.expected == fifth.value["commands"]!.description)
        let key = fifth.value["message"]!["value"]!["key"]!.int!
        #expect(d.got == "[{\"fetch\":{\"key\":\(key + 1)}}]")
        #expect("\(d)".contains("at message \(d.index)"))
        #expect(live.stats.messages > d.index)
    }

    @Test func recordedTimesAreTheLoopsVirtualTimes() throws {
        let driver = VirtualDriver()
        let runtime = Runtime(Churn(), driver: driver)
        let buffer = TranscriptBuffer<Churn>()
        buffer.attach(to: runtime)
        try runtime.start()
        try runtime.send(.set([.init(key: 1, isTimer: true, setting: 0)]))
        driver.advance(by: .milliseconds(25))
        let lines = try Transcript(data: buffer.data).lines.filter { $0.type == "message" }
        #expect(lines.map { $0.value["time_us"]!.int! } == [0, 10_000, 20_000])
        #expect(lines[1].value["origin"]! == .object(["kind": .string("source"), "id": .string("timer:1"), "activation": .int(1)]))
        // Each tick was its own round (processed, then reconciled).
        #expect(lines.map { $0.value["round"]!.int! } == [1, 2, 3])
    }

    @Test func replayFeedsRecordedTicksAndNotTimersOfItsOwn() throws {
        let (live, _, data) = try recordChurn(seed: 11, steps: 500)
        let outcome = try Replay.run(Churn(), try Transcript(data: data))
        #expect(outcome.divergence == nil)
        #expect(outcome.runtime.model.ticks == live.model.ticks)
    }

    @Test func messagesSentByStartCommandsAreTheFirstBatch() throws {
        struct Starter: Program {
            struct Model: Equatable { var on = false }
            enum Message: Codable { case on }
            enum Command: Codable { case turnOn }
            func start() -> (Model, [Command]) { (Model(), [.turnOn]) }
            func update(_ model: inout Model, _ message: Message) -> [Command] { model.on = true; return [] }
            func subscriptions(_ model: Model) -> Subscriptions<Message> {
                Subscriptions { if model.on { Subscription(Probe.self, key: 1, configuration: 0) { _ in .on } } }
            }
        }
        let driver = VirtualDriver()
        var plans: [Plan] = []
        let runtime = Runtime(Starter(), driver: driver) { _, rt in try? rt.send(.on) }
        runtime.didReconcile = { plans.append($0) }
        let buffer = TranscriptBuffer<Starter>()
        buffer.attach(to: runtime)
        try runtime.start()
        // One reconcile after the start batch: the probe starts once.
        #expect(plans.count == 1 && plans[0].steps.count == 1)
        let outcome = try Replay.run(Starter(), try Transcript(data: buffer.data))
        #expect(outcome.divergence == nil)
        #expect(outcome.runtime.activeIDs == runtime.activeIDs)
    }
}

