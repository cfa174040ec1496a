import CSystemd
import Foundation
import Glibc
import Reconcile
@testable import ReconcileSystemd
import TestSupport
import Testing

/// Collects the lines of one descriptor; the line "stop" asks for the
/// command `.stop`, the line "off" turns the subscription off.
struct BatchProgram: Program {
    struct Model: Equatable {
        var lines: [String] = []; var ended = false; var on = true
        /// `.lines` events seen (`batched`), and how many lines each had.
        var batches: [Int] = []
        /// Where each `.lineTooLong` came: the count of lines before it.
        var tooLongAt: [Int] = []
    }
    enum Message: Equatable { case descriptor(DescriptorSource.Event) }
    enum Command { case stop }
    let fd: Int32
    var batched = false
    var maxLineLength = DescriptorSource.defaultMaxLineLength

    func start() -> (Model, [Command]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .descriptor(.line(let s)):
            model.lines.append(s)
            if s == "stop" { return [.stop] }
            if s == "off" { model.on = false }
        case .descriptor(.lines(let lines)):
            #expect(!model.ended)
            model.lines += lines
            model.batches.append(lines.count)
        case .descriptor(.endOfFile): model.ended = true
        case .descriptor(.lineTooLong): model.tooLongAt.append(model.lines.count)
        case .descriptor(.bytes), .descriptor(.datagram), .descriptor(.closed), .descriptor(.failed): break
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        guard model.on else { return .none }
        return Subscriptions { Subscription.lines(fd, maxLineLength: maxLineLength, batched: batched) { .descriptor($0) } }
    }
}

/// Writes `bytes` to `fd` in writes of at most `chunk` bytes (the whole
/// text must fit in the socket's buffer: the loop is not running yet).
private func writeAll(_ fd: Int32, _ bytes: [UInt8], chunk: Int) {
    var off = 0
    while off < bytes.count {
        let n = bytes[off...].prefix(chunk).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        #expect(n > 0)
        guard n > 0 else { return }
        off += n
    }
}

/// Keeps every other batch it is given, the batch itself (not a copy of
/// its lines), in its model; copies the lines of all of them.
struct KeepingBatchProgram: Program {
    struct Model: Equatable {
        var kept: [LineBatch] = []
        var all: [String] = []
        var sizes: [Int] = []
        var tooLong = 0
        var ended = false
    }
    enum Message { case descriptor(DescriptorSource.Event) }
    let fd: Int32
    func start() -> (Model, [Never]) { (Model(), []) }
    func update(_ model: inout Model, _ message: Message) -> [Never] {
        switch message {
        case .descriptor(.lines(let lines)):
            if model.sizes.count % 2 == 0 { model.kept.append(lines) }
            model.all += lines
            model.sizes.append(lines.count)
        case .descriptor(.lineTooLong): model.tooLong += 1
        case .descriptor(.endOfFile): model.ended = true
        default: break
        }
        return []
    }
    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions { Subscription.lines(fd, maxLineLength: 200, batched: true) { .descriptor($0) } }
    }
}

