/// Answers incoming calls: the driver's (sends the reply on the bus) or a
/// test kit's (records it). Called on the loop thread only.
public protocol BusReplier: AnyObject, Sendable {
    /// Sends `result` as the reply to the call `token` stands for.
    /// - Parameters:
    ///   - token: The call's token.
    ///   - result: The reply's values, or an error name and message.
    /// - Returns: false when the call was already answered or can no longer
    ///   be (its object was unexported, its bus lost).
    func reply(_ token: BusReplyToken, with result: Result<[BusValue], BusError>) -> Bool
}

/// Stands for one incoming call until it is answered: carried by the call's
/// message, handed back in a `BusCommand.reply`. A call is answered once; a
/// second reply does nothing. An unanswered call gets an error reply when
/// its object is unexported or at shutdown.
public struct BusReplyToken: Hashable, Sendable, CustomStringConvertible {
    /// The call's number, unique per replier.
    public let serial: UInt64
    /// Who answers it.
    public let replier: any BusReplier

    /// A token for call `serial` of `replier`.
    public init(serial: UInt64, replier: any BusReplier) {
        self.serial = serial
        self.replier = replier
    }

    /// The same call of the same replier.
    public static func == (a: BusReplyToken, b: BusReplyToken) -> Bool { a.serial == b.serial && a.replier === b.replier }
    /// Hashes the serial and the replier's identity.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(serial)
        hasher.combine(ObjectIdentifier(replier))
    }

    /// `call #serial`.
    public var description: String { "call #\(serial)" }
}

/// A method call made to an exported object, as the program sees it: the
/// arguments already checked against the declared signature, the caller
/// already admitted by the method's `BusAccess`.
public struct BusIncomingCall: Hashable, Sendable {
    /// The object path called.
    public var path: String
    /// The interface.
    public var interface: String
    /// The method.
    public var member: String
    /// The arguments, of the declared types.
    public var arguments: [BusValue]
    /// Who called (from the bus, never from the body).
    public var caller: BusCredentials
    /// Answer with `BusCommand.reply(token, ...)` / `.fail(token, ...)`.
    public var token: BusReplyToken

    /// A call as delivered (the test kit builds them).
    public init(path: String, interface: String, member: String, arguments: [BusValue], caller: BusCredentials, token: BusReplyToken) {
        self.path = path
        self.interface = interface
        self.member = member
        self.arguments = arguments
        self.caller = caller
        self.token = token
    }
}

/// A `Properties.Set` of a writable property, as the program sees it: the
/// value already of the declared type, the caller admitted by the
/// property's write access. Answer with an empty reply or an error; the
/// new value is whatever the model says next.
public struct BusPropertyWrite: Hashable, Sendable {
    /// The object path.
    public var path: String
    /// The property's interface.
    public var interface: String
    /// The property.
    public var property: String
    /// The value asked for (the variant's content).
    public var value: BusValue
    /// Who asked.
    public var caller: BusCredentials
    /// Answer with `BusCommand.reply(token)` / `.fail(token, ...)`.
    public var token: BusReplyToken

    /// A write as delivered (the test kit builds them).
    public init(path: String, interface: String, property: String, value: BusValue, caller: BusCredentials, token: BusReplyToken) {
        self.path = path
        self.interface = interface
        self.property = property
        self.value = value
        self.caller = caller
        self.token = token
    }
}

/// A signal to emit from an exported object.
public struct BusSignalEmission: Hashable, Sendable, CustomStringConvertible {
    /// The bus.
    public var bus: BusAddress
    /// The object path it is emitted on.
    public var path: String
    /// The interface.
    public var interface: String
    /// The member.
    public var member: String
    /// The arguments.
    public var values: [BusValue]

    /// A signal `interface.member` on `path`.
    public init(bus: BusAddress, path: String, interface: String, member: String, values: [BusValue]) {
        self.bus = bus
        self.path = path
        self.interface = interface
        self.member = member
        self.values = values
    }

    /// `bus path interface.member(values)`.
    public var description: String { "\(bus) \(path) \(interface).\(member)(\(values.count) values)" }
}

/// What emits signals: the sd-event driver (`SystemdDriver`), or the test
/// kit's `VirtualDriver`, which records them.
public protocol BusSignalEmitter: AnyObject {
    /// Emits `signal` (loop thread).
    /// - Parameter signal: The signal.
    /// - Throws: `BusError` when it cannot be sent (no bus, invalid values).
    func emit(_ signal: BusSignalEmission) throws(BusError)
}

/// The bus commands a serving program returns from `update` (wrapped in its
/// own `Command`): a reply to an incoming call, a signal.
public enum BusCommand: Hashable, Sendable {
    /// Answers the call `token` stands for: values, or an error.
    case reply(BusReplyToken, Result<[BusValue], BusError>)
    /// Emits a signal.
    case emitSignal(BusSignalEmission)

    /// A method return carrying `values` (empty: a reply with no values).
    /// - Parameters:
    ///   - token: The call's token.
    ///   - values: The reply's values (of the method's output types).
    public static func reply(_ token: BusReplyToken, _ values: [BusValue] = []) -> BusCommand { .reply(token, .success(values)) }

