/// Who called: the caller's credentials as the bus daemon knows them (from
/// the connection's socket, asked with `GetConnectionCredentials`), never
/// from the message body.
public struct BusCredentials: Hashable, Sendable, CustomStringConvertible {
    /// The caller's unique name (`:1.42`).
    public var uniqueName: String
    /// The caller's user id; nil when the bus did not say.
    public var uid: UInt32?
    /// The caller's process id; nil when the bus did not say.
    public var pid: UInt32?

    /// Credentials as the bus reports them (tests build them by hand).
    public init(uniqueName: String, uid: UInt32?, pid: UInt32?) {
        self.uniqueName = uniqueName
        self.uid = uid
        self.pid = pid
    }

    /// `:1.42 uid 0 pid 123`.
    public var description: String {
        "\(uniqueName) uid \(uid.map(String.init) ?? "?") pid \(pid.map(String.init) ?? "?")"
    }
}

/// Who may call a method or write a property. A caller it refuses gets
/// `org.freedesktop.DBus.Error.AccessDenied` before `update` sees the call.
public struct BusAccess: Hashable, Sendable, CustomStringConvertible {
    enum Rule: Hashable, Sendable {
        case anyone
        case uids(Set<UInt32>)
        case predicate(String)
    }
    let rule: Rule
    let predicate: (@Sendable (BusCredentials) -> Bool)?

    /// Any caller.
    public static let anyone = BusAccess(rule: .anyone, predicate: nil)
    /// Only uid 0.
    public static let root = BusAccess(rule: .uids([0]), predicate: nil)

    /// Callers whose uid is in `uids` (root is not implied).
    /// - Parameter uids: The user ids allowed.
    public static func uids(_ uids: Set<UInt32>) -> BusAccess { BusAccess(rule: .uids(uids), predicate: nil) }

    /// Callers `allows` says yes to. Two predicates are the same access (a
    /// keep, not a retune) when their `name`s are equal.
    /// - Parameters:
    ///   - name: Names the predicate in plans and comparisons.
    ///   - allows: Decides from the caller's credentials.
    public static func predicate(_ name: String, _ allows: @escaping @Sendable (BusCredentials) -> Bool) -> BusAccess {
        BusAccess(rule: .predicate(name), predicate: allows)
    }

    /// Whether `caller` may call. A caller whose uid the bus did not report
    /// passes only `.anyone` (and a predicate that says so).
    /// - Parameter caller: The caller's credentials.
    public func allows(_ caller: BusCredentials) -> Bool {
        switch rule {
        case .anyone: true
        case .uids(let set): caller.uid.map(set.contains) ?? false
        case .predicate: predicate?(caller) ?? false
        }
    }

    /// Equal rules (predicates by name).
    public static func == (a: BusAccess, b: BusAccess) -> Bool { a.rule == b.rule }
    /// Hashes the rule.
    public func hash(into hasher: inout Hasher) { hasher.combine(rule) }

    /// `anyone`, `uids [0]`, `predicate name`.
    public var description: String {
        switch rule {
        case .anyone: "anyone"
        case .uids(let set): "uids \(set.sorted())"
        case .predicate(let name): "predicate \(name)"
        }
    }
}

/// A named, typed argument of a method or signal.
public struct BusArgument: Hashable, Sendable {
    /// The argument's name (shown by introspection).
    public var name: String
    /// Its type.
    public var type: BusType

    /// An argument `name` of `type`.
    public init(_ name: String, _ type: BusType) {
        self.name = name
        self.type = type
    }
}

/// A method an exported object serves.
public struct BusMethodDeclaration: Hashable, Sendable {
    /// The member name (`Refresh`).
    public var name: String
    /// The arguments it takes.
    public var inputs: [BusArgument]
    /// The values it returns.
    public var outputs: [BusArgument]
    /// Who may call it.
    public var access: BusAccess
    /// The input signature (`ss`), what a call's body must have.
    public let inputSignature: String
    /// The output signature.
    public let outputSignature: String

