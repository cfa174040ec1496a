import Reconcile

/// The transcript file format (JSON Lines; Docs/Replay.md describes every field).
public enum TranscriptFormat {
    /// The format's name in the first line.
    public static let name = "reconcile-transcript"
    /// The version this code writes and reads.
    public static let version = 1
}

/// Encodes a runtime's transcript records as JSON lines.
///
/// Messages and commands whose types are `Encodable` are written in full
/// (`message`, `commands`); other types are written as their kind only
/// (`message_kind`, `command_kinds`: the enum case or type name), which a
/// replay cannot feed back. A value that fails to encode (a non-finite
/// `Double`) is written as its kind plus `message_error` / `command_error`.
public final class TranscriptEncoder<Message, Command> {
    let json: StreamingJSONEncoder
    let message: PayloadCoder<Message>
    let command: PayloadCoder<Command>

    /// An encoder whose output starts with room for `capacity` bytes.
    public init(capacity: Int = 1 << 16) {
        json = StreamingJSONEncoder(capacity: capacity)
        message = PayloadCoder()
        command = PayloadCoder()
    }

    /// Whether messages are written with their payload (`Message: Encodable`).
    public var recordsMessages: Bool { message.encode != nil }

    /// The encoded lines not yet taken.
    public var output: JSONOutput {
        get { json.out }
        set { json.out = newValue }
    }

    /// Bytes waiting in `output`.
    public var pendingBytes: Int { json.out.bytes.count }

    /// Hands the pending bytes to `body` and empties the buffer, keeping
    /// `replacement`'s storage for what comes next.
    public func swapOutput(_ replacement: [UInt8]) -> [UInt8] {
        var fresh = replacement
        fresh.removeAll(keepingCapacity: true)
        let taken = json.out.bytes
        json.out.bytes = fresh
        return taken
    }

    /// Appends the first line: format, version, program type and wall-clock start.
    /// `arguments`: the command line the host was started with, for replay
    /// tools that rebuild the program from it (omitted when nil).
    public func header(program: String, startedAtMicros: Int64, startedAt: String, arguments: [String]? = nil) {
        let o = json
        o.out.raw("{\"type\":\"header\",\"format\":")
        o.out.string(TranscriptFormat.name)
        o.out.raw(",\"version\":")
        o.out.int(Int64(TranscriptFormat.version))
        o.out.raw(",\"program\":")
        o.out.string(program)
        o.out.raw(",\"started_at\":")
        o.out.string(startedAt)
        o.out.raw(",\"started_at_us\":")
        o.out.int(startedAtMicros)
        if let arguments {
            o.out.raw(",\"arguments\":[")
            for (i, a) in arguments.enumerated() {
                if i > 0 { o.out.byte(UInt8(ascii: ",")) }
                o.out.string(a)
            }
            o.out.byte(UInt8(ascii: "]"))
        }
        o.out.raw("}\n")
    }

    /// Appends the last line: why recording ended (`shutdown`, `size_limit`, ...).
    public func end(reason: String, time: Duration) {
        json.out.raw("{\"type\":\"end\",\"time_us\":")
        json.out.int(time.wholeMicroseconds)
        json.out.raw(",\"reason\":")
        json.out.string(reason)
        json.out.raw("}\n")
    }

    /// Appends one record as one line.
    public func append(_ record: TranscriptRecord<Message, Command>) {
        let o = json
        switch record {
        case .start(let time, let commands):
            o.out.raw("{\"type\":\"start\",\"time_us\":")
            o.out.int(time.wholeMicroseconds)
            appendCommands(commands)
        case .message(let m):
            o.out.raw("{\"type\":\"message\",\"index\":")
            o.out.int(Int64(m.index))
            o.out.raw(",\"round\":")
            o.out.int(Int64(m.round))
            o.out.raw(",\"time_us\":")
            o.out.int(m.time.wholeMicroseconds)
            o.out.raw(",\"origin\":")
            appendOrigin(m.origin)
            appendPayload(m.message, message, field: "message")
            appendCommands(m.commands)
        case .plan(let plan, let time, let round):
            o.out.raw("{\"type\":\"plan\",\"round\":")
            o.out.int(Int64(round))
            o.out.raw(",\"time_us\":")
            o.out.int(time.wholeMicroseconds)
            appendPlan(plan)
        case .diagnostic(let d, let time):
            o.out.raw("{\"type\":\"diagnostic\",\"time_us\":")
            o.out.int(time.wholeMicroseconds)
            appendDiagnostic(d)
        }
        o.out.raw("}\n")
    }

