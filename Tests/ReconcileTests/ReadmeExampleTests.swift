import Reconcile
import ReconcileTesting
import Testing

/// The README's example program, verbatim, so the README stays true.
struct Autosave: Program {
    struct Model: Equatable { var dirty = false; var phase = Phase() }
    enum Message { case edited, quiet(Phase), reload, saved(ok: Bool) }
    enum Command { case save, readConfig }

    func start() -> (Model, [Command]) { (Model(), [.readConfig]) }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .edited:
            model.dirty = true
            model.phase.advance()                 // a new debounce timer
            return []
        case .quiet(let phase):
            guard model.phase.isCurrent(phase), model.dirty else { return [] }   // stale tick
            model.dirty = false
            return [.save]
        case .reload:
            return [.readConfig]
        case .saved(let ok):
            if !ok { model.dirty = true; model.phase.advance() }   // retry after a quiet period
            return []
        }
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            if model.dirty {
                let phase = model.phase
                Subscription.debounce("save", phase: phase, after: .seconds(2)) { _ in .quiet(phase) }
            }
            Subscription.signal(.hangup) { _ in .reload }
        }
    }
}

@Suite struct ReadmeExampleTests {
    @Test func savesOnceAfterTwoQuietSecondsAndReloadsOnHangup() throws {
        let driver = VirtualDriver()
        var commands: [Autosave.Command] = []
        let rt = Runtime(Autosave(), driver: driver) { c, _ in commands.append(c) }
        try rt.start()
        #expect(commands == [.readConfig])
        try rt.send(.edited)
        driver.advance(by: .seconds(1))
        try rt.send(.edited)
        driver.advance(by: .seconds(1))
        #expect(commands == [.readConfig])
        driver.advance(by: .seconds(1))
        #expect(commands == [.readConfig, .save])
        driver.emit(SignalSource.Event.received(.hangup, sender: 1), to: SubscriptionID(SignalSource.self, key: SignalSource.Signal.hangup))
        #expect(commands == [.readConfig, .save, .readConfig])
    }

    /// The README's interpreter: `.save` is an owned task by ID; a failed
    /// save comes back as a message and is retried after a quiet period.
    @Test func saveRunsAsAnOwnedTaskAndAFailedSaveIsRetried() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Autosave(), driver: driver) { command, rt in
            switch command {
            case .save:
                rt.tasks.run(id: "save") {
                    try await writeDocument()
                    return .saved(ok: true)
                } failure: { _ in .saved(ok: false) }
            case .readConfig:
                break
            }
        }
        try rt.start()
        try rt.send(.edited)
        driver.advance(by: .seconds(2))
        #expect(driver.tasks.log == [.run(TaskID("save"))])
        #expect(driver.complete(task: "save", with: Autosave.Message.saved(ok: false)))
        #expect(rt.model.dirty)
        driver.advance(by: .seconds(2))
        #expect(driver.tasks.log == [.run(TaskID("save")), .run(TaskID("save"))])
        #expect(driver.perform(task: "save"))
        #expect(!rt.model.dirty && rt.tasks.inFlight.isEmpty)
    }
}

/// The README's `writeDocument()`.
@Sendable func writeDocument() async throws {}
