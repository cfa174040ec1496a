import Reconcile
import Testing

// Lines, end of input, connections and child exits injected as the
// descriptor, listener and process sources would deliver them.

extension Connection {
    /// A connection for tests: descriptor -1 (nothing real behind it),
    /// accepted by `listener`, from a unix peer with `credentials` if given.
    ///
    /// - Parameters:
    ///   - id: the connection's id (what `Subscription.connection` keys by).
    ///   - listener: the listener's name.
    ///   - credentials: the peer's `SO_PEERCRED`, or nil (an inet peer).
    /// - Returns: the connection.
    public static func testing(id: UInt64, listener: String = "test", credentials: PeerCredentials? = nil) -> Connection {
        Connection(id: id, fd: -1, listener: listener,
                   peer: PeerAddress(bytes: [], description: credentials == nil ? "192.0.2.1:40000" : "unix"),
                   credentials: credentials)
    }
}

extension VirtualDriver {
    /// Delivers each of `lines`, then `.endOfFile` when `endOfFile`, from
    /// the running descriptor source `id`; false (with a recorded issue)
    /// when it is not running.
    ///
    /// - Parameters:
    ///   - lines: the lines, without their newlines.
    ///   - batched: as one `.lines` event (a `lines(fd, batched: true)`
    ///     subscription's dispatch) instead of one `.line` each.
    ///   - endOfFile: whether the input then ends.
    ///   - id: the descriptor or connection subscription.
    ///   - sourceLocation: where a missing subscription is reported (the caller's).
    /// - Returns: whether every event was delivered.
    @discardableResult
    public func lines(_ lines: [String], batched: Bool = false, endOfFile: Bool = false, to id: TypedSubscriptionID<DescriptorSource>,
                      sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        var events = batched ? (lines.isEmpty ? [] : [DescriptorSource.Event.lines(LineBatch(lines))]) : lines.map { DescriptorSource.Event.line($0) }
        if endOfFile { events.append(.endOfFile) }
        return events.allSatisfy { emit($0, to: id, sourceLocation: sourceLocation) }
    }

    /// Delivers `.accepted(connection)` from the running listener `id`.
    ///
    /// - Parameters:
    ///   - connection: the accepted connection (`Connection.testing`).
    ///   - id: the listener subscription.
    ///   - sourceLocation: where a missing subscription is reported (the caller's).
    /// - Returns: whether it was delivered.
    @discardableResult
    public func accept(_ connection: Connection, on id: TypedSubscriptionID<ListenerSource>,
                       sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        emit(.accepted(connection), to: id, sourceLocation: sourceLocation)
    }

    /// Delivers a child's life from the running process source `id`:
    /// `.started(pid)`, each stdout line, then `.exited(status)`.
    ///
    /// - Parameters:
    ///   - status: the exit status.
    ///   - pid: the process id reported as started; nil: no `.started`.
    ///   - output: the stdout lines, in order.
    ///   - id: the process subscription.
    ///   - sourceLocation: where a missing subscription is reported (the caller's).
    /// - Returns: whether every event was delivered.
    @discardableResult
    public func exit(_ status: Int32, pid: Int32? = 1000, output: [String] = [], from id: TypedSubscriptionID<ProcessSource>,
                     sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        var events: [ProcessSource.Event] = pid.map { [.started(pid: $0)] } ?? []
        events += output.map { .output(.stdout, $0) }
        events.append(.exited(status: status))
        return events.allSatisfy { emit($0, to: id, sourceLocation: sourceLocation) }
    }
}

extension ProgramTester {
    /// Sends what the desired descriptor subscription `id` makes of each of
    /// `lines` (then of `.endOfFile` when `endOfFile`); returns every
    /// command, or nil (with a recorded issue) when the model does not want `id`.
    ///
    /// - Parameters:
    ///   - lines: the lines, without their newlines.
    ///   - batched: as one `.lines` event (a `lines(fd, batched: true)`
    ///     subscription's dispatch) instead of one `.line` each.
    ///   - endOfFile: whether the input then ends.
    ///   - id: the descriptor or connection subscription.
    ///   - sourceLocation: where a missing subscription is reported (the caller's).
    /// - Returns: the commands `update` returned, in order.
    @discardableResult
    public mutating func lines(_ lines: [String], batched: Bool = false, endOfFile: Bool = false, from id: TypedSubscriptionID<DescriptorSource>,
                               sourceLocation: SourceLocation = #_sourceLocation) -> [P.Command]? {
        var events = batched ? (lines.isEmpty ? [] : [DescriptorSource.Event.lines(LineBatch(lines))]) : lines.map { DescriptorSource.Event.line($0) }
        if endOfFile { events.append(.endOfFile) }
        var commands: [P.Command] = []
        for e in events {
            guard let c = event(e, from: id, sourceLocation: sourceLocation) else { return nil }
            commands += c
        }
        return commands
    }

    /// Sends `.accepted(connection)` from the desired listener `id`.
    ///
    /// - Parameters:
    ///   - connection: the accepted connection (`Connection.testing`).
    ///   - id: the listener subscription.
    ///   - sourceLocation: where a missing subscription is reported (the caller's).
    /// - Returns: the commands, or nil when the model does not want `id`.
    @discardableResult
    public mutating func accept(_ connection: Connection, on id: TypedSubscriptionID<ListenerSource>,
                                sourceLocation: SourceLocation = #_sourceLocation) -> [P.Command]? {
        event(.accepted(connection), from: id, sourceLocation: sourceLocation)
    }

    /// Sends a child's life from the desired process subscription `id`:
    /// `.started(pid)`, each stdout line, then `.exited(status)`.
    ///
    /// - Parameters:
    ///   - status: the exit status.
    ///   - pid: the process id reported as started; nil: no `.started`.
    ///   - output: the stdout lines, in order.
    ///   - id: the process subscription.
    ///   - sourceLocation: where a missing subscription is reported (the caller's).
    /// - Returns: the commands, or nil when the model does not want `id`.
    @discardableResult
    public mutating func exit(_ status: Int32, pid: Int32? = 1000, output: [String] = [], from id: TypedSubscriptionID<ProcessSource>,
                              sourceLocation: SourceLocation = #_sourceLocation) -> [P.Command]? {
        var events: [ProcessSource.Event] = pid.map { [.started(pid: $0)] } ?? []
        events += output.map { .output(.stdout, $0) }
        events.append(.exited(status: status))
        var commands: [P.Command] = []
        for e in events {
            guard let c = event(e, from: id, sourceLocation: sourceLocation) else { return nil }
            commands += c
        }
        return commands
    }
}
