import Reconcile

// The desired sets every implementation reconciles. They are built before any
// timing starts: building `Subscriptions` is the program's cost, and every
// implementation gets the very same values.

/// A user-defined source kind (a peer connection a daemon keeps open): a
/// struct key and a configuration whose timeout can be retuned in place.
enum PeerSource: Source {
    static let name = "peer"

    struct Key: Hashable, Sendable {
        var name: String
        var port: UInt16
    }

    struct Configuration: Hashable, Sendable {
        var address: String
        var timeout: Duration
        var retries: Int
    }

    enum Event {
        case up, down
        case failed(SourceFailure)
    }

    static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }

    static func canRetune(from old: Configuration, to new: Configuration) -> Bool {
        old.address == new.address
    }
}

/// Messages are plain integers: a selection for the benchmark programs, or
/// the index of the subscription an event came from.
typealias BenchMessage = Int

/// The kinds in a desired set, in equal parts: timers keyed by an integer,
/// file watches keyed by their path, signals keyed by an integer, peers keyed
/// by a struct.
enum Kind: Int, CaseIterable {
    case timer, file, signal, peer
}

/// Builds subscription `identity` in one of two parameter variants.
///
/// A replaced identity is `identity + replacementOffset`, which keeps its kind.
/// Variant 1 changes the parameters under the same identity: a timer's
/// interval and a peer's timeout (retuned in place), a watch's symlink policy
/// and a signal's number (restarted).
func makeSubscription(_ identity: Int, variant: Int) -> Subscription<BenchMessage> {
    let tag = identity
    switch Kind(rawValue: identity % 4)! {
    case .timer:
        return .every(.seconds(1 + identity % 60 + variant), key: identity) { _ in tag }
    case .file:
        return .watch("/srv/reconcile/conf.d/unit-\(identity).conf", symlinks: variant == 0 ? .follow : .noFollow) { _ in tag }
    case .signal:
        let all = SignalSource.Signal.allCases
        return Subscription(SignalSource.self, key: identity, configuration: all[(identity + variant) % all.count]) { _ in tag }
    case .peer:
        return Subscription(PeerSource.self, key: PeerSource.Key(name: "peer-\(identity)", port: 443),
                            configuration: .init(address: "10.\(identity >> 16 & 255).\(identity >> 8 & 255).\(identity & 255):443",
                                                 timeout: .seconds(5 + variant), retries: 3)) { _ in tag }
    }
}

let replacementOffset = 1 << 24

/// Whether position `i` is among the `churn` percent changed: one position in
/// every block of `100 / churn`, rotating through the block so every kind is
/// hit.
func isChanged(_ i: Int, churn: Int) -> Bool {
    guard churn > 0 else { return false }
    let stride = 100 / churn
    return i % stride == (i / stride) % 4 % stride
}

/// What one desired set is, for the harness: the subscriptions, and for the
/// baselines one driver ticket per subscription (in the same order).
final class DesiredSet {
    let name: String
    let subscriptions: Subscriptions<BenchMessage>
    /// The position of this set in its `SetTable` (the runtime's model).
    let index: Int
    private var minted: [SourceTicket]?

    /// Each subscription's configuration, type-erased once here (outside the
    /// timing), for the baselines that key or hash by it: they pay for the
    /// comparison, not for erasing the value again on every reconcile.
    let configurations: [AnyHashable]

    init(name: String, subscriptions: Subscriptions<BenchMessage>, index: Int) {
        self.name = name
        self.subscriptions = subscriptions
        self.index = index
        self.configurations = subscriptions.items.map(\.configuration)
    }

    var count: Int { subscriptions.items.count }

    /// One ticket per subscription, minted once by a runtime (tickets can only
    /// be made by a runtime). Baselines reuse them: they never pay for a
    /// ticket, where our runtime allocates one per start.
    var tickets: [SourceTicket] {
        if let minted { return minted }
        let t = mintTickets(subscriptions)
        minted = t
        return t
    }
}

/// Prebuilt desired sets by position: what the benchmark programs' models
/// select.
final class SetList {
    private(set) var sets: [Subscriptions<BenchMessage>] = []

    init(_ sets: [Subscriptions<BenchMessage>] = []) { self.sets = sets }

