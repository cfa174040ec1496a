/// A child process that runs while the model wants it.
///
/// The driver spawns it with standard input on `/dev/null`, standard output
/// and error on pipes read line by line, and no other descriptor; default
/// signal handling and an empty signal mask. Its exit is reported after its
/// last output line. Stopping the subscription sends `SIGTERM`, then
/// `SIGKILL` after `grace`, and reaps the child: none is left a zombie, and
/// none outlives the driver.
///
/// With a restart policy (`restart:`, default `.never`) a child that ends
/// is replaced by a new one after the policy's delay, as systemd's
/// `Restart=` would: the program sees `.exited` (or `.killed`, or
/// `.failed` when it could not be spawned), then
/// `.restarting(attempt:after:)`, then the next child's `.started(pid:)`.
/// Which ends restart is `RestartCondition` (default `.onFailure`: a clean
/// exit stays exited). Each attempt is a new child on an activation of its
/// own: a line the dead child's pipes still held after its exit event is
/// refused, never delivered as the new child's. Output does not count as
/// recovery (a child that prints and fails backs off); a child that ran a
/// whole window of the policy does, and the next failure waits `initial`.
public enum ProcessSource: RestartableSource {
    /// `process`.
    public static let name = "process"

    /// The grace a stopped child gets between `SIGTERM` and `SIGKILL`
    /// unless told otherwise: 5 s (systemd's `TimeoutStopSec=` is 90 s).
    public static let defaultGrace: Duration = .seconds(5)

    /// A child's parameters.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The program and its arguments; the first is searched in `PATH`
        /// when it has no slash.
        public var arguments: [String]
        /// The environment as `NAME=value` strings; nil: this process's.
        public var environment: [String]?
        /// The working directory; nil: this process's.
        public var directory: String?
        /// How long after `SIGTERM` a stopped child is killed.
        public var grace: Duration
        /// The longest output line delivered (longer ones are reported and skipped).
        public var maxLineLength: Int
        /// Whether an ended child is replaced by a new one, and when.
        public var restart: RestartPolicy
        /// Which ends restart under `restart`.
        public var restartOn: RestartCondition

        /// A child running `arguments`.
        /// - Parameters:
        ///   - arguments: The program and its arguments.
        ///   - environment: `NAME=value` strings; nil: this process's.
        ///   - directory: The working directory; nil: this process's.
        ///   - grace: The time between `SIGTERM` and `SIGKILL` when stopped.
        ///   - maxLineLength: The longest output line delivered.
        ///   - restart: Whether an ended child is replaced (default `.never`).
        ///   - restartOn: Which ends restart (default `.onFailure`).
        public init(arguments: [String], environment: [String]? = nil, directory: String? = nil,
                    grace: Duration = ProcessSource.defaultGrace,
                    maxLineLength: Int = DescriptorSource.defaultMaxLineLength,
                    restart: RestartPolicy = .never, restartOn: RestartCondition = .onFailure) {
            self.arguments = arguments
            self.environment = environment
            self.directory = directory
            self.grace = grace
            self.maxLineLength = maxLineLength
            self.restart = restart
            self.restartOn = restartOn
        }

