import CSystemd
import Glibc
import Reconcile

extension BusObjectSource: SystemdSource {
    /// Exports the object on the driver's shared connection to its bus.
    public static func start(_ ticket: SourceTicket, _ configuration: BusObject, context: SourceContext) throws -> any RunningSource {
        if let problem = configuration.problem {
            throw SourceFailure(operation: "export \(configuration.path)", reason: "the object's declaration is invalid: \(problem)")
        }
        return BusObjectRunner(ticket: ticket, object: configuration, connection: context.driver.buses.connection(configuration.bus),
                               logger: context.logger)
    }
}

/// An exported object: one `sd_bus_add_object` message handler (no C
/// vtable) answering Introspect, Properties.Get/GetAll/Set and the declared
/// methods from the current configuration (the last reconciled model).
/// A retune emits the `PropertiesChanged` signals the change calls for.
///
/// Calls wait for their caller's credentials (`GetConnectionCredentials`
/// on the bus driver, asynchronously, cached per unique name for this
/// connection) before the access check and the event; `Get`/`GetAll` and
/// `Introspect` are answered at once.
final class BusObjectRunner: RunningSource, BusConnectionClient {
    /// At most this many calls wait (for credentials or for the program's
    /// reply); more are answered LimitsExceeded.
    static let maximumWaiting = 10_000

    private unowned let ticket: SourceTicket
    private(set) var object: BusObject
    private let connection: BusConnection
    private let logger: DaemonLogger
    private var slot: OpaquePointer?
    private var xml: String?
    let replies = BusObjectReplies()
    /// Callers' credentials on the current connection (unique names are
    /// never reused on one bus, so an entry stays true).
    private var credentials: [String: BusCredentials] = [:]
    /// Calls waiting for their caller's credentials, per caller, in order.
    private var waitingForCredentials: [String: [OpaquePointer]] = [:]
    private var waitingCount = 0
    private var stopped = false
    /// PropertiesChanged signals sent (tests and benchmarks).
    private(set) var propertiesChangedSent = 0

    init(ticket: SourceTicket, object: BusObject, connection: BusConnection, logger: DaemonLogger) {
        self.ticket = ticket
        self.object = object
        self.connection = connection
        self.logger = logger
        connection.register(self)
    }

    // MARK: Connection

    func busConnected(_ connection: BusConnection) {
        guard !stopped, slot == nil, let bus = connection.handle else { return }
        var s: OpaquePointer?
        let r = sd_bus_add_object(bus, &s, object.path, { m, ud, _ in
            guard let ud, let m else { return 0 }
            let me = Unmanaged<BusObjectRunner>.fromOpaque(ud).takeUnretainedValue()
            var handled: Int32 = 0
            me.connection.inCallback { handled = me.handle(m) }
            return handled
        }, Unmanaged.passUnretained(self).toOpaque())
        guard r >= 0 else {
            return ticket.fail(SourceFailure(operation: "sd_bus_add_object \(object.path)", code: -r,
                                             reason: "cannot export \(object.path) on the \(object.bus) bus"))
        }
        slot = s
    }

    /// The bus went: one `.failed` event, delivered as an event rather
    /// than a source failure, because this runner exports the object again
    /// by itself when the bus is back; a failed source's next change would
    /// be a restart (a new export, no `PropertiesChanged`) instead of a retune.
    func busLost(_ failure: SourceFailure) {
        releaseSlot()
        forgetCallers()
        replies.dropAll()   // their connection is gone: no reply can be sent
        if !stopped { ticket.emit(BusObjectSource.Event.failed(failure)) }
    }

    private func releaseSlot() {
        if let slot {
            sd_bus_slot_set_userdata(slot, nil)
            sd_bus_slot_unref(slot)
        }
        slot = nil
    }

    /// Drops the credentials and the calls waiting for them (answered with
    /// `error` when the connection can still carry it).
    private func forgetCallers(answering error: BusError? = nil) {
        credentials = [:]
        for (_, ms) in waitingForCredentials {
            for m in ms {
                if let error { busSendError(m, error) }
                sd_bus_message_unref(m)
            }
        }
        waitingForCredentials = [:]
        waitingCount = 0
    }

    // MARK: Incoming messages

