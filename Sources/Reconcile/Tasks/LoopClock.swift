/// What a `LoopClock` reads and sleeps on: real monotonic time on the
/// sd-event loop (`ReconcileSystemd`), virtual time on `VirtualDriver`
/// (`ReconcileTesting`).
public protocol LoopClockSource: Sendable {
    /// The time now, as an offset from the source's epoch.
    var now: Duration { get }
    /// Suspends until `deadline` (an offset from the same epoch).
    /// - Throws: `CancellationError` when the task is cancelled first.
    func sleep(until deadline: Duration) async throws
}

/// The Swift `Clock` a runtime provides (`runtime.clock`, `daemon.clock`):
/// capture it in a task and `try await clock.sleep(for: .seconds(30))`.
///
/// On the sd-event loop it is the monotonic clock and sleeps are sd-event
/// timers; on `VirtualDriver` it is the virtual clock, so a 30-second sleep
/// ends when a test calls `advance(by: .seconds(30))`, not in real time.
public struct LoopClock: Clock {
    /// A point on the clock: an offset from its source's epoch.
    public struct Instant: InstantProtocol, Hashable, Sendable, CustomStringConvertible {
        /// The offset from the epoch.
        public var offset: Duration

        /// The instant `offset` after the epoch.
        public init(offset: Duration) { self.offset = offset }

        /// The instant `duration` later.
        public func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        /// The time from this instant to `other` (negative when `other` is earlier).
        public func duration(to other: Instant) -> Duration { other.offset - offset }
        /// Whether `a` comes before `b`.
        public static func < (a: Instant, b: Instant) -> Bool { a.offset < b.offset }
        /// `@` and the offset (`@30.0 seconds`).
        public var description: String { "@\(offset)" }
    }

    /// Where the time comes from.
    public let source: any LoopClockSource

    /// A clock on `source`.
    public init(_ source: any LoopClockSource) { self.source = source }

    /// The source's time now.
    public var now: Instant { Instant(offset: source.now) }
    /// One microsecond, the resolution of sd-event timers.
    public var minimumResolution: Duration { .microseconds(1) }

    /// Suspends until `deadline` on this clock.
    /// - Parameters:
    ///   - deadline: The instant to wake at.
    ///   - tolerance: Ignored; sd-event coalesces timers itself.
    /// - Throws: `CancellationError` when the task is cancelled first.
    ///
    /// A cancelled task's sleep still suspends once (`Task.yield`) before
    /// it throws: a task that retries in a loop
    /// (`while true { try? await clock.sleep(…) }`) then gives the loop its
    /// turn each time round, so the shutdown grace timer fires.
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        if Task.isCancelled {
            await Task.yield()
            throw CancellationError()
        }
        try await source.sleep(until: deadline.offset)
    }

    /// A clock on Swift's `ContinuousClock` (drivers that supply none).
    public static var continuous: LoopClock { LoopClock(ContinuousClockSource()) }
}

/// `ContinuousClock` as a clock source.
struct ContinuousClockSource: LoopClockSource {
    static let epoch = ContinuousClock.now
    var now: Duration { ContinuousClock.now - Self.epoch }
    func sleep(until deadline: Duration) async throws {
        try await ContinuousClock().sleep(until: Self.epoch + deadline)
    }
}
