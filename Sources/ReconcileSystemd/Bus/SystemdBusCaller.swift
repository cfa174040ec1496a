import CSystemd
import Reconcile
import Synchronization

extension SystemdDriver {
    /// Method calls on this driver's shared bus connections, for owned tasks:
    /// `try await driver.bus.call(bus: .system, service, path, interface, method, args)`
    /// inside `tasks.run`. The call is made on the loop (never blocking it)
    /// and dropped when its task is cancelled.
    public var bus: SystemdBusCaller { SystemdBusCaller(executor: loop.executor, buses: WeakBuses(buses)) }

    /// How many AddMatch and RemoveMatch this driver's connection to `bus`
    /// has sent (matches added, matches released), for tests and benchmarks.
    public func busMatchCounts(_ bus: BusAddress) -> (added: Int, removed: Int) {
        let c = buses.connection(bus)
        return (c.matchesAdded, c.matchesRemoved)
    }

    /// How many method calls wait for their reply on this driver's connection to `bus`.
    public func busPendingCalls(_ bus: BusAddress) -> Int { buses.connection(bus).calls.count }
}

/// A driver's bus connections, reachable from any thread (used only on the loop).
final class WeakBuses: @unchecked Sendable {
    weak var buses: BusConnections?
    init(_ buses: BusConnections) { self.buses = buses }
}

/// Makes method calls on a `SystemdDriver`'s bus connections (see
/// `SystemdDriver.bus`). Sendable: tasks on any executor may call; the call
/// itself is made on the loop thread.
public struct SystemdBusCaller: BusCaller {
    let executor: LoopExecutor
    let buses: WeakBuses

    /// Makes `call` on the driver's connection to `call.bus` (connecting if need be).
    /// - Parameter call: The call.
    /// - Returns: The reply's values.
    /// - Throws: `BusError` (an error reply; NoReply on timeout; Disconnected
    ///   when the bus is missing or lost; InvalidArgs when the arguments cannot
    ///   be sent), or `CancellationError` when the task is cancelled: the
    ///   pending call is dropped (its slot released, a late reply ignored).
    public func call(_ call: BusMethodCall) async throws -> [BusValue] {
        let handle = CallHandle()
        let executor = executor, buses = buses
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[BusValue], any Error>) in
                handle.wait(continuation)
                executor.execute { handle.start(call, on: buses.buses) }
            }
        } onCancel: {
            executor.execute { handle.cancel() }
        }
    }
}

/// One call from a task: its continuation (resumed once, from the loop)
/// and, on the loop, its pending sd-bus call.
final class CallHandle: @unchecked Sendable {
    private enum State {
        case idle
        case waiting(CheckedContinuation<[BusValue], any Error>)
        case done(Result<[BusValue], any Error>)
        case resumed
    }
    private let state = Mutex(State.idle)
    // Loop thread only.
    private var pending: BusPendingCall?
    private var cancelled = false

    /// Parks `continuation` (resumed at once when the result is already in).
    func wait(_ continuation: CheckedContinuation<[BusValue], any Error>) {
        let ready: Result<[BusValue], any Error>? = state.withLock { s in
            if case .done(let r) = s { s = .resumed; return r }
            s = .waiting(continuation)
            return nil
        }
        if let ready { continuation.resume(with: ready) }
    }

    private func resume(_ result: Result<[BusValue], any Error>) {
        let continuation: CheckedContinuation<[BusValue], any Error>? = state.withLock { s in
            switch s {
            case .idle: s = .done(result); return nil
            case .waiting(let c): s = .resumed; return c
            case .done, .resumed: return nil
            }
        }
        continuation?.resume(with: result)
    }

    /// Loop thread: sends the call (unless already cancelled).
    func start(_ call: BusMethodCall, on buses: BusConnections?) {
        guard !cancelled else { return }
        guard let buses else {
            return resume(.failure(BusError(BusError.disconnected, "the driver is gone")))
        }
        let timeout = call.timeout.map { max(1, usec($0)) }
        pending = buses.connected(call.bus).call(service: call.service, path: call.path, interface: call.interface,
                                                 method: call.method, arguments: call.arguments, timeout: timeout) { [self] result in
            pending = nil
            resume(result.mapError { $0 })
        }
    }

    /// Loop thread: drops the pending call and ends with `CancellationError`.
    func cancel() {
        cancelled = true
        pending?.cancel()
        pending = nil
        resume(.failure(CancellationError()))
    }
}
