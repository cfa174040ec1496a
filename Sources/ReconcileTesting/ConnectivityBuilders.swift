import Reconcile

/// Short builders for connectivity snapshots in tests:
/// `driver.emit(.online(via: "wlan0"), to: net)`.
extension ConnectivitySource.Interface {
    /// Interface `name` (index `index`) in `state` with `addresses`.
    public static func link(_ name: String, index: Int32 = 2, _ state: ConnectivitySource.OperationalState = .routable,
                            addresses: [String] = []) -> Self {
        Self(name: name, index: index, state: state, addresses: addresses)
    }
}

extension ConnectivitySource.State {
    /// Online through `link`: routable with a default route and one address.
    public static func online(via link: String = "eth0", address: String = "10.0.0.1/24",
                              backend: ConnectivitySource.Backend = .kernel) -> Self {
        Self(state: .routable, online: true, defaultRoute: true,
             interfaces: [.link(link, .routable, addresses: [address])], backend: backend)
    }

    /// Offline: every link in `links` (indexes from 2) is in `state`, no default route.
    public static func offline(_ state: ConnectivitySource.OperationalState = .noCarrier, links: [String] = ["eth0"],
                               backend: ConnectivitySource.Backend = .kernel) -> Self {
        Self(state: links.isEmpty ? .off : state, online: false, defaultRoute: false,
             interfaces: links.enumerated().map { .link($0.element, index: Int32($0.offset + 2), state) }, backend: backend)
    }
}

extension ConnectivitySource.Event {
    /// `.changed` to `state`, changed at `at` (µs since the epoch).
    public static func changed(_ state: ConnectivitySource.State, at: Int64 = 1_000_000) -> Self {
        .changed(ConnectivitySource.Change(state: state, changedAt: at))
    }

    /// `.changed` to online through `link` (see `State.online(via:address:backend:)`).
    public static func online(via link: String = "eth0", address: String = "10.0.0.1/24",
                              backend: ConnectivitySource.Backend = .kernel, at: Int64 = 1_000_000) -> Self {
        .changed(.online(via: link, address: address, backend: backend), at: at)
    }

    /// `.changed` to offline (see `State.offline(_:links:backend:)`).
    public static func offline(_ state: ConnectivitySource.OperationalState = .noCarrier, links: [String] = ["eth0"],
                               backend: ConnectivitySource.Backend = .kernel, at: Int64 = 1_000_000) -> Self {
        .changed(.offline(state, links: links, backend: backend), at: at)
    }

    /// `.failed` with `reason` (operation `operation`).
    public static func failed(_ reason: String, operation: String = "connectivity") -> Self {
        .failed(SourceFailure(operation: operation, reason: reason))
    }
}
