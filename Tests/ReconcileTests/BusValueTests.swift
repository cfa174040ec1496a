import Reconcile
import ReconcileTesting
import Testing

@Suite struct BusValueTests {
    @Test(arguments: ["", "s", "a{sv}", "sa{sv}as", "(sbh)", "v", "aa{s(iv)}", "a(oa{sa{sv}})", "ay", "yqnuixtdsogh"])
    func validSignaturesRoundTripThroughTheirText(_ text: String) throws {
        let signature = try BusSignature(parsing: text)
        #expect(signature.description == text)
    }

    @Test(arguments: [
        ("a", "ends inside a type"), ("{sv}", "dictionary entry outside an array"), ("a{vs}", "not a basic type"),
        ("a{s}", "not exactly two types"), ("a{svs}", "not exactly two types"), ("()", "empty struct"), ("(s", "not closed"),
        ("z", "unknown type code"),
    ])
    func invalidSignaturesAreRejectedWithTheirReason(_ text: String, _ reason: String) {
        #expect {
            try BusSignature(parsing: text)
        } throws: { ($0 as? BusSignatureError)?.reason.contains(reason) == true }
    }

    @Test func nestingLimitsAreThoseOfTheSpecification() throws {
        #expect(throws: Never.self) { try BusSignature(parsing: String(repeating: "a", count: 32) + "i") }
        #expect(throws: BusSignatureError.self) { try BusSignature(parsing: String(repeating: "a", count: 33) + "i") }
        #expect(throws: Never.self) { try BusSignature(parsing: String(repeating: "(", count: 32) + "i" + String(repeating: ")", count: 32)) }
        #expect(throws: BusSignatureError.self) { try BusSignature(parsing: String(repeating: "(", count: 33) + "i" + String(repeating: ")", count: 33)) }
        #expect(throws: BusSignatureError.self) { try BusSignature(parsing: String(repeating: "s", count: 256)) }
    }

    @Test func aSingleTypeParsesAsABusType() throws {
        #expect(try BusType(parsing: "a{sv}") == .dictionary(key: .string, value: .variant))
        #expect(try BusType(parsing: "(ia(so))") == .structure([.int32, .array(.structure([.string, .objectPath]))]))
        #expect(throws: BusSignatureError.self) { try BusType(parsing: "ss") }
    }

    @Test func valuesKnowTheirTypes() {
        let v: BusValue = .dictionary(["State": .string("on"), "Count": .uint32(3)])
        #expect(v.type == .dictionary(key: .string, value: .variant))
        #expect(BusValue.structure([.int32(1), .strings([])]).type.description == "(ias)")
        #expect(BusValue.variant(.int64(1)).type == .variant)
    }

    @Test func accessorsSeeThroughVariantsAndDictionaries() throws {
        let v: BusValue = .dictionary(["State": .string("routable"), "Online": .boolean(true), "Speed": .uint64(1000)])
        #expect(v["State"]?.string == "routable")
        #expect(v["Online"]?.bool == true)
        #expect(v["Speed"]?.int == 1000)
        #expect(v["Missing"] == nil)
        #expect(BusValue.variant(.variant(.string("x"))).string == "x")
        #expect(BusValue.int32(-1).uint64 == nil)
        #expect(BusValue.string("x").int == nil)
        #expect(BusValue.strings(["a", "b"])[1]?.string == "b")
        #expect(BusValue.objectPath(BusObjectPath("/a/b")!).string == "/a/b")
    }

    @Test func decodingIntoSwiftTypesChecksTypesAndSaysWhere() throws {
        let v: BusValue = .dictionary(["A": .int32(1), "B": .uint16(2)])
        #expect(try v.decode(as: [String: Int32].self) == ["A": 1, "B": 2])
        #expect(try BusValue.strings(["x", "y"]).decode(as: [String].self) == ["x", "y"])
        #expect(try BusValue.variant(.uint32(7)).decode(as: Int.self) == 7)
        #expect(throws: BusDecodingError(expected: "Int32", found: .string, path: "[1]")) {
            try BusValue.array(element: .variant, [.variant(.int32(1)), .variant(.string("no"))]).decode(as: [Int32].self)
        }
        #expect(throws: BusDecodingError.self) { try BusValue.uint64(UInt64.max).decode(as: Int64.self) }
        #expect([String: [Int32]].busType.description == "a{sai}")
    }

    @Test(arguments: ["/", "/a", "/org/freedesktop/network1", "/a_b/C9"])
    func validObjectPathsAreAccepted(_ text: String) { #expect(BusObjectPath(text) != nil) }

    @Test(arguments: ["", "a", "/a/", "//", "/a//b", "/a-b", "/ä"])
    func invalidObjectPathsAreRefused(_ text: String) { #expect(BusObjectPath(text) == nil) }

    @Test func sendableChecksRefuseWhatTheDaemonWouldDropTheConnectionFor() throws {
        var deep: BusValue = .int32(1)
        for _ in 0..<64 { deep = .variant(deep) }
        #expect(throws: Never.self) { try BusValue.checkSendable([deep]) }
        #expect(throws: BusValueError.self) { try BusValue.checkSendable([.variant(deep)]) }
        var arrays: BusValue = .int32(1)
        var type: BusType = .int32
        for _ in 0..<33 { arrays = .array(element: type, [arrays]); type = .array(type) }
        #expect(throws: BusValueError.self) { try BusValue.checkSendable([arrays]) }
        #expect(throws: BusValueError.self) { try BusValue.checkSendable([.array(element: .string, [.int32(1)])]) }
        #expect(throws: BusValueError.self) { try BusValue.checkSendable([.string("a\u{0}b")]) }
        #expect(throws: BusValueError.self) { try BusValue.checkSendable([.structure([])]) }
        #expect(throws: Never.self) { try BusValue.checkSendable([.string(String(repeating: "x", count: 1 << 20))]) }
    }

    @Test func fileDescriptorsAreClosedOnceUnlessTaken() {
        final class Closed: @unchecked Sendable { var fds: [Int32] = [] }
        let closed = Closed()
        do {
            let a = BusFileDescriptor(7) { closed.fds.append($0) }
            let b = BusFileDescriptor(8) { closed.fds.append($0) }
            #expect(BusValue.unixFD(a) == .unixFD(a))
            #expect(BusValue.unixFD(a) != .unixFD(b))
            #expect(b.take() == 8)
            #expect(b.take() == nil)
        }
        #expect(closed.fds == [7])
    }

    @Test func signalMatchRulesEscapeQuotes() {
        let c = BusSignalSource.Configuration(bus: .system, sender: "org.example", path: "/x", interface: "org.example.I",
                                              member: "M", arguments: [1: "it's", 0: "a"])
        #expect(c.rule == "type='signal',sender='org.example',path='/x',interface='org.example.I',member='M',arg0='a',arg1='it'\\''s'")
    }
}
