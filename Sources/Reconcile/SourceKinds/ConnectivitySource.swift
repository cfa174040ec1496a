/// The machine's connectivity: one event per change of what the subscriber
/// sees, from the kernel (rtnetlink) or from systemd-networkd (D-Bus).
public enum ConnectivitySource: Source {
    /// `connectivity`.
    public static let name = "connectivity"

    /// Where the state comes from.
    public enum Backend: String, Hashable, Sendable, CaseIterable {
        /// networkd when it owns `org.freedesktop.network1` on the system bus,
        /// else the kernel.
        case auto
        /// rtnetlink: links, addresses and routes; needs no daemon.
        case kernel
        /// systemd-networkd's `org.freedesktop.network1.Manager` properties.
        case networkd
    }

    /// What a subscription wants to be woken for. The driver compares each
    /// new state with the last one it reported *through this lens* and emits
    /// only when they differ; the event then carries the whole current state.
    public enum Granularity: String, Hashable, Sendable, CaseIterable {
        /// Only the verdict: `online`.
        case online
        /// The machine-wide picture: `state`, `online`, `defaultRoute` and
        /// `backend` (no per-interface detail, no addresses).
        case overall
        /// Everything in `State`, interfaces and addresses included (the default).
        case full

        /// Whether a subscriber at this granularity must be told about the
        /// change from `old` to `new`.
        public func distinguishes(_ old: State, _ new: State) -> Bool {
            switch self {
            case .online:
                old.online != new.online
            case .overall:
                old.online != new.online || old.state != new.state
                    || old.defaultRoute != new.defaultRoute || old.backend != new.backend
            case .full:
                old != new
            }
        }
    }

    /// A connectivity watch's parameters.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The backend.
        public var backend: Backend
        /// Interface name globs to include (empty: all but loopback).
        public var include: [String]
        /// Interface name globs to exclude (applied after `include`).
        public var exclude: [String]
        /// Report a state only after it has held this long (flapping links).
        public var settle: Duration?
        /// The kernel backend's socket receive buffer in bytes (nil: the
        /// kernel default). Small values make overruns (and resyncs) likely.
        public var receiveBuffer: Int?
        /// What wakes the program (default `.full`: any change of `State`).
        /// Changes in place, without a restart.
        public var granularity: Granularity
        /// How the backend retries after a failure: the kernel backend's
        /// resync after a lost or refused dump, the networkd backend's
        /// reconnect to the system bus (`defaultRetry` unless told otherwise).
        public var restart: RestartPolicy

        /// A watch on `backend` over the interfaces `include`/`exclude` admit, reporting after `settle`
        /// the changes `granularity` distinguishes.
        /// - Parameters:
        ///   - backend: The backend.
        ///   - include: Interface name globs to include (empty: all but loopback).
        ///   - exclude: Interface name globs to exclude.
        ///   - settle: How long a state must hold before it is reported.
        ///   - receiveBuffer: The kernel backend's socket receive buffer.
        ///   - granularity: What wakes the program.
        ///   - restart: How the backend retries after a failure.
        public init(backend: Backend = .auto, include: [String] = [], exclude: [String] = [],
                    settle: Duration? = nil, receiveBuffer: Int? = nil, granularity: Granularity = .full,
                    restart: RestartPolicy = ConnectivitySource.defaultRetry) {
            self.backend = backend
            self.include = include
            self.exclude = exclude
            self.settle = settle
            self.receiveBuffer = receiveBuffer
            self.granularity = granularity
            self.restart = restart
        }

        /// Whether interface `name` passes the filters.
        public func admits(_ name: String) -> Bool {
            if !include.isEmpty && !include.contains(where: { glob($0, matches: name) }) { return false }
            return !exclude.contains { glob($0, matches: name) }
        }