    /// A method `name` taking `inputs`, returning `outputs`, callable by `access`.
    public init(_ name: String, inputs: [BusArgument] = [], outputs: [BusArgument] = [], access: BusAccess = .anyone) {
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.access = access
        inputSignature = inputs.map(\.type.description).joined()
        outputSignature = outputs.map(\.type.description).joined()
    }
}

/// How clients hear of a property's changes (the
/// `org.freedesktop.DBus.Property.EmitsChangedSignal` annotation).
public enum BusPropertyChange: Hashable, Sendable {
    /// The new value in `PropertiesChanged` (`true`).
    case emits
    /// Its name in `PropertiesChanged`'s invalidated list, for values too
    /// large to send on every change (`invalidates`).
    case invalidates
    /// It never changes while the object is exported (`const`).
    case constant
    /// No signal (`false`): clients read it when they want it.
    case none

    var annotation: String {
        switch self {
        case .emits: "true"
        case .invalidates: "invalidates"
        case .constant: "const"
        case .none: "false"
        }
    }
}

/// A property of an exported object, with its current value: a pure
/// function of the model, computed by `subscriptions(model)`.
public struct BusExportedProperty: Hashable, Sendable {
    /// The property's name (`State`).
    public var name: String
    /// Its declared type.
    public var type: BusType
    /// The value now (of `type`; for a `v` property, a `.variant`).
    public var value: BusValue
    /// How changes are signalled.
    public var change: BusPropertyChange
    /// Who may write it (`Properties.Set`); nil: read-only.
    public var write: BusAccess?

    /// A property `name` of `type` whose value is `value`.
    public init(_ name: String, _ type: BusType, _ value: BusValue, change: BusPropertyChange = .emits, write: BusAccess? = nil) {
        self.name = name
        self.type = type
        self.value = value
        self.change = change
        self.write = write
    }

    /// A property whose type is its value's type.
    public init(_ name: String, _ value: BusValue, change: BusPropertyChange = .emits, write: BusAccess? = nil) {
        self.init(name, value.type, value, change: change, write: write)
    }
}

/// A signal an exported object declares (for introspection; emit it with
/// `BusCommand.emitSignal`).
public struct BusSignalDeclaration: Hashable, Sendable {
    /// The member name.
    public var name: String
    /// Its arguments.
    public var arguments: [BusArgument]

    /// A signal `name` with `arguments`.
    public init(_ name: String, arguments: [BusArgument] = []) {
        self.name = name
        self.arguments = arguments
    }
}

/// One interface of an exported object.
public struct BusInterface: Hashable, Sendable {
    /// The interface name (`org.reconcile.Connectivity1`).
    public var name: String
    /// Its methods.
    public var methods: [BusMethodDeclaration]
    /// Its properties and their current values.
    public var properties: [BusExportedProperty]
    /// Its signals.
    public var signals: [BusSignalDeclaration]

    /// An interface `name` with its members.
    public init(_ name: String, methods: [BusMethodDeclaration] = [], properties: [BusExportedProperty] = [],
                signals: [BusSignalDeclaration] = []) {
        self.name = name
        self.methods = methods
        self.properties = properties
        self.signals = signals
    }

    /// The method `name`, if declared.
    public func method(_ name: String) -> BusMethodDeclaration? { methods.first { $0.name == name } }
    /// The property `name`, if declared.
    public func property(_ name: String) -> BusExportedProperty? { properties.first { $0.name == name } }
}

/// An object served on a bus: its path, interfaces, properties (with the
/// model's values) and methods. The configuration of a `BusObjectSource`.
public struct BusObject: Hashable, Sendable, CustomStringConvertible {
    /// The bus.
    public var bus: BusAddress
    /// The object path.
    public var path: String
    /// Its interfaces.
    public var interfaces: [BusInterface]

    /// An object at `path` on `bus`.
    public init(bus: BusAddress, path: String, interfaces: [BusInterface]) {
        self.bus = bus
        self.path = path
        self.interfaces = interfaces
    }

    /// The interface `name`, if declared.
    public func interface(_ name: String) -> BusInterface? { interfaces.first { $0.name == name } }

