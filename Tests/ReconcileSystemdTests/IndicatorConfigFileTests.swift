import Foundation
import Testing

/// The built indicator against hostile config paths and command lines:
/// nothing blocks its loop (SIGTERM still stops it), every refusal is one
/// clear line on standard error.
extension SystemdTests {
    @Suite struct IndicatorConfigFile {
        let indicator = builtExecutable("connectivity-indicator")

        func start(_ config: String) throws -> Child {
            try Child("/usr/bin/unshare", ["-n", indicator, "--format", "json", "--backend", "kernel", "--config", config])
        }

        /// SIGTERM stops it promptly: the loop was never blocked.
        func expectStopsOnSigterm(_ child: Child) {
            child.signal(SIGTERM)
            #expect(child.wait(timeout: .seconds(5)) == 0)
        }

        @Test func fifoAtStartIsRefusedAndTheLoopRuns() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let fifo = dir + "/indicator.conf"
            #expect(mkfifo(fifo, 0o600) == 0)
            let child = try start(fifo)
            #expect(child.errorLine(matching: { $0.contains("cannot be read") })?
                .hasSuffix("config \(fifo) cannot be read: not a regular file (a FIFO): keeping the last good configuration") == true)
            #expect(child.line()?.contains("\"state\":\"off\"") == true)
            expectStopsOnSigterm(child)
        }

        @Test func fifoSwappedInWhileRunningIsRefusedAndAFileAfterItIsRead() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let config = dir + "/indicator.conf"
            try writeFile(config, "include = veth0\n")
            let child = try start(config)
            #expect(child.errorLine(matching: { $0.contains("applied") }) != nil)
            // The first read comes before the watch is armed: change the
            // file until a change is applied, so the watch is known to run.
            var watched = false
            for n in 0..<50 where !watched {
                try writeFile(config, "include = veth\(n + 2)\n")
                watched = child.errorLine(matching: { $0.contains("applied") }, timeout: .milliseconds(200)) != nil
            }
            #expect(watched)
            unlink(config)
            #expect(mkfifo(config, 0o600) == 0)
            #expect(child.errorLine(matching: { $0.contains("cannot be read") })?.contains("not a regular file (a FIFO)") == true)
            // Back to a regular file: read and applied again.
            unlink(config)
            try writeFile(config, "include = veth1\n")
            #expect(child.errorLine(matching: { $0.contains("applied") }) != nil)
            expectStopsOnSigterm(child)
        }

        @Test func deviceIsRefused() throws {
            let child = try start("/dev/zero")
            #expect(child.errorLine(matching: { $0.contains("cannot be read") })?.contains("not a regular file (a character device)") == true)
            expectStopsOnSigterm(child)
        }

        @Test func fileOverOneMebibyteIsRefused() throws {
            let dir = try makeTemporaryDirectory()
            defer { removeTree(dir) }
            let config = dir + "/indicator.conf"
            try writeFile(config, String(repeating: "# padding padding padding padding padding padding\n", count: 1 << 16))
            let child = try start(config)
            #expect(child.errorLine(matching: { $0.contains("cannot be read") })?.contains("too large (3276800 bytes, at most 1048576)") == true)
            expectStopsOnSigterm(child)
        }

        @Test(arguments: [["--config", "--once"], ["--include", "--exclude", "x"], ["--settle", "3000000h"], ["--config"]])
        func optionMistakeIsOneLineOnStderrAndExitTwo(args: [String]) throws {
            let child = try Child(indicator, args)
            let line = child.errorLine(matching: { _ in true })
            #expect(line?.hasPrefix("connectivity-indicator: \(args[0])") == true
                    || line?.hasPrefix("connectivity-indicator: bad value '3000000h' for --settle") == true, "\(line ?? "nothing")")
            #expect(child.wait() == 2)
            #expect(child.line(timeout: .milliseconds(100)) == nil)
        }
    }
}
