import IndicatorCore
import Reconcile
import ReconcileTesting
import Testing

/// The indicator's command line: every option that takes a value, every
/// way of getting it wrong. A mistake is a `UsageError` (the command prints
/// it and exits 2), never a value taken from the next option.
@Suite struct ArgumentsTests {
    func parse(_ args: String...) -> Result<Arguments, UsageError> { parseArguments(args, directory: "/cwd") }

    func error(_ r: Result<Arguments, UsageError>) -> String? {
        if case .failure(let e) = r { return e.message }
        return nil
    }

    @Test func anOptionIsNeverTakenAsAnotherOptionsValue() {
        #expect(error(parse("--config", "--once")) == "--config needs a value (see --help)")
        for option in Arguments.valued {
            for next in Arguments.valued + Arguments.flags + ["-x", "--unknown"] {
                #expect(error(parseArguments([option, next], directory: "/cwd")) == "\(option) needs a value (see --help)",
                        "\(option) \(next)")
            }
            #expect(error(parseArguments([option], directory: "/cwd")) == "\(option) needs a value (see --help)")
            #expect(error(parseArguments([option, ""], directory: "/cwd")) == "\(option) needs a value (see --help)")
            #expect(error(parseArguments(["\(option)="], directory: "/cwd")) == "\(option) needs a value (see --help)")
        }
    }

    @Test func aValueStartingWithADashIsGivenWithEquals() throws {
        let a = try parse("--config=--once", "--include=-x", "--exclude", "veth*").get()
        #expect(a.config == "/cwd/--once")
        #expect(a.once == false)
        #expect(a.settings.connectivity.include == ["-x"])
        #expect(a.settings.connectivity.exclude == ["veth*"])
        #expect(error(parse("--once=yes")) == "--once takes no value (see --help)")
    }

    @Test func everyValuedOptionIsParsed() throws {
        let a = try parse("--format", "json", "--backend=kernel", "--include", "eth*", "--exclude", "docker*",
                          "--settle", "1.5s", "--config", "indicator.conf", "--once").get()
        #expect(a.action == .run && a.format == .json && a.once)
        #expect(a.settings.connectivity.backend == .kernel)
        #expect(a.settings.connectivity.include == ["eth*"] && a.settings.connectivity.exclude == ["docker*"])
        #expect(a.settings.connectivity.settle == .milliseconds(1500))
        #expect(a.config == "/cwd/indicator.conf")
        #expect(try parse("--config", "/etc/i.conf").get().config == "/etc/i.conf")
        #expect(try parse("--settle", "0").get().settings.connectivity.settle == nil)
        #expect(try parse("--help", "--bogus").get().action == .help)
        #expect(try parse("--version").get().action == .version)
    }

    @Test func badValuesNameTheOptionAndTheAcceptedValues() throws {
        #expect(error(parse("--format", "xml")) == "bad value 'xml' for --format (accepted: text, json, waybar)")
        #expect(error(parse("--backend", "wifi")) == "bad value 'wifi' for --backend (accepted: auto, kernel, networkd)")
        #expect(error(parse("--colour"))?.hasPrefix("unknown option '--colour'") == true)
        #expect(error(parse("--colour=yes"))?.hasPrefix("unknown option '--colour=yes'") == true)
        for absurd in ["3000000h", "25h", "1e300s", "inf", "nans", "soon", "86400.001s"] {
            #expect(error(parse("--settle", absurd))
                    == "bad value '\(absurd)' for --settle (accepted: a duration from 0 to 24h like 500ms, 2s, 1m)", "\(absurd)")
        }
        #expect(error(parse("--settle=-1s")) == "bad value '-1s' for --settle (accepted: a duration from 0 to 24h like 500ms, 2s, 1m)")
        #expect(try parse("--settle", "24h").get().settings.connectivity.settle == .seconds(86_400))
    }

    @Test func parseDurationIsBoundedForEveryMagnitude() {
        // Whatever the number, parsing neither traps nor exceeds the maximum.
        var exponent = -12
        while exponent <= 310 {
            for unit in ["ms", "s", "m", "h"] {
                let text = "1e\(exponent)\(unit)"
                if let d = parseDuration(text) {
                    #expect(d >= .zero && d <= Settings.maximumSettle, "\(text)")
                }
            }
            exponent += 1
        }
        #expect(parseDuration("3000000h") == nil)
        #expect(parseDuration("1h") == .seconds(3600))
        #expect(parseDuration("90m", maximum: .seconds(Int64.max)) == .seconds(5400))
        #expect(parseDuration("3000000h", maximum: .seconds(Int64.max)) == .seconds(10_800_000_000))
        #expect(parseDuration("1e300h", maximum: .seconds(Int64.max)) == nil)
    }

    @Test func absurdSettleInTheConfigFileIsAConfigErrorAndKeepsTheOldSettings() {
        let path = "/etc/indicator.conf"
        var t = ProgramTester(Indicator(format: .json, configPath: path))
        t.send(.configRead(path: path, contents: "settle = 2s\n"))
        t.send(.configRead(path: path, contents: "settle = 3000000h\n"))
        #expect(t.commands.last == .log("config \(path): line 1: bad settle '3000000h' (a duration from 0 to 24h: 500ms, 2s, 1m, or 0): keeping the last good configuration"))
        #expect(t.model.settings.connectivity.settle == .seconds(2))
    }

    @Test func unreadableConfigIsReportedWithItsReasonAndKeepsTheOldSettings() {
        let path = "/etc/indicator.conf"
        var t = ProgramTester(Indicator(format: .json, configPath: path))
        t.send(.configRead(path: path, contents: "backend = kernel\n"))
        t.send(.configUnreadable(path: path, reason: "not a regular file (a FIFO)"))
        #expect(t.commands.last == .log("config \(path) cannot be read: not a regular file (a FIFO): keeping the last good configuration"))
        #expect(t.model.settings.connectivity.backend == .kernel)
        #expect(t.model.configProblem == "\(path): not a regular file (a FIFO)")
    }
}
