/// A daemon's logic in The Elm Architecture: pure functions over a model.
///
/// A program is a value and may carry configuration. None of its functions
/// performs I/O, reads a clock or makes random identifiers: effects are
/// `Command` values the host interprets, and ongoing sources are
/// `subscriptions(_:)`, which the runtime reconciles after each batch of
/// messages.
public protocol Program {
    /// Everything the program knows.
    associatedtype Model
    /// Inputs: user intents, command outcomes, source events.
    associatedtype Message
    /// Descriptions of one-off work for the host to perform.
    associatedtype Command = Never
    /// A projection of the model for presentation.
    associatedtype View = Void

    /// The initial model and the commands to perform at start.
    func start() -> (Model, [Command])

    /// Applies `message` to `model` and returns the commands to perform.
    func update(_ model: inout Model, _ message: Message) -> [Command]

    /// The sources `model` needs now. Called after the mailbox drains, never
    /// for intermediate models, and not at all when an `Equatable` model is
    /// unchanged.
    func subscriptions(_ model: Model) -> Subscriptions<Message>

    /// The presentation of `model`.
    func view(_ model: Model) -> View

    /// A one-line status for a service manager (`STATUS=`), or `nil`.
    func status(_ model: Model) -> String?

    /// Whether `new` needs no reconcile after `old`. `Equatable` models get
    /// `old == new`; other models are always reconciled.
    func isUnchanged(_ old: Model, _ new: Model) -> Bool
}

extension Program {
    /// No subscriptions (the default).
    public func subscriptions(_ model: Model) -> Subscriptions<Message> { .none }
    /// No status line (the default).
    public func status(_ model: Model) -> String? { nil }
    /// Always `false` for a model that is not `Equatable`: every batch is reconciled.
    public func isUnchanged(_ old: Model, _ new: Model) -> Bool { false }
}

extension Program where View == Void {
    /// No view (the default when `View` is `Void`).
    public func view(_ model: Model) {}
}

extension Program where Model: Equatable {
    /// `old == new`: an unchanged `Equatable` model skips the reconcile.
    public func isUnchanged(_ old: Model, _ new: Model) -> Bool { old == new }
}
