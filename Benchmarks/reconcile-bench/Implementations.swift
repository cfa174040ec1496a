@_spi(Benchmarks) import Reconcile

/// One way to keep running sources in line with a desired set.
///
/// Every implementation calls the same driver (`VirtualDriver` in the timed
/// runs), so each one's driver work shows in the figures. Desired sets are
/// prebuilt; baselines get one prebuilt ticket per subscription.
protocol Reconciling: AnyObject {
    /// Brings the running sources in line with `set`.
    func reconcile(to set: DesiredSet)
}

/// The implementations, as named on the command line.
enum Implementation: String, CaseIterable {
    /// `Runtime` over the driver: update, `subscriptions`, `Reconciler`, driver calls.
    case ours
    /// `Reconciler.reconcile(_:)` alone: the plan, no driver.
    case plan
    /// Stop everything, start everything.
    case restartAll = "restart-all"
    /// Build the set of keys, diff the key sets (Elmish v4 `Sub.Internal.diff`).
    case elmish
    /// Hash every subscription to 64 bits, keep the live ones (iced's tracker).
    case iced
    /// One dictionary lookup per subscription and nothing else (not a
    /// reconciler: it never starts or stops anything).
    case bare
    /// The keep path's own comparisons in position and nothing else
    /// (`KeepPathFloor`): the floor of a no-op reconcile.
    case floor
    /// iced's `Tracker::update` bookkeeping in Rust (Benchmarks/iced-tracker),
    /// run as a child process on the same inputs right after the others.
    case icedRust = "iced-rust"

    var label: String {
        switch self {
        case .ours: "ours (Runtime)"
        case .plan: "ours (plan only, no driver)"
        case .restartAll: "restart-all"
        case .elmish: "Elmish-style"
        case .iced: "iced-style"
        case .bare: "bare lookup"
        case .floor: "the keep path's comparisons"
        case .icedRust: "iced's tracker (Rust)"
        }
    }

    /// Whether the implementation uses prebuilt tickets.
    var usesTickets: Bool {
        switch self {
        case .ours, .plan, .floor, .icedRust: false
        case .restartAll, .elmish, .iced, .bare: true
        }
    }

    /// Whether it calls the driver.
    var callsDriver: Bool { self != .plan && self != .bare && self != .floor && self != .icedRust }

    /// Whether it runs only for a no-op (churn 0 of `reconcile`).
    var noopOnly: Bool { self == .bare || self == .floor }

    /// An instance already running `initial` on `driver`.
    func make(_ sets: SetList, initial: DesiredSet, driver: any Driver) -> any Reconciling {
        switch self {
        case .ours: return Ours(sets, initial: initial, driver: driver)
        case .plan: return PlanOnly(initial: initial)
        case .restartAll: return RestartAll(initial: initial, driver: driver)
        case .elmish: return ElmishStyle(initial: initial, driver: driver)
        case .iced: return IcedStyle(initial: initial, driver: driver)
        case .bare: return BareLookup(initial: initial)
        case .floor: return Floor(initial: initial)
        case .icedRust: fatalError("iced-rust runs as a child process (see runIcedRust)")
        }
    }
}

// MARK: Ours

/// Our runtime: a message selects the desired set, the runtime calls
/// `subscriptions` (which returns the prebuilt set), reconciles and calls the
/// driver.
final class Ours: Reconciling {
    let runtime: Runtime<SelectProgram>

    init(_ sets: SetList, initial: DesiredSet, driver: any Driver) {
        runtime = Runtime(SelectProgram(sets: sets, initial: initial.index), driver: driver)
        try! runtime.start()
    }

    func reconcile(to set: DesiredSet) { try! runtime.send(set.index) }
}

/// Our pure reconciler with nothing around it: the plan only.
final class PlanOnly: Reconciling {
    let reconciler = Reconciler<BenchMessage>()
    private(set) var steps = 0

    init(initial: DesiredSet) { reconciler.reconcile(initial.subscriptions) }

    func reconcile(to set: DesiredSet) {
        // The plan's public steps are built when read; reading them is not
        // planning, so only cheap fields are touched.
        let plan = reconciler.reconcile(set.subscriptions)
        steps &+= plan.kept &+ plan.duplicates.count &+ (plan.isEmpty ? 0 : 1)
    }
}

// MARK: Baselines

/// Stops every running source, then starts every desired one. Needs no
/// identity, no hashing and no comparison.
final class RestartAll: Reconciling {
    let driver: any Driver
    private var running: [SourceTicket] = []

    init(initial: DesiredSet, driver: any Driver) {
        self.driver = driver
        reconcile(to: initial)
    }

