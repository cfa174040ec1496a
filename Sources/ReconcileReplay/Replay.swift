import FoundationEssentials
import Reconcile
import ReconcileTranscript

/// Where a replay first did something else than the recorded run.
public struct ReplayDivergence: Equatable, CustomStringConvertible, Sendable {
    /// The index of the message at (or after) which the runs diverged; -1
    /// for the start.
    public var index: Int
    /// The message, as recorded (JSON).
    public var message: String
    /// What differed: `commands`, `plan (round N)`, `start commands`.
    public var what: String
    /// The recorded side.
    public var expected: String
    /// The replayed side.
    public var got: String

    /// One sentence: where, what, expected and got.
    public var description: String {
        let at = index < 0 ? "at start" : "at message \(index) \(message)"
        return "replay diverged \(at): \(what): expected \(expected), got \(got)"
    }
}

/// What a replay came to.
public struct ReplayOutcome<P: Program> {
    /// The runtime the transcript was replayed into (its model, stats).
    public let runtime: Runtime<P>
    /// The virtual driver it ran on.
    public let driver: VirtualDriver
    /// The first divergence, or nil when every command and plan matched.
    public let divergence: ReplayDivergence?
    /// Messages fed to the program.
    public let messages: Int
}

/// Feeds a transcript's messages to a program on `VirtualDriver` at the
/// recorded times, batch by batch as the recorded run processed them, and
/// compares, step by step, the commands and plans with the recorded ones.
///
/// Commands are not performed: messages a command produced in the recorded
/// run are in the transcript and are fed from there. Timers do not fire on
/// their own. A recorded source failure marks the running source as failed,
/// so a later change restarts it as it did in the run.
public enum Replay {
    /// Replays `transcript` into `program`.
    /// - Parameters:
    ///   - program: the program to feed (the recorded one, or a changed one).
    ///   - transcript: the recorded run.
    ///   - programName: the type name the transcript must name (default:
    ///     `P`'s; give the original's to replay into a changed program).
    ///   - prepare: called with the runtime and driver before the start
    ///     (install `didCommit` to see every model).
    /// - Returns: the runtime and driver after the replay, and the first divergence.
    /// - Throws: `TranscriptError` when the transcript is of another program
    ///   or a message cannot be decoded.
    public static func run<P: Program>(
        _ program: P, _ transcript: Transcript, programName: String? = nil,
        prepare: (Runtime<P>, VirtualDriver) -> Void = { _, _ in }
    ) throws(TranscriptError) -> ReplayOutcome<P> where P.Message: Decodable {
        let expectedName = programName ?? String(reflecting: P.self)
        guard transcript.program == expectedName else {
            throw .programMismatch(expected: expectedName, found: transcript.program)
        }
        let driver = VirtualDriver()
        driver.firesTimers = false
        let runtime = Runtime(program, driver: driver, inboxCapacity: 1 << 20)
        let collector = Collector<P.Message, P.Command>()
        runtime.transcript = { collector.take($0) }
        prepare(runtime, driver)

        let decoder = JSONDecoder()
        var startTime: Int64?
        var expectedStart: JSONValue?
        var lastMessage: (index: Int, text: String) = (-1, "")
        var fed = 0
        var i = 0
        let lines = transcript.lines
        var failed: [String] = []
        var started = false

        func divergence(_ what: String, _ expected: String, _ got: String) -> ReplayOutcome<P> {
            ReplayOutcome(runtime: runtime, driver: driver,
                          divergence: ReplayDivergence(index: lastMessage.index, message: lastMessage.text, what: what,
                                                       expected: expected, got: got),
                          messages: fed)
        }

        /// Compares what the replay produced since the last check with the
        /// recorded messages and plan of `round`.
        func check(batch: [Transcript.Line], plan: Transcript.Line?, round: Int64) -> ReplayOutcome<P>? {
            let got = collector.drain()
            if let expectedStart {
                guard let s = got.start else { return divergence("start", "a start", "none") }
                if let d = compareCommands(expectedStart, s) { return divergence("start commands", d.0, d.1) }
            }
            var k = 0
            for line in batch {
                let index = Int(line.value["index"]?.int ?? -1)
                lastMessage = (index, line.value["message"]?.description ?? "(\(line.value["message_kind"]?.string ?? "?"))")
                guard k < got.messages.count else { return divergence("message", "message \(index) processed", "not processed") }
                if let d = compareCommands(line.value, got.messages[k]) { return divergence("commands", d.0, d.1) }
                k += 1
            }
            if k < got.messages.count { return divergence("messages", "\(k) in this batch", "\(got.messages.count)") }
            let expectedPlan = plan.map { planFields($0.value) }
            let gotPlan = got.plan.map { planFields($0) }
            if expectedPlan != gotPlan {
                return divergence("plan (round \(round))", expectedPlan?.description ?? "no plan", gotPlan?.description ?? "no plan")
            }
            return nil
        }

        func noteFailure(_ line: Transcript.Line) {
            if line.value["kind"]?.string == "source_failed", let id = line.value["id"]?.string { failed.append(id) }
        }

        while i < lines.count {
            let line = lines[i]
            switch line.type {
            case "start":
                startTime = line.value["time_us"]?.int
                expectedStart = line.value
                i += 1
                continue
            case "diagnostic":
                noteFailure(line)
                i += 1
                continue
            case "end":
                i += 1
                continue
            default: break
            }
            // One round: its messages (diagnostics among them), then its
            // plan record if the reconcile changed something. The round's
            // first line is consumed below, so the loop always advances.
            guard line.type == "message" || line.type == "plan" else {
                throw .badLine(line: line.number, reason: "unknown record type \(line.type)")
            }
            guard let round = line.value["round"]?.int else {
                throw .badLine(line: line.number, reason: "a \(line.type) record needs an integer round")
            }
            let first = i
            var batch: [Transcript.Line] = []
            var later: [String] = []
            var plan: Transcript.Line?
            while i < lines.count {
                let l = lines[i]
                if l.type == "message", l.value["round"]?.int == round {
                    batch.append(l)
                    failed += later
                    later = []
                } else if l.type == "diagnostic" {
                    // Failures after the round's last message are of sources
                    // its reconcile started: they count from the next round.
                    if l.value["kind"]?.string == "source_failed", let id = l.value["id"]?.string { later.append(id) }
                } else if l.type == "plan", l.value["round"]?.int == round {
                    plan = l
                    i += 1
                    break
                } else {
                    break
                }
                i += 1
            }
            guard i > first else { throw .badLine(line: line.number, reason: "out of place in round \(round)") }
            var items: [(message: P.Message, origin: MessageOrigin)] = []
            for m in batch {
                let index = Int(m.value["index"]?.int ?? -1)
                guard m.value["message"] != nil else {
                    throw .notReplayable(index: index, reason: "recorded without payload (\(m.value["message_error"]?.string ?? "its type is not Codable"))")
                }
                do {
                    items.append((try decoder.decode(MessageField<P.Message>.self, from: m.bytes).message, origin(m.value["origin"], runtime)))
                } catch {
                    throw .notReplayable(index: index, reason: "the message does not decode as \(P.Message.self): \(error)")
                }
            }
            if let t = (batch.first ?? plan)?.value["time_us"]?.int, let s = startTime {
                // Times come from a file: a difference that does not fit is a bad line, not a trap.
                let (elapsed, overflow) = t.subtractingReportingOverflow(s)
                guard !overflow else { throw .badLine(line: line.number, reason: "time_us \(t) is out of range") }
                let target = Duration.microseconds(elapsed)
                if target > driver.now { driver.advance(by: target - driver.now) }
            }
            let failedIDs = runtime.activeIDs.filter { failed.contains($0.description) }
            failed = later
            if !started {
                // Round 0: the messages queued before and during the start.
                for item in items {
                    do { try runtime.send(item.message) } catch {
                        throw .badLine(line: line.number, reason: "the runtime refused a start message: \(error)")
                    }
                }
                do { try runtime.start() } catch { throw .badLine(line: line.number, reason: "the runtime does not start: \(error)") }
                started = true
            } else {
                runtime.replay(items, failed: failedIDs)
            }
            fed += items.count
            if let d = check(batch: batch, plan: plan, round: round) { return d }
            expectedStart = nil
        }
        if !started {
            do { try runtime.start() } catch { throw .badLine(line: 1, reason: "the runtime does not start: \(error)") }
            if let d = check(batch: [], plan: nil, round: 0) { return d }
        }
        return ReplayOutcome(runtime: runtime, driver: driver, divergence: nil, messages: fed)
    }

