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
}