    func reconcile(to set: DesiredSet) {
        for ticket in running { driver.stop(ticket) }
        running.removeAll(keepingCapacity: true)
        for ticket in set.tickets {
            driver.start(ticket)
            running.append(ticket)
        }
    }
}

/// An Elmish subscription key: the identity plus the parameters. Elmish
/// compares identities only (`SubId`), so a parameter change is seen only
/// when it is part of the id; users put it there, and so do we.
struct ElmishKey: Hashable {
    let id: SubscriptionID
    let configuration: AnyHashable
}

/// Elmish v4's diff: build the set of desired keys; if it equals the active
/// keys, nothing to do; else stop the active ones not desired and start the
/// desired ones not active. Buffers are reused between reconciles.
final class ElmishStyle: Reconciling {
    let driver: any Driver
    private var active: [ElmishKey: SourceTicket] = [:]
    private var desiredKeys: Set<ElmishKey> = []
    private var gone: [ElmishKey] = []

    init(initial: DesiredSet, driver: any Driver) {
        self.driver = driver
        reconcile(to: initial)
    }

    func reconcile(to set: DesiredSet) {
        let items = set.subscriptions.items
        desiredKeys.removeAll(keepingCapacity: true)
        desiredKeys.reserveCapacity(items.count)
        let configurations = set.configurations
        for (i, sub) in items.enumerated() { desiredKeys.insert(ElmishKey(id: sub.id, configuration: configurations[i])) }
        // Equal key sets: nothing to stop, nothing to start.
        if desiredKeys.count == active.count, desiredKeys.allSatisfy({ active[$0] != nil }) { return }
        for (key, ticket) in active where !desiredKeys.contains(key) {
            driver.stop(ticket)
            gone.append(key)
        }
        for key in gone { active[key] = nil }
        gone.removeAll(keepingCapacity: true)
        let tickets = set.tickets
        for (i, sub) in items.enumerated() {
            let key = ElmishKey(id: sub.id, configuration: configurations[i])
            if active[key] == nil {
                driver.start(tickets[i])
                active[key] = tickets[i]
            }
        }
    }
}

/// iced's subscription tracker: every subscription is hashed (type, identity
/// and parameters) to 64 bits on every reconcile; hashes seen this time are
/// alive; a hash not running is started; running hashes not alive are
/// stopped (`retain`). To honour the driver's stop-before-start contract the
/// starts wait until after the stops.
final class IcedStyle: Reconciling {
    let driver: any Driver
    private var running: [Int: SourceTicket] = [:]
    private var alive: Set<Int> = []
    private var pending: [(hash: Int, ticket: SourceTicket)] = []
    private var dead: [Int] = []

    init(initial: DesiredSet, driver: any Driver) {
        self.driver = driver
        reconcile(to: initial)
    }

    func reconcile(to set: DesiredSet) {
        let items = set.subscriptions.items
        let tickets = set.tickets
        alive.removeAll(keepingCapacity: true)
        for i in items.indices {
            var hasher = Hasher()
            hasher.combine(items[i].id)
            hasher.combine(set.configurations[i])
            let hash = hasher.finalize()
            guard alive.insert(hash).inserted else { continue }
            if running[hash] == nil { pending.append((hash, tickets[i])) }
        }
        // Running entries not alive exist exactly when this is true; then retain.
        if running.count > alive.count - pending.count {
            for (hash, ticket) in running where !alive.contains(hash) {
                driver.stop(ticket)
                dead.append(hash)
            }
            for hash in dead { running[hash] = nil }
            dead.removeAll(keepingCapacity: true)
        }
        for (hash, ticket) in pending {
            driver.start(ticket)
            running[hash] = ticket
        }
        pending.removeAll(keepingCapacity: true)
    }
}

/// The floor: one dictionary lookup per desired subscription. It cannot
/// reconcile anything; it shows what "look each one up" costs by itself.
final class BareLookup: Reconciling {
    private var table: [SubscriptionID: SourceTicket] = [:]
    private(set) var found = 0

    init(initial: DesiredSet) {
        let tickets = initial.tickets
        table.reserveCapacity(tickets.count)
        for (i, sub) in initial.subscriptions.items.enumerated() { table[sub.id] = tickets[i] }
    }

    func reconcile(to set: DesiredSet) {
        for sub in set.subscriptions.items where table[sub.id] != nil { found &+= 1 }
    }
}

/// The floor: the keep path's comparisons of each desired subscription with
/// the running one in its place, nothing else.
final class Floor: Reconciling {
    let floor: KeepPathFloor<BenchMessage>
    private(set) var equal = 0

    init(initial: DesiredSet) { floor = KeepPathFloor(initial.subscriptions) }

    func reconcile(to set: DesiredSet) { equal &+= floor.compare(set.subscriptions) }
}
