import CSystemd
import Reconcile

/// A source kind the sd-event driver can run. The built-in kinds conform;
/// a user's own kind (a D-Bus signal, a socket) conforms to run on the loop.
public protocol SystemdSource: Source {
    /// Starts a source for `ticket` on `context.loop`. Events go to
    /// `ticket.emit`, failures to `ticket.fail` (loop thread), or through
    /// `ticket.poster()` from other threads.
    /// - Throws: the error is delivered to the program as a failure event.
    static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource
}

/// A source running on the loop.
public protocol RunningSource: AnyObject {
    /// Applies `configuration` in place (only called when `canRetune` said so).
    /// - Throws: the error is delivered to the program as a failure event.
    func retune(to configuration: AnyHashable) throws
    /// Stops the source: after this returns it emits nothing.
    func stop()
}

/// What a starting source may use.
public struct SourceContext {
    /// The loop to attach to.
    public let loop: EventLoop
    /// The driver's logger.
    public let logger: DaemonLogger
    unowned let driver: SystemdDriver
}

extension SystemdSource {
    static func _start(_ ticket: SourceTicket, context: SourceContext) throws -> any RunningSource {
        guard let config = ticket.configuration(as: Self.self) else { throw wrongConfiguration(ticket) }
        return try start(ticket, config, context: context)
    }

    /// The failure of a start whose ticket carries another kind's configuration.
    static func wrongConfiguration(_ ticket: SourceTicket) -> SourceFailure {
        SourceFailure(operation: "start \(ticket.id)", reason: "configuration is not \(Configuration.self)")
    }
}
