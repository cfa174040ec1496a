/// Which message bus a bus source or call uses. One connection per bus per
/// driver is shared by every bus source and call on it.
public enum BusAddress: Hashable, Sendable, CustomStringConvertible {
    /// The system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket).
    case system
    /// The user's session bus (`DBUS_SESSION_BUS_ADDRESS`).
    case user
    /// A bus at an explicit address (`unix:path=/run/x/bus`).
    case address(String)

    /// `system`, `user` or the address.
    public var description: String {
        switch self {
        case .system: "system"
        case .user: "user"
        case .address(let a): a
        }
    }

    /// The reconnect policy bus sources get unless told otherwise (the
    /// connection's own: 100 ms doubling to 5 s, no jitter, no cap).
    ///
    /// One connection per bus is shared by every source on it, so it
    /// reconnects after the shortest delay any of its sources asks for;
    /// each source counts its own attempts (`.restarting(attempt:after:)`
    /// says the connection's actual delay), gives up alone at its cap, and
    /// with `.never` stays failed after the first loss.
    public static let defaultReconnect = RestartPolicy.backoff(Backoff(initial: .milliseconds(100), factor: 2, maximum: .seconds(5)))
}

/// `" restart <policy>"` unless `policy` is the default reconnect.
private func reconnectSuffix(_ policy: RestartPolicy) -> String {
    policy == BusAddress.defaultReconnect ? "" : " restart \(policy)"
}

/// A signal received from the bus.
public struct BusSignal: Hashable, Sendable {
    /// The sender's unique name (`:1.42`): never a well-known name.
    public var sender: String
    /// The object path it was emitted on.
    public var path: String
    /// The interface (`org.freedesktop.login1.Manager`).
    public var interface: String
    /// The member (`PrepareForSleep`).
    public var member: String
    /// The arguments, in order.
    public var arguments: [BusValue]

    /// A signal as received (tests build them by hand).
    public init(sender: String, path: String, interface: String, member: String, arguments: [BusValue]) {
        self.sender = sender
        self.path = path
        self.interface = interface
        self.member = member
        self.arguments = arguments
    }
}

/// Signals matching a rule, delivered with their arguments.
///
/// With a well-known `sender` (`org.freedesktop.login1`) the source tracks
/// that name's current owner and delivers only signals whose sender is that
/// owner's unique name: a signal from any other connection is never
/// delivered (sd-bus's local match alone would let one through; see
/// Docs/Bus.md). Until the owner is known, nothing is delivered.
public enum BusSignalSource: Source {
    /// `bus-signal`.
    public static let name = "bus-signal"

    /// A signal match.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The bus.
        public var bus: BusAddress
        /// The sender: a well-known name (owner-tracked) or a unique name; nil: any.
        public var sender: String?
        /// The object path; nil: any.
        public var path: String?
        /// The interface; nil: any.
        public var interface: String?
        /// The member; nil: any.
        public var member: String?
        /// String argument matches (`arg0='org.example'`), by argument index (0...63).
        public var arguments: [Int: String]
        /// Whether the match comes back after the bus was lost (see
        /// `BusAddress.defaultReconnect`).
        public var restart: RestartPolicy

        /// A match on `bus` for the given fields (nil: any).
        /// - Parameters:
        ///   - bus: The bus.
        ///   - sender: The sender (a well-known name is owner-tracked); nil: any.
        ///   - path: The object path; nil: any.
        ///   - interface: The interface; nil: any.
        ///   - member: The member; nil: any.
        ///   - arguments: String argument matches by index.
        ///   - restart: How it reconnects after the bus was lost.
        public init(bus: BusAddress, sender: String? = nil, path: String? = nil, interface: String? = nil,
                    member: String? = nil, arguments: [Int: String] = [:], restart: RestartPolicy = BusAddress.defaultReconnect) {
            self.bus = bus
            self.sender = sender
            self.path = path
            self.interface = interface
            self.member = member
            self.arguments = arguments
            self.restart = restart
        }

        /// The match rule as the bus daemon sees it (`type='signal',sender='...',...`).
        public var rule: String {
            var parts = ["type='signal'"]
            if let sender { parts.append("sender='\(matchEscaped(sender))'") }
            if let path { parts.append("path='\(matchEscaped(path))'") }
            if let interface { parts.append("interface='\(matchEscaped(interface))'") }
            if let member { parts.append("member='\(matchEscaped(member))'") }
            for (i, v) in arguments.sorted(by: { $0.key < $1.key }) { parts.append("arg\(i)='\(matchEscaped(v))'") }
            return parts.joined(separator: ",")
        }

