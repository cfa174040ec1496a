import CSystemd
import Dispatch
import Glibc

/// Drains the main actor's queue from an sd-event loop on the main thread.
///
/// On Linux the main actor's executor is libdispatch's main queue. While
/// `sd_event_loop` holds the main thread nothing else drains it, so
/// `@MainActor` code and `Task {}` from `main.swift` would wait forever.
/// libdispatch exports the run-loop hooks Foundation's `RunLoop` uses: an
/// eventfd that is readable while main-queue work is pending, and a call that
/// runs it. This adds an IO source for that eventfd to the loop.
///
/// Why not `ExecutorFactory`: in this toolchain it is SPI
/// (`@_spi(ExperimentalCustomExecutors)`), and a factory is chosen by the
/// program's `@main` type before anything runs; a library value created in
/// `main.swift` cannot install one. Draining the existing main queue needs
/// nothing from the program and is what every other run loop does.
final class MainQueueDrain {
    private var source: EventSource?

    /// Attaches to `loop`. Returns nil (does nothing) off the main thread.
    init?(loop: EventLoop) throws(SystemdError) {
        guard CSystemd_is_main_thread() != 0 else { return nil }
        // Make sure libdispatch (and its main queue) is linked and initialised.
        _ = DispatchQueue.main
        let fd = _dispatch_get_main_queue_handle_4CF()
        guard fd >= 0 else { return nil }
        var s: OpaquePointer?
        try check("sd_event_add_io (main queue)", sd_event_add_io(loop.handle, &s, fd, UInt32(EPOLLIN.rawValue), { _, fd, _, _ in
            var value: UInt64 = 0
            _ = read(fd, &value, 8)
            _dispatch_main_queue_callback_4CF(nil)
            return 0
        }, nil))
        source = EventSource(s!)
    }

    func close() {
        source?.close()
        source = nil
    }

    deinit { close() }
}
