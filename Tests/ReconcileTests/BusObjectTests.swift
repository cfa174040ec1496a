import Reconcile
import Testing

private let bus = BusAddress.address("unix:path=/run/test/bus")

private func object(state: String = "idle", online: Bool = false, label: String = "l", big: [UInt8] = [1],
                    constant: Int32 = 1, hidden: Int32 = 1) -> BusObject {
    BusObject(bus: bus, path: "/org/example/Thing", interfaces: [
        BusInterface("org.example.Thing1", methods: [
            BusMethodDeclaration("Echo", inputs: [BusArgument("text", .string)], outputs: [BusArgument("text", .string)]),
            BusMethodDeclaration("Reset", inputs: [BusArgument("reason", .string), BusArgument("force", .boolean)], access: .root),
        ], properties: [
            BusExportedProperty("State", .string(state)),
            BusExportedProperty("Online", .boolean(online)),
            BusExportedProperty("Big", .bytes(big), change: .invalidates),
            BusExportedProperty("Version", .int32(constant), change: .constant),
            BusExportedProperty("Hidden", .int32(hidden), change: .none),
            BusExportedProperty("Mode", .string("auto"), write: .uids([1000])),
        ], signals: [BusSignalDeclaration("Changed", arguments: [BusArgument("state", .string)])]),
        BusInterface("org.example.Thing1.Extra", properties: [BusExportedProperty("Label", .string(label))]),
    ])
}

private let nobody = BusCredentials(uniqueName: ":1.7", uid: 65534, pid: 7)
private let root = BusCredentials(uniqueName: ":1.8", uid: 0, pid: 8)

@Suite struct BusObjectTests {
    @Test func anUnchangedObjectEmitsNoPropertiesChanged() {
        #expect(object().propertiesChanged(from: object()) == [])
        #expect(object().propertiesChanged(from: nil) == [])
    }

