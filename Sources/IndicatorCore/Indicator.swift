import Reconcile

/// The connectivity indicator as a program: pure, run by `Daemon` in the
/// executable and by the virtual driver in tests.
///
/// Subscriptions: the connectivity source (with a config file, once the file
/// has been read, or `configWaitLimit` has passed); a one-minute timer only
/// while the text view shows "for 3m"; the config file watch (when there is a
/// file); SIGHUP (re-read the config); logind's `PrepareForSleep` on the
/// system bus when `followsLogind` (while the machine prepares for sleep the
/// connectivity source is stopped and nothing is printed; on resume it starts
/// again, so one fresh report of the current state is printed). Without a
/// system bus, or without logind on it, that subscription sees nothing (or
/// fails and retries quietly) and the indicator runs as it would without it.
public struct Indicator: Program {
    /// Command-line settings (the config file overrides the keys it sets).
    public var base: Settings
    public var format: OutputFormat
    public var configPath: String?
    public var once: Bool
    /// Whether logind's `PrepareForSleep` pauses the indicator (never with
    /// `once`). Off unless asked for: the executable decides it from
    /// `--logind` (by default, whether a system bus is there at start).
    public var followsLogind: Bool

    public init(base: Settings = Settings(), format: OutputFormat = .text, configPath: String? = nil, once: Bool = false,
                followsLogind: Bool = false) {
        self.base = base
        self.format = format
        self.configPath = configPath
        self.once = once
        self.followsLogind = followsLogind
    }

    /// logind's name, and where its `PrepareForSleep` signal comes from.
    public static let logind = "org.freedesktop.login1"
    /// logind's `PrepareForSleep(b)`, from the current owner of its name only.
    public static let sleepSignal = BusSignalSource.Configuration(
        bus: .system, sender: logind, path: "/org/freedesktop/login1",
        interface: "org.freedesktop.login1.Manager", member: "PrepareForSleep")

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
        /// logind said the machine is going to sleep (`PrepareForSleep(true)`)
        /// and has not said it resumed: the connectivity source is stopped
        /// and the view shows nothing.
        public var sleeping = false
        /// Resumes from sleep so far: a view printed after one is printed
        /// even when its line equals the last one before the sleep.
        public var wakes = 0
        /// Why the logind subscription is not delivering (no system bus,
        /// logind's signal malformed); nil when it is, or not asked for.
        public var logindProblem: String?

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
        /// logind's `PrepareForSleep`: true before the machine sleeps, false
        /// when it has resumed.
        case prepareForSleep(Bool)
        /// logind is on the bus (while the machine prepares for sleep).
        case logindPresent
        /// logind left the bus while the machine was preparing for sleep:
        /// its `PrepareForSleep(false)` will not come.
        case logindGone
        /// The logind subscription failed (no system bus, the bus lost, a
        /// malformed signal); it retries by itself.
        case logindUnavailable(String)
        /// The system bus is being reconnected (after `.logindUnavailable`).
        case logindReconnecting(attempt: Int, after: Duration)
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
            case .restarting:
                // The failure before it stays the one shown.
                break
            }
            return []
        case .minute:
            model.minutes += 1
            return []
        case .configChanged(.failed(let f)):
            return [.log("config watch: \(f)")]
        case .configChanged(.restarting):
            return []
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
        case .prepareForSleep(true):
            guard !model.sleeping else { return [] }
            model.sleeping = true
            // Whatever the connectivity source queued before it stopped is
            // about the machine before the sleep.
            model.phase.advance()
            return [.log("the machine is preparing for sleep: paused")]
        case .prepareForSleep(false):
            guard model.sleeping else { return [] }
            resume(&model)
            return [.log("the machine resumed: reading the current state")]
        case .logindPresent:
            return []
        case .logindGone:
            guard model.sleeping else { return [] }
            resume(&model)
            return [.log("logind left the bus while the machine was preparing for sleep: resuming")]
        case .logindUnavailable(let reason):
            model.logindProblem = reason
            return []
        case .logindReconnecting:
            return []
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

    /// Back from sleep: the connectivity source starts again (the next
    /// subscriptions), and its first report is printed as a fresh one.
    func resume(_ model: inout Model) {
        model.sleeping = false
        model.wakes += 1
        model.latest = nil
        model.failure = nil
        model.logindProblem = nil
    }

    /// Whether the view shows a relative time that needs a timer.
    public func needsMinuteTimer(_ model: Model) -> Bool {
        format == .text && model.settings.showSince && model.latest != nil && !once && !model.sleeping
    }

    public func subscriptions(_ model: Model) -> Subscriptions<Message> {
        let phase = model.phase
        return Subscriptions {
            if model.configWaiting {
                Subscription.after(Self.configWaitLimit, key: "config-wait") { _ in .configWaitOver }
            } else if !model.sleeping {
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
            if followsLogind && !once {
                Subscription.busSignal(Self.sleepSignal, key: "sleep") { event in
                    switch event {
                    case .received(let signal):
                        if case .boolean(let going)? = signal.arguments.first, signal.arguments.count == 1 {
                            .prepareForSleep(going)
                        } else {
                            .logindUnavailable("PrepareForSleep with arguments \(signal.arguments), not one boolean")
                        }
                    case .failed(let f):
                        .logindUnavailable(f.reason)
                    case .restarting(let attempt, let after):
                        // The failure before it stays the problem shown.
                        .logindReconnecting(attempt: attempt, after: after)
                    }
                }
                if model.sleeping {
                    // The resume signal would never come from a logind that went away.
                    Subscription.busName(bus: .system, name: Self.logind) { event in
                        if case .appeared = event { .logindPresent } else { .logindGone }
                    }
                }
            }
        }
    }

    public func status(_ model: Model) -> String? {
        if model.sleeping { return "paused: the machine is going to sleep" }
        if let f = model.failure { return "unknown: \(f)" }
        guard let c = model.latest else { return "starting" }
        return c.state.online ? "online via \(c.state.primary?.name ?? c.state.backend.rawValue)" : "offline (\(c.state.state.rawValue))"
    }
}
