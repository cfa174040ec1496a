import ReconcileTranscript
import Glibc

/// One result: benchmark × implementation × size × churn.
struct Record {
    var benchmark: String
    var implementation: String
    var size: Int
    /// Percent of identities replaced (or of parameters changed) per
    /// reconcile; nil where it does not apply.
    var churn: Int?
    /// What one timed unit is ("reconcile", "message", "start+stop").
    var unit: String
    var runs: Int
    var medianNanos: Double
    var p99Nanos: Double
    /// Whether median / size means something (per subscription).
    var perSubscription = true
    var driverCalls: Double?
    var allocations: Double?
    var bytesPerSubscription: Double?
    /// Further named figures (ratios, messages per second, phases).
    var extra: [(String, Double)] = []
    /// How the inputs were made, where it varies (`fresh`: equal sets built
    /// anew; `same`: the very set that started the sources).
    var variant: String?
    /// The least and greatest median of one repetition.
    var rangeMin: Double?
    var rangeMax: Double?

    var medianPerSubscription: Double? { perSubscription && size > 0 ? medianNanos / Double(size) : nil }
    var p99PerSubscription: Double? { perSubscription && size > 0 ? p99Nanos / Double(size) : nil }

    func extra(_ name: String) -> Double? { extra.first { $0.0 == name }?.1 }
}

// MARK: Number formatting (no Foundation)

/// `value` with `decimals` digits after the point.
func fixed(_ value: Double, _ decimals: Int) -> String {
    guard value.isFinite else { return "n/a" }
    var scale = 1.0
    for _ in 0..<decimals { scale *= 10 }
    let scaled = (abs(value) * scale).rounded()
    let whole = Int64(scaled / scale)
    let fraction = Int64(scaled - Double(whole) * scale)
    var s = (value < 0 && scaled != 0 ? "-" : "") + String(whole)
    if decimals > 0 {
        let f = String(fraction)
        s += "." + String(repeating: "0", count: decimals - f.count) + f
    }
    return s
}

/// Three significant digits.
func significant(_ value: Double) -> String {
    guard value.isFinite else { return "n/a" }
    let a = abs(value)
    if a >= 100 || a == 0 { return fixed(value, 0) }
    if a >= 10 { return fixed(value, 1) }
    if a >= 1 { return fixed(value, 2) }
    return fixed(value, 3)
}

/// A duration given in nanoseconds, in a readable unit.
func duration(_ nanos: Double) -> String {
    guard nanos.isFinite else { return "n/a" }
    if nanos < 1_000 { return significant(nanos) + " ns" }
    if nanos < 1_000_000 { return significant(nanos / 1_000) + " µs" }
    if nanos < 1_000_000_000 { return significant(nanos / 1_000_000) + " ms" }
    return significant(nanos / 1_000_000_000) + " s"
}

/// `n` with thousands separators.
func grouped(_ n: Int) -> String {
    let digits = String(n)
    var out = ""
    for (i, c) in digits.enumerated() {
        if i > 0 && (digits.count - i) % 3 == 0 { out += "," }
        out.append(c)
    }
    return out
}

// MARK: Tables

/// Prints a markdown table.
func printTable(_ header: [String], _ rows: [[String]]) {
    print("| " + header.joined(separator: " | ") + " |")
    print("|" + header.map { _ in "---:" }.joined(separator: "|") + "|")
    for r in rows { print("| " + r.joined(separator: " | ") + " |") }
    print("")
}

/// The full table of one benchmark: one row per record, with its ratio to
/// ours for the same size and churn.
func printRecords(_ title: String, _ records: [Record], reference: String = Implementation.ours.rawValue) {
    guard !records.isEmpty else { return }
    print("### \(title)\n")
    let rows = records.map { r -> [String] in
        let ours = records.first { $0.implementation == reference && $0.size == r.size && $0.churn == r.churn && $0.variant == r.variant }
        return [
            r.implementation + (r.variant.map { " (\($0))" } ?? ""),
            grouped(r.size),
            r.churn.map { "\($0)%" } ?? "—",
            duration(r.medianNanos),
            range(r),
            duration(r.p99Nanos),
            r.medianPerSubscription.map { significant($0) + " ns" } ?? "—",
            r.driverCalls.map { significant($0) } ?? "—",
            r.allocations.map { significant($0) } ?? "—",
            ours.map { significant(r.medianNanos / $0.medianNanos) + "×" } ?? "—",
        ]
    }
    let unit = records[0].unit
    printTable(["implementation", "size", "churn", "median/\(unit)", "range", "p99/\(unit)", "median/sub",
                "driver calls/\(unit)", "allocs/\(unit)", "× ours"], rows)
}

