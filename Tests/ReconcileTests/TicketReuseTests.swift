import Reconcile
import ReconcileTesting
import Testing

/// A start may reuse the ticket of a source the last reconcile stopped, but
/// only when nothing can reach the old activation through it any more.
@Suite struct TicketReuseTests {
    /// The object's address as a number (holds no reference to it).
    func address(_ ticket: SourceTicket?) -> UInt? { ticket.map { UInt(bitPattern: ObjectIdentifier($0).hashValue) } }

    @Test func stoppedTicketNothingHoldsIsReusedWithANewActivation() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver)
        try rt.start()
        let old = address(driver.running[feedID("a")])
        try rt.send(.setKeys(["b", "c"]))
        try rt.send(.setKeys(["b", "c", "d"]))
        let d = try #require(driver.running[feedID("d")])
        // The same object (so reuse happens), as a new activation of d.
        // (This also fails if the runtime's weak/unowned counts stop reading
        // as recycling expects: it then turns itself off.)
        #expect(address(d) == old)
        #expect(d.id == feedID("d"))
        #expect(d.activation == Activation(generation: 4))
        #expect(d.isActive && !d.hasFailed)
        #expect(driver.log.map(\.description).suffix(2) == ["stop feed:a #1", "start feed:d #4"])
        // Its events are d's, from the current tagger.
        #expect(driver.emit(Feed.Event.item(5), to: feedID("d")))
        #expect(rt.model.received == [Keyed.Received(key: "d", item: 5, generation: 0)])
        #expect(driver.contractViolations.isEmpty)
    }

    /// Stopping every source empties the active table at once: none of the
    /// old activations is found again, and the next starts reuse the
    /// stopped tickets as new activations.
    @Test func stoppingEverythingRetiresEveryTicketForReuse() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver)
        try rt.start()
        let old = Set(["a", "b", "c"].compactMap { address(driver.running[feedID($0)]) })
        #expect(old.count == 3)
        try rt.send(.setKeys([]))
        #expect(rt.lastPlan.steps.map(\.description) == ["stop feed:a", "stop feed:b", "stop feed:c"])
        #expect(rt.activeIDs.isEmpty)
        try rt.send(.setKeys(["a", "d", "e"]))
        // a is started anew (nothing of its old activation is still active).
        #expect(rt.lastPlan.steps.map(\.outcome) == ["start", "start", "start"])
        #expect(rt.activeIDs == [feedID("a"), feedID("d"), feedID("e")])
        #expect(Set(["a", "d", "e"].compactMap { address(driver.running[feedID($0)]) }) == old)
        #expect(driver.running[feedID("a")]?.activation == Activation(generation: 4))
        #expect(driver.emit(Feed.Event.item(5), to: feedID("e")))
        #expect(rt.model.received == [Keyed.Received(key: "e", item: 5, generation: 0)])
        try rt.send(.setKeys([]))
        #expect(rt.activeIDs.isEmpty)
        #expect(driver.contractViolations.isEmpty)
    }

    @Test func ticketHeldWeaklyAfterItsStopIsReleasedNotReused() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver)
        try rt.start()
        // A driver that forgot to let go: a weak reference to a's ticket.
        weak let stale = driver.running[feedID("a")]
        try rt.send(.setKeys(["b", "c"]))
        #expect(stale?.id == feedID("a") && stale?.isActive == false)
        try rt.send(.setKeys(["b", "c", "d"]))
        // Reused, the weak reference would now reach d's activation.
        #expect(stale == nil)
        #expect(driver.running[feedID("d")]?.activation == Activation(generation: 4))
        #expect(driver.emit(Feed.Event.item(5), to: feedID("d")))
        #expect(rt.model.received == [Keyed.Received(key: "d", item: 5, generation: 0)])
    }

    /// Reuse reads the Swift runtime's unowned count: an `unowned` (safe)
    /// reference, which would trap on a freed object and must not reach a
    /// new activation, keeps the ticket from reuse too.
    @Test func ticketHeldUnownedAfterItsStopIsNotReused() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver)
        try rt.start()
        final class Holder { unowned let ticket: SourceTicket; init(_ t: SourceTicket) { ticket = t } }
        let holder = Holder(try #require(driver.running[feedID("a")]))
        let old = address(holder.ticket)
        try rt.send(.setKeys(["b", "c"]))
        try rt.send(.setKeys(["b", "c", "d"]))
        // Not reused: a's ticket was released (destroyed; an unowned
        // reference keeps its memory, so no new ticket can have its address;
        // reading it now would trap, as it should).
        withExtendedLifetime(holder) {
            #expect(address(driver.running[feedID("d")]) != old)
        }
        #expect(driver.running[feedID("d")]?.activation == Activation(generation: 4))
        #expect(driver.emit(Feed.Event.item(5), to: feedID("d")))
        #expect(rt.model.received == [Keyed.Received(key: "d", item: 5, generation: 0)])
    }

    @Test func ticketHeldStronglyAfterItsStopStaysStopped() throws {
        let driver = VirtualDriver()
        var diagnostics: [Diagnostic] = []
        let rt = Runtime(Keyed(), driver: driver)
        rt.diagnostics = { diagnostics.append($0) }
        try rt.start()
        let stale = try #require(driver.running[feedID("a")])
        try rt.send(.setKeys(["b", "c"]))
        try rt.send(.setKeys(["b", "c", "d"]))
        #expect(stale !== driver.running[feedID("d")])
        #expect(stale.id == feedID("a") && stale.activation == Activation(generation: 1) && !stale.isActive)
        stale.fail(SourceFailure(operation: "read", reason: "late"))
        #expect(rt.model.failures.isEmpty)
        #expect(diagnostics == [.eventAfterStop(feedID("a"), Activation(generation: 1))])
    }

    @Test func heldPlanKeepsItsStoppedTicketsFromReuse() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Keyed(), driver: driver)
        var plans: [Plan] = []
        rt.didReconcile = { plans.append($0) }
        try rt.start()
        try rt.send(.setKeys(["b", "c"]))
        let stopped = plans.last?.description
        try rt.send(.setKeys(["b", "c", "d"]))
        try rt.send(.setKeys(["e"]))
        // The plan that stopped a still says so after later starts.
        #expect(plans[1].description == stopped)
        #expect(stopped == "stop feed:a\nkeep 2")
        #expect(driver.log.map(\.description).suffix(4) == ["stop feed:b #2", "stop feed:c #3", "stop feed:d #4", "start feed:e #5"])
    }

    @Test func lateEventOfAStoppedPosterIsNotDeliveredAsTheNextStart() throws {
        let driver = VirtualDriver()
        var diagnostics: [Diagnostic] = []
        let rt = Runtime(Keyed(), driver: driver)
        rt.diagnostics = { diagnostics.append($0) }
        try rt.start()
        let poster = try #require(driver.poster(for: feedID("a")))
        #expect(poster.post(Feed.Event.item(1)) == .accepted)
        // a stops and d starts before the loop pumps the inbox.
        try rt.send(.setKeys(["b", "c"]))
        try rt.send(.setKeys(["b", "c", "d"]))
        #expect(poster.post(Feed.Event.item(2)) == .closed)
        driver.runUntilIdle()
        // Delivered late, as a's (its tagger), counted and reported as such.
        #expect(rt.stats.lateDeliveries == 1)
        #expect(rt.model.received == [Keyed.Received(key: "a", item: 1, generation: 0)])
        #expect(diagnostics == [.lateDelivery(feedID("a"), Activation(generation: 1))])
        // d is a new activation that got nothing.
        #expect(driver.running[feedID("d")]?.activation == Activation(generation: 4))
    }
}