    /// One message for the object's path: 1 when answered (or to be), 0 to
    /// let sd-bus answer (Peer).
    private func handle(_ m: OpaquePointer) -> Int32 {
        guard !stopped, connection.isCurrent(m), sd_bus_message_is_method_call(m, nil, nil) > 0 else { return 0 }
        let interface = sd_bus_message_get_interface(m).map { String(cString: $0) }
        let member = sd_bus_message_get_member(m).map { String(cString: $0) } ?? ""
        let signature = sd_bus_message_get_signature(m, 1).map { String(cString: $0) } ?? ""
        switch interface {
        case "org.freedesktop.DBus.Peer":
            return 0
        case "org.freedesktop.DBus.Introspectable":
            guard member == "Introspect", signature.isEmpty else { return replyError(m, unknown(interface, member, signature)) }
            return replyValues(m, [.string(introspection)])
        case "org.freedesktop.DBus.Properties":
            return properties(m, member: member, signature: signature)
        default:
            if interface == nil, member == "Introspect", signature.isEmpty,
               !object.interfaces.contains(where: { $0.method("Introspect") != nil }) {
                return replyValues(m, [.string(introspection)])
            }
            // Unknown members and wrong signatures are answered before the
            // credentials are asked for; access after.
            if case .failure(let e) = object.resolve(interface: interface, member: member, signature: signature) {
                return replyError(m, e)
            }
            return withCaller(m)
        }
    }

    private func unknown(_ interface: String?, _ member: String, _ signature: String) -> BusError {
        BusError(BusError.unknownMethod, "Unknown method \(member)(\(signature)) on \(interface ?? object.path)")
    }

    private var introspection: String {
        if let xml { return xml }
        let text = object.introspectionXML
        xml = text
        return text
    }

    private func properties(_ m: OpaquePointer, member: String, signature: String) -> Int32 {
        switch (member, signature) {
        case ("Get", "ss"):
            guard let args = try? BusMarshalling.readAll(m), args.count == 2, let i = args[0].string, let p = args[1].string else {
                return replyError(m, BusError(BusError.invalidArgs, "Get takes (ss)"))
            }
            switch object.get(interface: i, property: p) {
            case .success(let v): return replyValues(m, [.variant(v)])
            case .failure(let e): return replyError(m, e)
            }
        case ("GetAll", "s"):
            guard let args = try? BusMarshalling.readAll(m), let i = args.first?.string else {
                return replyError(m, BusError(BusError.invalidArgs, "GetAll takes (s)"))
            }
            switch object.getAll(interface: i) {
            case .success(let all):
                return replyValues(m, [.dictionary(key: .string, value: .variant, all.map { BusDictionaryEntry(.string($0.name), .variant($0.value)) })])
            case .failure(let e): return replyError(m, e)
            }
        case ("Set", "ssv"):
            return withCaller(m)
        case ("Get", _), ("GetAll", _), ("Set", _):
            return replyError(m, BusError(BusError.invalidArgs, "Properties.\(member) does not take (\(signature))"))
        default:
            return replyError(m, unknown("org.freedesktop.DBus.Properties", member, signature))
        }
    }

    /// Runs `dispatch` for `m` once its sender's credentials are known.
    private func withCaller(_ m: OpaquePointer) -> Int32 {
        guard let sender = sd_bus_message_get_sender(m).map({ String(cString: $0) }) else {
            return replyError(m, BusError(BusError.accessDenied, "the call has no sender"))
        }
        if let caller = credentials[sender], waitingForCredentials[sender] == nil {
            dispatch(m, caller)
            return 1
        }
        guard waitingCount + replies.count < Self.maximumWaiting else {
            return replyError(m, BusError(BusError.limitsExceeded, "\(Self.maximumWaiting) calls to \(object.path) are waiting"))
        }
        sd_bus_message_ref(m)
        waitingCount += 1
        if waitingForCredentials[sender] != nil {
            waitingForCredentials[sender]!.append(m)
            return 1
        }
        waitingForCredentials[sender] = [m]
        connection.call(service: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                        method: "GetConnectionCredentials", arguments: [.string(sender)], timeout: nil) { [weak self] result in
            self?.credentialsArrived(sender, result)
        }
        return 1
    }

    private func credentialsArrived(_ sender: String, _ result: Result<[BusValue], BusError>) {
        guard let waiting = waitingForCredentials.removeValue(forKey: sender) else { return }
        waitingCount -= waiting.count
        defer { for m in waiting { sd_bus_message_unref(m) } }
        guard !stopped, case .success(let values) = result, let info = values.first else {
            // The caller left before we knew who it was: nothing to answer.
            return
        }
        let caller = BusCredentials(uniqueName: sender, uid: info["UnixUserID"]?.uint64.flatMap(UInt32.init(exactly:)), pid: info["ProcessID"]?.uint64.flatMap(UInt32.init(exactly:)))
        credentials[sender] = caller
        for m in waiting where !stopped && connection.isCurrent(m) { dispatch(m, caller) }
    }

