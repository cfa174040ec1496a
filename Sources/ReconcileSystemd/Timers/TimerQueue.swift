import CSystemd
import Glibc

/// A driver's timers, coalesced: the timers of one clock and one accuracy
/// share one sd-event source (a `TimerQueue`), so a timer start or stop is
/// a push onto or a removal from the queue's own heap, with no sd-event call
/// unless the earliest due time changes.
///
/// Queues live until the driver goes; `release()` (at `detach`) drops their
/// sd-event sources, which the next arming makes again. Queues that no
/// running timer uses are dropped when there are more than `queueLimit`
/// (a program that uses many accuracies does not keep a source for each).
final class TimerQueues {
    let loop: EventLoop
    @exclusivity(unchecked) private var queues: [TimerQueue] = []
    /// The queue found last (most starts ask for the same one).
    @exclusivity(unchecked) private var last: Unmanaged<TimerQueue>?
    static let queueLimit = 16

    init(loop: EventLoop) { self.loop = loop }

    /// The queue of `clock` and `accuracy`, made when there is none.
    func queue(_ clock: clockid_t, _ accuracy: UInt64) -> Unmanaged<TimerQueue> {
        if let last, last._withUnsafeGuaranteedRef({ $0.clock == clock && $0.accuracy == accuracy }) { return last }
        for i in queues.indices where queues[i].clock == clock && queues[i].accuracy == accuracy {
            let q = Unmanaged.passUnretained(queues[i])
            last = q
            return q
        }
        if queues.count >= Self.queueLimit {
            last = nil
            queues.removeAll { q in
                guard q.members == 0 else { return false }
                q.releaseSource()
                return true
            }
        }
        let q = TimerQueue(loop: loop, clock: clock, accuracy: accuracy)
        queues.append(q)
        last = .passUnretained(q)
        return .passUnretained(q)
    }

    /// Drops every queue's sd-event source (the driver detaches; its
    /// timers were stopped first).
    func release() {
        for q in queues { q.releaseSource() }
    }

    /// sd-event sources the queues hold now.
    var sourceCount: Int { queues.reduce(0) { $0 + ($1.hasSource ? 1 : 0) } }
}

/// The running timers of one clock and accuracy on one sd-event source,
/// in a binary min-heap of due times. The source is set to the earliest due
/// time with the queue's accuracy, so sd-event wakes for it as it would
/// for that timer's own source: not before the due time, and no later than
/// the accuracy allows. A dispatch delivers the timers due by the
/// iteration's time (`sd_event_now`) in due-time order, each as its own
/// source would (its own `emit`, so a tick's reconcile may stop timers that
/// are due too, and they do not fire), at most `dispatchLimit` of them (the
/// rest in the next iteration), and sets the source to the new earliest
/// due time. Every timer's due time is at least its accuracy's earliest;
/// a timer due later than the iteration's time waits for its own.
final class TimerQueue {
    struct Slot {
        var due: UInt64
        var runner: Unmanaged<TimerRunner>
    }

    let clock: clockid_t
    let accuracy: UInt64
    private let loop: EventLoop
    /// The sd-event source (accounted, `EventSource.account`), made by the
    /// first arming.
    @exclusivity(unchecked) private var source: OpaquePointer?
    /// The time `source` is set to (`usecInfinity`: parked, never due).
    @exclusivity(unchecked) private var armed: UInt64 = usecInfinity
    /// Set while a dispatch runs (arming waits for its end).
    @exclusivity(unchecked) private var dispatching = false
    /// Set after a firing: the source's time has passed, so it is set
    /// again whatever the earliest due time is.
    @exclusivity(unchecked) private var fired = false
    /// The source at the normal priority, not `timerPriority`: the last
    /// dispatch ended at `dispatchLimit` with timers still due (see
    /// `dispatch`).
    @exclusivity(unchecked) private var behind = false
    /// Running timers on this queue, in the heap or not (a one-shot that
    /// fired stays a member until it stops).
    @exclusivity(unchecked) var members = 0
    @exclusivity(unchecked) private var slots: UnsafeMutablePointer<Slot>
    @exclusivity(unchecked) private var capacity = 0
    @exclusivity(unchecked) private(set) var count = 0
    /// Timers delivered per dispatch at most (the loop's other sources run
    /// between two dispatches).
    static let dispatchLimit = 256

    init(loop: EventLoop, clock: clockid_t, accuracy: UInt64) {
        self.loop = loop
        self.clock = clock
        self.accuracy = accuracy
        slots = UnsafeMutablePointer(bitPattern: MemoryLayout<Slot>.alignment)!
    }

    deinit {
        releaseSource()
        if capacity > 0 { slots.deallocate() }
    }

    var hasSource: Bool { source != nil }

    /// The earliest due time, `usecInfinity` when empty.
    var earliest: UInt64 { count > 0 ? slots[0].due : usecInfinity }

    // MARK: The heap

    /// Adds `runner` (not in the heap) due at `due`; arms the source when
    /// it is the new earliest. On a failure to arm, `runner` is not added.
    func insert(_ runner: TimerRunner, due: UInt64) throws(SystemdError) {
        if count == capacity { grow() }
        let i = count
        count += 1
        siftUp(Slot(due: due, runner: .passUnretained(runner)), from: i)
        if runner.heapIndex == 0 {
            do { try arm() } catch {
                remove(runner)
                throw error
            }
        }
    }

