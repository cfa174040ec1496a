import CSystemd
import Glibc
import Reconcile

extension DescriptorSource: SystemdSource {
    /// Watches the descriptor with `sd_event_add_io` (made non-blocking).
    ///
    /// - Throws: `SourceFailure` when it cannot be watched (`EPERM`: a
    ///   regular file or `/dev/null`); an owned descriptor is closed then.
    public static func start(_ ticket: SourceTicket, _ configuration: Configuration, context: SourceContext) throws -> any RunningSource {
        try DescriptorRunner(ticket: ticket, configuration: configuration, driver: context.driver)
    }
}

/// One descriptor on the loop: bounded non-blocking reads per dispatch,
/// framed into events; for a connection, a write queue drained on `EPOLLOUT`.
final class DescriptorRunner: RunningSource {
    /// Bytes read per dispatch at most, so one flooding descriptor leaves
    /// the loop to its other sources between dispatches; shared among the
    /// open descriptors (`IOState.readBudgetPerDispatch`).
    static let readBudget = 64 << 10
    /// Datagrams read per dispatch at most.
    static let datagramBudget = 64

    /// Weak: the ticket's driver state holds this runner (through the
    /// driver's `ForeignRunner`), and a runner whose ticket goes away
    /// without a stop (a runtime dropped without `shutdown()`) stops in
    /// that runner's deinit; held strongly it was a cycle, and the source
    /// ran on while the driver lived. Cleared at stop.
    private weak var ticket: SourceTicket?
    private let configuration: DescriptorSource.Configuration
    private let state: IOState
    private var source: OpaquePointer?
    @exclusivity(unchecked) private var lines: LineBuffer
    /// The most bytes one `read` asks for (reads go to `IOState.readBuffer`).
    private let readSize: Int
    private var queue: [UInt8] = []
    private var queueStart = 0
    @exclusivity(unchecked) private var reading = true
    @exclusivity(unchecked) private var open = true
    /// A dispatch's events are one batch (`SourceTicket.emit(batch:of:)`):
    /// `update` runs for each line, then one reconcile (a restart attempt's
    /// ticket takes a batch too). A ticket that takes none (neither the
    /// runtime's nor an attempt's: none of the library's) gets the events
    /// through the runtime's inbox instead (this poster, made on first use).
    private var poster: EventPoster?
    /// Events the inbox had no room for, in order; reading waits for them.
    private var backlog: [DescriptorSource.Event] = []
    private var backlogStart = 0
    private var retry: OpaquePointer?
    /// The read `streamLines` is framing and how far: a shutdown during
    /// its batch frames the rest of it (`framedRest`), reported dropped.
    /// (Unchecked exclusivity here and on `lines`, `open` and `reading`:
    /// each line reads them; the runner is the loop thread's alone.)
    @exclusivity(unchecked) private var chunk = UnsafeRawBufferPointer(start: nil, count: 0)
    @exclusivity(unchecked) private var chunkPosition = 0
    /// The end of input was read and its `.endOfFile` not delivered yet.
    @exclusivity(unchecked) private var endPending = false
    private let loop: EventLoop
    private var fd: Int32 { configuration.fd }