    /// A call whose caller is known: access, arguments, then the event.
    private func dispatch(_ m: OpaquePointer, _ caller: BusCredentials) {
        sd_bus_message_rewind(m, 1)
        let interface = sd_bus_message_get_interface(m).map { String(cString: $0) }
        let member = sd_bus_message_get_member(m).map { String(cString: $0) } ?? ""
        let signature = sd_bus_message_get_signature(m, 1).map { String(cString: $0) } ?? ""
        let arguments: [BusValue]
        do { arguments = try BusMarshalling.readAll(m) } catch {
            _ = replyError(m, BusError(BusError.invalidArgs, "the arguments cannot be read: \(error.reason)"))
            return
        }
        if interface == "org.freedesktop.DBus.Properties" {
            guard arguments.count == 3, let i = arguments[0].string, let p = arguments[1].string else {
                _ = replyError(m, BusError(BusError.invalidArgs, "Set takes (ssv)"))
                return
            }
            switch object.admitWrite(interface: i, property: p, value: arguments[2].variantContentOnce, caller: caller) {
            case .failure(let e): _ = replyError(m, e)
            case .success:
                let token = replies.add(m, outputSignature: "")
                ticket.emit(BusObjectSource.Event.write(BusPropertyWrite(
                    path: object.path, interface: i, property: p, value: arguments[2].variantContentOnce, caller: caller, token: token)))
            }
            return
        }
        switch object.admit(interface: interface, member: member, signature: signature, caller: caller) {
        case .failure(let e): _ = replyError(m, e)
        case .success(let (name, method)):
            let token = replies.add(m, outputSignature: method.outputSignature)
            ticket.emit(BusObjectSource.Event.call(BusIncomingCall(
                path: sd_bus_message_get_path(m).map { String(cString: $0) } ?? object.path, interface: name, member: member,
                arguments: arguments, caller: caller, token: token)))
        }
    }

    private func replyValues(_ m: OpaquePointer, _ values: [BusValue]) -> Int32 {
        if let e = busSendReply(m, values) { logger.warning("bus: cannot answer \(object.path): \(e)") }
        return 1
    }

    private func replyError(_ m: OpaquePointer, _ error: BusError) -> Int32 {
        busSendError(m, error)
        return 1
    }

    // MARK: Changes

    func retune(to configuration: AnyHashable) throws {
        guard let new = configuration.base as? BusObject else { return }
        if let problem = new.problem {
            throw SourceFailure(operation: "export \(new.path)", reason: "the object's declaration is invalid (the last valid one stays): \(problem)")
        }
        let old = object
        object = new
        if old.interfaces.count != new.interfaces.count || !zip(old.interfaces, new.interfaces).allSatisfy(Self.sameDeclaration) {
            xml = nil
        }
        guard connection.isUp, let bus = connection.handle else { return }
        for change in new.propertiesChanged(from: old) {
            var s: OpaquePointer?
            var r = sd_bus_message_new_signal(bus, &s, change.path, "org.freedesktop.DBus.Properties", "PropertiesChanged")
            guard r >= 0, let s else { logger.warning("bus: cannot make PropertiesChanged (errno \(-r))"); continue }
            defer { sd_bus_message_unref(s) }
            do { try BusMarshalling.append(s, change.arguments) } catch {
                logger.warning("bus: cannot send PropertiesChanged of \(change.interface): \(error)")
                continue
            }
            r = sd_bus_send(nil, s, nil)
            if r < 0 { logger.warning("bus: sending PropertiesChanged failed (errno \(-r))") } else { propertiesChangedSent += 1 }
        }
    }

    /// Whether two interfaces declare the same members (values aside).
    private static func sameDeclaration(_ a: BusInterface, _ b: BusInterface) -> Bool {
        a.name == b.name && a.methods == b.methods && a.signals == b.signals
            && a.properties.count == b.properties.count
            && zip(a.properties, b.properties).allSatisfy { $0.name == $1.name && $0.type == $1.type && $0.change == $1.change && $0.write == $1.write }
    }

    func stop() {
        guard !stopped else { return }
        stopped = true
        releaseSlot()
        let gone = BusError(BusError.failed, "\(object.path) was unexported before it answered")
        forgetCallers(answering: connection.isUp ? gone : nil)
        replies.close(gone)
        connection.unregister(self)
    }

    deinit { stop() }
}

