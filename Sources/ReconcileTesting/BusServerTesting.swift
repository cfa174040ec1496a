import Reconcile
import Testing

/// A `BusReplier` for tests: the tokens the test kit hands out answer here,
/// so a test asserts what the program replied (`reply(for:)`), later too
/// (after an owned task). A second reply to a call is refused and counted.
public final class BusReplyRecorder: BusReplier, @unchecked Sendable {
    private var next: UInt64 = 0
    private var answers: [UInt64: Result<[BusValue], BusError>] = [:]
    private var open: Set<UInt64> = []
    /// Replies to a call already answered (or never handed out).
    public private(set) var refusedReplies = 0

    /// A recorder with no calls.
    public init() {}

    /// A new token for a call that waits for its reply.
    public func token() -> BusReplyToken {
        next += 1
        open.insert(next)
        return BusReplyToken(serial: next, replier: self)
    }

    /// Records `result` as the reply to `token`'s call (once).
    /// - Parameters:
    ///   - token: The call's token.
    ///   - result: The reply.
    /// - Returns: false when the call was already answered or is not this recorder's.
    public func reply(_ token: BusReplyToken, with result: Result<[BusValue], BusError>) -> Bool {
        guard token.replier === self, open.remove(token.serial) != nil else {
            refusedReplies += 1
            return false
        }
        answers[token.serial] = result
        return true
    }

    /// The reply the program gave to `token`'s call; nil while unanswered.
    /// - Parameter token: The call's token.
    public func reply(for token: BusReplyToken) -> Result<[BusValue], BusError>? { answers[token.serial] }

    /// The calls not answered yet.
    public var unanswered: Int { open.count }
}

/// A `BusSignalEmitter` for tests: records every signal the program emits
/// (`BusCommand.emitSignal`, performed with `command.perform(emitter:)`).
public final class BusSignalRecorder: BusSignalEmitter {
    /// Every signal emitted, in order.
    public private(set) var signals: [BusSignalEmission] = []

    /// A recorder with no signals.
    public init() {}

    /// Records `signal`.
    /// - Parameter signal: The signal.
    public func emit(_ signal: BusSignalEmission) throws(BusError) { signals.append(signal) }
}

/// What a test call came to: the token the program got (answer it, read
/// the reply from the recorder), or the error the bus caller got at once,
/// before `update` saw anything.
public enum BusTestCall: Equatable {
    /// The call reached `update`, with this token.
    case delivered(BusReplyToken)
    /// The call was answered with this error without reaching `update`.
    case refused(BusError)

    /// The token, when delivered.
    public var token: BusReplyToken? { if case .delivered(let t) = self { t } else { nil } }
    /// The error, when refused.
    public var error: BusError? { if case .refused(let e) = self { e } else { nil } }
}

/// The caller tests use when they do not say (uid 1000).
public let testBusCaller = BusCredentials(uniqueName: ":1.100", uid: 1000, pid: 4242)

extension VirtualDriver {
    /// The object the program exports at `path` on `bus` now (its
    /// properties as last reconciled), or nil.
    /// - Parameters:
    ///   - path: The object path.
    ///   - bus: The bus.
    public func exportedObject(at path: String, on bus: BusAddress) -> BusObject? {
        running[BusObjectSource.id(bus: bus, path: path)]?.configuration(as: BusObjectSource.self)
    }

    /// Calls `interface.member` on the exported object at `path` as `caller`,
    /// checked as the sd-event driver checks it (unknown member, argument
    /// types, access): a refused call never reaches `update`.
    /// - Parameters:
    ///   - member: The method.
    ///   - interface: The interface.
    ///   - path: The object path.
    ///   - bus: The bus.
    ///   - arguments: The arguments.
    ///   - caller: Who calls.
    ///   - replies: Where the program's reply is recorded.
    public func call(_ member: String, interface: String, at path: String, on bus: BusAddress, arguments: [BusValue] = [],
                     caller: BusCredentials = testBusCaller, replies: BusReplyRecorder) -> BusTestCall {
        guard let object = exportedObject(at: path, on: bus) else {
            return .refused(BusError("org.freedesktop.DBus.Error.UnknownObject", "Unknown object '\(path)'"))
        }
        switch object.admit(interface: interface, member: member, signature: arguments.map(\.type.description).joined(), caller: caller) {
        case .failure(let e): return .refused(e)
        case .success:
            let token = replies.token()
            let call = BusIncomingCall(path: path, interface: interface, member: member, arguments: arguments, caller: caller, token: token)
            guard emit(BusObjectSource.Event.call(call), to: BusObjectSource.id(bus: bus, path: path)) else {
                return .refused(BusError(BusError.failed, "the object is not running"))
            }
            return .delivered(token)
        }
    }