/// The range of repetition medians, `a–b`.
func range(_ r: Record) -> String {
    guard let lo = r.rangeMin, let hi = r.rangeMax, lo.isFinite, hi.isFinite else { return "—" }
    return duration(lo) + "–" + duration(hi)
}

/// The side-by-side view: one row per size and churn, one column per
/// implementation (median per reconcile, and its ratio to ours).
func printSideBySide(_ title: String, _ records: [Record]) {
    guard !records.isEmpty else { return }
    print("### \(title): median per reconcile, side by side (× ours)\n")
    var implementations: [String] = []
    for r in records where !implementations.contains(r.implementation) { implementations.append(r.implementation) }
    var keys: [String] = []
    var rows: [[String]] = []
    for r in records {
        let key = "\(r.size)/\(r.churn ?? -1)/\(r.variant ?? "")"
        if keys.contains(key) { continue }
        keys.append(key)
        let ours = records.first { $0.implementation == Implementation.ours.rawValue && $0.size == r.size && $0.churn == r.churn && $0.variant == r.variant }
        var row = [grouped(r.size), r.churn.map { "\($0)%" } ?? "—", r.variant ?? "—"]
        for i in implementations {
            if let x = records.first(where: { $0.implementation == i && $0.size == r.size && $0.churn == r.churn && $0.variant == r.variant }) {
                let ratio = ours.map { " (" + significant(x.medianNanos / $0.medianNanos) + "×)" } ?? ""
                row.append(duration(x.medianNanos) + (i == Implementation.ours.rawValue ? "" : ratio))
            } else {
                row.append("—")
            }
        }
        rows.append(row)
    }
    printTable(["size", "churn", "sets"] + implementations, rows)
}

// MARK: JSON

private func jsonString(_ s: String) -> String { JSONOutput.quoted(s) }

private func jsonNumber(_ v: Double?) -> String {
    guard let v, v.isFinite else { return "null" }
    return fixed(v, 3)
}

/// The records as a JSON document: `{"machine": ..., "records": [...]}`.
func json(_ records: [Record], context: [(String, String)]) -> String {
    var out = "{\n"
    for (k, v) in context { out += "  \(jsonString(k)): \(jsonString(v)),\n" }
    out += "  \"records\": [\n"
    for (n, r) in records.enumerated() {
        var fields: [(String, String)] = [
            ("benchmark", jsonString(r.benchmark)),
            ("implementation", jsonString(r.implementation)),
            ("size", String(r.size)),
            ("churn_percent", r.churn.map(String.init) ?? "null"),
            ("unit", jsonString(r.unit)),
            ("runs", String(r.runs)),
            ("median_ns", jsonNumber(r.medianNanos)),
            ("p99_ns", jsonNumber(r.p99Nanos)),
            ("median_ns_per_subscription", jsonNumber(r.medianPerSubscription)),
            ("p99_ns_per_subscription", jsonNumber(r.p99PerSubscription)),
            ("driver_calls_per_unit", jsonNumber(r.driverCalls)),
            ("allocations_per_unit", jsonNumber(r.allocations)),
            ("bytes_per_subscription", jsonNumber(r.bytesPerSubscription)),
            ("variant", r.variant.map(jsonString) ?? "null"),
            ("range_min_ns", jsonNumber(r.rangeMin)),
            ("range_max_ns", jsonNumber(r.rangeMax)),
        ]
        for (k, v) in r.extra { fields.append((k, jsonNumber(v))) }
        out += "    {" + fields.map { "\(jsonString($0.0)): \($0.1)" }.joined(separator: ", ") + "}"
        out += n == records.count - 1 ? "\n" : ",\n"
    }
    out += "  ]\n}\n"
    return out
}

/// Writes `text` to `path`; false on failure.
func writeFile(_ path: String, _ text: String) -> Bool {
    guard let f = fopen(path, "w") else { return false }
    defer { fclose(f) }
    var bytes = Array(text.utf8)
    return fwrite(&bytes, 1, bytes.count, f) == bytes.count
}