    /// The JSON of `commands` as a record's `commands` array would hold them
    /// (for comparing a replay's commands with recorded ones).
    public func commandsJSON(_ commands: [Command]) -> String {
        let saved = json.out.bytes
        json.out.bytes = []
        json.out.byte(UInt8(ascii: "{"))
        appendCommands(commands, leadingComma: false)
        json.out.byte(UInt8(ascii: "}"))
        let text = json.out.text
        json.out.bytes = saved
        return text
    }

    /// The JSON fields a plan record holds for `plan`, as an object.
    public func planJSON(_ plan: Plan) -> String {
        let saved = json.out.bytes
        json.out.bytes = []
        json.out.raw("{\"type\":\"plan\"")
        appendPlan(plan)
        json.out.byte(UInt8(ascii: "}"))
        let text = json.out.text
        json.out.bytes = saved
        return text
    }

    // MARK: Parts

    func appendOrigin(_ origin: MessageOrigin) {
        let o = json
        switch origin {
        case .host: o.out.raw("{\"kind\":\"host\"}")
        case .sender: o.out.raw("{\"kind\":\"sender\"}")
        case .source(let id, let activation):
            o.out.raw("{\"kind\":\"source\",\"id\":")
            o.out.string(id.description)
            o.out.raw(",\"activation\":")
            o.out.uint(activation.generation)
            o.out.byte(UInt8(ascii: "}"))
        case .task(let key):
            o.out.raw("{\"kind\":\"task\",\"id\":")
            o.out.string(String(describing: key.base))
            o.out.byte(UInt8(ascii: "}"))
        }
    }

    func appendPayload<T>(_ value: T, _ coder: PayloadCoder<T>, field: StaticString) {
        let o = json
        if let encode = coder.encode {
            let mark = o.out.bytes.count
            o.out.raw(",\"")
            o.out.raw(field)
            o.out.raw("\":")
            do {
                try encode(value, o)
                return
            } catch {
                o.reset()
                o.out.bytes.removeSubrange(mark...)
                o.out.raw(",\"")
                o.out.raw(field)
                o.out.raw("_error\":")
                o.out.string(String(describing: error))
            }
        }
        o.out.raw(",\"")
        o.out.raw(field)
        o.out.raw("_kind\":")
        o.out.string(kind(of: value))
    }

    func appendCommands(_ commands: [Command], leadingComma: Bool = true) {
        let o = json
        if leadingComma { o.out.byte(UInt8(ascii: ",")) }
        if let encode = command.encode {
            let mark = o.out.bytes.count
            o.out.raw("\"commands\":[")
            do {
                // Index loops: no generic iterator metadata per record.
                var i = 0
                while i < commands.count {
                    if i > 0 { o.out.byte(UInt8(ascii: ",")) }
                    try encode(commands[i], o)
                    i += 1
                }
                o.out.byte(UInt8(ascii: "]"))
                return
            } catch {
                o.reset()
                o.out.bytes.removeSubrange(mark...)
                o.out.raw("\"command_error\":")
                o.out.string(String(describing: error))
                o.out.byte(UInt8(ascii: ","))
            }
        }
        o.out.raw("\"command_kinds\":[")
        var i = 0
        while i < commands.count {
            if i > 0 { o.out.byte(UInt8(ascii: ",")) }
            o.out.string(kind(of: commands[i]))
            i += 1
        }
        o.out.byte(UInt8(ascii: "]"))
    }