    init(ticket: SourceTicket, configuration: DescriptorSource.Configuration, driver: SystemdDriver) throws {
        self.ticket = ticket
        self.configuration = configuration
        state = driver.io
        loop = driver.loop
        switch configuration.framing {
        case .lines(let limit), .lineBatches(let limit): lines = LineBuffer(limit: limit); readSize = IOState.readBufferSize
        case .bytes(let chunk): lines = LineBuffer(limit: 1); readSize = min(max(1, chunk), IOState.readBufferSize)
        case .datagrams(let size): lines = LineBuffer(limit: 1); readSize = max(1, size)
        }
        let fd = configuration.fd
        let readable = configuration.connection.map { state.readable($0.id, fd: fd) }
        if let c = configuration.connection, readable == .closed {
            // Its descriptor is closed and its number may be another's now.
            open = false
            throw SourceFailure(operation: "read \(c)", code: EBADF,
                                reason: "the connection is closed (its subscription stopped, or its listener stopped before it was subscribed)")
        }
        do {
            // (A connection a listener accepted is non-blocking already.)
            let nb = readable == .accepted ? 0 : CSystemd_set_nonblocking(fd)
            if nb < 0 {
                throw SourceFailure(operation: "fcntl(\(fd), O_NONBLOCK)", code: -nb, reason: "descriptor \(fd) cannot be made non-blocking: \(errorText(-nb))")
            }
            var s: OpaquePointer?
            let r = sd_event_add_io(driver.loop.handle, &s, fd, UInt32(EPOLLIN.rawValue), { _, _, revents, ud in
                Unmanaged<DescriptorRunner>.fromOpaque(ud!).takeUnretainedValue().dispatch(revents)
                return 0
            }, Unmanaged.passUnretained(self).toOpaque())
            if r == -EPERM {
                throw SourceFailure(operation: "sd_event_add_io(\(fd))", code: EPERM,
                                    reason: "descriptor \(fd) is a regular file or /dev/null, which epoll cannot watch (under systemd a daemon's stdin is /dev/null); read a file with a task instead")
            }
            if r < 0 {
                throw SourceFailure(operation: "sd_event_add_io(\(fd))", code: -r, reason: errorText(-r))
            }
            EventSource.account(s!)
            source = s
            state.readerOpened()
        } catch {
            if configuration.ownsDescriptor { Glibc.close(fd) }
            if let c = configuration.connection { state.closed(c.id) }
            open = false
            throw error
        }
        if let c = configuration.connection { state.adopt(c.id, fd: fd, by: self) }
    }

    /// Hands `events` to the program in order: as one batch when the ticket
    /// takes one, else through the inbox.
    private func deliver(_ events: [DescriptorSource.Event]) {
        guard let ticket, !events.isEmpty else { return }
        if backlogStart == backlog.count, ticket.emit(batch: events, of: DescriptorSource.self) { return }
        if poster == nil { poster = ticket.poster() }
        if backlogStart < backlog.count {
            backlog.append(contentsOf: events)
        } else {
            backlog = events
            backlogStart = 0
        }
        drainBacklog()
    }

    private func drainBacklog() {
        guard let poster, ticket != nil else {
            backlog = []
            backlogStart = 0
            return
        }
        while backlogStart < backlog.count {
            switch poster.post(backlog[backlogStart]) {
            case .accepted:
                backlogStart += 1
            case .closed:
                backlog = []
                backlogStart = 0
                return
            case .full:
                // The inbox is full: retry from a later iteration (after
                // the runtime pumped it); reading waits meanwhile.
                armRetry()
                updateEvents()
                return
            }
        }
        backlog = []
        backlogStart = 0
        updateEvents()
    }

