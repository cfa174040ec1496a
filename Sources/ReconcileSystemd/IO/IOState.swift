import CSystemd
import Glibc
import Reconcile

/// What the driver's descriptor, listener and process sources share: the
/// accepted connections not yet closed (by id), the children still being
/// stopped, and sd-event sources to release outside their own callback.
final class IOState {
    /// An accepted connection: its socket, the listener counting it, the
    /// subscription reading it once one has taken it.
    final class Entry {
        let fd: Int32
        /// Accepted by a listener (`accept4` with `SOCK_NONBLOCK`): already
        /// non-blocking, so its reader asks no `fcntl`.
        let accepted: Bool
        weak var listener: ListenerRunner?
        weak var reader: DescriptorRunner?
        /// Bytes written before a subscription took it (`writeEarly`).
        var early: [UInt8] = []
        /// Its listener stopped before a subscription took it: closed after
        /// that reconcile unless one of its starts took it.
        var orphaned = false
        init(fd: Int32, listener: ListenerRunner?) {
            self.fd = fd
            self.accepted = listener != nil
            self.listener = listener
        }
    }

    private let loop: EventLoop
    private(set) var nextConnection: UInt64 = 1
    private var connections: [UInt64: Entry] = [:]
    /// Stopped children not yet reaped, kept alive here.
    var lingering: [ObjectIdentifier: ProcessRunner] = [:]
    private var releases: [OpaquePointer] = []
    private var releaser: OpaquePointer?
    /// A listener stopped with connections no subscription had taken.
    private var closeOrphans = false

    init(loop: EventLoop) { self.loop = loop }

