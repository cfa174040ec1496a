/// How a name is asked for (`RequestName`'s flags).
public struct BusNameFlags: OptionSet, Hashable, Sendable {
    /// The flags' bits (this type's own, mapped to the bus's by the driver).
    public let rawValue: UInt32
    /// A flag set from its bits.
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// Another connection asking with `.replaceExisting` may take the name from us.
    public static let allowReplacement = BusNameFlags(rawValue: 1)
    /// Take the name from an owner that allows replacement.
    public static let replaceExisting = BusNameFlags(rawValue: 2)
    /// Wait in the name's queue when it is owned (and when replaced);
    /// without it a taken name is a failure and a replaced one is gone.
    public static let queue = BusNameFlags(rawValue: 4)
}

/// A well-known name this program owns while the model wants it: requested
/// when the subscription starts (and again after a reconnect), released
/// when it stops and at shutdown.
public enum BusOwnedNameSource: Source {
    /// `bus-owned-name`.
    public static let name = "bus-owned-name"

    /// A name to own.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The bus.
        public var bus: BusAddress
        /// The well-known name (`org.reconcile.Connectivity1`).
        public var name: String
        /// How it is asked for.
        public var flags: BusNameFlags

        /// Own `name` on `bus`, asked for with `flags`.
        public init(bus: BusAddress, name: String, flags: BusNameFlags = []) {
            self.bus = bus
            self.name = name
            self.flags = flags
        }

        /// `bus name`.
        public var description: String { "\(bus) \(name)" + (flags.isEmpty ? "" : " flags \(flags.rawValue)") }
    }

    /// Why a name is not (or no longer) ours.
    public enum Loss: Hashable, Sendable {
        /// Another connection took it (we allowed replacement); with
        /// `.queue` we wait in its queue, else we are out of it.
        case replaced
        /// It is owned; we wait in its queue (`.queue`).
        case queued
    }

    /// What an owned name reports.
    public enum Event: Hashable, Sendable {
        /// We are the primary owner.
        case acquired
        /// We are not (any more): replaced, or waiting in the queue.
        case lost(Loss)
        /// The name is owned by another connection that does not allow
        /// replacement (and we did not ask to queue), the bus refused the
        /// request, or the bus is missing or lost (the name is asked for
        /// again after a reconnect).
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }
}

/// Peers (unique names) a program follows: an event when one of them
/// leaves the bus, so the program can release what that client held.
/// Built on NameOwnerChanged for each unique name, not `sd_bus_track`
/// (see Docs/Bus.md).
public enum BusPeersSource: Source {
    /// `bus-peers`.
    public static let name = "bus-peers"

    /// The peers followed.
    public struct Configuration: Hashable, Sendable, CustomStringConvertible {
        /// The bus.
        public var bus: BusAddress
        /// The peers' unique names (`:1.42`).
        public var peers: Set<String>

        /// Follow `peers` on `bus`.
        public init(bus: BusAddress, peers: Set<String>) {
            self.bus = bus
            self.peers = peers
        }

        /// `bus n peers`.
        public var description: String { "\(bus) \(peers.count) peers" }
    }

    /// What peer tracking reports.
    public enum Event: Hashable, Sendable {
        /// The peer is not (or no longer) on the bus. Reported once per
        /// peer while it is in the set.
        case left(String)
        /// The bus is missing or lost: every peer of that connection is gone.
        case failed(SourceFailure)
    }

    /// `.failed(failure)`.
    public static func failed(_ failure: SourceFailure) -> Event { .failed(failure) }

    /// A new set of peers on the same bus changes in place.
    public static func canRetune(from old: Configuration, to new: Configuration) -> Bool { old.bus == new.bus }
}

extension Subscription {
    /// Owns `name` on `bus` while the model wants it (released when the
    /// subscription goes and at shutdown).
    /// - Parameters:
    ///   - bus: The bus.
    ///   - name: The well-known name.
    ///   - flags: How it is asked for.
    ///   - tag: Maps `.acquired`, `.lost`, `.failed` to messages.
    @inlinable
    public static func ownName(bus: BusAddress, name: String, flags: BusNameFlags = [],
                               _ tag: @escaping (BusOwnedNameSource.Event) -> Message) -> Subscription {
        let c = BusOwnedNameSource.Configuration(bus: bus, name: name, flags: flags)
        return Subscription(BusOwnedNameSource.self, key: c, configuration: c, tag: tag)
    }

    /// Follows `peers` on `bus` (keyed by `key`: a new set retunes).
    /// - Parameters:
    ///   - bus: The bus.
    ///   - peers: The peers' unique names.
    ///   - key: The subscription's key.
    ///   - tag: Maps `.left` and `.failed` to messages.
    @inlinable
    public static func trackPeers<Key: Hashable & Sendable>(bus: BusAddress, peers: Set<String>, key: Key,
                                                            _ tag: @escaping (BusPeersSource.Event) -> Message) -> Subscription {
        Subscription(BusPeersSource.self, key: key, configuration: BusPeersSource.Configuration(bus: bus, peers: peers), tag: tag)
    }
}
