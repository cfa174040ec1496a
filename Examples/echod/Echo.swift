import Reconcile

/// A line-echo daemon: each line a client sends is answered with the same
/// line, or (with a command) with the first stdout line of the command run
/// with the line as its last argument, or `exit N` when it printed nothing.
struct Echo: Program {
    /// What a socket does with its lines.
    enum Route: Equatable { case echo, run }

    /// A socket the daemon serves.
    struct Endpoint {
        var fd: Int32
        var name: String
        var kind: Kind
        enum Kind { case listening, connected(Connection), datagram }
    }

    /// Where an answer goes.
    enum Reply: Hashable {
        case connection(Connection)
        case datagram(fd: Int32, to: PeerAddress)
    }

    struct Job {
        var reply: Reply
        var line: String
        var first: String?
    }

    struct Client {
        var connection: Connection
        var route: Route
        var waiting: [String] = []
        var running: Int?
        var ended = false
    }

    struct Model {
        var clients: [UInt64: Client] = [:]
        var jobs: [Int: Job] = [:]
        var nextJob = 0
        var refused = 0
    }

    enum Message {
        case listener(name: String, ListenerSource.Event)
        case connection(UInt64, DescriptorSource.Event)
        case datagram(fd: Int32, name: String, DescriptorSource.Event)
        case job(Int, ProcessSource.Event)
    }

    enum Command {
        case write(Connection, String)
        case send(fd: Int32, to: PeerAddress, String)
        /// The handed-over connection ended (`--accept`): the daemon exits.
        case finished
    }

    let endpoints: [Endpoint]
    /// The command's words (`--run`), nil: echo.
    let command: [String]?
    let connectionLimit: Int

    /// Sockets named `echo` always echo, `run` always run; others run when there is a command.
    func route(_ name: String) -> Route {
        name == "echo" || command == nil ? .echo : .run
    }

    func start() -> (Model, [Command]) {
        var model = Model()
        for e in endpoints {
            if case .connected(let c) = e.kind { model.clients[c.id] = Client(connection: c, route: route(e.name)) }
        }
        return (model, [])
    }

    func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .listener(let name, .accepted(let c)):
            model.clients[c.id] = Client(connection: c, route: route(name))
            return []
        case .listener(_, .refused(let total)):
            model.refused = total
            return []
        case .listener:
            return []
        case .connection(let id, let event):
            guard var client = model.clients[id] else { return [] }
            switch event {
            case .line(let line):
                if client.route == .echo {
                    return [.write(client.connection, line)]
                }
                client.waiting.append(line)
            case .lineTooLong(let limit):
                model.clients[id] = client
                return [.write(client.connection, "error line longer than \(limit) bytes")]
            case .endOfFile:
                client.ended = true
            case .closed, .failed:
                client.ended = true
                client.waiting = []
            case .bytes, .lines, .datagram:
                break
            }
            model.clients[id] = client
            return next(&model, id)
        case .datagram(let fd, let name, .datagram(let bytes, let from, _)):
            let line = String(decoding: bytes.last == 10 ? bytes.dropLast() : bytes[...], as: UTF8.self)
            if route(name) == .echo { return [.send(fd: fd, to: from, line)] }
            model.jobs[model.nextJob] = Job(reply: .datagram(fd: fd, to: from), line: line)
            model.nextJob += 1
            return []
        case .datagram:
            return []
        case .job(let id, let event):
            guard var job = model.jobs[id] else { return [] }
            let answer: String
            switch event {
            case .output(.stdout, let line):
                if job.first == nil { job.first = line }
                model.jobs[id] = job
                return []
            case .exited(let status): answer = job.first ?? "exit \(status)"
            case .killed(let signal): answer = job.first ?? "killed \(signal)"
            case .failed(let failure): answer = "error \(failure.reason)"
            case .started, .output, .lineTooLong, .restarting: return []
            }
            model.jobs[id] = nil
            switch job.reply {
            case .datagram(let fd, let to): return [.send(fd: fd, to: to, answer)]
            case .connection(let c):
                model.clients[c.id]?.running = nil
                return [.write(c, answer)] + next(&model, c.id)
            }
        }
    }

    /// Starts the client's next line's job, or lets it go when it is done.
    private func next(_ model: inout Model, _ id: UInt64) -> [Command] {
        guard var client = model.clients[id] else { return [] }
        if client.running == nil, !client.waiting.isEmpty {
            let line = client.waiting.removeFirst()
            model.jobs[model.nextJob] = Job(reply: .connection(client.connection), line: line)
            client.running = model.nextJob
            model.nextJob += 1
        }
        if client.ended, client.running == nil, client.waiting.isEmpty {
            model.clients[id] = nil
            if endpoints.contains(where: { if case .connected(let c) = $0.kind { c.id == id } else { false } }) {
                return [.finished]
            }
            return []
        }
        model.clients[id] = client
        return []
    }

    func subscriptions(_ model: Model) -> Subscriptions<Message> {
        Subscriptions {
            for e in endpoints {
                switch e.kind {
                case .listening:
                    Subscription.listen(e.fd, name: e.name, connectionLimit: connectionLimit) { .listener(name: e.name, $0) }
                case .datagram:
                    Subscription.datagrams(e.fd) { .datagram(fd: e.fd, name: e.name, $0) }
                case .connected:
                    Subscriptions.none
                }
            }
            model.clients.values.map { c in Subscription.connection(c.connection) { .connection(c.connection.id, $0) } }
            model.jobs.map { id, job in
                Subscription.process((command ?? []) + [job.line], key: id, grace: .seconds(2)) { .job(id, $0) }
            }
        }
    }
}

/// `text` split into words as a POSIX shell splits a simple command: blanks
/// separate words, `'…'` is literal, `"…"` keeps blanks (a backslash
/// escapes `"`, `\`, `$` and a backquote inside), a backslash outside quotes
/// escapes the next character. No expansion of any kind. Nil when a quote
/// is not closed.
func shellWords(_ text: String) -> [String]? {
    var words: [String] = []
    var word = ""
    var inWord = false
    var chars = text.makeIterator()
    while let c = chars.next() {
        switch c {
        case " ", "\t", "\n":
            if inWord { words.append(word); word = ""; inWord = false }
        case "'":
            inWord = true
            var closed = false
            while let d = chars.next() {
                if d == "'" { closed = true; break }
                word.append(d)
            }
            if !closed { return nil }
        case "\"":
            inWord = true
            var closed = false
            while let d = chars.next() {
                if d == "\"" { closed = true; break }
                if d == "\\" {
                    guard let e = chars.next() else { return nil }
                    if !"\"\\$`".contains(e) { word.append("\\") }
                    if e != "\n" { word.append(e) }
                    continue
                }
                word.append(d)
            }
            if !closed { return nil }
        case "\\":
            inWord = true
            guard let e = chars.next() else { return nil }
            if e != "\n" { word.append(e) }
        default:
            inWord = true
            word.append(c)
        }
    }
    if inWord { words.append(word) }
    return words
}