    /// The size of `readBuffer` unless a datagram source needs more: 64 KiB.
    static let readBufferSize = 64 << 10
    private var buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: IOState.readBufferSize, alignment: 16)

    /// Whether a descriptor is streaming lines out of `readBuffer` now
    /// (`DescriptorRunner.streamLines`): its lines are framed from the
    /// buffer while `update` and the commands run, so nothing else may
    /// read into it meanwhile.
    var streaming = false

    /// The one buffer every descriptor's dispatch reads into, at least
    /// `count` bytes: one per loop, not one per connection. Reads happen on
    /// the loop thread, in sd-event dispatches, which do not nest: a
    /// dispatch has made what it read into events before it hands them
    /// on, or, streaming lines, frames them from the buffer as they are
    /// delivered, and no command reads a descriptor (checked here in debug
    /// builds).
    func readBuffer(atLeast count: Int) -> UnsafeMutableRawBufferPointer {
        assert(!streaming, "IOState.readBuffer: asked for while a descriptor streams lines out of it")
        if buffer.count < count {
            buffer.deallocate()
            buffer = .allocate(byteCount: count, alignment: 16)
        }
        return buffer
    }

    /// The batch a batched dispatch gathers its lines in (`lines(fd,
    /// batched: true)`), kept between dispatches: one per loop. Once
    /// `update` has seen a batch, it is emptied in place and its storage
    /// is used again, so a batch neither grows its arrays from nothing nor
    /// asks malloc for a large block each dispatch (a large block given
    /// back next to the heap's top makes glibc consolidate its free chunks,
    /// and every allocation after it takes the slow path).
    private var spareLines = LineBatch()

    /// Batches emptied in place for the next (tests).
    private(set) var lineBatchesEmptiedInPlace = 0

    /// The spare batch (empty), taken: a nested dispatch, were there one,
    /// gets an empty one of its own.
    func takeLineBatch() -> LineBatch {
        var batch = LineBatch()
        swap(&batch, &spareLines)
        return batch
    }

    /// `batch`, delivered, back as the spare: emptied, its room kept up to
    /// `spareLineCapacity` lines and `spareByteCapacity` bytes (one 64 KiB
    /// dispatch of 64-byte lines is about 1,000 lines). When something
    /// still holds its storage (a program kept it, a shutdown reported it
    /// dropped, the inbox holds it), the spare gets a copy of the room.
    func returnLineBatch(_ batch: consuming LineBatch) {
        let room = batch.capacity
        guard room.bytes > 0, room.lines <= Self.spareLineCapacity, room.bytes <= Self.spareByteCapacity else { return }
        if batch.emptyForReuse() { lineBatchesEmptiedInPlace += 1 }
        spareLines = batch
    }

    /// The most lines a spare batch keeps room for: 8,192 (128 KiB of places).
    static let spareLineCapacity = 8192
    /// The most bytes a spare batch keeps room for: 256 KiB (a dispatch
    /// reads at most `DescriptorRunner.readBudget`, 64 KiB; a line longer
    /// than a read joins its batch whole).
    static let spareByteCapacity = 256 << 10

    /// Descriptors open for reading now (`DescriptorRunner`).
    private(set) var readers = 0
    func readerOpened() { readers += 1 }
    func readerClosed() { readers -= 1 }

    /// Bytes one descriptor's dispatch reads at most: `DescriptorRunner.readBudget`
    /// shared among the open descriptors (at least 4 KiB), so a round of
    /// the loop over many flooding descriptors reads about that much in
    /// all, and a timer due meanwhile waits for that much work, not for
    /// the budget times the number of descriptors.
    var readBudgetPerDispatch: Int { max(4 << 10, DescriptorRunner.readBudget / max(1, readers)) }

    /// Registers a connection `listener` just accepted; returns its id.
    func register(fd: Int32, listener: ListenerRunner) -> UInt64 {
        let id = nextConnection
        nextConnection += 1
        connections[id] = Entry(fd: fd, listener: listener)
        return id
    }

    /// `reader` takes connection `id`: one a listener accepted, or one made
    /// elsewhere (`SocketActivation.connection(_:)`), registered now.
    func adopt(_ id: UInt64, fd: Int32, by reader: DescriptorRunner) {
        if let entry = connections[id], entry.fd == fd {
            entry.reader = reader
            if !entry.early.isEmpty {
                reader.queueEarly(entry.early)
                entry.early = []
            }
            return
        }
        let entry = Entry(fd: fd, listener: nil)
        entry.reader = reader
        connections[id] = entry
    }

    /// What a reader finds of connection `id` on `fd` (one table lookup).
    enum Readable {
        /// A listener accepted it (`SOCK_NONBLOCK`: non-blocking already).
        case accepted
        /// Open, or never a listener's (`SocketActivation.connection(_:)`).
        case other
        /// Closed (its subscription stopped, or its listener stopped
        /// before it was subscribed): its number may be another's now.
        case closed
    }

    func readable(_ id: UInt64, fd: Int32) -> Readable {
        if let entry = connections[id] { return entry.accepted && entry.fd == fd ? .accepted : .other }
        return id >= nextConnection ? .other : .closed
    }

    /// What an accepted connection may hold written before its
    /// subscription has started (a greeting written in the update that saw
    /// `.accepted`): 64 KiB.
    static let earlyWriteLimit = 64 << 10

    /// Keeps `bytes` for accepted connection `id`, which no subscription
    /// reads yet: the subscription that takes it sends them first. Beyond
    /// `earlyWriteLimit` in all, or for a connection that is gone, nothing
    /// is kept (`.closed`).
    func writeEarly(_ bytes: [UInt8], to id: UInt64) -> SystemdDriver.WriteOutcome {
        guard let entry = connections[id], entry.reader == nil,
              entry.early.count + bytes.count <= Self.earlyWriteLimit else { return .closed }
        entry.early += bytes
        return .queued(bytes: entry.early.count)
    }

    /// The reader of connection `id`, when a subscription holds it.
    func reader(of id: UInt64) -> DescriptorRunner? { connections[id]?.reader }

    /// Connection `id` was closed by its subscription: its listener counts one less.
    func closed(_ id: UInt64) {
        guard let entry = connections.removeValue(forKey: id) else { return }
        entry.listener?.connectionEnded()
    }

    /// `listener` stops: the connections no subscription has taken are
    /// closed after the reconcile that stopped it (from a later dispatch),
    /// so the ones the same reconcile starts reading stay open (a program
    /// that stops listening in the update that saw an accept keeps what it
    /// accepted); the others stay with their subscriptions.
    func listenerStopped(_ listener: ListenerRunner) {
        var orphans = false
        for (_, entry) in connections where entry.listener === listener {
            entry.listener = nil
            if entry.reader == nil {
                entry.orphaned = true
                orphans = true
            }
        }
        if orphans {
            closeOrphans = true
            armReleaser()
        }
    }

    /// Releases `source` from a later dispatch (it may be the one running now).
    func releaseLater(_ source: OpaquePointer) {
        releases.append(source)
        armReleaser()
    }

    /// Runs `releaseNow` from a later dispatch.
    private func armReleaser() {
        if releaser == nil {
            var s: OpaquePointer?
            let r = sd_event_add_defer(loop.handle, &s, { _, ud in
                Unmanaged<IOState>.fromOpaque(ud!).takeUnretainedValue().releaseNow()
                return 0
            }, Unmanaged.passUnretained(self).toOpaque())
            if r >= 0 { releaser = s } else { releaseNow() }
        } else if let releaser {
            sd_event_source_set_enabled(releaser, Int32(SD_EVENT_ONESHOT))
        }
    }

    private func releaseNow() {
        let all = releases
        releases = []
        for s in all { sd_event_source_disable_unref(s) }
        if closeOrphans {
            closeOrphans = false
            // A stopped listener's connections that no subscription took.
            for (id, entry) in connections where entry.orphaned && entry.reader == nil {
                Glibc.close(entry.fd)
                connections[id] = nil
            }
        }
    }

    /// The driver detaches: stopped children get up to a second (within
    /// their grace) to end after their SIGTERM, then are killed and reaped;
    /// connections nobody took are closed.
    func detach() {
        let children = Array(lingering.values)
        lingering = [:]
        ProcessRunner.finish(children)
        for (_, entry) in connections where entry.reader == nil { Glibc.close(entry.fd) }
        connections = [:]
        releaseNow()
        if let releaser { sd_event_source_disable_unref(releaser) }
        releaser = nil
    }

    deinit {
        detach()
        buffer.deallocate()
    }
}