    /// Removes `runner` (in the heap); re-arms when the earliest changed.
    func remove(_ runner: TimerRunner) {
        let i = runner.heapIndex
        runner.heapIndex = -1
        count -= 1
        if i != count {
            let moved = slots[count]
            if i > 0 && moved.due < slots[(i - 1) / 2].due { siftUp(moved, from: i) } else { siftDown(moved, from: i) }
        }
        if i == 0 { try? arm() }
    }

    /// Moves `runner` (in the heap) to due time `due`.
    func update(_ runner: TimerRunner, due: UInt64) throws(SystemdError) {
        let i = runner.heapIndex
        let old = slots[i].due
        let slot = Slot(due: due, runner: .passUnretained(runner))
        if due < old { siftUp(slot, from: i) } else { siftDown(slot, from: i) }
        if i == 0 || runner.heapIndex == 0 { try arm() }
    }

    @inline(__always)
    private func place(_ slot: Slot, at i: Int) {
        slots[i] = slot
        slot.runner._withUnsafeGuaranteedRef { $0.heapIndex = i }
    }

    private func siftUp(_ slot: Slot, from start: Int) {
        var i = start
        while i > 0 {
            let p = (i - 1) / 2
            guard slots[p].due > slot.due else { break }
            place(slots[p], at: i)
            i = p
        }
        place(slot, at: i)
    }

    private func siftDown(_ slot: Slot, from start: Int) {
        var i = start
        while true {
            let l = 2 * i + 1
            guard l < count else { break }
            let r = l + 1
            let c = r < count && slots[r].due < slots[l].due ? r : l
            guard slots[c].due < slot.due else { break }
            place(slots[c], at: i)
            i = c
        }
        place(slot, at: i)
    }

    private func grow() {
        let bigger = max(64, capacity * 2)
        let new = UnsafeMutablePointer<Slot>.allocate(capacity: bigger)
        if capacity > 0 {
            new.moveInitialize(from: slots, count: count)
            slots.deallocate()
        }
        slots = new
        capacity = bigger
    }

    // MARK: The sd-event source

    /// Sets the source to the earliest due time (none: parked at
    /// `usecInfinity`), when that changed; makes the source when there is
    /// none and something is due. Waits while a dispatch runs.
    func arm() throws(SystemdError) {
        guard !dispatching else { return }
        let want = earliest
        guard want != armed || fired else { return }
        if let source {
            try check("sd_event_source_set_time", sd_event_source_set_time(source, want))
        } else if want != usecInfinity {
            var s: OpaquePointer?
            try check("sd_event_add_time", sd_event_add_time(
                loop.handle, &s, clock, want, accuracy,
                { _, _, ud in
                    // A strong reference for the dispatch: a tick's
                    // reconcile may detach the driver, and with it its queues.
                    let queue = Unmanaged<TimerQueue>.fromOpaque(ud!).takeUnretainedValue()
                    queue.dispatch()
                    return 0
                }, Unmanaged.passUnretained(self).toOpaque()))
            // Ahead of the loop's other sources (`timerPriority`): a due
            // timer is served at the next iteration, not after every
            // descriptor that became ready before it.
            sd_event_source_set_priority(s, TimerQueue.timerPriority)
            // On, not one-shot: the dispatch sets the next time itself.
            sd_event_source_set_enabled(s, Int32(SD_EVENT_ON))
            EventSource.account(s!)
            source = s
        }
        armed = want
        fired = false
    }

    /// The sd-event priority of a queue's source: 10 ahead of the normal
    /// one every other source has. sd-event dispatches one pending source
    /// per iteration, the highest priority first and, among equals, the one
    /// pending longest; at equal priority a due timer waited behind every
    /// descriptor that was ready before it (100 flooding connections: 100
    /// dispatches). Its work stays bounded (at most `dispatchLimit` timers a
    /// dispatch), and a queue still behind after a full dispatch drops to
    /// the normal priority until it catches up (`dispatch`), so the
    /// descriptors wait at most one dispatch in turn.
    static let timerPriority = Int64(SD_EVENT_PRIORITY_NORMAL) - 10

    /// Disables and drops the source; the next arming makes a new one.
    func releaseSource() {
        if let s = source {
            source = nil
            armed = usecInfinity
            behind = false
            sd_event_source_disable_unref(s)
        }
    }

    /// The source fired: delivers the timers due by the iteration's time,
    /// in due-time order, at most `dispatchLimit`, then sets the source to
    /// the next earliest due time.
    private func dispatch() {
        let now = loop.now(clock)
        dispatching = true
        var budget = Self.dispatchLimit
        while count > 0, budget > 0 {
            let first = slots[0]
            guard first.due <= now else { break }
            budget -= 1
            // The runner reschedules (or removes) itself before it emits;
            // the emit may stop, start or retune any timer of this queue.
            first.runner._withUnsafeGuaranteedRef { $0.fire(now) }
        }
        dispatching = false
        fired = true
        // Still behind after a full dispatch (more timers due than the loop
        // serves: thousands of short intervals): ahead of every other source
        // the queue would be due again at each iteration and nothing else
        // would run until it caught up, which an overload never does. At
        // the normal priority it takes turns with the others, by how long
        // each is pending; caught up, it is ahead again.
        let stillDue = count > 0 && slots[0].due <= now
        if stillDue != behind, let source {
            behind = stillDue
            sd_event_source_set_priority(source, stillDue ? Int64(SD_EVENT_PRIORITY_NORMAL) : Self.timerPriority)
        }
        // A failure here means the loop finished: nothing fires again.
        try? arm()
    }
}
