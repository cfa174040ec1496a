/// Reading a file descriptor on the loop: raw bytes, lines or datagrams, and
/// (for a connection) writing to it with back-pressure.
///
/// The driver makes the descriptor non-blocking, reads a bounded amount per
/// dispatch (a flood from one descriptor does not starve the loop's other
/// sources), and reports the end of input, errors and a line longer than the
/// limit as events. Stopping the subscription removes the watch, and closes
/// the descriptor when the subscription owns it (`ownsDescriptor`).
public enum DescriptorSource: Source {
    /// `descriptor`.
    public static let name = "descriptor"

    /// How the bytes read are cut into events.
    public enum Framing: Hashable, Sendable, CustomStringConvertible {
        /// Each read as it comes, at most `maxChunk` bytes per event.
        case bytes(maxChunk: Int)
        /// Lines ended by `\n` (a trailing `\r` is dropped too), each at most
        /// `maxLineLength` bytes; a longer line is reported by
        /// `Event.lineTooLong` and skipped, never buffered whole.
        case lines(maxLineLength: Int)
        /// Lines as `lines` cuts them, but the lines of one dispatch come as
        /// one `Event.lines` (in order; a `.lineTooLong` or the end of input
        /// ends the batch before it): one message per read batch instead of
        /// one per line, for a daemon that reads many short lines.
        case lineBatches(maxLineLength: Int)
        /// One event per datagram (`recvfrom`), at most `maxSize` bytes each
        /// (a longer one is truncated and reported so).
        case datagrams(maxSize: Int)

        /// `bytes(4096)`, `lines(65536)`, `datagrams(65536)`.
        public var description: String {
            switch self {
            case .bytes(let n): "bytes(\(n))"
            case .lines(let n): "lines(\(n))"
            case .lineBatches(let n): "lineBatches(\(n))"
            case .datagrams(let n): "datagrams(\(n))"
            }
        }
    }

    /// The line limit `lines(_:)` and connections get unless told otherwise: 64 KiB.
    public static let defaultMaxLineLength = 64 << 10
    /// The write queue a connection gets unless told otherwise: 1 MiB.
    public static let defaultWriteQueueLimit = 1 << 20

    /// A descriptor watch's parameters.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The descriptor.
        public var fd: Int32
        /// How reads become events.
        public var framing: Framing
        /// Whether stopping the subscription closes `fd`.
        public var ownsDescriptor: Bool
        /// The accepted connection this reads, when it is one: writes to it
        /// go through the driver (`SystemdDriver.write(_:to:)`).
        public var connection: Connection?
        /// How many bytes of writes may wait for the peer before the
        /// connection is closed with `Event.closed(.writeQueueFull)`.
        public var writeQueueLimit: Int

        /// A watch of `fd` framed by `framing`.
        public init(fd: Int32, framing: Framing, ownsDescriptor: Bool = false, connection: Connection? = nil,
                    writeQueueLimit: Int = DescriptorSource.defaultWriteQueueLimit) {
            self.fd = fd
            self.framing = framing
            self.ownsDescriptor = ownsDescriptor
            self.connection = connection
            self.writeQueueLimit = writeQueueLimit
        }