    /// Replays the transcript file at `path`.
    public static func run<P: Program>(
        _ program: P, path: String, programName: String? = nil,
        prepare: (Runtime<P>, VirtualDriver) -> Void = { _, _ in }
    ) throws(TranscriptError) -> ReplayOutcome<P> where P.Message: Decodable {
        try run(program, try Transcript(contentsOf: path), programName: programName, prepare: prepare)
    }

    static func origin<P: Program>(_ value: JSONValue?, _ runtime: Runtime<P>) -> MessageOrigin {
        switch value?["kind"]?.string {
        case "sender": return .sender
        case "task": return .task(value?["id"]?.string ?? "")
        case "source":
            if let id = value?["id"]?.string, let a = value?["activation"]?.int, let generation = UInt64(exactly: a),
               let sid = runtime.activeIDs.first(where: { $0.description == id }) {
                return .source(sid, Activation(generation: generation))
            }
            return .host
        default: return .host
        }
    }

    static func compareCommands(_ expected: JSONValue, _ got: JSONValue) -> (String, String)? {
        for key in ["commands", "command_kinds", "command_error"] where expected[key] != got[key] {
            return (expected[key]?.description ?? "no \(key)", got[key]?.description ?? "no \(key)")
        }
        return nil
    }

    static func planFields(_ v: JSONValue) -> JSONValue {
        .object(["steps": v["steps"] ?? .null, "kept": v["kept"] ?? .null, "duplicates": v["duplicates"] ?? .null])
    }
}

struct MessageField<M: Decodable>: Decodable { let message: M }

/// Collects a replay's own records, encoded the way the recorder encodes them.
final class Collector<Message, Command> {
    struct Batch {
        var start: JSONValue?
        var messages: [JSONValue] = []
        var plan: JSONValue?
    }
    let encoder = TranscriptEncoder<Message, Command>(capacity: 1 << 12)
    var batch = Batch()

    func take(_ record: TranscriptRecord<Message, Command>) {
        switch record {
        case .diagnostic: return
        default: break
        }
        encoder.append(record)
        let bytes = encoder.swapOutput([])
        let value = (try? JSONParser.parse(bytes)) ?? .null
        switch record {
        case .start: batch.start = value
        case .message: batch.messages.append(value)
        case .plan: batch.plan = value
        case .diagnostic: break
        }
    }

    func drain() -> Batch {
        defer { batch = Batch() }
        return batch
    }
}
