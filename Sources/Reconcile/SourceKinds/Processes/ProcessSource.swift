/// A child process that runs while the model wants it.
///
/// The driver spawns it with standard input on `/dev/null`, standard output
/// and error on pipes read line by line, and no other descriptor; default
/// signal handling and an empty signal mask. Its exit is reported after its
/// last output line. Stopping the subscription sends `SIGTERM`, then
/// `SIGKILL` after `grace`, and reaps the child: none is left a zombie, and
/// none outlives the driver.
public enum ProcessSource: Source {
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

        /// A child running `arguments`.
        public init(arguments: [String], environment: [String]? = nil, directory: String? = nil,
                    grace: Duration = ProcessSource.defaultGrace,
                    maxLineLength: Int = DescriptorSource.defaultMaxLineLength) {
            self.arguments = arguments
            self.environment = environment
            self.directory = directory
            self.grace = grace
            self.maxLineLength = maxLineLength
        }

        /// `/bin/sh -c 'exit 3'`, as plans show it.
        public var description: String {
            arguments.map { $0.contains(" ") || $0.isEmpty ? "'\($0)'" : $0 }.joined(separator: " ")
        }
    }

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
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
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
    ///   - tag: makes a message of each event.
    public static func process<Key: Hashable & Sendable>(
        _ arguments: [String], environment: [String]? = nil, directory: String? = nil, key: Key,
        grace: Duration = ProcessSource.defaultGrace, _ tag: @escaping (ProcessSource.Event) -> Message
    ) -> Subscription {
        Subscription(ProcessSource.self, key: key,
                     configuration: .init(arguments: arguments, environment: environment, directory: directory, grace: grace),
                     tag: tag)
    }
}