        /// `fd 3 lines(65536) owned`, as plans show it.
        public var description: String {
            var s = "fd \(fd) \(framing)"
            if ownsDescriptor { s += " owned" }
            if let connection { s += " \(connection)" }
            return s
        }
    }

    /// Why the driver closed a connection itself.
    public enum CloseReason: Hashable, Sendable, CustomStringConvertible {
        /// The peer did not read: more than `writeQueueLimit` bytes waited.
        case writeQueueFull(queued: Int)
        /// A write failed with `errno` (`EPIPE`: the peer is gone).
        case writeFailed(errno: Int32)

        /// `write queue full (N bytes)`, `write failed (errno N)`.
        public var description: String {
            switch self {
            case .writeQueueFull(let n): "write queue full (\(n) bytes)"
            case .writeFailed(let e): "write failed (errno \(e))"
            }
        }
    }

    /// What a descriptor subscription reports.
    public enum Event: Hashable, Sendable {
        /// Bytes read (`Framing.bytes`).
        case bytes([UInt8])
        /// One line without its end (`Framing.lines`); a last line without a
        /// newline is delivered at the end of input. Invalid UTF-8 is repaired.
        case line(String)
        /// The lines of one dispatch, in order, without their ends
        /// (`Framing.lineBatches`; never empty). Each is what `.line` would
        /// carry, made a `String` when it is read (`LineBatch`).
        case lines(LineBatch)
        /// A line grew past the limit: its bytes up to the next newline are
        /// skipped (`limit` is the configured maximum).
        case lineTooLong(limit: Int)
        /// One datagram and who sent it (`Framing.datagrams`); `truncated`
        /// when it was longer than `maxSize`.
        case datagram([UInt8], from: PeerAddress, truncated: Bool)
        /// The end of input (the writer closed, the peer shut down, `EPOLLHUP`
        /// without data). Nothing more is read; queued writes still go out.
        case endOfFile
        /// The driver closed the connection itself (see `CloseReason`).
        case closed(CloseReason)
        /// The descriptor cannot be watched or read: `sd_event_add_io` gives
        /// `EPERM` for a regular file or `/dev/null`, or a read failed.
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

extension DescriptorSource.Framing {
    /// `lines` or, `batched`, `lineBatches`, of at most `maxLineLength` (at least 1) bytes.
    @inlinable static func lineFraming(_ maxLineLength: Int, batched: Bool) -> Self {
        batched ? .lineBatches(maxLineLength: max(1, maxLineLength)) : .lines(maxLineLength: max(1, maxLineLength))
    }
}

/// A socket address as bytes (`struct sockaddr_*`), and its text form.
public struct PeerAddress: Hashable, Sendable, CustomStringConvertible {
    /// The raw `sockaddr` bytes (what `sendto` needs).
    public var bytes: [UInt8]
    /// `127.0.0.1:40000`, `[::1]:40000`, `unix:/run/x.sock`, or `unix` when unnamed.
    public var description: String

    /// An address of `bytes`, shown as `description`.
    public init(bytes: [UInt8], description: String) {
        self.bytes = bytes
        self.description = description
    }
}

/// Who is on the other end of an `AF_UNIX` connection (`SO_PEERCRED`), as
/// the kernel saw it at `connect`.
public struct PeerCredentials: Hashable, Sendable, CustomStringConvertible {
    /// The peer's process id.
    public var pid: Int32
    /// Its user id.
    public var uid: UInt32
    /// Its group id.
    public var gid: UInt32

    /// The credentials `pid`, `uid`, `gid`.
    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }

    /// `pid 12 uid 65534 gid 65534`.
    public var description: String { "pid \(pid) uid \(uid) gid \(gid)" }
}

/// An accepted connection: what `ListenerSource` reports, and what a
/// `Subscription.connection(_:_:)` reads and the driver writes to.
public struct Connection: Hashable, Sendable, CustomStringConvertible {
    /// Unique within the process (never reused, unlike descriptor numbers).
    public var id: UInt64
    /// The connected socket.
    public var fd: Int32
    /// The name of the listener that accepted it.
    public var listener: String
    /// The peer's address.
    public var peer: PeerAddress
    /// The peer's credentials on an `AF_UNIX` socket; nil otherwise.
    public var credentials: PeerCredentials?

    /// A connection `id` on `fd`, accepted by `listener` from `peer`.
    public init(id: UInt64, fd: Int32, listener: String, peer: PeerAddress, credentials: PeerCredentials? = nil) {
        self.id = id
        self.fd = fd
        self.listener = listener
        self.peer = peer
        self.credentials = credentials
    }

    /// `connection 7 (fd 9, web, 127.0.0.1:40000)`.
    public var description: String { "connection \(id) (fd \(fd), \(listener), \(peer))" }
}