extension SystemdTests.Descriptors {
    /// The loop reuses a delivered batch's array for the next batch: the
    /// batches the program did not keep are emptied in place, those it
    /// kept keep what they were given, and a kept batch holds no more room
    /// than eight times its lines.
    @Test func aBatchTheProgramKeepsIsNotChangedByTheBatchesAfterIt() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]) }
        let h = try Harness(KeepingBatchProgram(fd: pair[0]))
        let emptiedBefore = h.driver.io.lineBatchesEmptiedInPlace
        // About 100 KB (at most 64 KiB a dispatch: two batches or more),
        // a too-long line after the 1,200th (one more batch boundary).
        let lines = (0..<2500).map { "kept \($0) " + String(repeating: "k", count: $0 % 61) }
        let text = lines[..<1200].joined(separator: "\n") + "\n" + String(repeating: "z", count: 5000) + "\n"
            + lines[1200...].joined(separator: "\n") + "\n"
        writeAll(pair[1], Array(text.utf8), chunk: 50_000)
        close(pair[1])
        try h.run(until: { h.runtime.model.ended })
        let m = h.runtime.model
        #expect(m.all == lines)
        #expect(m.tooLong == 1)
        #expect(m.sizes.count >= 3)
        #expect(!m.sizes.contains(0))
        // Each kept batch is what its event carried: batches 0, 2, 4, ...
        var start = 0
        var expected: [LineBatch] = []
        for (i, n) in m.sizes.enumerated() {
            if i % 2 == 0 { expected.append(LineBatch(m.all[start..<start + n])) }
            start += n
        }
        #expect(m.kept == expected)
        // Framed from the reads (places in them) or made of strings, the
        // same lines hash alike.
        #expect(m.kept.map(\.hashValue) == expected.map(\.hashValue))
        #expect(m.kept.allSatisfy { $0.capacity.lines <= max(8 * $0.count, 16) && $0.capacity.bytes <= max(8 * $0.byteCount, 32) })
        // The batches between the kept ones were emptied in place.
        #expect(h.driver.io.lineBatchesEmptiedInPlace > emptiedBefore)
    }

    @Test func aDispatchsLinesReachUpdateInOrderWithOneReconcilePerBatchNotPerLine() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]) }
        let h = try Harness(BatchProgram(fd: pair[0]))
        let reconcilesBefore = h.runtime.stats.reconciles
        // 2,000 lines (some split across reads) in a few writes.
        let lines = (0..<2000).map { "line \($0) " + String(repeating: "x", count: $0 % 97) }
        let text = Array(lines.joined(separator: "\n").utf8) + [10]
        writeAll(pair[1], text, chunk: 40_000)
        close(pair[1])
        try h.run(until: { h.runtime.model.ended })
        #expect(h.runtime.model.lines == lines)
        let reconciles = h.runtime.stats.reconciles - reconcilesBefore
        // At most 64 KiB a dispatch: a handful of batches, one reconcile each
        // at most (one per line would be 2,000).
        #expect(reconciles >= 1)
        #expect(reconciles <= 20)
    }

    @Test func batchedLinesComeAsOneEventPerDispatchInOrderAroundATooLongLineAndAPartialLast() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]) }
        let h = try Harness(BatchProgram(fd: pair[0], batched: true, maxLineLength: 200))
        // 1,500 lines (about 85 KB: more than one dispatch reads, less than
        // the socket takes before the loop runs), one of 5,000 bytes (too
        // long) after the 750th, then a last line without its newline.
        let lines = (0..<1500).map { "line \($0) " + String(repeating: "y", count: $0 % 89) }
        let text = Array((lines[..<750].joined(separator: "\n") + "\n" + String(repeating: "z", count: 5000) + "\n"
                          + lines[750...].joined(separator: "\n") + "\npartial").utf8)
        writeAll(pair[1], text, chunk: 30_000)
        close(pair[1])
        try h.run(until: { h.runtime.model.ended })
        let m = h.runtime.model
        #expect(m.lines == lines + ["partial"])
        #expect(m.tooLongAt == [750])
        // Never an empty batch; far fewer events than lines (a batch per
        // dispatch of at most 64 KiB, split once more at the long line).
        #expect(!m.batches.contains(0))
        #expect(m.batches.reduce(0, +) == 1501)
        #expect(m.batches.count >= 2)
        #expect(m.batches.count <= 40)
    }

    /// The same bytes read per line and batched give the same strings: a
    /// `\r` before a newline dropped, invalid UTF-8 repaired, empty lines
    /// kept, a line longer than a dispatch's read (64 KiB) and a partial
    /// last line whole.
    @Test func batchedAndPerLineReadsMakeTheSameStringsOfTheSameBytes() throws {
        var bytes: [UInt8] = Array("plain\r\n\ncr\rinside\n".utf8) + [0x66, 0xFF, 0xC3, 10] + Array("é\r\n".utf8)
        bytes += Array(String(repeating: "s", count: 70_000).utf8) + [13, 10] + Array("last\r".utf8)
        var seen: [[String]] = []
        for batched in [false, true] {
            var pair: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
            defer { close(pair[0]) }
            let h = try Harness(BatchProgram(fd: pair[0], batched: batched, maxLineLength: 100_000))
            writeAll(pair[1], bytes, chunk: 7_000)
            close(pair[1])
            try h.run(until: { h.runtime.model.ended })
            #expect(h.runtime.model.batches.isEmpty != batched)
            seen.append(h.runtime.model.lines)
        }
        let expected = ["plain", "", "cr\rinside", "f\u{FFFD}\u{FFFD}", "é", String(repeating: "s", count: 70_000), "last"]
        #expect(seen[0] == expected)
        #expect(seen[1] == expected)
    }

    @Test func aShutdownInTheMiddleOfABatchReportsTheRestAsDropped() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        final class Box { var report: ShutdownReport<BatchProgram.Message>? }
        let box = Box()
        let h = try Harness(BatchProgram(fd: pair[0])) { command, runtime in
            if case .stop = command { box.report = runtime.shutdown() }
        }
        let text = "a\nstop\nb\nc\n"
        #expect(write(pair[1], text, text.utf8.count) == text.utf8.count)
        try h.run(until: { box.report != nil })
        #expect(h.runtime.model.lines == ["a", "stop"])
        #expect(box.report?.dropped == [.descriptor(.line("b")), .descriptor(.line("c"))])
        #expect(box.report?.stopped.count == 1)
    }

    @Test func theReconcileABatchLeftToThePumpRunsWithNoOtherEvent() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        let h = try Harness(BatchProgram(fd: pair[0]))
        #expect(h.runtime.activeIDs.count == 1)
        let text = "a\noff\nb\n"
        #expect(write(pair[1], text, text.utf8.count) == text.utf8.count)
        // One batch: all three lines reach update (the subscription is still
        // running while its batch is delivered), then the pump's reconcile
        // stops it; the peer stays open, so nothing else happens.
        try h.run(until: { h.runtime.activeIDs.isEmpty })
        #expect(h.runtime.model.lines == ["a", "off", "b"])
        #expect(h.runtime.stats.lateDeliveries == 0)
        #expect(h.runtime.stats.stops == 1)
    }
}

