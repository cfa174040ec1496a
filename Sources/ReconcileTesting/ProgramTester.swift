import Reconcile
import Testing

/// Drives a program's pure functions and asserts model, commands and desired
/// subscriptions together (no driver, no runtime).
///
/// It also keeps a reconciler over the desired sets, so a test can assert how
/// the last message changed the running sources (`lastPlan`: start, keep,
/// retune, restart, stop) exactly as the runtime would.
///
/// Given a command interpreter (`perform:`), it interprets every command as
/// the runtime does, with a real `TaskRegistry` (`effects.tasks`) whose tasks
/// are recorded by identity and run only when the test says so:
/// `complete(task:with:)`, `perform(task:)`, `runUntilIdle()`,
/// `advance(by:)` (ProgramTesterTasks.swift).
public struct ProgramTester<P: Program> {
    /// The program under test.
    public let program: P
    /// The current model.
    public private(set) var model: P.Model
    /// The commands the last step requested (the start commands at first).
    public private(set) var commands: [P.Command]
    /// Every command requested since the tester was created, in order.
    public private(set) var allCommands: [P.Command]
    /// How the last step changed the desired subscriptions: the plan of its
    /// reconcile, empty when nothing changed. The same value `Runtime.lastPlan`
    /// holds after that message (the runtime reconciles once per drained
    /// batch; a tester step is a batch of one).
    public private(set) var lastPlan: Plan
    private let reconciler = Reconciler<P.Message>()
    /// What the interpreter is handed: the task registry and the virtual
    /// clock. A reference: copies of a tester share their tasks.
    public let effects = TesterEffects<P.Message>()
    let interpreter: ((P.Command, TesterEffects<P.Message>) -> Void)?

    /// A tester starting from `program.start()`.
    public init(_ program: P) {
        self.init(program, interpreter: nil)
    }

    /// A tester starting from `program.start()` that interprets every
    /// command with `perform` (the start commands first), as the runtime
    /// does: tasks it starts through `effects.tasks` are recorded, not run.
    /// - Parameters:
    ///   - program: The program under test.
    ///   - perform: The command interpreter, e.g. one written against
    ///     `CommandContext` and also passed to `Daemon` or `Runtime`.
    public init(_ program: P, perform: @escaping (P.Command, TesterEffects<P.Message>) -> Void) {
        self.init(program, interpreter: perform)
    }

    private init(_ program: P, interpreter: ((P.Command, TesterEffects<P.Message>) -> Void)?) {
        self.program = program
        self.interpreter = interpreter
        (model, commands) = program.start()
        allCommands = commands
        // As the runtime: the start commands are performed, then the first reconcile.
        for c in commands { interpreter?(c, effects) }
        let first = model
        lastPlan = reconciler.reconcile(building: { program.subscriptions(first) })
    }

    /// A tester starting from `model` (no start commands).
    public init(_ program: P, model: P.Model) {
        self.init(program, model: model, interpreter: nil)
    }

    /// A tester starting from `model` (no start commands) that interprets
    /// every command with `perform`.
    /// - Parameters:
    ///   - program: The program under test.
    ///   - model: The model to start from.
    ///   - perform: The command interpreter.
    public init(_ program: P, model: P.Model, perform: @escaping (P.Command, TesterEffects<P.Message>) -> Void) {
        self.init(program, model: model, interpreter: perform)
    }

    private init(_ program: P, model: P.Model, interpreter: ((P.Command, TesterEffects<P.Message>) -> Void)?) {
        self.program = program
        self.model = model
        self.interpreter = interpreter
        commands = []
        allCommands = []
        lastPlan = reconciler.reconcile(building: { program.subscriptions(model) })
    }

    /// The subscriptions the current model wants.
    public var subscriptions: Subscriptions<P.Message> { program.subscriptions(model) }

    /// The identities the current model wants.
    public var subscriptionIDs: Set<SubscriptionID> { Set(subscriptions.ids) }