extension SystemdDriver {
    /// The shared descriptor/listener/process state, made on first use.
    var io: IOState {
        if let state = ioState { return state }
        let state = IOState(loop: loop)
        ioState = state
        return state
    }

    /// What a write to a connection came to.
    public enum WriteOutcome: Equatable, Sendable {
        /// Written to the socket in full.
        case sent
        /// Partly or wholly queued: `bytes` wait for the peer to read.
        case queued(bytes: Int)
        /// The connection is closed (by its subscription, or now: the queue
        /// passed its limit or a write failed, reported as `.closed`).
        case closed
    }

    /// Writes `bytes` to `connection` without blocking: what the socket does
    /// not take now is queued and sent as the peer reads, up to the
    /// subscription's `writeQueueLimit`; beyond it the connection is closed
    /// and its subscription gets `.closed(.writeQueueFull)`.
    ///
    /// A connection accepted but not yet read by a subscription (a greeting
    /// written in the update that saw `.accepted`, before the reconcile
    /// that starts its `Subscription.connection`) keeps up to 64 KiB
    /// (`.queued`), sent first once its subscription starts; beyond that,
    /// or if no subscription ever takes it, they are dropped with it.
    ///
    /// - Parameters:
    ///   - bytes: the bytes to send.
    ///   - connection: a connection a `Subscription.connection` reads, or
    ///     one just accepted that it is about to.
    /// - Returns: what became of the write.
    @discardableResult
    public func write(_ bytes: [UInt8], to connection: Connection) -> WriteOutcome {
        guard let ioState else { return .closed }
        guard let reader = ioState.reader(of: connection.id) else { return ioState.writeEarly(bytes, to: connection.id) }
        return reader.write(bytes)
    }

    /// Writes `text` to `connection` (see `write(_:to:)`).
    ///
    /// - Parameters:
    ///   - text: the text, sent as UTF-8.
    ///   - connection: a connection a running `Subscription.connection` reads.
    /// - Returns: what became of the write.
    @discardableResult
    public func write(_ text: String, to connection: Connection) -> WriteOutcome {
        write(Array(text.utf8), to: connection)
    }

    /// Sends one datagram on socket `fd` to `address` (a reply to
    /// `.datagram(_, from: address, _)`), without blocking.
    ///
    /// - Parameters:
    ///   - bytes: the datagram.
    ///   - fd: the datagram socket.
    ///   - address: where to send it.
    /// - Returns: 0, or the `errno` of the failed `sendto` (`EAGAIN`: the
    ///   socket's buffer is full; the datagram was dropped).
    @discardableResult
    public func send(_ bytes: [UInt8], on fd: Int32, to address: PeerAddress) -> Int32 {
        let n = bytes.withUnsafeBytes { b in
            address.bytes.withUnsafeBytes { a in
                sendto(fd, b.baseAddress, b.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL),
                       a.baseAddress?.assumingMemoryBound(to: sockaddr.self), socklen_t(a.count))
            }
        }
        return n < 0 ? errno : 0
    }
}

/// The text in a NUL-terminated C buffer.
func cText(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// The text of `errno` value `code`.
func errorText(_ code: Int32) -> String { String(cString: strerror(code)) }

/// The address in `storage` (`length` bytes), as bytes and text.
func peerAddress(_ storage: sockaddr_storage, _ length: socklen_t) -> PeerAddress {
    var copy = storage
    let bytes = withUnsafeBytes(of: &copy) { Array($0.prefix(Int(length))) }
    var text = "?"
    withUnsafePointer(to: &copy) { p in
        switch Int32(storage.ss_family) {
        case AF_INET:
            p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
                var a = sin.pointee.sin_addr
                var buffer = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN))
                inet_ntop(AF_INET, &a, &buffer, socklen_t(buffer.count))
                text = "\(cText(buffer)):\(UInt16(bigEndian: sin.pointee.sin_port))"
            }
        case AF_INET6:
            p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin in
                var a = sin.pointee.sin6_addr
                var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
                inet_ntop(AF_INET6, &a, &buffer, socklen_t(buffer.count))
                text = "[\(cText(buffer))]:\(UInt16(bigEndian: sin.pointee.sin6_port))"
            }
        case AF_UNIX:
            let pathBytes = bytes.dropFirst(2)
            if pathBytes.isEmpty || pathBytes.allSatisfy({ $0 == 0 }) {
                text = "unix"
            } else if pathBytes.first == 0 {
                text = "unix:@" + String(decoding: pathBytes.dropFirst().prefix { $0 != 0 }, as: UTF8.self)
            } else {
                text = "unix:" + String(decoding: pathBytes.prefix { $0 != 0 }, as: UTF8.self)
            }
        default:
            text = "family \(storage.ss_family)"
        }
    }
    return PeerAddress(bytes: bytes, description: text)
}