    @Test func oneSignalPerChangedInterfaceWithOnlyTheChangedProperties() {
        let changes = object(state: "busy", label: "m").propertiesChanged(from: object())
        #expect(changes == [
            BusPropertiesChanged(path: "/org/example/Thing", interface: "org.example.Thing1", changed: [BusPropertyValue("State", .string("busy"))]),
            BusPropertiesChanged(path: "/org/example/Thing", interface: "org.example.Thing1.Extra", changed: [BusPropertyValue("Label", .string("m"))]),
        ])
        let one = object(online: true).propertiesChanged(from: object())
        #expect(one.map(\.interface) == ["org.example.Thing1"])
        #expect(one.first?.changed == [BusPropertyValue("Online", .boolean(true))])
    }

    @Test func largePropertiesAreInvalidatedAndConstantOrSilentOnesNeverSent() {
        #expect(object(big: [1, 2, 3]).propertiesChanged(from: object()) == [
            BusPropertiesChanged(path: "/org/example/Thing", interface: "org.example.Thing1", changed: [], invalidated: ["Big"]),
        ])
        #expect(object(constant: 2, hidden: 5).propertiesChanged(from: object()) == [])
    }

    @Test func theSignalsArgumentsAreInterfaceChangedAndInvalidated() {
        let change = BusPropertiesChanged(path: "/p", interface: "a.B", changed: [BusPropertyValue("X", .int32(1))], invalidated: ["Y"])
        #expect(change.arguments == [.string("a.B"),
                                     .dictionary(key: .string, value: .variant, [BusDictionaryEntry(.string("X"), .variant(.int32(1)))]),
                                     .array(element: .string, [.string("Y")])])
        #expect(change.arguments.map(\.type.description) == ["s", "a{sv}", "as"])
    }

    @Test func callsAreResolvedTypeCheckedAndAdmittedByCredentials() {
        let o = object()
        #expect(o.admit(interface: "org.example.Thing1", member: "Echo", signature: "s", caller: nobody).map(\.method.name) == .success("Echo"))
        // Without an interface, the first that declares the member.
        #expect(o.admit(interface: nil, member: "Echo", signature: "s", caller: nobody).map(\.interface) == .success("org.example.Thing1"))
        #expect(o.admit(interface: "org.example.Thing1", member: "Echo", signature: "i", caller: nobody).errorName == BusError.invalidArgs)
        #expect(o.admit(interface: "org.example.Thing1", member: "Nope", signature: "", caller: nobody).errorName == BusError.unknownMethod)
        #expect(o.admit(interface: "org.example.Other", member: "Echo", signature: "s", caller: nobody).errorName == BusError.unknownInterface)
        #expect(o.admit(interface: "org.example.Thing1", member: "Reset", signature: "sb", caller: nobody).errorName == BusError.accessDenied)
        #expect(o.admit(interface: "org.example.Thing1", member: "Reset", signature: "sb", caller: root).map(\.method.name) == .success("Reset"))
        // A wrong signature is InvalidArgs even for a caller who may not call.
        #expect(o.admit(interface: "org.example.Thing1", member: "Reset", signature: "s", caller: nobody).errorName == BusError.invalidArgs)
        // Unknown uid: only `.anyone`.
        let unknown = BusCredentials(uniqueName: ":1.9", uid: nil, pid: nil)
        #expect(o.admit(interface: "org.example.Thing1", member: "Reset", signature: "sb", caller: unknown).errorName == BusError.accessDenied)
    }

    @Test func accessRulesAdmitRootUidSetsAndPredicates() {
        #expect(BusAccess.anyone.allows(nobody))
        #expect(BusAccess.root.allows(root) && !BusAccess.root.allows(nobody))
        #expect(BusAccess.uids([65534]).allows(nobody) && !BusAccess.uids([65534]).allows(root))
        let even = BusAccess.predicate("even pid") { ($0.pid ?? 1) % 2 == 0 }
        #expect(even.allows(root) && !even.allows(nobody))
        #expect(even == BusAccess.predicate("even pid") { _ in false })   // compared by name
        #expect(even != BusAccess.predicate("odd pid") { _ in false })
    }

    @Test func writesNeedAWritablePropertyOfTheDeclaredTypeAndAnAdmittedCaller() {
        let o = object()
        let user = BusCredentials(uniqueName: ":1.3", uid: 1000, pid: 3)
        #expect(o.admitWrite(interface: "org.example.Thing1", property: "Mode", value: .string("x"), caller: user).map(\.name) == .success("Mode"))
        #expect(o.admitWrite(interface: "org.example.Thing1", property: "Mode", value: .int32(1), caller: user).errorName == BusError.invalidArgs)
        #expect(o.admitWrite(interface: "org.example.Thing1", property: "Mode", value: .string("x"), caller: root).errorName == BusError.accessDenied)
        #expect(o.admitWrite(interface: "org.example.Thing1", property: "State", value: .string("x"), caller: user).errorName == BusError.propertyReadOnly)
        #expect(o.admitWrite(interface: "org.example.Thing1", property: "Nope", value: .string("x"), caller: user).errorName == BusError.unknownProperty)
    }

    @Test func getAndGetAllAnswerTheDeclaredValues() {
        let o = object(state: "busy")
        #expect(o.get(interface: "org.example.Thing1", property: "State") == .success(.string("busy")))
        #expect(o.get(interface: "org.example.Thing1", property: "Nope").errorName == BusError.unknownProperty)
        #expect(o.getAll(interface: "org.example.Thing1.Extra") == .success([BusPropertyValue("Label", .string("l"))]))
        #expect(o.getAll(interface: "org.example.Nope").errorName == BusError.unknownInterface)
    }

    @Test func introspectionListsEveryDeclaredMemberWithItsTypesAndAnnotations() {
        let xml = object().introspectionXML
        for piece in ["<interface name=\"org.example.Thing1\">", "<method name=\"Echo\">",
                      "<arg name=\"text\" type=\"s\" direction=\"in\"/>", "<arg name=\"text\" type=\"s\" direction=\"out\"/>",
                      "<arg name=\"force\" type=\"b\" direction=\"in\"/>", "<signal name=\"Changed\">",
                      "<property name=\"State\" type=\"s\" access=\"read\">", "<property name=\"Mode\" type=\"s\" access=\"readwrite\">",
                      "<property name=\"Big\" type=\"ay\" access=\"read\">", "value=\"invalidates\"", "value=\"const\"", "value=\"false\"",
                      "<interface name=\"org.example.Thing1.Extra\">", "<interface name=\"org.freedesktop.DBus.Properties\">",
                      "<interface name=\"org.freedesktop.DBus.Introspectable\">", "<interface name=\"org.freedesktop.DBus.Peer\">"] {
            #expect(xml.contains(piece), "\(piece)")
        }
        #expect(xml.hasSuffix("</node>\n"))
    }

    @Test func invalidDeclarationsAreNamed() {
        #expect(object().problem == nil)
        #expect(BusObject(bus: bus, path: "no-slash", interfaces: []).problem == "invalid object path 'no-slash'")
        #expect(BusObject(bus: bus, path: "/p", interfaces: [BusInterface("single")]).problem == "invalid interface name 'single'")
        #expect(BusObject(bus: bus, path: "/p", interfaces: [BusInterface("a.b"), BusInterface("a.b")]).problem == "interface a.b is declared twice")
        #expect(BusObject(bus: bus, path: "/p", interfaces: [BusInterface("a.b", methods: [BusMethodDeclaration("Bad-name")])]).problem
                == "invalid method name 'a.b.Bad-name'")
        #expect(BusObject(bus: bus, path: "/p", interfaces: [BusInterface("a.b", properties: [BusExportedProperty("X", .string, .int32(1))])]).problem
                == "property a.b.X is declared s but its value is i")
        #expect(BusObject(bus: bus, path: "/p", interfaces: [BusInterface("a.b", methods: [BusMethodDeclaration("M", inputs: [BusArgument("<x>", .string)])])]).problem
                == "invalid argument name '<x>' of a.b.M")
    }

    @Test func aChangedObjectIsARetuneAndAnUnchangedOneAKeep() {
        #expect(BusObjectSource.canRetune(from: object(), to: object(state: "x")))
        var moved = object()
        moved.path = "/elsewhere"
        #expect(!BusObjectSource.canRetune(from: object(), to: moved))
        let a = Subscription<Int>.busObject(object()) { _ in 0 }
        let b = Subscription<Int>.busObject(object()) { _ in 1 }
        #expect(a.id == b.id && a.configuration == b.configuration)
        #expect(a.id == BusObjectSource.id(bus: bus, path: "/org/example/Thing"))
    }
}

