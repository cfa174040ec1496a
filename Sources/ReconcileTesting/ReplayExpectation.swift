import Reconcile
import Testing

/// Replays the transcript at `path` into `program` and records an issue
/// with the first divergence, or the reason the file cannot be replayed.
/// Returns the outcome (nil on error) for further checks on the model.
@discardableResult
public func expectReplay<P: Program>(
    _ program: P, transcript path: String, programName: String? = nil,
    sourceLocation: SourceLocation = #_sourceLocation
) -> ReplayOutcome<P>? where P.Message: Decodable {
    do {
        let outcome = try Replay.run(program, path: path, programName: programName)
        if let d = outcome.divergence { Issue.record("\(d)", sourceLocation: sourceLocation) }
        return outcome
    } catch {
        Issue.record("\(error)", sourceLocation: sourceLocation)
        return nil
    }
}