    /// Bus and path only (equal objects hash equal; configurations are compared, not hashed).
    public func hash(into hasher: inout Hasher) {
        hasher.combine(bus)
        hasher.combine(path)
    }

    /// `bus path (n interfaces)`.
    public var description: String { "\(bus) \(path) (\(interfaces.map(\.name).joined(separator: ", ")))" }
}

/// One `org.freedesktop.DBus.Properties.PropertiesChanged` signal.
public struct BusPropertiesChanged: Hashable, Sendable, CustomStringConvertible {
    /// The object path.
    public var path: String
    /// The interface whose properties changed.
    public var interface: String
    /// The changed properties with their new values, in declaration order.
    public var changed: [BusPropertyValue]
    /// The properties that changed but are not sent (`.invalidates`).
    public var invalidated: [String]

    /// A signal for `interface` at `path`.
    public init(path: String, interface: String, changed: [BusPropertyValue], invalidated: [String] = []) {
        self.path = path
        self.interface = interface
        self.changed = changed
        self.invalidated = invalidated
    }

    /// The signal's arguments: `s`, `a{sv}`, `as`.
    public var arguments: [BusValue] {
        [.string(interface),
         .dictionary(key: .string, value: .variant, changed.map { BusDictionaryEntry(.string($0.name), .variant($0.value)) }),
         .array(element: .string, invalidated.map(BusValue.string))]
    }

    /// `path interface changed [..] invalidated [..]`.
    public var description: String {
        "\(path) \(interface) changed \(changed.map { "\($0.name)=\($0.value)" }) invalidated \(invalidated)"
    }
}

/// A property's name and value.
public struct BusPropertyValue: Hashable, Sendable {
    /// The property's name.
    public var name: String
    /// Its value.
    public var value: BusValue

    /// `name` = `value`.
    public init(_ name: String, _ value: BusValue) {
        self.name = name
        self.value = value
    }
}

extension BusObject {
    /// The `PropertiesChanged` signals that moving from `old` to `self`
    /// emits: one per interface with at least one changed property, listing
    /// only the changed ones (by name), values for `.emits`, names for
    /// `.invalidates`; `.constant` and `.none` properties are never sent,
    /// and nothing is sent for an interface `old` did not have. Empty when
    /// nothing changed.
    /// - Parameter old: The object as last exported (nil: just exported).
    public func propertiesChanged(from old: BusObject?) -> [BusPropertiesChanged] {
        guard let old else { return [] }
        var out: [BusPropertiesChanged] = []
        for (i, interface) in interfaces.enumerated() {
            // The same position first (the usual case), else by name.
            let before: BusInterface
            if i < old.interfaces.count, old.interfaces[i].name == interface.name {
                before = old.interfaces[i]
            } else if let b = old.interface(interface.name) {
                before = b
            } else { continue }
            if before.properties == interface.properties { continue }
            var changed: [BusPropertyValue] = []
            var invalidated: [String] = []
            for (j, p) in interface.properties.enumerated() {
                let was: BusExportedProperty?
                if j < before.properties.count, before.properties[j].name == p.name { was = before.properties[j] } else { was = before.property(p.name) }
                guard let was, was.value != p.value else { continue }
                switch p.change {
                case .emits: changed.append(BusPropertyValue(p.name, p.value))
                case .invalidates: invalidated.append(p.name)
                case .constant, .none: break
                }
            }
            if !changed.isEmpty || !invalidated.isEmpty {
                out.append(BusPropertiesChanged(path: path, interface: interface.name, changed: changed, invalidated: invalidated))
            }
        }
        return out
    }

