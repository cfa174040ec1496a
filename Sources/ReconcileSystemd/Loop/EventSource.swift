import CSystemd
import Synchronization

/// sd-event sources created by Reconcile and not yet destroyed by sd-event
/// (counted down from each source's destroy callback): every source the
/// drivers hold, kept ones included (a timer queue's parked source, a
/// stopped file watch's flush source). Timers share one source per clock
/// and accuracy (`TimerQueue`), so they count one per queue, not one per
/// timer. Tests use it to show that nothing is left on the loop.
///
/// Both counts live in one word (live in the low 32 bits, created in the
/// high 32, wrapping after 2^32 creations), so a creation is one atomic
/// operation, not two (a timer start paid about 5 % of a churned reconcile
/// for the second).
package enum EventSourceAccounting {
    static let counts = Atomic<Int>(0)
    /// What a creation adds: one live, one created.
    static let oneCreated = 1 | 1 << 32

    /// Sources created and not yet destroyed, process-wide.
    package static var live: Int { Int(Int32(truncatingIfNeeded: counts.load(ordering: .relaxed))) }
    /// Sources ever created, process-wide (modulo 2^32).
    package static var created: Int { Int(UInt(bitPattern: counts.load(ordering: .relaxed)) >> 32) }

    /// Counts a creation.
    @inline(__always)
    static func countCreation() { counts.wrappingAdd(oneCreated, ordering: .relaxed) }

    /// Counts a destruction.
    @inline(__always)
    static func countDestruction() { counts.wrappingSubtract(1, ordering: .relaxed) }
}

/// One owner of one `sd_event_source *`: disabled and released by `close()`
/// or deinit.
final class EventSource {
    private(set) var handle: OpaquePointer?

    /// Takes ownership of `handle`, just returned by an `sd_event_add_*` call.
    init(_ handle: OpaquePointer) {
        self.handle = handle
        Self.account(handle)
    }

    /// Counts `handle` in `EventSourceAccounting` until sd-event destroys it:
    /// for owners that keep the `sd_event_source *` themselves (one object
    /// less per source) and release it with `sd_event_source_disable_unref`.
    static func account(_ handle: OpaquePointer) {
        EventSourceAccounting.countCreation()
        sd_event_source_set_destroy_callback(handle) { _ in EventSourceAccounting.countDestruction() }
    }

    /// Turns the source off and drops it; a pending dispatch is cancelled.
    /// The corresponding C function is `sd_event_source_disable_unref`.
    func close() {
        if let h = handle {
            handle = nil
            sd_event_source_disable_unref(h)
        }
    }

    deinit { close() }
}
