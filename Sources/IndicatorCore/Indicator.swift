import Reconcile

/// The connectivity indicator as a program: pure, run by `Daemon` in the
/// executable and by the virtual driver in tests.
///
/// Subscriptions: the connectivity source (with a config file, once the file
/// has been read, or `configWaitLimit` has passed); a one-minute timer only
/// while the text view shows "for 3m"; the config file watch (when there is a
/// file); SIGHUP (re-read the config).
public struct Indicator: Program {
    /// Command-line settings (the config file overrides the keys it sets).
    public var base: Settings
    public var format: OutputFormat
    public var configPath: String?
    public var once: Bool

    public init(base: Settings = Settings(), format: OutputFormat = .text, configPath: String? = nil, once: Bool = false) {
        self.base = base
        self.format = format
        self.configPath = configPath
        self.once = once
    }

    public struct Model: Equatable, Sendable {
        public var settings: Settings
        public var phase = Phase()
        public var latest: ConnectivitySource.Change?
        public var failure: String?
        /// Bumped by the relative-time timer so the view is redrawn.
        public var minutes = 0
        /// The last config problem (kept until a good file is read).
        public var configProblem: String?
        public var rejected = 0
        /// Config file changes wait for a quiet moment (a debounce keyed by
        /// this phase), so a file caught half-written is not read.
        public var configPhase = Phase()
        public var configPending = false
        /// A read of the config file is under way (its `.configRead` or
        /// `.configUnreadable` has not come back). Reads run one at a time,
        /// so their results cannot arrive out of order.
        public var configReading = false
        /// A read was asked for during the one under way: read again when
        /// it is back.
        public var configRereadWanted = false
        /// The first read of the config file has not come back yet: the
        /// connectivity source waits for it (at most `configWaitLimit`), so
        /// the first report, and `--once`'s verdict, use the file's settings.
        public var configWaiting = false

        public init(settings: Settings) { self.settings = settings }
    }

    public enum Message: Sendable {
        case connectivity(ConnectivitySource.Event, Phase)
        case minute
        case configChanged(FileWatchSource.Event)
        case configQuiet(Phase)
        case reload
        case configRead(path: String, contents: String?)
        /// The config file was not read, and why (not a regular file, too
        /// large, an open or read error).
        case configUnreadable(path: String, reason: String)
        /// The first read of the config file took longer than
        /// `configWaitLimit` (or its timer could not be armed): start with
        /// the command-line settings.
        case configWaitOver
    }

    public enum Command: Equatable, Sendable, Codable {
        /// Read the config file and answer with `.configRead` or
        /// `.configUnreadable`. One at a time: the next is asked for only
        /// after that answer.
        case readConfig(String)
        /// Tell the operator about the configuration (stderr / journal).
        case log(String)
        /// Exit with this status (`--once`).
        case exit(Int32)
    }

    /// How long a config file must stay unchanged before it is read.
    public static let configQuiet: Duration = .milliseconds(100)
    /// How long the connectivity source waits for the first read of the
    /// config file (a file on a hung mount must not hold it back forever).
    public static let configWaitLimit: Duration = .seconds(2)

    public func start() -> (Model, [Command]) {
        var model = Model(settings: base)
        model.configWaiting = configPath != nil
        let commands = readConfig(&model)
        return (model, commands)
    }

    /// Asks for a read of the config file, or, with one under way, for
    /// another once it is back.
    func readConfig(_ model: inout Model) -> [Command] {
        guard let configPath else { return [] }
        if model.configReading {
            model.configRereadWanted = true
            return []
        }
        model.configReading = true
        return [.readConfig(configPath)]
    }

    /// A read came back: the one asked for during it, if any, goes now.
    func readDone(_ model: inout Model) -> [Command] {
        model.configReading = false
        model.configWaiting = false
        guard model.configRereadWanted else { return [] }
        model.configRereadWanted = false
        return readConfig(&model)
    }

    public func update(_ model: inout Model, _ message: Message) -> [Command] {
        switch message {
        case .connectivity(let event, let phase):
            guard model.phase.isCurrent(phase) else {
                model.rejected += 1
                return []
            }
            switch event {
            case .changed(let c):
                // A restarted source reports its initial state again: the
                // same state is not a change (and keeps its time).
                if model.latest?.state != c.state { model.latest = c }
                model.failure = nil
                if once { return [.exit(c.state.online ? 0 : 1)] }
            case .failed(let f):
                model.failure = f.reason
                if once { return [.log("connectivity: \(f.reason)"), .exit(1)] }
            }
            return []
        case .minute:
            model.minutes += 1
            return []
        case .configChanged(.failed(let f)):
            return [.log("config watch: \(f)")]
        case .configChanged(.deleted):
            return configPath.map { [.log("config \($0) was deleted: keeping the last good configuration")] } ?? []
        case .configChanged:
            model.configPhase.advance()
            model.configPending = true
            return []
        case .configQuiet(let phase):
            guard model.configPhase.isCurrent(phase), model.configPending else { return [] }
            model.configPending = false
            return readConfig(&model)
        case .reload:
            return readConfig(&model)
        case .configWaitOver:
            guard model.configWaiting, let configPath else { return [] }
            model.configWaiting = false
            return [.log("config \(configPath) not read yet: starting with the command-line settings; the file is applied when read")]
        case .configUnreadable(let path, let reason):
            model.configProblem = "\(path): \(reason)"
            return [.log("config \(path) cannot be read: \(reason): keeping the last good configuration")] + readDone(&model)
        case .configRead(let path, let contents):
            let next = readDone(&model)
            guard let contents else {
                return [.log("config \(path) cannot be read: keeping the last good configuration")] + next
            }
            switch parseConfig(contents, base: base) {
            case .success(let s):
                model.configProblem = nil
                if s.connectivity != model.settings.connectivity {
                    // Events queued under the old configuration are stale.
                    model.phase.advance()
                }
                if s == model.settings { return next }
                model.settings = s
                return [.log("config \(path) applied")] + next
            case .failure(let e):
                model.configProblem = "\(path): \(e)"
                return [.log("config \(path): \(e): keeping the last good configuration")] + next
            }
        }
    }

    /// Whether the view shows a relative time that needs a timer.
    public func needsMinuteTimer(_ model: Model) -> Bool {
        format == .text && model.settings.showSince && model.latest != nil && !once
    }

    public func subscriptions(_ model: Model) -> Subscriptions<Message> {
        let phase = model.phase
        return Subscriptions {
            if model.configWaiting {
                Subscription.after(Self.configWaitLimit, key: "config-wait") { _ in .configWaitOver }
            } else {
                Subscription.connectivity(model.settings.connectivity, key: "net") { .connectivity($0, phase) }
            }
            if needsMinuteTimer(model) {
                Subscription.every(.seconds(60), key: "since", leeway: .seconds(1)) { _ in .minute }
            }
            if let path = configPath, !once {
                // `.exists` once armed: read after the watch is in place.
                Subscription.watch(path, reportExisting: true) { .configChanged($0) }
                if model.configPending {
                    let phase = model.configPhase
                    Subscription.debounce("config", phase: phase, after: Self.configQuiet) { _ in .configQuiet(phase) }
                }
            }
        }
    }

    public func status(_ model: Model) -> String? {
        if let f = model.failure { return "unknown: \(f)" }
        guard let c = model.latest else { return "starting" }
        return c.state.online ? "online via \(c.state.primary?.name ?? c.state.backend.rawValue)" : "offline (\(c.state.state.rawValue))"
    }
}
