import CSystemd
import Glibc
import Reconcile

/// A failed libsystemd or system call: the function's name and the errno.
public struct SystemdError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The C function that failed (`sd_event_add_inotify`).
    public let function: String
    /// The positive errno value.
    public let errno: Int32

    /// The failure of C function `function` with `errno`.
    public init(_ function: String, errno: Int32) {
        self.function = function
        self.errno = errno
    }

    /// The system's sentence for the errno (`No such file or directory`).
    public var reason: String { String(cString: strerror(errno)) }

    /// `function: reason (errno N)`.
    public var description: String { "\(function): \(reason) (errno \(errno))" }

    /// The error as a source failure event.
    public var failure: SourceFailure { SourceFailure(operation: function, code: errno, reason: reason) }
}

/// Turns an sd-* style return (negative errno on failure) into a typed error
/// carrying the function's name.
@discardableResult
@inline(__always)
func check(_ function: @autoclosure () -> String, _ result: Int32) throws(SystemdError) -> Int32 {
    if result < 0 { throw SystemdError(function(), errno: -result) }
    return result
}

/// Turns a libc return (-1 with errno) into a typed error.
@discardableResult
@inline(__always)
func checkLibc(_ function: @autoclosure () -> String, _ result: Int32) throws(SystemdError) -> Int32 {
    if result < 0 { throw SystemdError(function(), errno: Glibc.errno) }
    return result
}
