import Reconcile
import Synchronization

extension VirtualDriver {
    /// Delivers `signal` to every running bus signal source on `bus` whose
    /// rule admits it (`owner`: the unique name that owns the rule's
    /// well-known sender, so a signal from it is the owner's); returns how
    /// many got it.
    @discardableResult
    public func emit(busSignal signal: BusSignal, on bus: BusAddress, owner: String? = nil) -> Int {
        var delivered = 0
        for (id, ticket) in running {
            guard let c = ticket.configuration(as: BusSignalSource.self), c.bus == bus, c.admits(signal, owner: owner) else { continue }
            if emit(BusSignalSource.Event.received(signal), to: id) { delivered += 1 }
        }
        return delivered
    }

    /// Says that `name` on `bus` is now owned by `owner` (nil: no owner):
    /// `.appeared(owner:)` / `.vanished` to every running name watch of it,
    /// and `.vanished` to every property watch of that service when it goes.
    /// Returns how many sources got an event.
    @discardableResult
    public func busName(_ name: String, on bus: BusAddress, owner: String?) -> Int {
        var delivered = 0
        for (id, ticket) in running {
            if let c = ticket.configuration(as: BusNameSource.self), c.bus == bus, c.name == name {
                if emit(owner.map { BusNameSource.Event.appeared(owner: $0) } ?? .vanished, to: id) { delivered += 1 }
            } else if owner == nil, let c = ticket.configuration(as: BusPropertySource.self), c.bus == bus, c.service == name {
                if emit(BusPropertySource.Event.vanished, to: id) { delivered += 1 }
            }
        }
        return delivered
    }

    /// Gives every running property watch of `interface.property` on
    /// `service`'s `path` on `bus` the value `value` (a value of a type the
    /// watch does not expect becomes its failure, as on the real driver).
    /// Returns how many sources got it.
    @discardableResult
    public func busProperty(_ property: String, of interface: String, at path: String, service: String, on bus: BusAddress,
                            is value: BusValue) -> Int {
        var delivered = 0
        for (id, ticket) in running {
            guard let c = ticket.configuration(as: BusPropertySource.self), c.bus == bus, c.service == service,
                  c.path == path, c.interface == interface, c.property == property else { continue }
            let content = value.variantContent
            if let expected = c.type, content.type != expected {
                if fail(id, SourceFailure(operation: "\(interface).\(property)",
                                          reason: "the value is of type \(content.type), the program expects \(expected)")) { delivered += 1 }
            } else if emit(BusPropertySource.Event.value(content), to: id) {
                delivered += 1
            }
        }
        return delivered
    }
}

/// A `BusCaller` for tests: records every call and lets the test answer
/// it (values, a `BusError`), so programs that call the bus test on virtual
/// time with no bus. A cancelled task's call ends with `CancellationError`
/// and leaves `pending`. Answers may also be given ahead (`answer(method:with:)`).
public final class BusCallRecorder: BusCaller {
    private struct Waiting {
        let serial: Int
        let call: BusMethodCall
        let continuation: CheckedContinuation<[BusValue], any Error>
    }
    private struct State {
        var serial = 0
        var calls: [BusMethodCall] = []
        var waiting: [Waiting] = []
        var early: [Int: Result<[BusValue], any Error>] = [:]
        var cancelled: Set<Int> = []
        var canned: [String: Result<[BusValue], BusError>] = [:]
        var cancelledCount = 0
    }
    private let state = Mutex(State())

    /// A recorder with no calls.
    public init() {}

    /// Every call made, in order (answered, pending or cancelled).
    public var calls: [BusMethodCall] { state.withLock { $0.calls } }

    /// The calls waiting for an answer, oldest first.
    public var pending: [BusMethodCall] { state.withLock { $0.waiting.map(\.call) } }

    /// How many calls ended because their task was cancelled.
    public var cancelledCount: Int { state.withLock { $0.cancelledCount } }

    /// Answers every later call of `method` (any interface) with `result` at once.
    public func answer(method: String, with result: Result<[BusValue], BusError>) {
        state.withLock { $0.canned[method] = result }
    }

    /// Answers the oldest pending call that satisfies `match` with `values`;
    /// false when none waits.
    @discardableResult
    public func reply(with values: [BusValue], to match: (BusMethodCall) -> Bool = { _ in true }) -> Bool {
        finish(.success(values), match)
    }

    /// Answers the oldest pending call that satisfies `match` with `error`.
    @discardableResult
    public func fail(with error: BusError, to match: (BusMethodCall) -> Bool = { _ in true }) -> Bool {
        finish(.failure(error), match)
    }

    private func finish(_ result: Result<[BusValue], any Error>, _ match: (BusMethodCall) -> Bool) -> Bool {
        let found: Waiting? = state.withLock { s in
            guard let i = s.waiting.firstIndex(where: { match($0.call) }) else { return nil }
            return s.waiting.remove(at: i)
        }
        guard let found else { return false }
        found.continuation.resume(with: result)
        return true
    }

    /// Records `call` and waits for the test's answer (or a canned one).
    /// - Parameter call: The call.
    /// - Returns: The values the test answered with.
    /// - Throws: The `BusError` the test answered with, or `CancellationError`.
    public func call(_ call: BusMethodCall) async throws -> [BusValue] {
        let serial: Int = state.withLock { s in
            s.serial += 1
            s.calls.append(call)
            return s.serial
        }
        if let canned = state.withLock({ $0.canned[call.method] }) { return try canned.get() }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[BusValue], any Error>) in
                let cancelledAlready = state.withLock { s in
                    if s.cancelled.remove(serial) != nil { s.cancelledCount += 1; return true }
                    s.waiting.append(Waiting(serial: serial, call: call, continuation: continuation))
                    return false
                }
                if cancelledAlready { continuation.resume(throwing: CancellationError()) }
            }
        } onCancel: {
            let waiting: Waiting? = state.withLock { s in
                guard let i = s.waiting.firstIndex(where: { $0.serial == serial }) else {
                    s.cancelled.insert(serial)
                    return nil
                }
                s.cancelledCount += 1
                return s.waiting.remove(at: i)
            }
            waiting?.continuation.resume(throwing: CancellationError())
        }
    }
}