    /// The view of the current model.
    public var view: P.View { program.view(model) }

    /// Applies `message`; returns the commands it requested.
    @discardableResult
    public mutating func send(_ message: P.Message) -> [P.Command] {
        let before = model
        commands = program.update(&model, message)
        allCommands += commands
        // As the runtime: each command is performed right after its update.
        if let interpreter { for c in commands { interpreter(c, effects) } }
        // As `Runtime.lastPlan`: an unchanged `Equatable` model is not reconciled.
        lastPlan = program.isUnchanged(before, model) ? Plan() : reconciler.reconcile(building: { program.subscriptions(model) })
        return commands
    }

    /// The message the current subscription `id` makes of `event`, or nil when
    /// the model does not want `id` or the event has the wrong type.
    public func message(for event: Any, from id: SubscriptionID) -> P.Message? {
        subscriptions[id]?.message(for: event)
    }

    /// Sends what the subscription `id` makes of `event`; records an issue and
    /// returns nil when the model does not want `id`.
    @discardableResult
    public mutating func event(_ event: Any, from id: SubscriptionID, sourceLocation: SourceLocation = #_sourceLocation) -> [P.Command]? {
        guard let message = message(for: event, from: id) else {
            Issue.record("no subscription \(id) takes \(type(of: event)); wanted: \(subscriptions.ids)", sourceLocation: sourceLocation)
            return nil
        }
        return send(message)
    }
}

extension ProgramTester where P.Model: Equatable, P.Command: Equatable {
    /// Sends `message` and checks, together, the next model, the commands
    /// requested and (when given) the desired subscription identities.
    /// - Parameters:
    ///   - message: The message to send.
    ///   - model: The expected model.
    ///   - commands: The expected commands.
    ///   - subscriptions: The expected desired identities, or nil to not check them.
    ///   - ignoring: Phases of the model not compared (taken from the model the
    ///     step produced): a test that cannot know a phase's number says so
    ///     with `ignoring: [\.phase]`.
    ///   - sourceLocation: Where a failed expectation is reported (the caller's).
    public mutating func send(
        _ message: P.Message, expect model: P.Model, commands: [P.Command],
        subscriptions: Set<SubscriptionID>? = nil, ignoring: [WritableKeyPath<P.Model, Phase>] = [],
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let got = send(message)
        var expected = model
        for path in ignoring { expected[keyPath: path] = self.model[keyPath: path] }
        check(expected, got, commands, subscriptions, sourceLocation)
    }

    /// Sends `message` and checks, together, that the model changed exactly
    /// as `change` describes (applied to a copy of the model before the step,
    /// as TCA's `TestStore.send` does), the commands requested and (when
    /// given) the desired subscription identities. A phase is expected by
    /// advancing it: `t.send(.edited, commands: []) { $0.dirty = true; $0.phase.advance() }`.
    /// - Parameters:
    ///   - message: The message to send.
    ///   - commands: The expected commands.
    ///   - subscriptions: The expected desired identities, or nil to not check them.
    ///   - change: Turns the model before the step into the expected one.
    ///   - sourceLocation: Where a failed expectation is reported (the caller's).
    public mutating func send(
        _ message: P.Message, commands: [P.Command], subscriptions: Set<SubscriptionID>? = nil,
        sourceLocation: SourceLocation = #_sourceLocation, _ change: (inout P.Model) -> Void
    ) {
        var expected = model
        change(&expected)
        let got = send(message)
        check(expected, got, commands, subscriptions, sourceLocation)
    }

    private func check(_ expected: P.Model, _ got: [P.Command], _ commands: [P.Command],
                       _ subscriptions: Set<SubscriptionID>?, _ sourceLocation: SourceLocation) {
        #expect(self.model == expected, "model", sourceLocation: sourceLocation)
        #expect(got == commands, "commands", sourceLocation: sourceLocation)
        if let subscriptions {
            #expect(subscriptionIDs == subscriptions, "subscriptions", sourceLocation: sourceLocation)
        }
    }
}
