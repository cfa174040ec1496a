/// Where a message that entered `update` came from.
public enum MessageOrigin: Hashable {
    /// `Runtime.send` on the loop thread: the host or a command interpreter.
    case host
    /// A `Sender` (another thread).
    case sender
    /// A running source: the subscription's identity and its activation.
    case source(SubscriptionID, Activation)
    /// A task the host ran for a command, by its ID (recorded by description).
    case task(AnyHashable)
}

/// One thing a runtime did, handed to `Runtime.transcript` as it happens.
///
/// Times are the driver's `loopTime` (monotonic) at the moment of recording.
/// `round` numbers the runtime's reconcile passes: the messages of round `r`
/// are processed together, then reconcile pass `r` runs (skipped or not). A
/// replay that groups messages by round reproduces the batches.
public enum TranscriptRecord<Message, Command> {
    /// `Runtime.start()`: the start commands, before they are performed.
    case start(time: Duration, commands: [Command])
    /// A message that entered `update`, and the commands it returned.
    case message(TranscriptMessage<Message, Command>)
    /// A reconcile whose plan was not empty or saw duplicates.
    case plan(Plan, time: Duration, round: Int)
    /// A diagnostic the runtime raised.
    case diagnostic(Diagnostic, time: Duration)
}

/// A message that entered `update`: its place, origin and time, and the
/// commands it returned.
public struct TranscriptMessage<Message, Command> {
    /// The message's number in the run (0 first), as `RuntimeStats.messages` counts.
    public var index: Int
    /// The message as `update` received it.
    public var message: Message
    /// Where it came from (see `MessageOrigin`).
    public var origin: MessageOrigin
    /// The loop's time when it was processed.
    public var time: Duration
    /// The reconcile pass it preceded (see `TranscriptRecord`).
    public var round: Int
    /// The commands `update` returned for it.
    public var commands: [Command]

    /// A record with every field given.
    public init(index: Int, message: Message, origin: MessageOrigin, time: Duration, round: Int, commands: [Command]) {
        self.index = index
        self.message = message
        self.origin = origin
        self.time = time
        self.round = round
        self.commands = commands
    }
}

extension Runtime {
    /// Processes recorded messages as one batch (each through `update`, in
    /// order, then one reconcile), the way a recorded run processed one
    /// round. A message from a source is delivered as that source's when the
    /// same activation is running. `failed` marks running sources as failed
    /// first (a recorded `sourceFailed`), so a later change restarts them as
    /// it did in the recorded run. Loop thread; for replay in tests.
    public func replay(_ batch: [(message: P.Message, origin: MessageOrigin)], failed: [SubscriptionID] = []) {
        guard state == .running, !draining else { return }
        for id in failed { if let ticket = reconciler.active(id) { ticket.hasFailed = true } }
        for item in batch {
            var source: ActiveSource?
            if case .source(let id, let activation) = item.origin,
               let ticket = reconciler.active(id), ticket.activation == activation {
                source = ticket
            }
            mailbox.append(Envelope(message: item.message, source: source, origin: item.origin))
        }
        pumpInbox()
    }
}
