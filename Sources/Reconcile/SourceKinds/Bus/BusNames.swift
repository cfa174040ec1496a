/// The D-Bus specification's name rules, in one place: object paths
/// (`BusObjectPath`), interface, member and well-known bus names.

/// `[A-Za-z0-9_]`: a byte of a member name, of a path element, and of an
/// element of an interface name.
package func isBusNameByte(_ b: UInt8) -> Bool {
    (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x5F
}

/// One element: not empty, not starting with a digit, every byte a name byte
/// (or `-`, in a bus name).
private func isNameElement(_ element: some Collection<UInt8>, allowingHyphen: Bool) -> Bool {
    guard let first = element.first, !(first >= 0x30 && first <= 0x39) else { return false }
    return element.allSatisfy { isBusNameByte($0) || (allowingHyphen && $0 == UInt8(ascii: "-")) }
}

/// Two or more elements separated by `.`, at most 255 bytes.
private func isDottedName(_ name: String, allowingHyphen: Bool) -> Bool {
    guard name.utf8.count <= 255 else { return false }
    let parts = name.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
    return parts.count >= 2 && parts.allSatisfy { isNameElement($0, allowingHyphen: allowingHyphen) }
}

/// Whether `name` is a valid interface name: two or more elements of
/// `[A-Za-z0-9_]`, none starting with a digit, at most 255 bytes.
package func isValidInterfaceName(_ name: String) -> Bool {
    isDottedName(name, allowingHyphen: false)
}

/// Whether `name` is a valid well-known bus name: an interface name whose
/// elements may also hold `-` (a unique name, `:1.42`, is not one).
package func isValidWellKnownBusName(_ name: String) -> Bool {
    isDottedName(name, allowingHyphen: true)
}

/// Whether `name` is a valid member (or argument) name: `[A-Za-z0-9_]`, not
/// starting with a digit, 1...255 bytes.
package func isValidMemberName(_ name: String) -> Bool {
    name.utf8.count <= 255 && isNameElement(name.utf8, allowingHyphen: false)
}
