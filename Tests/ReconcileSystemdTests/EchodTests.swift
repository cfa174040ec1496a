import Foundation
import Testing

/// A TCP port nothing listens on now (bound to port 0, then released).
func freePort(datagram: Bool = false) -> UInt16 {
    let fd = socket(AF_INET, datagram ? Int32(SOCK_DGRAM.rawValue) : Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { p in
        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { a in
            bind(fd, a, length) == 0 ? getsockname(fd, a, &length) : -1
        }
    }
    return UInt16(bigEndian: addr.sin_port)
}

/// A python3 client: `lines` over `connections` TCP connections to
/// 127.0.0.1:`port` (retrying the first connect for a while); prints each
/// answer line.
let tcpClient = """
    import socket, sys, time
    port, count = int(sys.argv[1]), int(sys.argv[2])
    lines = sys.argv[3:]
    deadline = time.time() + 10
    for i in range(count):
        while True:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except ConnectionRefusedError:
                if time.time() > deadline: raise
                time.sleep(0.02)
        f = s.makefile("rb")
        for line in lines:
            s.sendall((line.replace("{i}", str(i)) + "\\n").encode())
            print(f.readline().decode().rstrip("\\n"), flush=True)
        s.close()
    """

extension SystemdTests {
    @Suite struct Echod {
        let echod = builtExecutable("echod")
        /// `systemd-socket-activate` gives the daemon only the environment
        /// it is told to (`-E`): under `make sanitize` the sanitizer's options
        /// (`detect_leaks=0`: LeakSanitizer takes the side tables of Swift's
        /// weak references, which the objects point to in an encoded form,
        /// for leaks at exit) go to the daemon too.
        let sanitizerEnvironment = ["ASAN_OPTIONS", "TSAN_OPTIONS"].flatMap { name in
            ProcessInfo.processInfo.environment[name].map { ["-E", "\(name)=\($0)"] } ?? []
        }

        func client(_ port: UInt16, connections: Int, _ lines: [String]) throws -> [String] {
            let c = try Child("/usr/bin/python3", ["-c", tcpClient, "\(port)", "\(connections)"] + lines)
            var answers: [String] = []
            // Until the client closes its output (it has exited then).
            while let line = c.line(timeout: .seconds(20)) { answers.append(line) }
            return answers
        }

        @Test func underSystemdSocketActivateItEchoes100ConnectionsAndStopsOnSIGTERM() throws {
            let port = freePort()
            let daemon = try Child("/usr/bin/systemd-socket-activate", sanitizerEnvironment + ["-l", "127.0.0.1:\(port)", echod])
            let answers = try client(port, connections: 100, ["hello {i} ✓", "second {i}"])
            #expect(answers.count == 200)
            #expect(answers == (0..<100).flatMap { ["hello \($0) ✓", "second \($0)"] })
            daemon.signal(SIGTERM)
            #expect(daemon.wait() == 0)
        }

        @Test func acceptModeServesEachConnectionInItsOwnDaemon() throws {
            let port = freePort()
            let daemon = try Child("/usr/bin/systemd-socket-activate", sanitizerEnvironment + ["--accept", "-l", "127.0.0.1:\(port)", echod])
            defer { daemon.signal(SIGTERM); _ = daemon.wait(timeout: .seconds(2)) }
            let answers = try client(port, connections: 5, ["accepted {i}"])
            #expect(answers == (0..<5).map { "accepted \($0)" })
        }

        @Test func datagramModeAnswersEachDatagram() throws {
            let port = freePort(datagram: true)
            let daemon = try Child("/usr/bin/systemd-socket-activate", sanitizerEnvironment + ["--datagram", "-l", "127.0.0.1:\(port)", echod])
            defer { daemon.signal(SIGTERM); _ = daemon.wait(timeout: .seconds(2)) }
            let script = """
                import socket, sys
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.settimeout(0.5)
                for i in range(3):
                    for attempt in range(40):
                        s.sendto(f"ping {i}\\n".encode(), ("127.0.0.1", int(sys.argv[1])))
                        try:
                            print(s.recvfrom(65536)[0].decode().rstrip("\\n"), flush=True)
                            break
                        except socket.timeout:
                            pass
                """
            let c = try Child("/usr/bin/python3", ["-c", script, "\(port)"])
            #expect(c.line() == "ping 0")
            #expect(c.line() == "ping 1")
            #expect(c.line() == "ping 2")
        }

        @Test func twoNamedSocketsAreRoutedByName() throws {
            let echoPort = freePort(), runPort = freePort()
            let daemon = try Child("/usr/bin/systemd-socket-activate",
                                   sanitizerEnvironment + ["-l", "127.0.0.1:\(echoPort)", "-l", "127.0.0.1:\(runPort)", "--fdname=echo:run",
                                    echod, "--run", "/bin/echo 'ran with'"])
            defer { daemon.signal(SIGTERM); _ = daemon.wait(timeout: .seconds(2)) }
            #expect(try client(echoPort, connections: 2, ["plain {i}"]) == ["plain 0", "plain 1"])
            #expect(try client(runPort, connections: 2, ["line {i}"]) == ["ran with line 0", "ran with line 1"])
            #expect(try client(echoPort, connections: 1, ["again"]) == ["again"])
        }

        @Test func withAWrongListenPidNothingIsAdopted() throws {
            let daemon = try Child(echod, [], environment: ["LISTEN_FDS": "1", "LISTEN_PID": "1", "LISTEN_FDNAMES": "echo"])
            #expect(daemon.wait() == 2)
            #expect(daemon.errorLine(matching: { $0.contains("no socket") }) != nil)
        }

        @Test func runByHandItBindsTheAddressAndAnswersWithTheCommandOrItsExitStatus() throws {
            let port = freePort()
            let daemon = try Child(echod, ["--listen", "127.0.0.1:\(port)", "--run", #"/bin/sh -c "test \"$0\" = quiet && exit 4; echo \"got $0\"""#])
            defer { daemon.signal(SIGTERM); _ = daemon.wait(timeout: .seconds(2)) }
            #expect(try client(port, connections: 1, ["one", "quiet", "two words"]) == ["got one", "exit 4", "got two words"])
        }

        @Test func sigtermStopsItWithItsChildrenReaped() throws {
            let port = freePort()
            // The child and its own child ignore SIGTERM: only the SIGKILL at
            // the end of shutdown ends them, and the daemon reaps the child.
            let daemon = try Child(echod, ["--listen", "127.0.0.1:\(port)", "--run", #"/bin/sh -c "trap '' TERM; sleep 30; echo $0""#])
            let script = """
                import socket, sys, time
                for attempt in range(500):
                    try:
                        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10); break
                    except ConnectionRefusedError:
                        time.sleep(0.02)
                s.sendall(b"a\\n")
                print("sent", flush=True)
                s.recv(100)
                """
            let c = try Child("/usr/bin/python3", ["-c", script, "\(port)"])
            #expect(c.line() == "sent")
            // The daemon's child (the shell) appears.
            var children: [String] = []
            let deadline = ContinuousClock.now + .seconds(5)
            while children.isEmpty, ContinuousClock.now < deadline {
                children = ((try? String(contentsOfFile: "/proc/\(daemon.pid)/task/\(daemon.pid)/children", encoding: .utf8)) ?? "")
                    .split(separator: " ").map(String.init)
                usleep(10_000)
            }
            #expect(children.count == 1)
            var grandchildren: [String] = []
            while grandchildren.isEmpty, let child = children.first, ContinuousClock.now < deadline {
                grandchildren = ((try? String(contentsOfFile: "/proc/\(child)/task/\(child)/children", encoding: .utf8)) ?? "")
                    .split(separator: " ").map(String.init)
                usleep(10_000)
            }
            #expect(grandchildren.count == 1)
            let stopped = ContinuousClock.now
            daemon.signal(SIGTERM)
            #expect(daemon.wait() == 0)
            #expect(ContinuousClock.now - stopped < .seconds(3))
            // The child was reaped by the daemon; the grandchild was killed
            // (init reaps it, perhaps a moment later).
            for pid in children { #expect(!FileManager.default.fileExists(atPath: "/proc/\(pid)")) }
            for pid in grandchildren {
                let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
                let state = stat.lastIndex(of: ")").flatMap { stat[stat.index(after: $0)...].split(separator: " ").first }
                #expect(state == nil || state == "Z", "grandchild \(pid) still runs: \(stat)")
            }
            _ = c.wait()
        }
    }
}
