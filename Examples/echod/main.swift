import Glibc
import Reconcile
import ReconcileSystemd

// echod: a line-echo daemon on the sockets systemd passes (socket
// activation), or on addresses it binds itself when run by hand.
//
//   systemd-socket-activate -l 7001 echod
//   echod --listen 127.0.0.1:7001 [--listen run=/run/echod.sock] [--datagram]
//         [--run 'COMMAND ARGS'] [--limit N]

let usage = """
    usage: echod [--listen [NAME=]ADDRESS]... [--datagram] [--run COMMAND] [--limit N]
      Sockets passed by systemd (LISTEN_FDS) are used when there are any, by
      name: a socket named "echo" echoes, others run COMMAND when given.
      --listen ADDRESS  bind ADDRESS (/path, @abstract, host:port, port) when
                        systemd passed nothing; NAME= names it (default "listen")
      --datagram        bind datagram sockets instead of stream ones
      --run COMMAND     answer each line with the first stdout line of COMMAND
                        (split into words as a shell would, not run by one)
                        run with the line as its last argument, or "exit N"
      --limit N         connections open at once per listener (default 256)
    """

func fail(_ message: String) -> Never {
    let text = "echod: \(message)\n"
    _ = text.withCString { write(2, $0, strlen($0)) }
    exit(2)
}

var listens: [(name: String, address: String)] = []
var datagram = false
var command: [String]?
var limit = ListenerSource.defaultConnectionLimit
var arguments = CommandLine.arguments.dropFirst()
while let argument = arguments.popFirst() {
    switch argument {
    case "--listen":
        guard let value = arguments.popFirst() else { fail("--listen needs an address") }
        if let eq = value.firstIndex(of: "="), !value.hasPrefix("/"), !value.hasPrefix("@") {
            listens.append((String(value[..<eq]), String(value[value.index(after: eq)...])))
        } else {
            listens.append(("listen", value))
        }
    case "--datagram": datagram = true
    case "--run":
        guard let value = arguments.popFirst() else { fail("--run needs a command") }
        guard let words = shellWords(value), !words.isEmpty else { fail("--run: cannot split '\(value)' into words") }
        command = words
    case "--limit":
        guard let value = arguments.popFirst(), let n = Int(value), n > 0 else { fail("--limit needs a positive number") }
        limit = n
    case "--help", "-h":
        print(usage)
        exit(0)
    default:
        fail("unknown argument '\(argument)'\n\(usage)")
    }
}

// Before any thread starts: the loop reads SIGTERM/SIGINT and SIGCHLD.
do { try Signals.block() } catch { fail("\(error)") }
// A peer that goes away must not kill the daemon on the next write.
signal(SIGPIPE, SIG_IGN)

var sockets = SocketActivation.adopted()
if sockets.isEmpty {
    for (name, address) in listens {
        do {
            sockets.append(ActivatedSocket(fd: try SocketActivation.bind(address, datagram: datagram), name: name,
                                           kind: datagram ? .datagram : .listening))
        } catch { fail("\(error)") }
    }
}
guard !sockets.isEmpty else { fail("no socket: run under systemd socket activation, or give --listen ADDRESS\n\(usage)") }

var endpoints: [Echo.Endpoint] = []
for s in sockets {
    switch s.kind {
    case .listening: endpoints.append(Echo.Endpoint(fd: s.fd, name: s.name, kind: .listening))
    case .connected: endpoints.append(Echo.Endpoint(fd: s.fd, name: s.name, kind: .connected(SocketActivation.connection(s))))
    case .datagram: endpoints.append(Echo.Endpoint(fd: s.fd, name: s.name, kind: .datagram))
    case .other: fail("socket \(s) is neither a stream nor a datagram socket")
    }
}

var options = Daemon<Echo>.Options()
options.logger = DaemonLogger(level: .notice)
do {
    let daemon = try Daemon(Echo(endpoints: endpoints, command: command, connectionLimit: limit), options: options) { command, daemon in
        switch command {
        case .write(let connection, let line):
            daemon.driver.write(line + "\n", to: connection)
        case .send(let fd, let address, let line):
            daemon.driver.send(Array((line + "\n").utf8), on: fd, to: address)
        case .finished:
            daemon.stop()
        }
    }
    exit(try daemon.run())
} catch {
    fail("\(error)")
}
