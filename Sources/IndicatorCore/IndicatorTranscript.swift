import Reconcile

// The indicator's messages are Codable so its runs can be recorded and
// replayed (Docs/Replay.md). The source events they carry are written through
// the plain mirrors below (the library's event types are not Codable).

extension Indicator.Message: Codable {
    public init(from decoder: any Decoder) throws { self = try MessageCoding(from: decoder).message }
    public func encode(to encoder: any Encoder) throws { try MessageCoding(self).encode(to: encoder) }
}

enum MessageCoding: Codable {
    case connectivity(ConnectivityEventCoding, phase: Phase)
    case minute
    case configChanged(FileEventCoding)
    case configQuiet(Phase)
    case reload
    case configRead(path: String, contents: String?)
    case configUnreadable(path: String, reason: String)
    case configWaitOver
    case prepareForSleep(Bool)
    case logindPresent
    case logindGone
    case logindUnavailable(String)
    case logindReconnecting(attempt: Int, afterMicroseconds: Int64)

    init(_ m: Indicator.Message) {
        switch m {
        case .connectivity(let e, let p): self = .connectivity(ConnectivityEventCoding(e), phase: p)
        case .minute: self = .minute
        case .configChanged(let e): self = .configChanged(FileEventCoding(e))
        case .configQuiet(let p): self = .configQuiet(p)
        case .reload: self = .reload
        case .configRead(let path, let contents): self = .configRead(path: path, contents: contents)
        case .configUnreadable(let path, let reason): self = .configUnreadable(path: path, reason: reason)
        case .configWaitOver: self = .configWaitOver
        case .prepareForSleep(let going): self = .prepareForSleep(going)
        case .logindPresent: self = .logindPresent
        case .logindGone: self = .logindGone
        case .logindUnavailable(let reason): self = .logindUnavailable(reason)
        case .logindReconnecting(let attempt, let after):
            self = .logindReconnecting(attempt: attempt, afterMicroseconds: after.saturatingMicroseconds)
        }
    }

    var message: Indicator.Message {
        get throws {
            switch self {
            case .connectivity(let e, let p): .connectivity(try e.event, p)
            case .minute: .minute
            case .configChanged(let e): .configChanged(e.event)
            case .configQuiet(let p): .configQuiet(p)
            case .reload: .reload
            case .configRead(let path, let contents): .configRead(path: path, contents: contents)
            case .configUnreadable(let path, let reason): .configUnreadable(path: path, reason: reason)
            case .configWaitOver: .configWaitOver
            case .prepareForSleep(let going): .prepareForSleep(going)
            case .logindPresent: .logindPresent
            case .logindGone: .logindGone
            case .logindUnavailable(let reason): .logindUnavailable(reason)
            case .logindReconnecting(let attempt, let after): .logindReconnecting(attempt: attempt, after: .microseconds(after))
            }
        }
    }
}

struct FailureCoding: Codable {
    var operation: String
    var code: Int32?
    var reason: String
    init(_ f: SourceFailure) { (operation, code, reason) = (f.operation, f.code, f.reason) }
    var failure: SourceFailure { SourceFailure(operation: operation, code: code, reason: reason) }
}

enum FileEventCoding: Codable {
    case exists, created, modified, replaced, deleted, rescan
    case failed(FailureCoding)
    case restarting(attempt: Int, afterMicroseconds: Int64)

    init(_ e: FileWatchSource.Event) {
        switch e {
        case .exists: self = .exists
        case .created: self = .created
        case .modified: self = .modified
        case .replaced: self = .replaced
        case .deleted: self = .deleted
        case .rescan: self = .rescan
        case .failed(let f): self = .failed(FailureCoding(f))
        case .restarting(let n, let after): self = .restarting(attempt: n, afterMicroseconds: after.saturatingMicroseconds)
        }
    }

    var event: FileWatchSource.Event {
        switch self {
        case .exists: .exists
        case .created: .created
        case .modified: .modified
        case .replaced: .replaced
        case .deleted: .deleted
        case .rescan: .rescan
        case .failed(let f): .failed(f.failure)
        case .restarting(let n, let after): .restarting(attempt: n, after: .microseconds(after))
        }
    }
}

enum ConnectivityEventCoding: Codable {
    struct Interface: Codable {
        var name: String
        var index: Int32
        var state: String
        var addresses: [String]
    }
    struct Change: Codable {
        var state: String
        var online: Bool
        var defaultRoute: Bool?
        var interfaces: [Interface]
        var backend: String
        var changedAt: Int64
    }
    case changed(Change)
    case failed(FailureCoding)
    case restarting(attempt: Int, afterMicroseconds: Int64)

    init(_ e: ConnectivitySource.Event) {
        switch e {
        case .changed(let c):
            let s = c.state
            self = .changed(Change(
                state: s.state.rawValue, online: s.online, defaultRoute: s.defaultRoute,
                interfaces: s.interfaces.map { Interface(name: $0.name, index: $0.index, state: $0.state.rawValue, addresses: $0.addresses) },
                backend: s.backend.rawValue, changedAt: c.changedAt))
        case .failed(let f):
            self = .failed(FailureCoding(f))
        case .restarting(let n, let after):
            self = .restarting(attempt: n, afterMicroseconds: after.saturatingMicroseconds)
        }
    }

    var event: ConnectivitySource.Event {
        get throws {
            switch self {
            case .failed(let f): return .failed(f.failure)
            case .restarting(let n, let after): return .restarting(attempt: n, after: .microseconds(after))
            case .changed(let c):
                func state(_ raw: String) throws -> ConnectivitySource.OperationalState {
                    guard let s = ConnectivitySource.OperationalState(rawValue: raw) else {
                        throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "unknown operational state '\(raw)'"))
                    }
                    return s
                }
                // A replayed time is checked before anything computes with it:
                // microseconds since the epoch, up to the end of year 9999.
                guard (0...253_402_300_799_999_999).contains(c.changedAt) else {
                    throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "changedAt \(c.changedAt) is out of range"))
                }
                guard let backend = ConnectivitySource.Backend(rawValue: c.backend) else {
                    throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "unknown backend '\(c.backend)'"))
                }
                let interfaces = try c.interfaces.map {
                    ConnectivitySource.Interface(name: $0.name, index: $0.index, state: try state($0.state), addresses: $0.addresses)
                }
                return .changed(ConnectivitySource.Change(
                    state: ConnectivitySource.State(state: try state(c.state), online: c.online, defaultRoute: c.defaultRoute,
                                                    interfaces: interfaces, backend: backend),
                    changedAt: c.changedAt))
            }
        }
    }
}