/// `BatchProgram`'s lines subscription inside a memoized group of a mapped
/// set: its events reach `update` through the group's route (the tagger
/// and the mapping), not the subscription's own closure alone.
struct RoutedLinesProgram: Program {
    struct Model: Equatable { var lines: [String] = []; var ended = false; var sent: [String] = [] }
    enum Inner: Equatable { case descriptor(DescriptorSource.Event) }
    enum Message: Equatable { case inner(Inner), sent(String) }
    enum Command { case stop, send(String) }
    let fd: Int32

    func start() -> (Model, [Command]) { (Model(), []) }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .inner(.descriptor(.line(let s))):
            model.lines.append(s)
            if s == "stop" { return [.stop] }
            if s.hasPrefix("send ") { return [.send(String(s.dropFirst(5)))] }
        case .inner(.descriptor(.endOfFile)): model.ended = true
        case .inner: break
        case .sent(let s): model.sent.append(s); model.lines.append("(sent \(s))")
        }
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions<Inner> {
            Subscriptions<Inner>.group("reader", fd) { fd in
                Subscription.lines(fd) { .descriptor($0) }
            }
        }.map { .inner($0) }
    }
}

extension SystemdTests.Descriptors {
    @Test func aMessageACommandSendsDuringADispatchsLinesComesAfterThemAll() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]) }
        let h = try Harness(RoutedLinesProgram(fd: pair[0])) { command, runtime in
            if case .send(let s) = command { try? runtime.send(.sent(s)) }
        }
        // One write, so one read: each line's `update` runs (and its
        // command is performed) before the next line is framed; what the
        // command sends waits for the end of the dispatch's lines.
        let text = "a\nsend x\nb\nsend y\nc\n"
        #expect(write(pair[1], text, text.utf8.count) == text.utf8.count)
        close(pair[1])
        try h.run(until: { h.runtime.model.ended })
        #expect(h.runtime.model.lines == ["a", "send x", "b", "send y", "c", "(sent x)", "(sent y)"])
        #expect(h.runtime.stats.droppedEvents == 0)
    }

    @Test func aShutdownDuringARoutedBatchReportsTheRestAsDroppedMessages() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        final class Box { var report: ShutdownReport<RoutedLinesProgram.Message>? }
        let box = Box()
        let h = try Harness(RoutedLinesProgram(fd: pair[0])) { command, runtime in
            if case .stop = command { box.report = runtime.shutdown() }
        }
        let text = "a\nstop\nb\nc\npartial"
        #expect(write(pair[1], text, text.utf8.count) == text.utf8.count)
        try h.run(until: { box.report != nil })
        #expect(h.runtime.model.lines == ["a", "stop"])
        // The read's whole lines after "stop", mapped as update would get
        // them; the partial line was never a line.
        #expect(box.report?.dropped == [.inner(.descriptor(.line("b"))), .inner(.descriptor(.line("c")))])
        #expect(box.report?.stopped.count == 1)
    }
}

