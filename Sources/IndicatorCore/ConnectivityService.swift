import Reconcile

/// The indicator's state served on a bus (`--bus`): owns
/// `org.reconcile.Connectivity1` and exports `/org/reconcile/Connectivity1`
/// with the properties `State` (s), `Online` (b) and `Interfaces`
/// (`a(ssas)`: name, state, addresses), each announced by
/// `PropertiesChanged`, and the method `Refresh() -> (s state)`, which
/// re-reads the config file (as SIGHUP) and answers the state now.
///
/// A program of its own, fed by the indicator's committed models
/// (`.indicator(Snapshot(model))`), so the indicator's program, its
/// transcripts and replays are unchanged by serving.
public struct ConnectivityService: Program {
    /// The well-known name owned.
    public static let name = "org.reconcile.Connectivity1"
    /// The object path.
    public static let path = "/org/reconcile/Connectivity1"
    /// The interface.
    public static let interface = "org.reconcile.Connectivity1"

    /// The bus served on.
    public var bus: BusAddress

    /// Serves on `bus`.
    public init(bus: BusAddress) { self.bus = bus }

    /// What the bus is shown of the indicator's model.
    public struct Snapshot: Equatable, Sendable {
        /// The operational state (`routable`), `unknown` while the backend fails, `starting` before the first report.
        public var state: String
        /// The online verdict.
        public var online: Bool
        /// Every interface considered: name, state, addresses.
        public var interfaces: [ConnectivitySource.Interface]

        /// Before the first report.
        public init() {
            state = "starting"
            online = false
            interfaces = []
        }

        /// The indicator's `model`, as served.
        public init(_ model: Indicator.Model) {
            self.init()
            if model.failure != nil {
                state = "unknown"
            } else if let c = model.latest {
                state = c.state.state.rawValue
                online = c.state.online
                interfaces = c.state.interfaces
            }
        }
    }

    /// The service's model.
    public struct Model: Equatable, Sendable {
        /// The last snapshot of the indicator.
        public var snapshot = Snapshot()
        /// Whether the name is ours (the last name event).
        public var name: BusOwnedNameSource.Event?
        /// Refresh calls answered.
        public var refreshes = 0
        /// A fresh model.
        public init() {}
    }

    /// The service's inputs.
    public enum Message: Sendable {
        /// The indicator committed a model.
        case indicator(Snapshot)
        /// A call on the object, or its failure.
        case object(BusObjectSource.Event)
        /// The owned name's events.
        case name(BusOwnedNameSource.Event)
    }

    /// What the host performs.
    public enum Command: Equatable, Sendable {
        /// A reply (through the driver).
        case bus(BusCommand)
        /// Re-read the indicator's config file (as SIGHUP).
        case refresh
        /// Tell the operator (stderr / journal).
        case log(String)
    }

    /// No commands at start.
    public func start() -> (Model, [Command]) { (Model(), []) }

    /// Applies `message`.
    public func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .indicator(let s):
            model.snapshot = s
        case .object(.call(let call)):
            // The only declared method (the runner answers anything else).
            model.refreshes += 1
            return [.refresh, .bus(.reply(call.token, [.string(model.snapshot.state)]))]
        case .object(.write(let write)):
            return [.bus(.fail(write.token, BusError.propertyReadOnly, "read-only"))]
        case .object(.failed(let f)):
            return [.log("bus: \(Self.path): \(f.reason)")]
        case .name(let event):
            let was = model.name
            model.name = event
            switch event {
            case .acquired: return was == .acquired ? [] : [.log("bus: serving \(Self.name) on the \(bus) bus")]
            case .lost(.replaced): return [.log("bus: another connection took \(Self.name)")]
            case .lost(.queued): return [.log("bus: waiting for \(Self.name)")]
            case .failed(let f): return [.log("bus: \(Self.name): \(f.reason)")]
            }
        }
        return []
    }

    /// The exported object for `snapshot`.
    public func object(_ snapshot: Snapshot) -> BusObject {
        let interfaceType = BusType.structure([.string, .string, .array(.string)])
        return BusObject(bus: bus, path: Self.path, interfaces: [
            BusInterface(Self.interface, methods: [
                BusMethodDeclaration("Refresh", outputs: [BusArgument("state", .string)]),
            ], properties: [
                BusExportedProperty("State", .string(snapshot.state)),
                BusExportedProperty("Online", .boolean(snapshot.online)),
                BusExportedProperty("Interfaces", .array(element: interfaceType, snapshot.interfaces.map {
                    .structure([.string($0.name), .string($0.state.rawValue), .strings($0.addresses)])
                })),
            ]),
        ])
    }

    /// The name, and the object with the last snapshot's values.
    public func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            Subscription.ownName(bus: bus, name: Self.name) { .name($0) }
            Subscription.busObject(object(model.snapshot)) { .object($0) }
        }
    }
}