extension Result where Failure == BusError {
    var errorName: String? { if case .failure(let e) = self { e.name } else { nil } }
}

/// The specification's name rules (BusNames.swift), shared by the object
/// declaration and the owned-name source.
@Suite struct BusNameRules {
    @Test func interfaceNamesAreTwoOrMoreElementsWithNoLeadingDigitOrHyphen() {
        #expect(isValidInterfaceName("org.example.Thing1"))
        #expect(isValidInterfaceName("a._b"))
        for bad in ["org", "org.", ".org", "org..x", "org.1x", "org.ex-ample", "org.é", String(repeating: "a.", count: 128) + "a"] {
            #expect(!isValidInterfaceName(bad), "\(bad)")
        }
    }

    @Test func wellKnownBusNamesAlsoAllowHyphensButNoUniqueNames() {
        #expect(isValidWellKnownBusName("org.ex-ample.Thing"))
        #expect(isValidWellKnownBusName("org.example.Thing1"))
        for bad in [":1.42", "org", "org.1x", "org..x", "org.ex ample"] {
            #expect(!isValidWellKnownBusName(bad), "\(bad)")
        }
    }

    @Test func memberNamesAreOneElementOfAtMost255Bytes() {
        #expect(isValidMemberName("Echo_2"))
        #expect(isValidMemberName(String(repeating: "a", count: 255)))
        for bad in ["", "2x", "a.b", "a-b", String(repeating: "a", count: 256)] {
            #expect(!isValidMemberName(bad), "\(bad)")
        }
    }
}