extension SystemdTests.Descriptors {
    @Test func aShutdownDuringThePartialLastLinesUpdateReportsTheEndAsDropped() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]) }
        final class Box { var report: ShutdownReport<BatchProgram.Message>? }
        let box = Box()
        let h = try Harness(BatchProgram(fd: pair[0])) { command, runtime in
            if case .stop = command { box.report = runtime.shutdown() }
        }
        // "stop" is the partial last line: delivered at the end of input,
        // and its command shuts the runtime down before `.endOfFile` is.
        let text = "a\nstop"
        #expect(write(pair[1], text, text.utf8.count) == text.utf8.count)
        close(pair[1])
        try h.run(until: { box.report != nil })
        #expect(h.runtime.model.lines == ["a", "stop"])
        #expect(!h.runtime.model.ended)
        #expect(box.report?.dropped == [.descriptor(.endOfFile)])
    }

    @Test func aLinesTagMayUseItsOwnedEventMoreThanOnce() {
        // `lines` and `connection` hand the event owned; a closure that
        // reads it before moving it, or switches on it, still compiles
        // and sees the same event.
        var seen: [DescriptorSource.Event] = []
        let logging = Subscription<BatchProgram.Message>.lines(0) { e in
            seen.append(e)
            return .descriptor(e)
        }
        let switching = Subscription<String>.lines(0) { e in
            switch e {
            case .line(let s): s
            default: "other"
            }
        }
        #expect(logging.message(for: DescriptorSource.Event.line("x")) == .descriptor(.line("x")))
        #expect(seen == [.line("x")])
        #expect(switching.message(for: DescriptorSource.Event.line("y")) == "y")
        #expect(switching.message(for: DescriptorSource.Event.endOfFile) == "other")
    }
}

extension SystemdTests.Descriptors {
    /// A batched subscription whose own batch turns it off (its update
    /// asks for no subscription), 2,000 times on one descriptor: each
    /// cycle's lines arrive as one batch, the stop from inside the batch's
    /// dispatch leaves the descriptor open (not owned) and nothing else
    /// behind: no descriptor, no event source, no lost or repeated line.
    @Test func aBatchedSubscriptionStoppedByItsOwnBatchTwoThousandTimesLeavesNothingBehind() throws {
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        final class Seen: @unchecked Sendable { var lines: [String] = [] }
        let seen = Seen()
        let fd = pair[0]
        let h = try Harness(Toggle { on in
            on ? Subscription.lines(fd, batched: true) { event in
                if case .lines(let lines) = event { seen.lines += lines }
                return false
            } : nil
        })
        func cycle(_ i: Int) throws {
            writeAll(pair[1], Array("a\(i)\nb\(i)\n".utf8), chunk: 64)
            try h.runtime.send(true)
            // Until the batch turned it off and the reconcile after the
            // batch (left to the loop's next pump) stopped it.
            try h.run(until: { !h.runtime.model && h.driver.runningCount == 0 })
        }
        for i in 0..<100 { try cycle(i) }
        let fds = openDescriptors()
        let live = EventSourceAccounting.live
        let startsBefore = h.runtime.stats.starts
        for i in 100..<2_100 { try cycle(i) }
        #expect(h.runtime.stats.starts - startsBefore == 2_000)
        #expect(h.driver.runningCount == 0)
        #expect(openDescriptors().subtracting(fds).isEmpty)
        #expect(EventSourceAccounting.live == live)
        #expect(seen.lines == (0..<2_100).flatMap { ["a\($0)", "b\($0)"] })
        // The descriptor is still open and still the subscription's input.
        #expect(fcntl(fd, F_GETFD) >= 0)
    }
}