        /// `backend auto include eth* settle 2s`, as plans show it.
        public var description: String {
            var parts = ["backend \(backend.rawValue)"]
            if !include.isEmpty { parts.append("include \(include.joined(separator: ","))") }
            if !exclude.isEmpty { parts.append("exclude \(exclude.joined(separator: ","))") }
            if let settle { parts.append("settle \(settle.short)") }
            if let receiveBuffer { parts.append("rcvbuf \(receiveBuffer)") }
            if granularity != .full { parts.append("granularity \(granularity.rawValue)") }
            if restart != ConnectivitySource.defaultRetry { parts.append("restart \(restart)") }
            return parts.joined(separator: " ")
        }
    }

    /// networkd's operational states, in order.
    public enum OperationalState: String, Hashable, Sendable, Comparable, CaseIterable {
        /// The link is down (administratively or missing).
        case off
        /// Up, but no carrier (no cable, not associated).
        case noCarrier = "no-carrier"
        /// Carrier, but waiting for something (802.1X, a dormant device).
        case dormant
        /// A bond or bridge whose ports have carrier, but not the master itself.
        case degradedCarrier = "degraded-carrier"
        /// Carrier, no address beyond link-local.
        case carrier
        /// Has an address, but no route off the link.
        case degraded
        /// Part of a bond or bridge.
        case enslaved
        /// Has an address and a route off the link.
        case routable

        /// Whether `a` comes before `b` in networkd's order (`off` < … < `routable`).
        public static func < (a: Self, b: Self) -> Bool {
            allCases.firstIndex(of: a)! < allCases.firstIndex(of: b)!
        }
    }

    /// One interface as the subscriber sees it.
    public struct Interface: Hashable, Sendable {
        /// The interface name (`eth0`).
        public var name: String
        /// The kernel's interface index.
        public var index: Int32
        /// The link's operational state.
        public var state: OperationalState
        /// Addresses with prefix length (`192.168.1.2/24`, `fe80::1/64`).
        public var addresses: [String]

        /// An interface as reported.
        public init(name: String, index: Int32, state: OperationalState, addresses: [String]) {
            self.name = name
            self.index = index
            self.state = state
            self.addresses = addresses
        }
    }

    /// What the subscriber sees. Two states that compare equal are the same
    /// report: an event is emitted only when this changes (or, with a coarser
    /// `Granularity`, only when the part it looks at changes).
    public struct State: Hashable, Sendable {
        /// The overall operational state: the highest over included links.
        public var state: OperationalState
        /// Routable and a default route exists (kernel); networkd's
        /// OnlineState, or routable when it has none (networkd).
        public var online: Bool
        /// Whether an IPv4 or IPv6 default route exists (from rtnetlink with
        /// either backend; nil when it cannot be known).
        public var defaultRoute: Bool?
        /// The included interfaces, by index (from rtnetlink with either backend).
        public var interfaces: [Interface]
        /// The backend that answered (`kernel` or `networkd`).
        public var backend: Backend

        /// A state as reported (tests: see `ReconcileTesting`'s `.online(via:)` builders).
        public init(state: OperationalState, online: Bool, defaultRoute: Bool?, interfaces: [Interface], backend: Backend) {
            self.state = state
            self.online = online
            self.defaultRoute = defaultRoute
            self.interfaces = interfaces
            self.backend = backend
        }

        /// The interface that makes the machine online, if one is routable.
        public var primary: Interface? {
            interfaces.first { $0.state == .routable } ?? interfaces.max { $0.state < $1.state }
        }
    }

    /// A reported change.
    public struct Change: Hashable, Sendable {
        /// The whole current state. With a coarser granularity, the fields it
        /// does not look at are as of this event: later changes to them alone
        /// are not reported.
        public var state: State
        /// When it changed (or, with settle, when it started to hold):
        /// microseconds since the Unix epoch.
        public var changedAt: Int64

        /// A change to `state` at `changedAt` (µs since the epoch).
        public init(state: State, changedAt: Int64) {
            self.state = state
            self.changedAt = changedAt
        }
    }

    /// What a connectivity watch reports.
    public enum Event: Hashable, Sendable {
        /// The state changed (the first event is the initial state).
        case changed(Change)
        /// The backend failed (no bus, networkd gone, socket error). The
        /// source keeps trying and reports `.changed` when it recovers.
        case failed(SourceFailure)
        /// The backend tries again (attempt `attempt`) after `after`, by the
        /// restart policy: the kernel backend's resync, the networkd
        /// backend's reconnect. Added with restart policies: an exhaustive
        /// `switch` needs this case.
        case restarting(attempt: Int, after: Duration)
    }

    /// The retry a connectivity watch gets unless told otherwise: a bus
    /// source's (`BusAddress.defaultReconnect`: 100 ms doubling to 5 s, no
    /// jitter, no cap; it retries as long as it is wanted). With `.never` a
    /// failed backend stays failed until its subscription changes; at a cap
    /// it reports one last failure.
    public static let defaultRetry = BusAddress.defaultReconnect

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }

    /// Filters, settle and granularity change in place; a backend or
    /// receive buffer change restarts.
    public static func canRetune(from old: Configuration, to new: Configuration) -> Bool {
        old.backend == new.backend && old.receiveBuffer == new.receiveBuffer && old.restart == new.restart
    }
}

extension Subscription {
    /// A connectivity watch keyed by `key`.
    @inlinable
    public static func connectivity<Key: Hashable & Sendable>(
        _ configuration: ConnectivitySource.Configuration = .init(), key: Key,
        _ tag: @escaping (ConnectivitySource.Event) -> Message
    ) -> Subscription {
        Subscription(ConnectivitySource.self, key: key, configuration: configuration, tag: tag)
    }
}

extension ConnectivitySource {
    /// Shell-style glob, as the interface filters match names: `*`, `?` and
    /// `[...]` (with `!` or `^` negation and ranges).
    public static func glob(_ pattern: String, matches name: String) -> Bool {
        let p = Array(pattern.unicodeScalars), s = Array(name.unicodeScalars)
        var pi = 0, si = 0, starP = -1, starS = 0
        while si < s.count {
            if pi < p.count {
                switch p[pi] {
                case "*":
                    starP = pi; starS = si; pi += 1; continue
                case "?":
                    pi += 1; si += 1; continue
                case "[":
                    if let (ok, next) = matchClass(p, pi, s[si]) {
                        if ok { pi = next; si += 1; continue }
                    } else if p[pi] == s[si] { pi += 1; si += 1; continue }
                default:
                    if p[pi] == s[si] { pi += 1; si += 1; continue }
                }
            }
            guard starP >= 0 else { return false }
            pi = starP + 1; starS += 1; si = starS
        }
        while pi < p.count && p[pi] == "*" { pi += 1 }
        return pi == p.count
    }

    private static func matchClass(_ p: [Unicode.Scalar], _ start: Int, _ c: Unicode.Scalar) -> (Bool, Int)? {
        var i = start + 1
        var negate = false
        if i < p.count && (p[i] == "!" || p[i] == "^") { negate = true; i += 1 }
        var matched = false
        var first = true
        while i < p.count && (p[i] != "]" || first) {
            first = false
            if i + 2 < p.count && p[i + 1] == "-" && p[i + 2] != "]" {
                if p[i] <= c && c <= p[i + 2] { matched = true }
                i += 3
            } else {
                if p[i] == c { matched = true }
                i += 1
            }
        }
        guard i < p.count else { return nil }   // no closing bracket: literal '['
        return (matched != negate, i + 1)
    }
}