        /// `/bin/sh -c 'exit 3'`, as plans show it (with the restart policy unless `never`).
        public var description: String {
            let command = arguments.map { $0.contains(" ") || $0.isEmpty ? "'\($0)'" : $0 }.joined(separator: " ")
            return restart == .never ? command : "\(command) restart \(restart) \(restartOn)"
        }
    }

    /// Which ends of a child restart it under a restart policy (systemd's
    /// `Restart=on-failure` and `Restart=always`). A spawn failure restarts
    /// under both.
    public enum RestartCondition: String, Hashable, Sendable, CustomStringConvertible {
        /// A non-zero exit status, or a kill by a signal other than the
        /// clean ones (`SIGHUP`, `SIGINT`, `SIGTERM`, `SIGPIPE`, as systemd
        /// counts them); a clean end stays ended.
        case onFailure = "on-failure"
        /// Every end, an exit with status 0 included.
        case always

        /// `on-failure` or `always`.
        public var description: String { rawValue }

        /// Whether `event` (an exit or a kill) restarts under this condition.
        /// - Parameter event: The child's last event.
        public func restarts(after event: Event) -> Bool {
            switch event {
            case .exited(let status): self == .always || status != 0
            case .killed(let signal): self == .always || !ProcessSource.cleanSignals.contains(signal)
            default: false
            }
        }
    }

    /// The signals whose kill counts as a clean end (`SIGHUP`, `SIGINT`,
    /// `SIGPIPE`, `SIGTERM` on Linux), as systemd's `Restart=on-failure` counts them.
    public static let cleanSignals: Set<Int32> = [LinuxSignal.hangup, LinuxSignal.interrupt, LinuxSignal.brokenPipe,
                                                  LinuxSignal.terminate]

    /// Which output stream a line came from.
    public enum Stream: String, Hashable, Sendable {
        /// Standard output.
        case stdout
        /// Standard error.
        case stderr
    }

    /// What a process subscription reports.
    public enum Event: Hashable, Sendable {
        /// The child was spawned with process id `pid`.
        case started(pid: Int32)
        /// One line of its output (a last line without a newline included).
        case output(Stream, String)
        /// An output line grew past `maxLineLength` and was skipped.
        case lineTooLong(Stream)
        /// The child exited with `status`.
        case exited(status: Int32)
        /// The child was killed by `signal`.
        case killed(signal: Int32)
        /// The child could not be spawned or watched.
        case failed(SourceFailure)
        /// The restart policy spawns child number `attempt` after `after`
        /// (after an `.exited`, a `.killed` or a `.failed`). Added with
        /// restart policies: an exhaustive `switch` needs this case.
        case restarting(attempt: Int, after: Duration)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
    /// The configuration's restart policy.
    public static func restartPolicy(_ configuration: Configuration) -> RestartPolicy { configuration.restart }
    /// `.restarting(attempt:after:)`.
    public static func restarting(attempt: Int, after: Duration) -> Event { .restarting(attempt: attempt, after: after) }
    /// An exit or a kill ends the child.
    public static func isEnd(_ event: Event) -> Bool {
        switch event {
        case .exited, .killed: true
        default: false
        }
    }
    /// An exit or a kill that `restartOn` restarts ends the attempt (a clean
    /// exit under `.onFailure` is delivered and the source stays exited).
    public static func isEnd(_ event: Event, configuration: Configuration) -> Bool {
        configuration.restartOn.restarts(after: event)
    }
    /// No event is a recovery (a child that starts, prints and fails backs off).
    public static func isRecovery(_ event: Event) -> Bool { false }
}

extension Subscription {
    /// A child process running `arguments` while the model wants it, keyed by `key`.
    ///
    /// - Parameters:
    ///   - arguments: the program (searched in `PATH` without a slash) and its arguments.
    ///   - environment: `NAME=value` strings; nil: this process's environment.
    ///   - directory: the working directory; nil: this process's.
    ///   - key: the subscription's identity (a new key is a new child).
    ///   - grace: the time between `SIGTERM` and `SIGKILL` when it is stopped.
    ///   - restart: whether an ended child is replaced by a new one, and
    ///     when (default `.never`: it stays ended until its subscription changes).
    ///   - restartOn: which ends restart (default `.onFailure`: not a clean exit).
    ///   - tag: makes a message of each event.
    @inlinable
    public static func process<Key: Hashable & Sendable>(
        _ arguments: [String], environment: [String]? = nil, directory: String? = nil, key: Key,
        grace: Duration = ProcessSource.defaultGrace, restart: RestartPolicy = .never,
        restartOn: ProcessSource.RestartCondition = .onFailure, _ tag: @escaping (ProcessSource.Event) -> Message
    ) -> Subscription {
        Subscription(ProcessSource.self, key: key,
                     configuration: .init(arguments: arguments, environment: environment, directory: directory, grace: grace,
                                          restart: restart, restartOn: restartOn),
                     tag: tag)
    }
}

/// Linux's numbers of the signals the pure core names (it cannot import
/// Glibc); the one place they are written. A driver-side test checks each
/// against Glibc's constant (`SignalNumbers`).
package enum LinuxSignal {
    /// `SIGHUP`.
    package static let hangup: Int32 = 1
    /// `SIGINT`.
    package static let interrupt: Int32 = 2
    /// `SIGPIPE`.
    package static let brokenPipe: Int32 = 13
    /// `SIGTERM`.
    package static let terminate: Int32 = 15
}
