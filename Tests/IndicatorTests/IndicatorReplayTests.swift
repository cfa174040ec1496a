import Foundation
import IndicatorCore
import Reconcile
import ReconcileTesting
import Testing

/// A recorded session (`--record`, a scripted veth pair in a private network
/// namespace: up, carrier, address, default route, route removed, link down)
/// kept as a regression test: the program must still decide the same.
@Suite struct IndicatorReplayTests {
    static let session = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Transcripts/veth-session.jsonl").path

    var program: Indicator {
        var s = Settings()
        s.connectivity.backend = .kernel
        s.connectivity.include = ["veth0"]
        return Indicator(base: s, format: .json)
    }

    @Test func recordedVethSessionReplaysWithoutDivergence() throws {
        let outcome = try #require(expectReplay(program, transcript: Self.session))
        #expect(outcome.messages == 8)
        #expect(outcome.runtime.model.latest?.state.state == .off)
        #expect(outcome.runtime.model.latest?.state.interfaces.first?.addresses == ["10.0.0.1/24"])
    }

    @Test func programThatSubscribesDifferentlyDivergesAtTheStartPlan() throws {
        // A changed program: text format on a terminal wants the minute timer
        // once something is known, which the recorded json session never did.
        var changed = program
        changed.format = .text
        let outcome = try Replay.run(changed, path: Self.session)
        let d = try #require(outcome.divergence)
        #expect(d.index == 0)
        #expect(d.what == "plan (round 1)")
        #expect(d.expected == "no plan")
        #expect(d.got.contains("\"op\":\"start\"") && d.got.contains("timer:since"))
    }

    @Test func transcriptOfAnotherProgramIsRefused() throws {
        struct Other: Program {
            enum Message: Codable { case x }
            func start() -> (Int, [Never]) { (0, []) }
            func update(_ model: inout Int, _ message: Message) -> [Never] { [] }
        }
        #expect(throws: TranscriptError.programMismatch(expected: String(reflecting: Other.self), found: "IndicatorCore.Indicator")) {
            try Replay.run(Other(), path: Self.session)
        }
    }

    @Test(arguments: [
        ("\"time_us\":2549260945,", "\"time_us\":-9223372036854775807,"),   // elapsed time overflows
        ("\"activation\":1}", "\"activation\":-1}"),                        // not a generation
        ("\"changedAt\":1796061256321521", "\"changedAt\":-9223372036854775808"), // reached the renderer (issue 19)
        ("\"changedAt\":1796061256321521", "\"changedAt\":9223372036854775807"),
    ])
    func outOfRangeNumbersAreABadTranscriptNotATrap(field: String, replacement: String) throws {
        let text = try String(contentsOfFile: Self.session, encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        // The first message's line, damaged; the others as recorded.
        let damaged = lines.map { $0.contains("\"index\":0,") ? $0.replacingOccurrences(of: field, with: replacement) : $0 }
        #expect(damaged != lines)
        let transcript = try Transcript(data: Data(damaged.joined(separator: "\n").utf8))
        do {
            let outcome = try Replay.run(program, transcript)
            // A negative activation is no source the replay knows: the event
            // arrives from the host and the run diverges or matches, no trap.
            #expect(field.contains("activation"))
            _ = outcome
        } catch {
            #expect(!field.contains("activation"))
            #expect("\(error)".contains("out of range"), "\(error)")
        }
    }
}