extension BusValue {
    /// The content of one variant level (a `Set`'s `v`), else the value.
    var variantContentOnce: BusValue {
        if case .variant(let inner) = self { return inner }
        return self
    }
}

/// The calls of one exported object waiting for the program's reply; what
/// its tokens answer through. Loop thread only (the driver performs
/// commands there).
final class BusObjectReplies: BusReplier, @unchecked Sendable {
    private var next: UInt64 = 0
    private var waiting: [UInt64: (message: OpaquePointer, outputSignature: String)] = [:]

    /// How many calls wait.
    var count: Int { waiting.count }

    /// A token for `m` (referenced until it is answered or dropped).
    func add(_ m: OpaquePointer, outputSignature: String) -> BusReplyToken {
        next += 1
        sd_bus_message_ref(m)
        waiting[next] = (m, outputSignature)
        return BusReplyToken(serial: next, replier: self)
    }

    func reply(_ token: BusReplyToken, with result: Result<[BusValue], BusError>) -> Bool {
        guard token.replier === self, let (m, signature) = waiting.removeValue(forKey: token.serial) else { return false }
        defer { sd_bus_message_unref(m) }
        switch result {
        case .success(let values):
            let got = values.map(\.type.description).joined()
            guard got == signature else {
                busSendError(m, BusError(BusError.failed, "the service's reply (\(got)) does not match the declared (\(signature))"))
                return false
            }
            if let e = busSendReply(m, values) {
                busSendError(m, e)
                return false
            }
        case .failure(let e):
            busSendError(m, e)
        }
        return true
    }

    /// The connection went: the calls cannot be answered.
    func dropAll() {
        for (_, w) in waiting { sd_bus_message_unref(w.message) }
        waiting = [:]
    }

    /// The object goes: every waiting call gets `error`; later replies do nothing.
    func close(_ error: BusError) {
        for (_, w) in waiting.sorted(by: { $0.key < $1.key }) {
            busSendError(w.message, error)
            sd_bus_message_unref(w.message)
        }
        waiting = [:]
    }
}

/// Sends a method return for `m` with `values`; the error when it cannot.
func busSendReply(_ m: OpaquePointer, _ values: [BusValue]) -> BusError? {
    var r: OpaquePointer?
    var rc = sd_bus_message_new_method_return(m, &r)
    guard rc >= 0, let r else { return BusError(BusError.failed, "cannot make the reply (errno \(-rc))") }
    defer { sd_bus_message_unref(r) }
    do { try BusMarshalling.append(r, values) } catch {
        return BusError(BusError.failed, "the reply cannot be sent: \(error.reason)")
    }
    rc = sd_bus_send(nil, r, nil)
    return rc < 0 ? BusError(BusError.failed, "sending the reply failed (errno \(-rc))") : nil
}

/// Sends the error reply `error` for `m` (nothing when it cannot be sent:
/// the caller gets NoReply).
func busSendError(_ m: OpaquePointer, _ error: BusError) {
    error.name.withCString { name in
        error.message.withCString { message in
            var e = sd_bus_error(name: name, message: message, _need_free: 0)
            _ = sd_bus_reply_method_error(m, &e)
        }
    }
}

extension SystemdDriver: BusSignalEmitter {
    /// Emits `signal` on this driver's connection to its bus.
    /// - Parameter signal: The signal.
    /// - Throws: `BusError` Disconnected when the bus is not connected,
    ///   InvalidArgs when the values cannot be sent.
    public func emit(_ signal: BusSignalEmission) throws(BusError) {
        guard let bus = buses.connected(signal.bus).handle else {
            throw BusError(BusError.disconnected, "not connected to the \(signal.bus) bus")
        }
        var s: OpaquePointer?
        var r = sd_bus_message_new_signal(bus, &s, signal.path, signal.interface, signal.member)
        guard r >= 0, let s else { throw BusError(BusError.invalidArgs, "cannot make the signal \(signal): errno \(-r)") }
        defer { sd_bus_message_unref(s) }
        do { try BusMarshalling.append(s, signal.values) } catch { throw BusError(BusError.invalidArgs, "\(signal): \(error.reason)") }
        r = sd_bus_send(nil, s, nil)
        if r < 0 { throw BusError(BusError.disconnected, "sending \(signal) failed: errno \(-r)") }
    }

    /// Performs a bus command: a reply through its token, a signal on the bus.
    /// - Parameter command: The command.
    /// - Returns: false when the reply found no waiting call or the signal could not be sent.
    @discardableResult
    public func perform(_ command: BusCommand) -> Bool { command.perform(emitter: self) }
}
