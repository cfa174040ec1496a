import Reconcile
import TestSupport

// MARK: The seed search program, ported

enum LookupFailure: Error, Equatable { case offline }

struct Search: Program {
    struct Model: Equatable {
        var query = ""
        var results: [String] = []
        var requestID: Int?
        var nextID = 0
        var message: String?
    }
    enum Message {
        case queryChanged(String)
        case submitted
        case response(Int, Result<[String], LookupFailure>)
    }
    enum Command: Equatable {
        case search(id: Int, query: String)
        case cancel(id: Int)
    }

    func start() -> (Model, [Command]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        var commands: [Command] = []
        switch message {
        case .queryChanged(let query):
            if let id = model.requestID { commands.append(.cancel(id: id)) }
            model.query = query
            model.requestID = nil
            model.results = []
            model.message = nil
        case .submitted:
            guard !model.query.isEmpty else { return [] }
            if let id = model.requestID { commands.append(.cancel(id: id)) }
            model.nextID += 1
            model.requestID = model.nextID
            model.message = nil
            commands.append(.search(id: model.nextID, query: model.query))
        case .response(let id, let result):
            guard model.requestID == id else { return [] }
            model.requestID = nil
            switch result {
            case .success(let values): model.results = values; model.message = nil
            case .failure: model.message = "Search is unavailable."
            }
        }
        return commands
    }
}

// MARK: The seed counters

/// The first seed's counter: the model is an Int, the view a String.
struct Counter: Program {
    enum Message { case userDidTapIncrementButton, userDidTapDecrementButton }
    func start() -> (Int, [Never]) { (0, []) }
    func update(_ model: inout Int, _ message: Message) -> [Never] {
        switch message {
        case .userDidTapIncrementButton: model += 1
        case .userDidTapDecrementButton: model -= 1
        }
        return []
    }
    func view(_ model: Int) -> String { String(model) }
}

/// The second seed's counter: a struct model and a view with buttons that carry
/// their messages.
struct ButtonCounter: Program {
    enum Message: Equatable { case userDidTapIncrementButton, userDidTapDecrementButton }
    struct Model: Equatable { var count = 0 }
    struct View: Equatable {
        struct Button: Equatable { let title: String; let callback: Message }
        let title = "Counter"
        let count: String
        let incrementButton = Button(title: "Increment", callback: .userDidTapIncrementButton)
        let decrementButton = Button(title: "Decrement", callback: .userDidTapDecrementButton)
    }
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .userDidTapIncrementButton: model.count += 1
        case .userDidTapDecrementButton: model.count -= 1
        }
        return []
    }
    func view(_ model: Model) -> View { View(count: String(model.count)) }
}

// MARK: The seed debounce exercise

/// Typing restarts a one-shot timer keyed by the phase; only a quiet period
/// after the last edit issues a search.
struct Debounce: Program {
    struct Model: Equatable {
        var query = ""
        var phase = Phase()
        var waiting = false
    }
    enum Message { case typed(String), quiet(Phase) }
    enum Command: Equatable { case search(String) }

    static let delay: Duration = .milliseconds(300)

    func start() -> (Model, [Command]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .typed(let q):
            model.query = q
            model.phase.advance()
            model.waiting = !q.isEmpty
            return []
        case .quiet(let token):
            guard model.phase.isCurrent(token), model.waiting else { return [] }
            model.waiting = false
            return [.search(model.query)]
        }
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            if model.waiting {
                let phase = model.phase
                Subscription.debounce("query", phase: phase, after: Self.delay) { _ in .quiet(phase) }
            }
        }
    }
}

// MARK: A user-defined source kind

/// A source with no in-place change: any configuration change restarts it.
enum Feed: Source {
    static let name = "feed"
    typealias Configuration = String
    enum Event: Equatable, Sendable { case item(Int), failed(SourceFailure) }
    static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

extension Subscription {
    static func feed(_ key: String, topic: String, _ tag: @escaping (Feed.Event) -> Message) -> Subscription {
        Subscription(Feed.self, key: key, configuration: topic, tag: tag)
    }
}

// MARK: Deterministic randomness