    /// A retry 1 ms later (a timer: a deferred source re-armed from its own
    /// dispatch would come before the runtime's wake-up, again and again).
    private func armRetry() {
        let due = usecAdd(loop.now(), 1000)
        if let retry {
            sd_event_source_set_time(retry, due)
            sd_event_source_set_enabled(retry, Int32(SD_EVENT_ONESHOT))
            return
        }
        var t: OpaquePointer?
        if sd_event_add_time(loop.handle, &t, CLOCK_MONOTONIC, due, 1000, { _, _, ud in
            Unmanaged<DescriptorRunner>.fromOpaque(ud!).takeUnretainedValue().drainBacklog()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque()) >= 0 {
            EventSource.account(t!)
            retry = t
        }
    }

    func retune(to configuration: AnyHashable) throws {}

    private func dispatch(_ revents: UInt32) {
        if revents & UInt32(EPOLLOUT.rawValue) != 0 {
            flush()
            guard open else { return }
        }
        if reading, revents & UInt32(EPOLLIN.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 {
            if case .datagrams(let size) = configuration.framing { readDatagrams(size) } else { readStream() }
        }
        updateEvents()
    }

    private func readStream() {
        if case .lines(let limit) = configuration.framing, backlogStart == backlog.count, let ticket, ticket.streams {
            return streamLines(limit: limit, ticket: ticket)
        }
        var budget = state.readBudgetPerDispatch
        var events: [DescriptorSource.Event] = []
        // `lineBatches`: the lines not yet in `events` (a `.lineTooLong` or
        // the end closes the batch before it, so the order is kept).
        var batch = state.takeLineBatch()
        var ended = false
        var failure: Int32 = 0
        let buffer = state.readBuffer(atLeast: readSize)
        while budget > 0 {
            let asked = min(readSize, budget)
            let n = read(fd, buffer.baseAddress, asked)
            if n > 0 {
                budget -= n
                let got = UnsafeRawBufferPointer(rebasing: buffer[..<n])
                switch configuration.framing {
                // (`next` in a loop, not `feed` and a closure: the closure
                // was not inlined, a call per line.)
                case .lines(let limit):
                    var position = 0
                    while let item = lines.next(got, from: &position) { events.append(item.event(limit: limit)) }
                case .lineBatches(let limit):
                    // The read copied into the batch once, a line that lies
                    // whole in it kept as its place there (a line begun in
                    // an earlier read is copied on its own); no string made
                    // until the program reads it.
                    var copied: Int? = batch.appendRead(got)
                    let first = got.baseAddress!
                    var position = 0
                    while true {
                        if let copied, lines.isClear {
                            lines.wholeLines(got, from: &position) { batch.appendLine(from: copied + $0, count: $1) }
                        }
                        // A line begun before, one too long, the last part.
                        guard let item = lines.next(got, from: &position, { line in
                            if let copied, let start = line.baseAddress, start >= first, start + line.count <= first + n {
                                batch.appendLine(from: copied + first.distance(to: start), count: line.count)
                            } else {
                                batch.append(utf8: line)
                            }
                        }) else { break }
                        // A too-long line closes the batch, the copy with it.
                        if case .tooLong = item, !batch.isEmpty { copied = nil }
                        Self.collect(item, limit: limit, into: &batch, &events)
                    }
                case .bytes, .datagrams:
                    events.append(.bytes(Array(got)))
                }
                // A short read took what was there: the next would most
                // likely say EAGAIN (epoll is level-triggered: more data
                // dispatches again).
                if n < asked { break }
            } else if n == 0 {
                ended = true
                break
            } else {
                let e = errno
                if e == EINTR { continue }
                if e != EAGAIN && e != EWOULDBLOCK { failure = e }
                break
            }
        }
        if ended {
            switch configuration.framing {
            case .lines(let limit): if let last = lines.finish() { events.append(last.event(limit: limit)) }
            case .lineBatches(let limit): if let last = lines.finish({ batch.append(utf8: $0) }) { Self.collect(last, limit: limit, into: &batch, &events) }
            case .bytes, .datagrams: break
            }
        }
        if !batch.isEmpty { events.append(Self.lines(of: &batch)) }
        if ended || failure != 0 { reading = false }
        if ended { events.append(.endOfFile) }
        // The buffer is not used past here: the program may start a reader
        // that reads into it before this returns.
        deliver(consume events)
        // Delivered: the batch's storage kept for the next when nothing
        // else holds it (moved: a copy left here would make it shared, and
        // emptying it would allocate new storage).
        state.returnLineBatch(consume batch)
        if failure != 0 {
            ticket?.fail(SourceFailure(operation: "read(\(fd))", code: failure, reason: errorText(failure)))
        }
    }

    /// `lines` to the runtime's own ticket: each line is delivered (and
    /// `update` runs for it) as it is framed, no array of a dispatch's
    /// events built (`SourceTicket.stream`); the same bounded reads as
    /// `readStream`, the same events in the same order.
    private func streamLines(limit: Int, ticket: SourceTicket) {
        var budget = state.readBudgetPerDispatch
        var failure: Int32 = 0
        let buffer = state.readBuffer(atLeast: readSize)
        state.streaming = true
        defer { state.streaming = false }
        _ = ticket.stream(of: DescriptorSource.self, rest: { framedRest(limit) }) { deliver in
            // False once the runtime takes nothing more (it shut down).
            var taking = true
            // Reads stop when a command closed this connection meanwhile;
            // what was read is still delivered.
            while taking, open, budget > 0 {
                let asked = min(readSize, budget)
                let n = read(fd, buffer.baseAddress, asked)
                if n > 0 {
                    budget -= n
                    chunk = UnsafeRawBufferPointer(rebasing: buffer[..<n])
                    chunkPosition = 0
                    while taking, let item = lines.next(chunk, from: &chunkPosition) {
                        taking = deliver(item.event(limit: limit))
                    }
                    chunk = UnsafeRawBufferPointer(start: nil, count: 0)
                    if n < asked { break }   // (as in readStream)
                } else if n == 0 {
                    reading = false
                    // The partial last line is taken out of the buffer
                    // before it is delivered (its `update` may shut the
                    // runtime down, and `framedRest` reads the buffer); the
                    // end is owed until it is delivered.
                    endPending = true
                    if let last = lines.finish() { taking = deliver(last.event(limit: limit)) }
                    if taking {
                        endPending = false
                        _ = deliver(.endOfFile)
                    }
                    break
                } else {
                    let e = errno
                    if e == EINTR { continue }
                    if e != EAGAIN && e != EWOULDBLOCK {
                        failure = e
                        reading = false
                    }
                    break
                }
            }
        }
        if failure != 0 {
            self.ticket?.fail(SourceFailure(operation: "read(\(fd))", code: failure, reason: errorText(failure)))
        }
    }

    /// The events the rest of `chunk` frames, then the end when it is owed
    /// (a shutdown during `streamLines`'s batch).
    private func framedRest(_ limit: Int) -> [DescriptorSource.Event] {
        var events: [DescriptorSource.Event] = []
        while let item = lines.next(chunk, from: &chunkPosition) { events.append(item.event(limit: limit)) }
        if endPending {
            endPending = false
            events.append(.endOfFile)
        }
        return events
    }

    private func readDatagrams(_ size: Int) {
        var events: [DescriptorSource.Event] = []
        var failure: Int32 = 0
        let buffer = state.readBuffer(atLeast: size)
        for _ in 0..<Self.datagramBudget {
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let n = withUnsafeMutablePointer(to: &storage) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    recvfrom(fd, buffer.baseAddress, size, Int32(MSG_TRUNC), $0, &length)
                }
            }
            if n >= 0 {
                events.append(.datagram(Array(UnsafeRawBufferPointer(rebasing: buffer[..<min(n, size)])),
                                        from: peerAddress(storage, length), truncated: n > size))
            } else {
                let e = errno
                if e == EINTR { continue }
                if e != EAGAIN && e != EWOULDBLOCK { failure = e }
                break
            }
        }
        if failure != 0 { reading = false }
        deliver(events)
        if failure != 0 {
            ticket?.fail(SourceFailure(operation: "recvfrom(\(fd))", code: failure, reason: errorText(failure)))
        }
    }