    /// An error reply `name` (`org.example.Error.Busy`) with `message`.
    /// - Parameters:
    ///   - token: The call's token.
    ///   - name: The D-Bus error name.
    ///   - message: The human message.
    public static func fail(_ token: BusReplyToken, _ name: String, _ message: String) -> BusCommand {
        .reply(token, .failure(BusError(name, message)))
    }

    /// The signal `interface.member` with `values` from the object at `path` on `bus`.
    /// - Parameters:
    ///   - bus: The bus.
    ///   - path: The object path.
    ///   - interface: The interface.
    ///   - member: The signal's name.
    ///   - values: Its arguments.
    public static func emitSignal(bus: BusAddress, path: String, interface: String, member: String, values: [BusValue] = []) -> BusCommand {
        .emitSignal(BusSignalEmission(bus: bus, path: path, interface: interface, member: member, values: values))
    }

    /// Performs the command (loop thread): a reply through its token's
    /// replier, a signal through `emitter`.
    /// - Parameter emitter: What emits signals (the driver).
    /// - Returns: false when a reply found its call already answered or
    ///   gone, or a signal could not be sent.
    @discardableResult
    public func perform(emitter: any BusSignalEmitter) -> Bool {
        switch self {
        case .reply(let token, let result): return token.replier.reply(token, with: result)
        case .emitSignal(let signal):
            do { try emitter.emit(signal); return true } catch { return false }
        }
    }
}

/// Error names a serving object answers with.
extension BusError {
    /// `org.freedesktop.DBus.Error.AccessDenied`: the caller may not.
    public static let accessDenied = "org.freedesktop.DBus.Error.AccessDenied"
    /// `org.freedesktop.DBus.Error.UnknownMethod`.
    public static let unknownMethod = "org.freedesktop.DBus.Error.UnknownMethod"
    /// `org.freedesktop.DBus.Error.UnknownInterface`.
    public static let unknownInterface = "org.freedesktop.DBus.Error.UnknownInterface"
    /// `org.freedesktop.DBus.Error.UnknownProperty`.
    public static let unknownProperty = "org.freedesktop.DBus.Error.UnknownProperty"
    /// `org.freedesktop.DBus.Error.PropertyReadOnly`.
    public static let propertyReadOnly = "org.freedesktop.DBus.Error.PropertyReadOnly"
    /// `org.freedesktop.DBus.Error.LimitsExceeded`: too many unanswered calls.
    public static let limitsExceeded = "org.freedesktop.DBus.Error.LimitsExceeded"
    /// `org.freedesktop.DBus.Error.Failed`: the object went before it answered.
    public static let failed = "org.freedesktop.DBus.Error.Failed"
}

extension BusObject {
    /// The method a call of `interface.member` (nil interface: the first
    /// interface declaring `member`) with body signature `signature` from
    /// `caller` reaches, or the error reply it gets instead: UnknownInterface,
    /// UnknownMethod, InvalidArgs (wrong signature), AccessDenied.
    /// - Parameters:
    ///   - interface: The call's interface, if it named one.
    ///   - member: The method.
    ///   - signature: The body's signature.
    ///   - caller: The caller's credentials.
    public func admit(interface: String?, member: String, signature: String, caller: BusCredentials)
        -> Result<(interface: String, method: BusMethodDeclaration), BusError> {
        resolve(interface: interface, member: member, signature: signature).flatMap { found in
            guard found.method.access.allows(caller) else {
                return .failure(BusError(BusError.accessDenied, "\(found.interface).\(member) is not permitted for \(caller)"))
            }
            return .success(found)
        }
    }

    /// The method a call of `interface.member` with body signature
    /// `signature` reaches, whoever calls, or UnknownInterface,
    /// UnknownMethod, InvalidArgs (`admit` without the access check).
    /// - Parameters:
    ///   - interface: The call's interface, if it named one.
    ///   - member: The method.
    ///   - signature: The body's signature.
    public func resolve(interface: String?, member: String, signature: String)
        -> Result<(interface: String, method: BusMethodDeclaration), BusError> {
        let found: (String, BusMethodDeclaration)?
        if let interface {
            guard let i = self.interface(interface) else {
                return .failure(BusError(BusError.unknownInterface, "Unknown interface \(interface) on \(path)"))
            }
            found = i.method(member).map { (i.name, $0) }
        } else {
            found = interfaces.lazy.compactMap { i in i.method(member).map { (i.name, $0) } }.first
        }
        guard let (name, method) = found else {
            return .failure(BusError(BusError.unknownMethod, "Unknown method \(member) on \(interface ?? path)"))
        }
        guard signature == method.inputSignature else {
            return .failure(BusError(BusError.invalidArgs,
                                     "\(name).\(member) takes (\(method.inputSignature)), the call has (\(signature))"))
        }
        return .success((name, method))
    }