        /// `bus rule`, as plans show it.
        public var description: String { "\(bus) \(rule)" + reconnectSuffix(restart) }

        /// Whether `signal` matches this rule: path, interface, member and
        /// string arguments as the bus compares them; the sender when it is
        /// the configured name itself or `owner`, that name's current owner
        /// (the test kit's matching; the driver leaves the rule to the bus).
        public func admits(_ signal: BusSignal, owner: String? = nil) -> Bool {
            if let sender, signal.sender != sender, signal.sender != owner { return false }
            if let path, signal.path != path { return false }
            if let interface, signal.interface != interface { return false }
            if let member, signal.member != member { return false }
            for (i, v) in arguments {
                guard i < signal.arguments.count, signal.arguments[i].string == v,
                      case .string = signal.arguments[i] else { return false }
            }
            return true
        }
    }

    /// What a signal subscription reports.
    public enum Event: Hashable, Sendable {
        /// A matching signal from the sender asked for (its current owner).
        case received(BusSignal)
        /// The bus is missing or was lost (the source reconnects and re-adds
        /// its match), the match was refused, or a signal could not be
        /// decoded (that signal is skipped).
        case failed(SourceFailure)
        /// After a lost or missing bus: reconnect attempt `attempt` comes
        /// after `after` (the shared connection's delay). Added with restart
        /// policies: an exhaustive `switch` needs this case.
        case restarting(attempt: Int, after: Duration)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }

    /// Path, interface, member and argument filters change in place (the
    /// match is swapped); a new bus or sender restarts.
    public static func canRetune(from old: Configuration, to new: Configuration) -> Bool {
        old.bus == new.bus && old.sender == new.sender && old.restart == new.restart
    }
}

/// Whether a bus name has an owner, and which connection it is.
public enum BusNameSource: Source {
    /// `bus-name`.
    public static let name = "bus-name"

    /// A watched name.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The bus.
        public var bus: BusAddress
        /// The well-known name (`org.freedesktop.login1`).
        public var name: String
        /// Whether the watch comes back after the bus was lost (see
        /// `BusAddress.defaultReconnect`).
        public var restart: RestartPolicy

        /// A watch of `name` on `bus`.
        /// - Parameters:
        ///   - bus: The bus.
        ///   - name: The well-known name.
        ///   - restart: How it reconnects after the bus was lost.
        public init(bus: BusAddress, name: String, restart: RestartPolicy = BusAddress.defaultReconnect) {
            self.bus = bus
            self.name = name
            self.restart = restart
        }

