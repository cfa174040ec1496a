import Foundation
import IndicatorCore
import Reconcile
import ReconcileTesting
import Testing

/// `connectivity-indicator --record` in a private network namespace, then
/// `--replay` of the file, end to end.
extension SystemdTests {
    @Suite struct IndicatorReplay {
        let indicator = builtExecutable("connectivity-indicator")

        /// Runs the indicator with `--record` in a new network namespace and
        /// scripts a veth pair: up, carrier, address, default route, route
        /// removed, link down. Returns every line it printed (waiting for each
        /// step's line) and the child, still running.
        func recordSession(to file: String, steps: Int = 7) throws -> ([String], Child) {
            let child = try Child("/usr/bin/unshare", ["-n", indicator, "--format", "json", "--backend", "kernel",
                                                       "--include", "veth0", "--record", file])
            func inside(_ c: String) { sh(nsenter(child.pid, "-n", c)) }
            var lines: [String] = []
            func next(_ expect: String) {
                let line = child.line()
                #expect(line?.contains("\"state\":\"\(expect)\"") == true, "\(line ?? "no line") after \(lines.count) lines")
                if let line { lines.append(line) }
            }
            next("off")
            let script: [([String], String)] = [
                (["ip link add veth0 type veth peer name veth1", "ip link set veth0 addrgenmode none"], "off"),
                (["ip link set veth0 up"], "no-carrier"),
                (["ip link set veth1 up"], "carrier"),
                (["ip addr add 10.0.0.1/24 dev veth0"], "routable"),
                (["ip route add default via 10.0.0.2"], "routable"),
                (["ip route del default"], "routable"),
                (["ip link set veth0 down"], "off"),
            ]
            for (commands, state) in script.prefix(steps) {
                commands.forEach(inside)
                next(state)
            }
            return (lines, child)
        }

        /// Runs `--replay file`; returns stdout, stderr and the exit status.
        func replay(_ file: String, wrapper: [String] = []) throws -> (out: String, err: String, status: Int32?) {
            let p = Process()
            let args = wrapper + [indicator, "--replay", file]
            p.executableURL = URL(fileURLWithPath: args[0])
            p.arguments = Array(args.dropFirst())
            let out = Pipe(), err = Pipe()
            p.standardOutput = out
            p.standardError = err
            try p.run()
            // A replay that hangs is killed (by its PID) and fails the test.
            let pid = p.processIdentifier
            let watchdog = DispatchWorkItem { if p.isRunning { kill(pid, SIGKILL) } }
            DispatchQueue.global().asyncAfter(deadline: .now() + 30, execute: watchdog)
            defer { watchdog.cancel() }
            let o = out.fileHandleForReading.readDataToEndOfFile()
            let e = err.fileHandleForReading.readDataToEndOfFile()
            p.waitUntilExit()
            return (String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self), p.terminationStatus)
        }

        /// The messages recorded in `file` whose payload is a connectivity change.
        func waitForRecords(_ file: String, atLeast n: Int) -> Bool {
            let deadline = ContinuousClock.now + .seconds(10)
            while ContinuousClock.now < deadline {
                let text = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
                if text.components(separatedBy: "\"changed\":").count - 1 >= n { return true }
                usleep(10_000)
            }
            return false
        }

        @Test func replayOfARecordedSessionPrintsTheSameBytes() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let file = dir + "/session.jsonl"
            let (lines, child) = try recordSession(to: file)
            #expect(lines.count == 8)
            child.signal(SIGTERM)
            #expect(child.wait() == 0)
            // A transcript can hold private data: owner only.
            let mode = try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int
            #expect(mode == 0o600)
            let transcript = try Transcript(contentsOf: file)
            #expect(transcript.endReason == "shutdown")
            #expect(transcript.program == "IndicatorCore.Indicator")

            // Replayed under strace: no netlink socket, no bus connection.
            let trace = dir + "/trace"
            let r = try replay(file, wrapper: ["/usr/bin/strace", "-f", "-qq", "-e", "trace=socket,connect", "-o", trace])
            #expect(r.status == 0, "\(r.err)")
            #expect(r.out == lines.map { $0 + "\n" }.joined())
            let calls = try String(contentsOfFile: trace, encoding: .utf8)
            #expect(!calls.contains("AF_NETLINK") && !calls.contains("bus"), "\(calls)")