extension SystemdTests.Descriptors {
    /// Batched lines from a writer no one here wrote: python3 writes 50,000
    /// lines (and one of 100,000 bytes) into a FIFO as fast as it can while
    /// the loop reads; every line arrives once, in order, the long one as
    /// `.lineTooLong` where it was.
    @Test func batchedLinesFromAPythonWriterThroughAFIFOArriveWholeAndInOrder() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        let path = dir + "/fifo"
        #expect(mkfifo(path, 0o600) == 0)
        let reader = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        defer { close(reader) }
        try writeFile(dir + "/writer.py", """
            import sys
            f = open(sys.argv[1], 'w')
            for i in range(50000):
                if i == 25000:
                    f.write('z' * 100000 + '\\n')
                f.write('py %d %s\\n' % (i, 'q' * (i % 113)))
            f.close()
            """)
        let h = try Harness(BatchProgram(fd: reader, batched: true))
        let writer = try Spawned("/usr/bin/python3 \(dir)/writer.py \(path)")
        try h.run(until: { h.runtime.model.ended }, timeout: .seconds(30))
        let expected = (0..<50_000).map { "py \($0) " + String(repeating: "q", count: $0 % 113) }
        #expect(h.runtime.model.lines == expected)
        #expect(h.runtime.model.tooLongAt == [25_000])
        #expect(h.runtime.model.batches.count > 1)
        let deadline = ContinuousClock.now + .seconds(5)
        while !writer.isDone, ContinuousClock.now < deadline { usleep(1000) }
        #expect(writer.isDone)
    }

    /// Random bytes (lines of 0 to 300 bytes, some ended by `\r\n`, some
    /// with invalid UTF-8, a limit of 200) written by python3 into a FIFO
    /// in random pieces while the loop reads: per line and batched give
    /// what a plain reference framing of the same bytes gives.
    @Test func randomLinesInRandomPiecesFrameAsAReferenceFramingDoesPerLineAndBatched() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        var random = SplitMix64(seed: 24)
        var bytes: [UInt8] = []
        while bytes.count < 400_000 {
            let length = Int(random.next() % 301)
            for _ in 0..<length {
                let r = random.next() % 100
                bytes.append(r < 2 ? 0xFF : r < 4 ? 13 : UInt8(97 + r % 26))
            }
            if random.next() % 5 == 0 { bytes.append(13) }
            bytes.append(10)
        }
        bytes += Array("tail without a newline\r".utf8)
        // The reference: split at newlines, a `\r` before the end dropped,
        // longer than 200 (before that) reported and skipped.
        var expected: [String] = [], tooLongAt: [Int] = []
        var rest = bytes[...]
        while !rest.isEmpty {
            let end = rest.firstIndex(of: 10) ?? rest.endIndex
            var line = rest[rest.startIndex..<end]
            rest = end == rest.endIndex ? rest[end...] : rest[(end + 1)...]
            if line.count > 200 { tooLongAt.append(expected.count); continue }
            if line.last == 13 { line = line.dropLast() }
            expected.append(String(decoding: line, as: UTF8.self))
        }
        let input = dir + "/input"
        #expect(FileManager.default.createFile(atPath: input, contents: Data(bytes)))
        try writeFile(dir + "/writer.py", """
            import random, sys
            random.seed(int(sys.argv[3]))
            data = open(sys.argv[1], 'rb').read()
            out = open(sys.argv[2], 'wb', buffering=0)
            i = 0
            while i < len(data):
                n = random.choice([1, 2, 7, 100, 4095, 4096, 4097, 65535, 65536, 70000])
                out.write(data[i:i + n])
                i += n
            out.close()
            """)
        for batched in [false, true] {
            let path = dir + "/fifo-\(batched)"
            #expect(mkfifo(path, 0o600) == 0)
            let reader = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
            defer { close(reader) }
            let h = try Harness(BatchProgram(fd: reader, batched: batched, maxLineLength: 200))
            let writer = try Spawned("/usr/bin/python3 \(dir)/writer.py \(input) \(path) \(batched ? 1 : 2)")
            try h.run(until: { h.runtime.model.ended }, timeout: .seconds(30))
            #expect(h.runtime.model.lines == expected, "batched: \(batched)")
            #expect(h.runtime.model.tooLongAt == tooLongAt, "batched: \(batched)")
            #expect(h.runtime.model.batches.isEmpty != batched)
            let deadline = ContinuousClock.now + .seconds(5)
            while !writer.isDone, ContinuousClock.now < deadline { usleep(1000) }
            #expect(writer.isDone)
        }
    }

    /// Lines at the limit and one byte past it (a `\r` before the newline
    /// counts toward it, as `lines` counts it), whole in one read and then
    /// written a byte at a time by python3 (every line begun in an earlier
    /// read), per line and batched: the same lines kept, the same refused.
    @Test func linesAtTheLimitAndOnePastItAreKeptAndRefusedAlikeWholeOrAByteAtATime() throws {
        let limit = 100
        let lengths = [100, 101, 99, 0, 1, 100, 101]
        var bytes: [UInt8] = []
        var expected: [String] = [], tooLongAt: [Int] = []
        for (i, n) in lengths.enumerated() {
            for cr in [false, true] {
                let text = String(repeating: Character(UnicodeScalar(UInt8(97 + i))), count: cr ? max(0, n - 1) : n)
                bytes += Array(text.utf8) + (cr ? [13] : []) + [10]
                let counted = text.utf8.count + (cr ? 1 : 0)
                if counted > limit { tooLongAt.append(expected.count) } else { expected.append(text) }
            }
        }
        let dir = try makeTemporaryDirectory()
        defer { removeTree(dir) }
        #expect(FileManager.default.createFile(atPath: dir + "/input", contents: Data(bytes)))
        try writeFile(dir + "/writer.py", """
            import sys
            data = open(sys.argv[1], 'rb').read()
            out = open(sys.argv[2], 'wb', buffering=0)
            for i in range(len(data)):
                out.write(data[i:i + 1])
            out.close()
            """)
        for batched in [false, true] {
            // Whole: written before the loop reads (one read).
            var pair: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
            defer { close(pair[0]) }
            let whole = try Harness(BatchProgram(fd: pair[0], batched: batched, maxLineLength: limit))
            writeAll(pair[1], bytes, chunk: bytes.count)
            close(pair[1])
            try whole.run(until: { whole.runtime.model.ended })
            #expect(whole.runtime.model.lines == expected, "whole, batched: \(batched)")
            #expect(whole.runtime.model.tooLongAt == tooLongAt, "whole, batched: \(batched)")
            // A byte at a time, while the loop reads.
            let path = dir + "/fifo-\(batched)"
            #expect(mkfifo(path, 0o600) == 0)
            let reader = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
            defer { close(reader) }
            let slow = try Harness(BatchProgram(fd: reader, batched: batched, maxLineLength: limit))
            let writer = try Spawned("/usr/bin/python3 \(dir)/writer.py \(dir)/input \(path)")
            try slow.run(until: { slow.runtime.model.ended }, timeout: .seconds(30))
            #expect(slow.runtime.model.lines == expected, "a byte at a time, batched: \(batched)")
            #expect(slow.runtime.model.tooLongAt == tooLongAt, "a byte at a time, batched: \(batched)")
            let deadline = ContinuousClock.now + .seconds(5)
            while !writer.isDone, ContinuousClock.now < deadline { usleep(1000) }
            #expect(writer.isDone)
        }
    }
}
