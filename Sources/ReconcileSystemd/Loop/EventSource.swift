import CSystemd
import Synchronization

/// sd-event sources created by Reconcile and not yet destroyed by sd-event
/// (counted down from each source's destroy callback; a timer's when its
/// runner releases it, see `EventSource.accountReleasedByOwner()`). Tests use it to show
/// start-once / stop-once at the sd-event level.
package enum EventSourceAccounting {
    static let liveCount = Atomic<Int>(0)
    static let createdCount = Atomic<Int>(0)

    /// Sources created and not yet destroyed, process-wide.
    package static var live: Int { liveCount.load(ordering: .relaxed) }
    /// Sources ever created, process-wide.
    package static var created: Int { createdCount.load(ordering: .relaxed) }
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
        EventSourceAccounting.liveCount.add(1, ordering: .relaxed)
        EventSourceAccounting.createdCount.add(1, ordering: .relaxed)
        sd_event_source_set_destroy_callback(handle) { _ in
            EventSourceAccounting.liveCount.subtract(1, ordering: .relaxed)
        }
    }

    /// Counts a source in `EventSourceAccounting` whose owner counts it down
    /// itself (`releasedByOwner()`) when it releases its only reference with
    /// `sd_event_source_disable_unref` (sd-event frees it then, or as soon as
    /// a dispatch of it in progress returns): no destroy callback to set and
    /// call per source (timers: two C calls fewer per start and stop).
    static func accountReleasedByOwner() {
        EventSourceAccounting.liveCount.add(1, ordering: .relaxed)
        EventSourceAccounting.createdCount.add(1, ordering: .relaxed)
    }

    /// The count-down of a source counted by `accountReleasedByOwner()`.
    static func releasedByOwner() {
        EventSourceAccounting.liveCount.subtract(1, ordering: .relaxed)
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
