import Glibc

/// An SVG plot of the `reconcile` benchmark: median cost per reconcile
/// against desired-set size, log-log, one line per implementation, one
/// panel per churn level (0 % and 10 % by default). No Foundation: the SVG
/// is written by hand.
func reconcilePlot(_ records: [Record], churns: [Int] = [0, 10], title: String) -> String? {
    let panels = churns.map { c in (c, records.filter { $0.benchmark == "reconcile" && $0.churn == c && $0.medianNanos > 0 }) }
        .filter { !$0.1.isEmpty }
    guard !panels.isEmpty else { return nil }
    let all = panels.flatMap(\.1)
    var implementations: [String] = []
    for r in all where !implementations.contains(r.implementation) { implementations.append(r.implementation) }

    // Axes: whole decades around the data.
    let xs = all.map { log10(Double($0.size)) }, ys = all.map { log10($0.medianNanos) }
    let x0 = xs.min()!.rounded(.down), x1 = max(xs.max()!.rounded(.up), x0 + 1)
    let y0 = ys.min()!.rounded(.down), y1 = max(ys.max()!.rounded(.up), y0 + 1)

    let panelWidth = 380.0, panelHeight = 300.0
    let left = 80.0, top = 56.0, gap = 60.0, legendHeight = 30.0
    let width = left + Double(panels.count) * panelWidth + Double(panels.count - 1) * gap + 40
    let height = top + panelHeight + 56 + legendHeight
    let colors: [String: String] = [
        "ours": "#d62728", "plan": "#ff9896", "restart-all": "#1f77b4", "elmish": "#2ca02c", "iced": "#9467bd", "bare": "#7f7f7f",
    ]
    let fallback = ["#8c564b", "#e377c2", "#bcbd22", "#17becf"]
    func color(_ i: String) -> String {
        colors[i] ?? fallback[(implementations.firstIndex(of: i) ?? 0) % fallback.count]
    }
    func f(_ v: Double) -> String { fixed(v, 1) }

    var svg = """
    <svg xmlns="http://www.w3.org/2000/svg" width="\(f(width))" height="\(f(height))" viewBox="0 0 \(f(width)) \(f(height))" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">
    <rect width="100%" height="100%" fill="white"/>
    <text x="\(f(width / 2))" y="24" text-anchor="middle" font-size="15" font-weight="bold">\(escape(title))</text>

    """
    for (n, panel) in panels.enumerated() {
        let (churn, rs) = panel
        let px = left + Double(n) * (panelWidth + gap)
        func X(_ size: Int) -> Double { px + (log10(Double(size)) - x0) / (x1 - x0) * panelWidth }
        func Y(_ nanos: Double) -> Double { top + panelHeight - (log10(nanos) - y0) / (y1 - y0) * panelHeight }
        svg += "<g>\n"
        svg += "<text x=\"\(f(px + panelWidth / 2))\" y=\"\(f(top - 10))\" text-anchor=\"middle\" font-size=\"13\">churn \(churn) %</text>\n"
        // Grid and ticks: decades, with 2× and 5× minor lines.
        var d = y0
        while d <= y1 {
            let y = top + panelHeight - (d - y0) / (y1 - y0) * panelHeight
            svg += "<line x1=\"\(f(px))\" y1=\"\(f(y))\" x2=\"\(f(px + panelWidth))\" y2=\"\(f(y))\" stroke=\"#ccc\"/>\n"
            svg += "<text x=\"\(f(px - 6))\" y=\"\(f(y + 4))\" text-anchor=\"end\">\(decade(Int(d)))</text>\n"
            if d < y1 {
                for m in [2.0, 5.0] {
                    let ym = top + panelHeight - (d + log10(m) - y0) / (y1 - y0) * panelHeight
                    svg += "<line x1=\"\(f(px))\" y1=\"\(f(ym))\" x2=\"\(f(px + panelWidth))\" y2=\"\(f(ym))\" stroke=\"#eee\"/>\n"
                }
            }
            d += 1
        }
        d = x0
        while d <= x1 {
            let x = px + (d - x0) / (x1 - x0) * panelWidth
            svg += "<line x1=\"\(f(x))\" y1=\"\(f(top))\" x2=\"\(f(x))\" y2=\"\(f(top + panelHeight))\" stroke=\"#ccc\"/>\n"
            svg += "<text x=\"\(f(x))\" y=\"\(f(top + panelHeight + 18))\" text-anchor=\"middle\">\(grouped(Int(pow(10, d).rounded())))</text>\n"
            d += 1
        }
        svg += "<rect x=\"\(f(px))\" y=\"\(f(top))\" width=\"\(f(panelWidth))\" height=\"\(f(panelHeight))\" fill=\"none\" stroke=\"#333\"/>\n"
        svg += "<text x=\"\(f(px + panelWidth / 2))\" y=\"\(f(top + panelHeight + 38))\" text-anchor=\"middle\">desired subscriptions</text>\n"
        if n == 0 {
            let cy = top + panelHeight / 2
            svg += "<text x=\"18\" y=\"\(f(cy))\" text-anchor=\"middle\" transform=\"rotate(-90 18 \(f(cy)))\">median time per reconcile</text>\n"
        }
        // One line per implementation, ours drawn last (on top).
        for i in implementations.filter({ $0 != "ours" }) + ["ours"] {
            let points = rs.filter { $0.implementation == i }.sorted { $0.size < $1.size }
            guard !points.isEmpty else { continue }
            let c = color(i), w = i == "ours" ? "3" : "1.8"
            let path = points.map { "\(f(X($0.size))),\(f(Y($0.medianNanos)))" }.joined(separator: " ")
            svg += "<polyline points=\"\(path)\" fill=\"none\" stroke=\"\(c)\" stroke-width=\"\(w)\"/>\n"
            for p in points {
                svg += "<circle cx=\"\(f(X(p.size)))\" cy=\"\(f(Y(p.medianNanos)))\" r=\"3\" fill=\"\(c)\"><title>\(escape(i)): \(grouped(p.size)), \(escape(duration(p.medianNanos)))</title></circle>\n"
            }
        }
        svg += "</g>\n"
    }
    // Legend, one row under the panels.
    var lx = left
    let ly = height - legendHeight / 2 - 4
    for i in implementations {
        svg += "<line x1=\"\(f(lx))\" y1=\"\(f(ly))\" x2=\"\(f(lx + 22))\" y2=\"\(f(ly))\" stroke=\"\(color(i))\" stroke-width=\"\(i == "ours" ? "3" : "1.8")\"/>\n"
        svg += "<text x=\"\(f(lx + 28))\" y=\"\(f(ly + 4))\">\(escape(i))</text>\n"
        lx += 40 + Double(i.count) * 7.5
    }
    svg += "</svg>\n"
    return svg
}

private func escape(_ s: String) -> String {
    var out = ""
    for c in s {
        switch c {
        case "&": out += "&amp;"
        case "<": out += "&lt;"
        case ">": out += "&gt;"
        case "\"": out += "&quot;"
        default: out.append(c)
        }
    }
    return out
}

/// `10^exponent` nanoseconds as a tick label: `1 µs`, `10 µs`, `100 ms`.
private func decade(_ exponent: Int) -> String {
    let units = ["ns", "µs", "ms", "s"]
    let unit = min(max(exponent, 0) / 3, units.count - 1)
    var value = 1
    for _ in 0..<(exponent - unit * 3) { value *= 10 }
    return "\(grouped(value)) \(units[unit])"
}
