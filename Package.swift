// swift-tools-version:6.0
import PackageDescription

let strict: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
]

let package = Package(
    name: "Reconcile",
    products: [
        .library(name: "Reconcile", targets: ["Reconcile"]),
        .library(name: "ReconcileTesting", targets: ["ReconcileTesting"]),
    ],
    targets: [
        .target(name: "Reconcile", swiftSettings: strict),
        .target(name: "ReconcileTesting", dependencies: ["Reconcile"], swiftSettings: strict),
        .testTarget(name: "ReconcileTests", dependencies: ["Reconcile", "ReconcileTesting"], swiftSettings: strict),
        .testTarget(name: "ReconcileTestingTests", dependencies: ["Reconcile", "ReconcileTesting"], swiftSettings: strict),
    ]
)