            // The same transcript replays against the Indicator program in a
            // Swift Testing test, and a changed program is caught.
            let program = Indicator(base: settings(), format: .json)
            let outcome = expectReplay(program, transcript: file)
            #expect(outcome?.messages == transcript.lines.filter { $0.type == "message" }.count)
            let firstOnline = try #require(transcript.lines.first { $0.value["message"]?["connectivity"]?["_0"]?["changed"]?["_0"]?["online"] == .bool(true) })
            let changed = try Replay.run(LogsWhenOnline(inner: program), transcript, programName: "IndicatorCore.Indicator")
            let d = try #require(changed.divergence)
            #expect(d.index == Int(firstOnline.value["index"]!.int!))
            #expect(d.what == "commands" && d.expected == "[]" && d.got == "[{\"log\":{\"_0\":\"online\"}}]")
            #expect(d.message == firstOnline.value["message"]!.description)
        }

        func settings() -> Settings {
            var s = Settings()
            s.connectivity.backend = .kernel
            s.connectivity.include = ["veth0"]
            return s
        }

        @Test func sigkilledRecordingReplaysUpToItsLastCompleteLine() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let file = dir + "/killed.jsonl"
            let (lines, child) = try recordSession(to: file, steps: 4)
            // The writer trails the loop by an iteration: wait (bounded) until
            // the last change is on disk, then kill without a chance to flush.
            #expect(waitForRecords(file, atLeast: lines.count))
            child.signal(SIGKILL)
            _ = child.wait()
            let killed = try Transcript(contentsOf: file)
            #expect(killed.endReason == nil)
            let r = try replay(file)
            #expect(r.status == 0, "\(r.err)")
            #expect(r.out == lines.map { $0 + "\n" }.joined())

            // Cut in the middle of the last line: that line is left out.
            var data = try Data(contentsOf: URL(fileURLWithPath: file))
            let lastStart = data.dropLast().lastIndex(of: 10)! + 1
            data = data.prefix(lastStart + (data.count - lastStart) / 2)
            let cut = dir + "/cut.jsonl"
            try data.write(to: URL(fileURLWithPath: cut))
            #expect(try Transcript(contentsOf: cut).truncatedTail)
            let rc = try replay(cut)
            #expect(rc.status == 0, "\(rc.err)")
            #expect(lines.map { $0 + "\n" }.joined().hasPrefix(rc.out))
        }

        /// `--replay` answers SIGTERM (issue 19, item 3): the loop's
        /// signal mask is not set for a replay. The replay is held in its
        /// first write (its stdout is a full pipe), then sent SIGTERM.
        @Test func replayAnswersSIGTERM() throws {
            let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("IndicatorTests/Transcripts/veth-session.jsonl").path
            let out = Pipe()
            let w = out.fileHandleForWriting.fileDescriptor
            let flags = fcntl(w, F_GETFL)
            _ = fcntl(w, F_SETFL, flags | O_NONBLOCK)
            var fill = [UInt8](repeating: 0, count: 4096)
            while write(w, &fill, fill.count) > 0 {}
            _ = fcntl(w, F_SETFL, flags)
            let p = Process()
            p.executableURL = URL(fileURLWithPath: indicator)
            p.arguments = ["--replay", fixture]
            p.standardOutput = out
            p.standardError = FileHandle.nullDevice
            try p.run()
            defer { if p.isRunning { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() } }
            // Blocked in write(1, ...): system call 1 on fd 1.
            let deadline = ContinuousClock.now + .seconds(10)
            var blocked = false
            while !blocked && p.isRunning && ContinuousClock.now < deadline {
                let syscall = (try? String(contentsOfFile: "/proc/\(p.processIdentifier)/syscall", encoding: .utf8)) ?? ""
                blocked = syscall.hasPrefix("1 0x1 ")
                if !blocked { usleep(5_000) }
            }
            #expect(blocked)
            kill(p.processIdentifier, SIGTERM)
            let stop = ContinuousClock.now + .seconds(10)
            while p.isRunning && ContinuousClock.now < stop { usleep(5_000) }
            #expect(!p.isRunning)
            if !p.isRunning {
                #expect(p.terminationReason == .uncaughtSignal && p.terminationStatus == SIGTERM)
            }
        }

        @Test func badTranscriptsAreOneLineErrorsWithExitThree() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let header = #"{"type":"header","format":"reconcile-transcript","version":1,"program":"IndicatorCore.Indicator","started_at":"","started_at_us":0}"#
            var binary = Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 7919 >> 3) })
            binary[100] = 10
            let cases: [(String, Data, String)] = [
                ("empty", Data(), "not a transcript: the file holds no complete line"),
                ("binary", binary, "not a transcript: line 1 is not a JSON object"),
                ("truncated", Data(header.utf8.prefix(40)), "not a transcript: the first line is incomplete"),
                ("version", Data(header.replacingOccurrences(of: "\"version\":1", with: "\"version\":99").utf8 + [10]),
                 "unsupported transcript version 99 (this build reads version 1)"),
                ("program", Data(header.replacingOccurrences(of: "IndicatorCore.Indicator", with: "Other.Daemon").utf8 + [10]),
                 "transcript of program Other.Daemon, not IndicatorCore.Indicator"),
                ("long", Data(repeating: UInt8(ascii: "x"), count: 10 << 20), "transcript line 1 is longer than 1048576 bytes"),
                ("badline", Data((header + "\n{\"type\":\"message\",\"index\":0}\n").utf8),
                 "transcript line 2 is not a valid record: a message record needs index, round and time_us"),
                // A plan without an integer round used to spin for ever (issue 19, item 3).
                ("planround", Data((header + "\n{\"type\":\"plan\"}\n").utf8),
                 "transcript line 2 is not a valid record: a plan record needs an integer round"),
                ("planstring", Data((header + "\n{\"type\":\"plan\",\"round\":\"1\"}\n").utf8),
                 "transcript line 2 is not a valid record: a plan record needs an integer round"),
            ]
            for (name, bytes, message) in cases {
                let file = dir + "/" + name
                try bytes.write(to: URL(fileURLWithPath: file))
                let r = try replay(file)
                #expect(r.status == 3, "\(name)")
                #expect(r.out.isEmpty, "\(name)")
                #expect(r.err == "connectivity-indicator: \(message)\n", "\(name)")
            }
            let missing = try replay(dir + "/missing")
            #expect(missing.status == 3)
            #expect(missing.err.hasPrefix("connectivity-indicator: cannot read transcript ") && missing.err.filter { $0 == "\n" }.count == 1)
        }
    }
}

/// The indicator with a deliberate change: it logs when a change is online.
struct LogsWhenOnline: Program {
    let inner: Indicator
    func start() -> (Indicator.Model, [Indicator.Command]) { inner.start() }
    func update(_ model: inout Indicator.Model, _ message: Indicator.Message) -> [Indicator.Command] {
        let commands = inner.update(&model, message)
        if case .connectivity(.changed(let c), _) = message, c.state.online { return commands + [.log("online")] }
        return commands
    }
    func subscriptions(_ model: Indicator.Model) -> Subscriptions<Indicator.Message> { inner.subscriptions(model) }
}