extension Subscription {
    /// Raw bytes from `fd` as they arrive, keyed by `fd`.
    ///
    /// - Parameters:
    ///   - fd: a pipe, FIFO, socket, tty or character device (not a regular
    ///     file or `/dev/null`: epoll refuses those, reported as `.failed`).
    ///   - maxChunk: the most bytes in one event.
    ///   - owned: whether stopping the subscription closes `fd`.
    ///   - tag: makes a message of each event.
    @inlinable
    public static func readable(_ fd: Int32, maxChunk: Int = 4096, owned: Bool = false,
                                _ tag: @escaping (DescriptorSource.Event) -> Message) -> Subscription {
        Subscription(DescriptorSource.self, key: fd,
                     configuration: .init(fd: fd, framing: .bytes(maxChunk: max(1, maxChunk)), ownsDescriptor: owned), tag: tag)
    }

    /// The lines read from `fd`, keyed by `fd`.
    ///
    /// - Parameters:
    ///   - fd: a pipe, FIFO, socket, tty or character device.
    ///   - maxLineLength: the longest line delivered; a longer one is an
    ///     `.lineTooLong` event and is skipped.
    ///   - owned: whether stopping the subscription closes `fd`.
    ///   - batched: each dispatch's lines as one `.lines(LineBatch)` event
    ///     instead of one `.line` each (`Framing.lineBatches`): one message
    ///     and one `update` per batch, for throughput.
    ///   - tag: makes a message of each event; it gets the event owned, so
    ///     `{ .input($0) }` moves the line into the message (no copy).
    @inlinable
    public static func lines(_ fd: Int32, maxLineLength: Int = DescriptorSource.defaultMaxLineLength, owned: Bool = false,
                             batched: Bool = false,
                             _ tag: @escaping (consuming DescriptorSource.Event) -> Message) -> Subscription {
        .consumingEvents(DescriptorSource.self, key: fd,
                         configuration: .init(fd: fd, framing: .lineFraming(maxLineLength, batched: batched), ownsDescriptor: owned),
                         tag: tag)
    }

    /// The datagrams arriving on socket `fd`, keyed by `fd`.
    ///
    /// - Parameters:
    ///   - fd: a datagram socket (`SOCK_DGRAM`).
    ///   - maxSize: the largest datagram delivered whole.
    ///   - owned: whether stopping the subscription closes `fd`.
    ///   - tag: makes a message of each event.
    @inlinable
    public static func datagrams(_ fd: Int32, maxSize: Int = 65536, owned: Bool = false,
                                 _ tag: @escaping (DescriptorSource.Event) -> Message) -> Subscription {
        Subscription(DescriptorSource.self, key: fd,
                     configuration: .init(fd: fd, framing: .datagrams(maxSize: max(1, maxSize)), ownsDescriptor: owned), tag: tag)
    }

    /// An accepted connection read as lines, keyed by its id. The
    /// subscription owns the socket: stopping it closes the connection.
    ///
    /// - Parameters:
    ///   - connection: what the listener reported in `.accepted`.
    ///   - maxLineLength: the longest line delivered.
    ///   - writeQueueLimit: the bytes of writes that may wait for a slow
    ///     peer before the connection is closed with `.closed(.writeQueueFull)`.
    ///   - batched: each dispatch's lines as one `.lines(LineBatch)` event
    ///     (`Framing.lineBatches`).
    ///   - tag: makes a message of each event.
    @inlinable
    public static func connection(_ connection: Connection, maxLineLength: Int = DescriptorSource.defaultMaxLineLength,
                                  writeQueueLimit: Int = DescriptorSource.defaultWriteQueueLimit, batched: Bool = false,
                                  _ tag: @escaping (consuming DescriptorSource.Event) -> Message) -> Subscription {
        .consumingEvents(DescriptorSource.self, key: connection.id,
                         configuration: .init(fd: connection.fd, framing: .lineFraming(maxLineLength, batched: batched),
                                              ownsDescriptor: true, connection: connection, writeQueueLimit: writeQueueLimit),
                         tag: tag)
    }
}