    /// What is wrong with this declaration, nil when nothing: invalid path
    /// or names, duplicate interfaces or members, a property value that is
    /// not of its declared type. A runner refuses to export a bad one (a
    /// `.failed` event).
    public var problem: String? {
        guard BusObjectPath.isValid(path) else { return "invalid object path '\(path)'" }
        var seen = Set<String>()
        for i in interfaces {
            guard isValidInterfaceName(i.name) else { return "invalid interface name '\(i.name)'" }
            guard seen.insert(i.name).inserted else { return "interface \(i.name) is declared twice" }
            var members = Set<String>()
            for m in i.methods {
                guard isValidMemberName(m.name) else { return "invalid method name '\(i.name).\(m.name)'" }
                guard members.insert("m" + m.name).inserted else { return "method \(i.name).\(m.name) is declared twice" }
                for a in m.inputs + m.outputs where !isValidMemberName(a.name) { return "invalid argument name '\(a.name)' of \(i.name).\(m.name)" }
            }
            for p in i.properties {
                guard isValidMemberName(p.name) else { return "invalid property name '\(i.name).\(p.name)'" }
                guard members.insert("p" + p.name).inserted else { return "property \(i.name).\(p.name) is declared twice" }
                guard p.value.type == p.type else { return "property \(i.name).\(p.name) is declared \(p.type) but its value is \(p.value.type)" }
            }
            for s in i.signals {
                guard isValidMemberName(s.name) else { return "invalid signal name '\(i.name).\(s.name)'" }
                for a in s.arguments where !isValidMemberName(a.name) { return "invalid argument name '\(a.name)' of \(i.name).\(s.name)" }
            }
        }
        return nil
    }

    /// The object's introspection XML (what `Introspect` answers): the
    /// standard Peer, Introspectable and Properties interfaces, then each
    /// declared interface with its methods, properties (type, access, the
    /// EmitsChangedSignal annotation) and signals. Names are validated
    /// (`problem`), so nothing needs escaping.
    public var introspectionXML: String {
        var x = """
            <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
            <node>
             <interface name="org.freedesktop.DBus.Peer">
              <method name="Ping"/>
              <method name="GetMachineId">
               <arg type="s" name="machine_uuid" direction="out"/>
              </method>
             </interface>
             <interface name="org.freedesktop.DBus.Introspectable">
              <method name="Introspect">
               <arg name="xml_data" type="s" direction="out"/>
              </method>
             </interface>
             <interface name="org.freedesktop.DBus.Properties">
              <method name="Get">
               <arg name="interface_name" direction="in" type="s"/>
               <arg name="property_name" direction="in" type="s"/>
               <arg name="value" direction="out" type="v"/>
              </method>
              <method name="GetAll">
               <arg name="interface_name" direction="in" type="s"/>
               <arg name="props" direction="out" type="a{sv}"/>
              </method>
              <method name="Set">
               <arg name="interface_name" direction="in" type="s"/>
               <arg name="property_name" direction="in" type="s"/>
               <arg name="value" direction="in" type="v"/>
              </method>
              <signal name="PropertiesChanged">
               <arg type="s" name="interface_name"/>
               <arg type="a{sv}" name="changed_properties"/>
               <arg type="as" name="invalidated_properties"/>
              </signal>
             </interface>

            """
        for i in interfaces {
            x += " <interface name=\"\(i.name)\">\n"
            for m in i.methods {
                x += "  <method name=\"\(m.name)\">\n"
                for a in m.inputs { x += "   <arg name=\"\(a.name)\" type=\"\(a.type)\" direction=\"in\"/>\n" }
                for a in m.outputs { x += "   <arg name=\"\(a.name)\" type=\"\(a.type)\" direction=\"out\"/>\n" }
                x += "  </method>\n"
            }
            for s in i.signals {
                x += "  <signal name=\"\(s.name)\">\n"
                for a in s.arguments { x += "   <arg name=\"\(a.name)\" type=\"\(a.type)\"/>\n" }
                x += "  </signal>\n"
            }
            for p in i.properties {
                x += "  <property name=\"\(p.name)\" type=\"\(p.type)\" access=\"\(p.write == nil ? "read" : "readwrite")\">\n"
                x += "   <annotation name=\"org.freedesktop.DBus.Property.EmitsChangedSignal\" value=\"\(p.change.annotation)\"/>\n"
                x += "  </property>\n"
            }
            x += " </interface>\n"
        }
        return x + "</node>\n"
    }
}
