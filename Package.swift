// swift-tools-version:6.0
import PackageDescription

import Foundation

/// `RECONCILE_CHECK_INVARIANTS=1 swift build` compiles the reconciler's
/// invariant checks in (`make check-invariants`); off by default.
let checks: [SwiftSetting] = ProcessInfo.processInfo.environment["RECONCILE_CHECK_INVARIANTS"] == "1"
    ? [.define("RECONCILE_CHECK_INVARIANTS")] : []

let strict: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
]

let package = Package(
    name: "Reconcile",
    products: [
        .library(name: "Reconcile", targets: ["Reconcile"]),
        .library(name: "ReconcileTesting", targets: ["ReconcileTesting"]),
        .library(name: "ReconcileSystemd", targets: ["ReconcileSystemd"]),
        .library(name: "ReconcileTranscript", targets: ["ReconcileTranscript"]),
        .library(name: "ReconcileReplay", targets: ["ReconcileReplay"]),
        .executable(name: "echod", targets: ["echod"]),
    ],
    targets: [
        .target(name: "Reconcile", swiftSettings: strict + checks),
        // The Swift Testing helpers; re-exports ReconcileReplay.
        .target(name: "ReconcileTesting", dependencies: ["Reconcile", "ReconcileReplay"], swiftSettings: strict),
        // The virtual driver, transcript reading and replay, without Swift
        // Testing: what a shipped binary's `--replay` needs.
        .target(name: "ReconcileReplay", dependencies: ["Reconcile", "ReconcileTranscript"], swiftSettings: strict),
        // Transcripts as JSON Lines: the encoder the recorder and replay share.
        .target(name: "ReconcileTranscript", dependencies: ["Reconcile"], swiftSettings: strict),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        .target(name: "ReconcileSystemd", dependencies: ["Reconcile", "CSystemd", "ReconcileTranscript"], swiftSettings: strict),
        // A small daemon the driver tests run as a child process (signals,
        // sd_notify, the watchdog and shutdown are process-wide).
        .executableTarget(name: "reconcile-probe", dependencies: ["Reconcile", "ReconcileSystemd", "CSystemd"],
                          path: "Tests/Probe", swiftSettings: strict),
        // The same, with an `async` main (Daemon.run() async, DaemonService).
        .executableTarget(name: "reconcile-async-probe", dependencies: ["Reconcile", "ReconcileSystemd"],
                          path: "Tests/AsyncProbe", swiftSettings: strict),
        // The benchmark harness (`make bench`) and the malloc-counting shim
        // only it links.
        .target(name: "CMallocCounter", path: "Benchmarks/CMallocCounter"),
        .executableTarget(name: "reconcile-bench",
                          dependencies: ["Reconcile", "ReconcileTesting", "ReconcileSystemd", "ReconcileTranscript", "CSystemd", "CMallocCounter"],
                          path: "Benchmarks/reconcile-bench", swiftSettings: strict),
        // The line-echo example daemon (Docs/IO.md): socket activation,
        // connections and child processes.
        .executableTarget(name: "echod", dependencies: ["Reconcile", "ReconcileSystemd"],
                          path: "Examples/echod", swiftSettings: strict),
        // What the test targets share (one seeded generator).
        .target(name: "TestSupport", path: "Tests/Support", swiftSettings: strict),
        .testTarget(name: "ReconcileSystemdTests", dependencies: ["Reconcile", "ReconcileSystemd", "CSystemd", "IndicatorCore", "ReconcileTesting", "TestSupport"],
                    swiftSettings: strict),
        // The connectivity indicator: its pure program (tested with the
        // virtual driver) and the executable that runs it.
        .target(name: "IndicatorCore", dependencies: ["Reconcile", "ReconcileTranscript"], swiftSettings: strict),
        .executableTarget(name: "connectivity-indicator", dependencies: ["IndicatorCore", "Reconcile", "ReconcileSystemd", "ReconcileReplay"],
                          swiftSettings: strict),
        .testTarget(name: "IndicatorTests", dependencies: ["IndicatorCore", "Reconcile", "ReconcileTesting"],
                    exclude: ["Transcripts"], swiftSettings: strict),
        .testTarget(name: "ReconcileTests", dependencies: ["Reconcile", "ReconcileTesting", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "ReconcileTestingTests", dependencies: ["Reconcile", "ReconcileTesting", "ReconcileTranscript", "TestSupport"], swiftSettings: strict),
    ]
)