    func appendPlan(_ plan: Plan) {
        let o = json
        o.out.raw(",\"steps\":[")
        for (i, step) in plan.steps.enumerated() {
            if i > 0 { o.out.byte(UInt8(ascii: ",")) }
            o.out.raw("{\"op\":")
            o.out.string(step.outcome)
            o.out.raw(",\"id\":")
            o.out.string(step.id.description)
            switch step {
            case .start(_, let c):
                o.out.raw(",\"config\":")
                o.out.string(String(describing: c.base))
            case .retune(_, let a, let b), .restart(_, let a, let b):
                o.out.raw(",\"from\":")
                o.out.string(String(describing: a.base))
                o.out.raw(",\"to\":")
                o.out.string(String(describing: b.base))
            case .stop:
                break
            }
            o.out.byte(UInt8(ascii: "}"))
        }
        o.out.raw("],\"kept\":")
        o.out.int(Int64(plan.kept))
        o.out.raw(",\"duplicates\":[")
        for (i, d) in plan.duplicates.enumerated() {
            if i > 0 { o.out.byte(UInt8(ascii: ",")) }
            o.out.string(d.description)
        }
        o.out.byte(UInt8(ascii: "]"))
    }

    func appendDiagnostic(_ d: Diagnostic) {
        let o = json
        switch d {
        case .duplicateIdentity(let id):
            o.out.raw(",\"kind\":\"duplicate_identity\",\"id\":")
            o.out.string(id.description)
        case .sourceFailed(let id, let a, let f):
            o.out.raw(",\"kind\":\"source_failed\",\"id\":")
            o.out.string(id.description)
            o.out.raw(",\"activation\":")
            o.out.uint(a.generation)
            o.out.raw(",\"operation\":")
            o.out.string(f.operation)
            if let code = f.code {
                o.out.raw(",\"errno\":")
                o.out.int(Int64(code))
            }
            o.out.raw(",\"reason\":")
            o.out.string(f.reason)
        case .lateDelivery(let id, let a):
            o.out.raw(",\"kind\":\"late_delivery\",\"id\":")
            o.out.string(id.description)
            o.out.raw(",\"activation\":")
            o.out.uint(a.generation)
        case .eventAfterStop(let id, let a):
            o.out.raw(",\"kind\":\"event_after_stop\",\"id\":")
            o.out.string(id.description)
            o.out.raw(",\"activation\":")
            o.out.uint(a.generation)
        case .eventTypeMismatch(let id, let type):
            o.out.raw(",\"kind\":\"event_type_mismatch\",\"id\":")
            o.out.string(id.description)
            o.out.raw(",\"event_type\":")
            o.out.string(type)
        case .groupDependsOnMoreThanInput(let key):
            o.out.raw(",\"kind\":\"group_not_pure\",\"group\":")
            o.out.string(key)
        }
        o.out.raw(",\"text\":")
        o.out.string(d.description)
    }
}

/// Encodes values of `T` when `T` is `Encodable` (decided once, at init).
struct PayloadCoder<T> {
    let encode: ((T, StreamingJSONEncoder) throws -> Void)?

    init() {
        if let e = T.self as? any Encodable.Type {
            encode = Self.coder(for: e)
        } else {
            encode = nil
        }
    }

    static func coder<E: Encodable>(for type: E.Type) -> (T, StreamingJSONEncoder) throws -> Void {
        { value, json in
            // T is E (the cast above succeeded for T.self).
            try json.encode(unsafeBitCast(value, to: E.self))
        }
    }
}

/// A value's kind: its enum case name, or its type's name.
func kind<T>(of value: T) -> String {
    let d = String(describing: value)
    if let paren = d.firstIndex(of: "(") { return String(d[..<paren]) }
    return d
}

extension Duration {
    /// Whole microseconds (transcript times): the one checked conversion.
    var wholeMicroseconds: Int64 { saturatingMicroseconds }
}
