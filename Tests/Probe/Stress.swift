// Stress modes of the probe (scripts/stress.sh runs them; Docs/Reliability.md
// has the figures). Not tests: they print what they measured and exit 1
// when an invariant broke (a message lost or duplicated, a descriptor left).
import Foundation
import Glibc
import Reconcile
import ReconcileSystemd
import Synchronization

// MARK: stress-send THREADS MESSAGES CAPACITY

/// One message: which thread sent it and its sequence number in that thread.
struct Numbered: Sendable { let thread: Int; let sequence: Int }

/// Counts what arrives, per sending thread: in order, duplicated or missing.
struct CountingProgram: Program {
    let threads: Int
    struct Model { var next: [Int]; var delivered = 0; var duplicates = 0; var gaps = 0 }
    func start() -> (Model, [Never]) { (Model(next: Array(repeating: 0, count: threads)), []) }
    func update(_ model: inout Model, _ m: Numbered) -> [Never] {
        model.delivered += 1
        let expected = model.next[m.thread]
        if m.sequence < expected { model.duplicates += 1 }
        else {
            if m.sequence > expected { model.gaps += m.sequence - expected }
            model.next[m.thread] = m.sequence + 1
        }
        return []
    }
}

/// THREADS threads each send MESSAGES numbered messages through a `Sender`
/// into a runtime on a real sd-event loop whose inbox holds CAPACITY; a
/// refused send (`.inboxFull`) is retried. Delivered must equal sent, in
/// order per thread, nothing twice.
func stressSend(threads: Int, messages: Int, capacity: Int) -> Int32 {
    do {
        let loop = try EventLoop()
        let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
        let runtime = Runtime(CountingProgram(threads: threads), driver: driver, inboxCapacity: capacity)
        try runtime.start()
        let sender = runtime.sender()
        let finished = Atomic<Int>(0)
        let refused = Atomic<Int>(0)
        let otherErrors = Atomic<Int>(0)
        let clock = ContinuousClock()
        let began = clock.now
        for t in 0..<threads {
            let thread = Thread {
                var full = 0
                for s in 0..<messages {
                    while true {
                        do {
                            try sender.send(Numbered(thread: t, sequence: s))
                            break
                        } catch RuntimeError.inboxFull {
                            full += 1
                            sched_yield()
                        } catch {
                            otherErrors.add(1, ordering: .relaxed)
                            break
                        }
                    }
                }
                refused.add(full, ordering: .relaxed)
                finished.add(1, ordering: .releasing)
            }
            thread.start()
        }
        let total = threads * messages
        let done = try loop.run(until: {
            finished.load(ordering: .acquiring) == threads && runtime.model.delivered >= total
        }, timeout: .seconds(600))
        let elapsed = clock.now - began
        // Anything late would show here.
        _ = try loop.run(until: { false }, timeout: .milliseconds(200))
        let m = runtime.model
        let inOrder = m.next.allSatisfy { $0 == messages }
        let lost = total - (m.delivered - m.duplicates)
        say("stress-send: \(threads) threads x \(messages) messages, inbox capacity \(capacity): sent \(total), delivered \(m.delivered), lost \(lost), duplicated \(m.duplicates), gaps \(m.gaps), per-thread order \(inOrder ? "kept" : "BROKEN"), refused with .inboxFull and retried \(refused.load(ordering: .relaxed)), other errors \(otherErrors.load(ordering: .relaxed)), \(elapsed)\(done ? "" : ", TIMED OUT")")
        runtime.shutdown()
        let ok = done && m.delivered == total && lost == 0 && m.duplicates == 0 && m.gaps == 0 && inOrder
            && otherErrors.load(ordering: .relaxed) == 0
        return ok ? 0 : 1
    } catch {
        say("error \(error)")
        return 3
    }
}

// MARK: stress-churn SECONDS

/// While the model is true: a timer, a file watch and a signal subscription.
struct ChurnProgram: Program {
    let path: String
    func start() -> (Bool, [Never]) { (false, []) }
    func update(_ model: inout Bool, _ on: Bool) -> [Never] { model = on; return [] }
    func subscriptions(_ on: Bool) -> Subscriptions<Bool> {
        Subscriptions {
            if on {
                Subscription.every(.seconds(1), key: "t") { _ in false }
                Subscription.watch(path) { _ in false }
                Subscription.signal(.user1) { _ in false }
            }
        }
    }
}

func openDescriptorCount() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}

func residentKiB() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return -1 }
    let fields = text.split(separator: " ")
    return (Int(fields[1]) ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE))) / 1024
}

/// Starts and stops a timer, a file watch and a signal subscription through
/// the real driver for SECONDS (the loop runs between batches), and samples
/// descriptors and resident memory at the start, middle and end.
func stressChurn(seconds: Int) -> Int32 {
    do {
        var template = Array((NSTemporaryDirectory() + "reconcile-churn-XXXXXX").utf8CString)
        guard let dir = mkdtemp(&template) else { say("error mkdtemp errno \(errno)"); return 3 }
        let directory = String(cString: dir)
        let path = directory + "/watched"
        _ = FileManager.default.createFile(atPath: path, contents: Array("x".utf8).withUnsafeBytes { Data($0) })
        defer { unlink(path); rmdir(directory) }

        let loop = try EventLoop()
        let driver = SystemdDriver(loop: loop, logger: DaemonLogger(level: .error, handler: .stderr))
        let runtime = Runtime(ChurnProgram(path: path), driver: driver)
        try runtime.start()
        func cycles(_ n: Int) throws {
            for _ in 0..<n {
                try runtime.send(true)
                try runtime.send(false)
            }
            _ = try loop.runOnce(timeout: .zero)
        }
        // Warm up allocator pools and caches before the first sample.
        for _ in 0..<10 { try cycles(1_000) }
        let live = EventSourceAccounting.live
        let clock = ContinuousClock()
        let began = clock.now
        let end = began + .seconds(seconds)
        let middle = began + .seconds(seconds) / 2
        var samples: [(String, Int, Int, Int)] = [("start", runtime.stats.starts, openDescriptorCount(), residentKiB())]
        var sampledMiddle = false
        while clock.now < end {
            try cycles(1_000)
            if !sampledMiddle && clock.now >= middle {
                samples.append(("middle", runtime.stats.starts, openDescriptorCount(), residentKiB()))
                sampledMiddle = true
            }
        }
        let elapsed = clock.now - began
        samples.append(("end", runtime.stats.starts, openDescriptorCount(), residentKiB()))
        let s = runtime.stats
        let cyclesRun = (s.starts - samples[0].1) / 3
        say("stress-churn: \(cyclesRun) on/off cycles of (timer + file watch + signal) in \(elapsed): starts \(s.starts), stops \(s.stops) (3 subscriptions per cycle)")
        for (label, starts, fds, rss) in samples {
            say("stress-churn: \(label): starts \(starts), fds \(fds), rss \(rss) KiB")
        }
        let leftLive = EventSourceAccounting.live - live
        say("stress-churn: event sources left live by the cycles: \(leftLive)")
        runtime.shutdown()
        let fdsFlat = samples.allSatisfy { $0.2 == samples[0].2 }
        // Flat: 4 MiB of slack over the whole run.
        let rssFlat = samples.last!.3 - samples[0].3 < 4 << 10
        say("stress-churn: fds \(fdsFlat ? "flat" : "GREW"), rss \(rssFlat ? "flat" : "GREW")")
        return fdsFlat && rssFlat && leftLive == 0 && s.starts == s.stops ? 0 : 1
    } catch {
        say("error \(error)")
        return 3
    }
}