        /// `bus name`.
        public var description: String { "\(bus) \(name)" + reconnectSuffix(restart) }
    }

    /// What a name watch reports; the first event is the current state.
    public enum Event: Hashable, Sendable {
        /// The name has an owner now, the connection with unique name `owner`.
        case appeared(owner: String)
        /// The name has no owner.
        case vanished
        /// The bus is missing or was lost; the source reconnects and reports
        /// the state again.
        case failed(SourceFailure)
        /// After a lost or missing bus: reconnect attempt `attempt` comes
        /// after `after`. Added with restart policies: an exhaustive
        /// `switch` needs this case.
        case restarting(attempt: Int, after: Duration)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

/// One property of an object, followed: read when the watch starts, then
/// every change (`PropertiesChanged`, an invalidated property is read
/// again), `.vanished` when the service's owner goes, read afresh when it
/// comes back. Only the service's current owner is believed.
public enum BusPropertySource: Source {
    /// `bus-property`.
    public static let name = "bus-property"

    /// A followed property.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The bus.
        public var bus: BusAddress
        /// The service's well-known name (or a unique name).
        public var service: String
        /// The object path.
        public var path: String
        /// The interface the property belongs to.
        public var interface: String
        /// The property's name.
        public var property: String
        /// The type the program expects; a value of another type is a
        /// failure event, not a value (nil: any type).
        public var type: BusType?
        /// Whether the watch comes back after the bus was lost (see
        /// `BusAddress.defaultReconnect`).
        public var restart: RestartPolicy

        /// A watch of `interface.property` on `service`'s object `path`.
        /// - Parameters:
        ///   - bus: The bus.
        ///   - service: The service's well-known (or unique) name.
        ///   - path: The object path.
        ///   - interface: The property's interface.
        ///   - property: The property's name.
        ///   - type: The type the program expects (nil: any).
        ///   - restart: How it reconnects after the bus was lost.
        public init(bus: BusAddress, service: String, path: String, interface: String, property: String, type: BusType? = nil,
                    restart: RestartPolicy = BusAddress.defaultReconnect) {
            self.bus = bus
            self.service = service
            self.path = path
            self.interface = interface
            self.property = property
            self.type = type
            self.restart = restart
        }

        /// `bus service path interface.property`.
        public var description: String {
            "\(bus) \(service) \(path) \(interface).\(property)" + (type.map { " as \($0)" } ?? "") + reconnectSuffix(restart)
        }
    }

    /// What a property watch reports.
    public enum Event: Hashable, Sendable {
        /// The property's value (the content of the variant), read or changed.
        case value(BusValue)
        /// The service has no owner (gone); a value follows when it is back.
        case vanished
        /// The bus is missing or lost, the read failed, or the value is not
        /// of the expected type.
        case failed(SourceFailure)
        /// After a lost or missing bus: reconnect attempt `attempt` comes
        /// after `after`. Added with restart policies: an exhaustive
        /// `switch` needs this case.
        case restarting(attempt: Int, after: Duration)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

/// `value` with `'` escaped for a match rule (`'\''`, as dbus-daemon reads it).
func matchEscaped(_ value: String) -> String {
    guard value.contains("'") else { return value }
    return value.split(separator: "'", omittingEmptySubsequences: false).joined(separator: "'\\''")
}

extension Subscription {
    /// Signals on `bus` matching the fields given (nil: any), keyed by the
    /// match unless `key` is given. A well-known `sender` is owner-tracked.
    ///
    /// - Parameters:
    ///   - bus: the bus.
    ///   - sender: the sender (a well-known name is owner-tracked); nil: any.
    ///   - path: the object path; nil: any.
    ///   - interface: the interface; nil: any.
    ///   - member: the member; nil: any.
    ///   - arguments: string argument matches by index.
    ///   - restart: how it reconnects after the bus was lost (`BusAddress.defaultReconnect`).
    ///   - tag: makes a message of each event.
    @inlinable
    public static func busSignal(
        bus: BusAddress, sender: String? = nil, path: String? = nil, interface: String? = nil, member: String? = nil,
        arguments: [Int: String] = [:], restart: RestartPolicy = BusAddress.defaultReconnect,
        _ tag: @escaping (BusSignalSource.Event) -> Message
    ) -> Subscription {
        let c = BusSignalSource.Configuration(bus: bus, sender: sender, path: path, interface: interface, member: member,
                                              arguments: arguments, restart: restart)
        return Subscription(BusSignalSource.self, key: c, configuration: c, tag: tag)
    }

    /// Signals matching `configuration`, keyed by `key` (a filter change retunes).
    @inlinable
    public static func busSignal<Key: Hashable & Sendable>(
        _ configuration: BusSignalSource.Configuration, key: Key, _ tag: @escaping (BusSignalSource.Event) -> Message
    ) -> Subscription {
        Subscription(BusSignalSource.self, key: key, configuration: configuration, tag: tag)
    }

    /// Whether `name` has an owner on `bus` (first event: the current state).
    ///
    /// - Parameters:
    ///   - bus: the bus.
    ///   - name: the well-known name.
    ///   - restart: how it reconnects after the bus was lost (`BusAddress.defaultReconnect`).
    ///   - tag: makes a message of each event.
    @inlinable
    public static func busName(bus: BusAddress, name: String, restart: RestartPolicy = BusAddress.defaultReconnect,
                               _ tag: @escaping (BusNameSource.Event) -> Message) -> Subscription {
        let c = BusNameSource.Configuration(bus: bus, name: name, restart: restart)
        return Subscription(BusNameSource.self, key: c, configuration: c, tag: tag)
    }

    /// `interface.property` of `service`'s object `path` on `bus`, followed;
    /// with `type`, a value of another type is a failure event.
    ///
    /// - Parameters:
    ///   - bus: the bus.
    ///   - service: the service's name.
    ///   - path: the object path.
    ///   - interface: the property's interface.
    ///   - property: the property's name.
    ///   - type: the type the program expects (nil: any).
    ///   - restart: how it reconnects after the bus was lost (`BusAddress.defaultReconnect`).
    ///   - tag: makes a message of each event.
    @inlinable
    public static func busProperty(
        bus: BusAddress, service: String, path: String, interface: String, property: String, type: BusType? = nil,
        restart: RestartPolicy = BusAddress.defaultReconnect, _ tag: @escaping (BusPropertySource.Event) -> Message
    ) -> Subscription {
        let c = BusPropertySource.Configuration(bus: bus, service: service, path: path, interface: interface,
                                                property: property, type: type, restart: restart)
        return Subscription(BusPropertySource.self, key: c, configuration: c, tag: tag)
    }
}