    /// The value `Properties.Get(interface, property)` answers, or its error.
    /// - Parameters:
    ///   - interface: The property's interface.
    ///   - property: The property.
    public func get(interface: String, property: String) -> Result<BusValue, BusError> {
        guard let i = self.interface(interface) else {
            return .failure(BusError(BusError.unknownInterface, "Unknown interface \(interface) on \(path)"))
        }
        guard let p = i.property(property) else {
            return .failure(BusError(BusError.unknownProperty, "Unknown property \(interface).\(property)"))
        }
        return .success(p.value)
    }

    /// The properties `Properties.GetAll(interface)` answers, or its error.
    /// - Parameter interface: The interface.
    public func getAll(interface: String) -> Result<[BusPropertyValue], BusError> {
        guard let i = self.interface(interface) else {
            return .failure(BusError(BusError.unknownInterface, "Unknown interface \(interface) on \(path)"))
        }
        return .success(i.properties.map { BusPropertyValue($0.name, $0.value) })
    }

    /// The property a `Properties.Set(interface, property, value)` from
    /// `caller` writes, or its error: UnknownInterface, UnknownProperty,
    /// PropertyReadOnly, InvalidArgs (a value of another type), AccessDenied.
    /// - Parameters:
    ///   - interface: The property's interface.
    ///   - property: The property.
    ///   - value: The value asked for (the variant's content).
    ///   - caller: The caller's credentials.
    public func admitWrite(interface: String, property: String, value: BusValue, caller: BusCredentials) -> Result<BusExportedProperty, BusError> {
        guard let i = self.interface(interface) else {
            return .failure(BusError(BusError.unknownInterface, "Unknown interface \(interface) on \(path)"))
        }
        guard let p = i.property(property) else {
            return .failure(BusError(BusError.unknownProperty, "Unknown property \(interface).\(property)"))
        }
        guard let access = p.write else {
            return .failure(BusError(BusError.propertyReadOnly, "\(interface).\(property) is read-only"))
        }
        guard value.type == p.type else {
            return .failure(BusError(BusError.invalidArgs, "\(interface).\(property) is of type \(p.type), the value is \(value.type)"))
        }
        guard access.allows(caller) else {
            return .failure(BusError(BusError.accessDenied, "writing \(interface).\(property) is not permitted for \(caller)"))
        }
        return .success(p)
    }
}

/// An object served on a bus while the model wants it: its properties are
/// the subscription's configuration (recomputed by `subscriptions(model)`
/// after every batch: a change is a retune, which emits one
/// `PropertiesChanged` per interface with only the changed properties, and
/// an unchanged object is a keep that costs nothing); method calls and
/// property writes are events carrying a reply token.
public enum BusObjectSource: Source {
    /// `bus-object`.
    public static let name = "bus-object"

    /// The object: path, interfaces, properties with their values, methods.
    public typealias Configuration = BusObject

    /// What an exported object reports.
    public enum Event: Hashable, Sendable {
        /// A method call (arguments checked, caller admitted).
        case call(BusIncomingCall)
        /// A property write (value checked, caller admitted).
        case write(BusPropertyWrite)
        /// The bus is missing or lost (the object is exported again when it
        /// is back), or the declaration is invalid, or the path is taken.
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }

    /// Everything but the bus and the path changes in place.
    public static func canRetune(from old: BusObject, to new: BusObject) -> Bool { old.bus == new.bus && old.path == new.path }

    /// The identity of the object at `path` on `bus`.
    /// - Parameters:
    ///   - bus: The bus.
    ///   - path: The object path.
    public static func id(bus: BusAddress, path: String) -> SubscriptionID { SubscriptionID(BusObjectSource.self, key: Key(bus: bus, path: path)) }

    /// An object's key: its bus and path.
    public struct Key: Hashable, Sendable {
        /// The bus.
        public var bus: BusAddress
        /// The object path.
        public var path: String

        @usableFromInline init(bus: BusAddress, path: String) {
            self.bus = bus
            self.path = path
        }
    }
}

extension Subscription {
    /// Serves `object` (keyed by its bus and path) while the model wants it.
    /// - Parameters:
    ///   - object: The object, its properties computed from the model.
    ///   - tag: Maps calls, writes and failures to messages.
    @inlinable
    public static func busObject(_ object: BusObject, _ tag: @escaping (BusObjectSource.Event) -> Message) -> Subscription {
        Subscription(BusObjectSource.self, key: BusObjectSource.Key(bus: object.bus, path: object.path), configuration: object, tag: tag)
    }

    /// Serves the object at `path` on `bus` with `interfaces`.
    /// - Parameters:
    ///   - bus: The bus.
    ///   - path: The object path.
    ///   - interfaces: Its interfaces, properties computed from the model.
    ///   - tag: Maps calls, writes and failures to messages.
    @inlinable
    public static func busObject(bus: BusAddress, path: String, interfaces: [BusInterface],
                                 _ tag: @escaping (BusObjectSource.Event) -> Message) -> Subscription {
        busObject(BusObject(bus: bus, path: path, interfaces: interfaces), tag)
    }
}