    /// Reading and whether writes wait decide the epoll mask; neither: off
    /// (a hung-up descriptor is not dispatched again and again).
    private func updateEvents() {
        guard let source, open else { return }
        var mask: UInt32 = 0
        if reading, backlogStart == backlog.count { mask |= UInt32(EPOLLIN.rawValue) }
        if queueStart < queue.count { mask |= UInt32(EPOLLOUT.rawValue) }
        if mask == 0 {
            sd_event_source_set_enabled(source, Int32(SD_EVENT_OFF))
        } else {
            sd_event_source_set_io_events(source, mask)
            sd_event_source_set_enabled(source, Int32(SD_EVENT_ON))
        }
    }

    /// One non-blocking write; the count written, or -errno.
    private func writeSome(_ bytes: UnsafeRawBufferPointer) -> Int {
        while true {
            var n = send(fd, bytes.baseAddress, bytes.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
            if n < 0, errno == ENOTSOCK { n = Glibc.write(fd, bytes.baseAddress, bytes.count) }
            if n >= 0 { return n }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { return 0 }
            return -Int(e)
        }
    }

    /// Bytes written to this connection before this subscription took it
    /// (`IOState.writeEarly`): queued ahead of everything, sent from a
    /// dispatch once the socket is writable.
    func queueEarly(_ bytes: [UInt8]) {
        guard open, !bytes.isEmpty else { return }
        queue.insert(contentsOf: bytes, at: queueStart)
        updateEvents()
    }

    func write(_ bytes: [UInt8]) -> SystemdDriver.WriteOutcome {
        guard open, ticket != nil else { return .closed }
        var rest = bytes[...]
        if queueStart == queue.count {
            queue.removeAll(keepingCapacity: true)
            queueStart = 0
            let n = bytes.withUnsafeBytes { writeSome($0) }
            if n < 0 {
                closeConnection(.writeFailed(errno: Int32(-n)))
                return .closed
            }
            if n == bytes.count { return .sent }
            rest = bytes[n...]
        }
        queue.append(contentsOf: rest)
        let queued = queue.count - queueStart
        if queued > configuration.writeQueueLimit {
            closeConnection(.writeQueueFull(queued: queued))
            return .closed
        }
        updateEvents()
        return .queued(bytes: queued)
    }

    private func flush() {
        while queueStart < queue.count {
            let n = queue.withUnsafeBytes { writeSome(UnsafeRawBufferPointer(rebasing: $0[queueStart...])) }
            if n < 0 { return closeConnection(.writeFailed(errno: Int32(-n))) }
            if n == 0 { break }
            queueStart += n
        }
        if queueStart == queue.count {
            queue.removeAll(keepingCapacity: false)
            queueStart = 0
        } else if queueStart > queue.count / 2 {
            queue.removeFirst(queueStart)
            queueStart = 0
        }
    }

    /// Closes the descriptor now and tells the program why.
    private func closeConnection(_ reason: DescriptorSource.CloseReason) {
        release()
        deliver([.closed(reason)])
    }

    private func release() {
        guard open else { return }
        open = false
        reading = false
        if let source {
            sd_event_source_disable_unref(source)
            state.readerClosed()
        }
        source = nil
        queue = []
        queueStart = 0
        if configuration.ownsDescriptor { Glibc.close(fd) }
        if let c = configuration.connection { state.closed(c.id) }
    }

    func stop() {
        ticket = nil
        poster = nil
        backlog = []
        backlogStart = 0
        if let retry { sd_event_source_disable_unref(retry) }
        retry = nil
        // A last attempt at what waits (the peer may have read meanwhile).
        if open, queueStart < queue.count { flush() }
        release()
    }

    deinit {
        release()
        if let retry { sd_event_source_disable_unref(retry) }
    }
}

extension DescriptorRunner {
    /// `lineBatches`: a line has joined `batch` as it was framed; a
    /// too-long line closes the batch (into `events`) and follows it.
    @inline(__always)
    static func collect(_ item: LineBuffer.Item<Void>, limit: Int, into batch: inout LineBatch, _ events: inout [DescriptorSource.Event]) {
        switch item {
        case .line: break
        case .tooLong:
            if !batch.isEmpty {
                events.append(lines(of: &batch))
                batch.removeAll(keepingCapacity: true)
            }
            events.append(.lineTooLong(limit: limit))
        }
    }

    /// The `.lines` event of `batch` (not empty). A batch that fills less
    /// than an eighth of its room (the loop's spare keeps the room of its
    /// largest batch), in lines or in its lines' own bytes (line ends and
    /// skipped lines are not counted), goes as a copy of its own
    /// size, and `batch` is emptied in place: a program that keeps the
    /// lines does not keep the room. A fuller one goes as it is, `batch`
    /// still holding it.
    static func lines(of batch: inout LineBatch) -> DescriptorSource.Event {
        let room = batch.capacity
        guard batch.count &* 8 < room.lines || batch.byteCount &* 8 < room.bytes else { return .lines(batch) }
        let copy = batch.copiedToSize()
        batch.removeAll(keepingCapacity: true)
        return .lines(copy)
    }
}

extension LineBuffer.Item where Line == String {
    /// The descriptor event of this item (`limit`: the configured maximum).
    @inline(__always)
    consuming func event(limit: Int) -> DescriptorSource.Event {
        switch consume self {
        case .line(let s): .line(s)
        case .tooLong: .lineTooLong(limit: limit)
        }
    }
}
