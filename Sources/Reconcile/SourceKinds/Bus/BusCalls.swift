/// A method call to make on a bus.
public struct BusMethodCall: Hashable, Sendable, CustomStringConvertible {
    /// The bus.
    public var bus: BusAddress
    /// The destination: a well-known or unique name.
    public var service: String
    /// The object path.
    public var path: String
    /// The interface.
    public var interface: String
    /// The method.
    public var method: String
    /// The arguments, in order.
    public var arguments: [BusValue]
    /// How long to wait for the reply; nil: the bus default (25 s).
    public var timeout: Duration?

    /// A call of `interface.method` on `service`'s object `path`.
    public init(bus: BusAddress, service: String, path: String, interface: String, method: String,
                arguments: [BusValue] = [], timeout: Duration? = nil) {
        self.bus = bus
        self.service = service
        self.path = path
        self.interface = interface
        self.method = method
        self.arguments = arguments
        self.timeout = timeout
    }

    /// `service path interface.method(n args)`.
    public var description: String { "\(service) \(path) \(interface).\(method)(\(arguments.count) args)" }
}

/// A D-Bus error reply (or a call that could not be made): the error's name
/// and message. A timeout is `org.freedesktop.DBus.Error.NoReply`; a lost
/// or missing bus is `org.freedesktop.DBus.Error.Disconnected`.
public struct BusError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The error name (`org.freedesktop.DBus.Error.UnknownMethod`).
    public var name: String
    /// The human message.
    public var message: String

    /// An error `name` with `message`.
    public init(_ name: String, _ message: String) {
        self.name = name
        self.message = message
    }

    /// `org.freedesktop.DBus.Error.NoReply`: the call timed out (or the bus went away meanwhile).
    public static let noReply = "org.freedesktop.DBus.Error.NoReply"
    /// `org.freedesktop.DBus.Error.Disconnected`: no connection to the bus.
    public static let disconnected = "org.freedesktop.DBus.Error.Disconnected"
    /// `org.freedesktop.DBus.Error.InvalidArgs`: the arguments cannot be sent or the reply not read.
    public static let invalidArgs = "org.freedesktop.DBus.Error.InvalidArgs"

    /// `name: message`.
    public var description: String { "\(name): \(message)" }
}

/// What makes method calls: the driver's buses (`SystemdDriver.bus`), or a
/// test double that records calls and lets the test answer them
/// (`ReconcileTesting`'s `BusCallRecorder`). Call it from inside an owned
/// task (`tasks.run`): the call is cancelled with its task.
public protocol BusCaller: Sendable {
    /// Makes `call` and returns the reply's values.
    /// - Parameter call: The call.
    /// - Throws: `BusError` for an error reply, a timeout or a missing bus;
    ///   `CancellationError` when the task was cancelled (the pending call is dropped).
    func call(_ call: BusMethodCall) async throws -> [BusValue]
}

extension BusCaller {
    /// Calls `interface.method` on `service`'s object `path` on `bus`.
    /// - Parameters:
    ///   - bus: The bus.
    ///   - service: The destination name.
    ///   - path: The object path.
    ///   - interface: The interface.
    ///   - method: The method.
    ///   - arguments: The arguments.
    ///   - timeout: How long to wait (nil: the bus default, 25 s).
    /// - Returns: The reply's values.
    /// - Throws: `BusError` or `CancellationError`, as `call(_:)`.
    public func call(bus: BusAddress, _ service: String, _ path: String, _ interface: String, _ method: String,
                     _ arguments: [BusValue] = [], timeout: Duration? = nil) async throws -> [BusValue] {
        try await call(BusMethodCall(bus: bus, service: service, path: path, interface: interface, method: method,
                                     arguments: arguments, timeout: timeout))
    }

    /// Reads `interface.property` of `service`'s object `path` (`Properties.Get`).
    /// - Parameters:
    ///   - bus: The bus.
    ///   - service: The destination name.
    ///   - path: The object path.
    ///   - interface: The property's interface.
    ///   - property: The property.
    ///   - timeout: How long to wait (nil: 25 s).
    /// - Returns: The value (the variant's content).
    /// - Throws: `BusError` or `CancellationError`, as `call(_:)`.
    public func property(bus: BusAddress, _ service: String, _ path: String, _ interface: String, _ property: String,
                         timeout: Duration? = nil) async throws -> BusValue {
        let reply = try await call(bus: bus, service, path, "org.freedesktop.DBus.Properties", "Get",
                                   [.string(interface), .string(property)], timeout: timeout)
        guard let first = reply.first else { throw BusError(BusError.invalidArgs, "Get returned no value") }
        return first.variantContent
    }
}