    /// Appends `set`; returns its position.
    func append(_ set: Subscriptions<BenchMessage>) -> Int {
        sets.append(set)
        return sets.count - 1
    }

    subscript(index: Int) -> Subscriptions<BenchMessage> { sets[index] }
}

/// The sets of one size: the base set `A`, a separately built copy `A'`
/// (equal content, so "no change" is not helped by shared storage), and per
/// churn level the set with that share of identities replaced or of
/// parameters changed.
final class SetTable {
    let size: Int
    let list = SetList()
    private var byName: [String: DesiredSet] = [:]

    init(size: Int) { self.size = size }

    private func add(_ name: String, _ build: () -> [Subscription<BenchMessage>]) -> DesiredSet {
        if let s = byName[name] { return s }
        let subscriptions = Subscriptions(build())
        let s = DesiredSet(name: name, subscriptions: subscriptions, index: list.append(subscriptions))
        byName[name] = s
        return s
    }

    /// The base set.
    var base: DesiredSet { add("A") { (0..<size).map { makeSubscription($0, variant: 0) } } }

    /// The base set's content, built again.
    var baseCopy: DesiredSet { add("A'") { (0..<size).map { makeSubscription($0, variant: 0) } } }

    /// The base set's content, built a third time.
    var baseCopy2: DesiredSet { add("A''") { (0..<size).map { makeSubscription($0, variant: 0) } } }

    /// `churn` percent of identities replaced by new ones.
    func replaced(_ churn: Int) -> DesiredSet {
        if churn == 0 { return baseCopy }
        return add("replace \(churn)%") {
            (0..<size).map { makeSubscription(isChanged($0, churn: churn) ? $0 + replacementOffset : $0, variant: 0) }
        }
    }

    /// `churn` percent of subscriptions with changed parameters, same identities.
    func retuned(_ churn: Int) -> DesiredSet {
        add("retune \(churn)%") {
            (0..<size).map { makeSubscription($0, variant: isChanged($0, churn: churn) ? 1 : 0) }
        }
    }
}

// MARK: Drivers that do nothing

/// A driver that does nothing: for measuring an implementation's own memory
/// and time without a driver's.
final class NullDriver: Driver {
    func attach(_ host: any DriverHost) throws -> Waker { Waker {} }
    func start(_ ticket: SourceTicket) {}
    func retune(_ ticket: SourceTicket, from old: AnyHashable) {}
    func stop(_ ticket: SourceTicket) {}
    func detach() {}
}

/// A driver that keeps every ticket it is asked to start, in order.
final class MintDriver: Driver {
    var tickets: [SourceTicket] = []
    func attach(_ host: any DriverHost) throws -> Waker { Waker {} }
    func start(_ ticket: SourceTicket) { tickets.append(ticket) }
    func retune(_ ticket: SourceTicket, from old: AnyHashable) {}
    func stop(_ ticket: SourceTicket) {}
    func detach() {}
}

/// A program whose model selects one prebuilt set of a table. Its model is
/// not `Equatable`, so every message is followed by a full reconcile.
struct SelectProgram: Program {
    struct Model { var index: Int }
    let sets: SetList
    let initial: Int

    func start() -> (Model, [Never]) { (Model(index: initial), []) }
    func update(_ model: inout Model, _ message: BenchMessage) -> [Never] {
        if message >= 0 { model.index = message }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<BenchMessage> { sets[model.index] }
}

/// A program that wants one fixed set (for minting tickets).
struct FixedProgram: Program {
    let set: Subscriptions<BenchMessage>
    func start() -> (Int, [Never]) { (0, []) }
    func update(_ model: inout Int, _ message: BenchMessage) -> [Never] { [] }
    func subscriptions(_ model: Int) -> Subscriptions<BenchMessage> { set }
}

/// One started ticket per subscription of `set`, in the set's order.
func mintTickets(_ set: Subscriptions<BenchMessage>) -> [SourceTicket] {
    let mint = MintDriver()
    let runtime = Runtime(FixedProgram(set: set), driver: mint)
    try! runtime.start()
    precondition(mint.tickets.count == set.items.count, "the mint started \(mint.tickets.count) of \(set.items.count)")
    return mint.tickets
}