    /// Writes `interface.property` on the object at `path` as `caller`
    /// (`Properties.Set`), checked as the sd-event driver checks it.
    /// - Parameters:
    ///   - property: The property.
    ///   - interface: Its interface.
    ///   - path: The object path.
    ///   - bus: The bus.
    ///   - value: The value.
    ///   - caller: Who writes.
    ///   - replies: Where the program's reply is recorded.
    public func write(_ property: String, interface: String, at path: String, on bus: BusAddress, value: BusValue,
                      caller: BusCredentials = testBusCaller, replies: BusReplyRecorder) -> BusTestCall {
        guard let object = exportedObject(at: path, on: bus) else {
            return .refused(BusError("org.freedesktop.DBus.Error.UnknownObject", "Unknown object '\(path)'"))
        }
        switch object.admitWrite(interface: interface, property: property, value: value, caller: caller) {
        case .failure(let e): return .refused(e)
        case .success:
            let token = replies.token()
            let write = BusPropertyWrite(path: path, interface: interface, property: property, value: value, caller: caller, token: token)
            guard emit(BusObjectSource.Event.write(write), to: BusObjectSource.id(bus: bus, path: path)) else {
                return .refused(BusError(BusError.failed, "the object is not running"))
            }
            return .delivered(token)
        }
    }

    /// The `PropertiesChanged` signals the object at `path` would emit for
    /// what `body` does (sends, events, time): the change between its
    /// exported properties before and after.
    /// - Parameters:
    ///   - path: The object path.
    ///   - bus: The bus.
    ///   - body: The transition.
    public func propertiesChanged(at path: String, on bus: BusAddress, during body: () throws -> Void) rethrows -> [BusPropertiesChanged] {
        let before = exportedObject(at: path, on: bus)
        try body()
        return exportedObject(at: path, on: bus)?.propertiesChanged(from: before) ?? []
    }
}

extension ProgramTester {
    /// The object the current model exports at `path` on `bus`, or nil.
    /// - Parameters:
    ///   - path: The object path.
    ///   - bus: The bus.
    public func exportedObject(at path: String, on bus: BusAddress) -> BusObject? {
        subscriptions[BusObjectSource.id(bus: bus, path: path)]?.configuration.base as? BusObject
    }

    /// Calls `interface.member` on the object at `path` as `caller`,
    /// checked as the driver checks it; a delivered call runs `update`.
    /// - Parameters:
    ///   - member: The method.
    ///   - interface: The interface.
    ///   - path: The object path.
    ///   - bus: The bus.
    ///   - arguments: The arguments.
    ///   - caller: Who calls.
    ///   - replies: The tokens' replier.
    ///   - sourceLocation: Where an object the model does not export is reported.
    /// - Returns: What the call came to, and the commands `update` returned (none when refused).
    @discardableResult
    public mutating func call(_ member: String, interface: String, at path: String, on bus: BusAddress, arguments: [BusValue] = [],
                              caller: BusCredentials = testBusCaller, replies: BusReplyRecorder,
                              sourceLocation: SourceLocation = #_sourceLocation) -> (BusTestCall, [P.Command]) {
        guard let object = exportedObject(at: path, on: bus) else {
            return (.refused(BusError("org.freedesktop.DBus.Error.UnknownObject", "Unknown object '\(path)'")), [])
        }
        switch object.admit(interface: interface, member: member, signature: arguments.map(\.type.description).joined(), caller: caller) {
        case .failure(let e): return (.refused(e), [])
        case .success:
            let token = replies.token()
            let call = BusIncomingCall(path: path, interface: interface, member: member, arguments: arguments, caller: caller, token: token)
            let commands = event(BusObjectSource.Event.call(call), from: BusObjectSource.id(bus: bus, path: path), sourceLocation: sourceLocation) ?? []
            return (.delivered(token), commands)
        }
    }

    /// Sends `message` and returns the `PropertiesChanged` signals the
    /// object at `path` emits for it (none when no exported property changed).
    /// - Parameters:
    ///   - message: The message.
    ///   - path: The object path.
    ///   - bus: The bus.
    public mutating func propertiesChanged(by message: P.Message, at path: String, on bus: BusAddress) -> [BusPropertiesChanged] {
        let before = exportedObject(at: path, on: bus)
        send(message)
        return exportedObject(at: path, on: bus)?.propertiesChanged(from: before) ?? []
    }
}
