import IndicatorCore
import Reconcile
import ReconcileSystemd

/// `--bus`: runs `ConnectivityService` on the daemon's loop, with a driver
/// (and a bus connection) of its own, fed by every model the indicator
/// commits. Its `Refresh()` re-reads the config file as SIGHUP does.
/// - Parameters:
///   - bus: The bus to serve on.
///   - daemon: The indicator's daemon (not running yet).
/// - Returns: The service's runtime (shut down after the daemon's run).
/// - Throws: The driver's error when the service cannot start.
func serveOnBus(_ bus: BusAddress, _ daemon: Daemon<Indicator>) throws -> Runtime<ConnectivityService> {
    let driver = SystemdDriver(loop: daemon.loop, logger: daemon.logger)
    let service = Runtime(ConnectivityService(bus: bus), driver: driver) { [unowned daemon, unowned driver] command, _ in
        switch command {
        case .bus(let c): driver.perform(c)
        case .refresh: try? daemon.runtime.send(.reload)
        case .log(let text): daemon.logger.notice(text)
        }
    }
    try service.start()
    let render = daemon.didCommit
    daemon.didCommit = { model in
        render?(model)
        try? service.send(.indicator(ConnectivityService.Snapshot(model)))
    }
    return service
}
