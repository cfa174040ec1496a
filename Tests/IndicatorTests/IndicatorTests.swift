import Foundation
import IndicatorCore
import Reconcile
import ReconcileTesting
import Testing

let net = SubscriptionID(ConnectivitySource.self, key: "net")
let since = SubscriptionID(TimerSource.self, key: "since")
let sleep = SubscriptionID(BusSignalSource.self, key: "sleep")

func online(_ name: String = "eth0", at: Int64 = 1_000_000) -> ConnectivitySource.Event {
    .online(via: name, at: at)
}

@Suite struct IndicatorTests {
    @Test func relativeTimeTimerExistsOnlyWhenTheTextViewNeedsIt() {
        var t = ProgramTester(Indicator(format: .text))
        #expect(t.subscriptionIDs == [net])
        t.event(online(), from: net)
        #expect(t.subscriptionIDs == [net, since])
        var json = ProgramTester(Indicator(format: .json))
        json.event(online(), from: net)
        #expect(json.subscriptionIDs == [net])
    }

    @Test func presentationChangeRetunesNothingAndKeepsConnectivity() {
        let path = "/etc/indicator.conf"
        var t = ProgramTester(Indicator(format: .text, configPath: path))
        #expect(t.commands == [.readConfig(path)])
        t.send(.configRead(path: path, contents: ""))
        t.event(online(), from: net)
        t.send(.configRead(path: path, contents: "show_since = no\n"))
        // The timer goes; the connectivity source is kept (no driver call),
        // and the config watch (SIGHUP is the daemon's reload now).
        #expect(t.lastPlan.steps.map(\.description) == ["stop timer:since"])
        #expect(t.lastPlan.kept == 2)
        // A settle change is a retune in place, not a restart.
        t.send(.configRead(path: path, contents: "show_since = no\nsettle = 2s\n"))
        #expect(t.lastPlan.steps.map(\.description) == ["retune connectivity:net: backend auto -> backend auto settle 2s"])
    }

    @Test func connectivityEventFromAnOldPhaseIsRejected() {
        let path = "/etc/indicator.conf"
        var t = ProgramTester(Indicator(format: .json, configPath: path))
        t.send(.configRead(path: path, contents: ""))
        let old = t.model.phase
        let tagged = t.message(for: online("old0"), from: net)!
        t.send(.configRead(path: path, contents: "backend = kernel\n"))
        #expect(t.lastPlan.steps.map(\.description) == ["restart connectivity:net: backend auto -> backend kernel"])
        #expect(t.model.phase != old)
        let before = t.model
        t.send(tagged)
        #expect(t.model.latest == nil && t.model.rejected == before.rejected + 1)
    }

    @Test func invalidConfigKeepsTheLastGoodOneAndNamesTheLine() {
        let path = "/etc/indicator.conf"
        var t = ProgramTester(Indicator(configPath: path))
        t.send(.configRead(path: path, contents: "include = eth*\n"))
        let good = t.model.settings
        t.send(.configRead(path: path, contents: "include = wl*\n# fine\ncolour = yes\n"))
        #expect(t.model.settings == good)
        #expect(t.commands == [.log("config /etc/indicator.conf: line 3: unknown key 'colour' (accepted: backend, include, exclude, settle, show_since, color): keeping the last good configuration")])
        t.send(.configChanged(.deleted))
        #expect(t.model.settings == good)
        // A change is read after a quiet moment (debounce): only the last
        // of a burst of changes reads the file.
        t.send(.configChanged(.created))
        #expect(t.commands.isEmpty)
        let firstQuiet = t.model.configPhase
        t.send(.configChanged(.modified))
        t.send(.configQuiet(firstQuiet))
        #expect(t.commands.isEmpty)
        t.send(.configQuiet(t.model.configPhase))
        #expect(t.commands == [.readConfig(path)])
        // SIGHUP during that read: read again once it is back.
        t.send(.reload)
        #expect(t.commands.isEmpty)
        t.send(.configRead(path: path, contents: "include = eth*\n"))
        #expect(t.commands == [.readConfig(path)])
    }

    @Test func connectivityWaitsForTheFirstConfigReadSoTheFirstReportUsesTheFile() {
        let path = "/etc/indicator.conf"
        var t = ProgramTester(Indicator(format: .json, configPath: path, once: true))
        // No connectivity source until the file is read: `--once` cannot
        // give a verdict under the command-line settings.
        #expect(!t.subscriptionIDs.contains(net))
        t.send(.configRead(path: path, contents: "exclude = eth0\n"))
        #expect(t.subscriptionIDs.contains(net))
        #expect(t.lastPlan.steps.map(\.description).contains { $0.hasPrefix("start connectivity:net:") && $0.contains("eth0") })
        // The wait's timer goes with it; a late `.configWaitOver` does nothing.
        #expect(t.lastPlan.steps.map(\.description).contains("stop timer:config-wait"))
        #expect(t.send(.configWaitOver).isEmpty)
        // An unreadable file ends the wait the same way; a change or SIGHUP
        // during the wait does not end it.
        var u = ProgramTester(Indicator(format: .json, configPath: path))
        u.send(.configChanged(.exists))
        u.send(.reload)
        #expect(!u.subscriptionIDs.contains(net))
        u.send(.configUnreadable(path: path, reason: "not a regular file (a FIFO)"))
        #expect(u.subscriptionIDs.contains(net))
        #expect(u.commands.last == .readConfig(path))   // the SIGHUP's read, now
    }

    @Test func aConfigReadThatHangsHoldsConnectivityBackForTwoSecondsAtMost() throws {
        let driver = VirtualDriver()
        var commands: [Indicator.Command] = []
        let path = "/mnt/hung/indicator.conf"
        let rt = Runtime(Indicator(format: .json, configPath: path), driver: driver) { c, _ in commands.append(c) }
        try rt.start()
        #expect(driver.runningIDs.contains(net) == false)
        driver.advance(by: Indicator.configWaitLimit - .milliseconds(1))
        #expect(driver.runningIDs.contains(net) == false)
        driver.advance(by: .milliseconds(1))
        #expect(driver.runningIDs.contains(net))
        #expect(commands.last == .log("config /mnt/hung/indicator.conf not read yet: starting with the command-line settings; the file is applied when read"))
        // The read comes back at last: applied (a new backend restarts the source).
        try rt.send(.configRead(path: path, contents: "backend = kernel\n"))
        driver.runUntilIdle()
        #expect(rt.model.settings.connectivity.backend == .kernel)
        #expect(rt.lastPlan.steps.map(\.description) == ["restart connectivity:net: backend auto -> backend kernel"])
    }

    @Test func readsRunOneAtATimeSoTheirAnswersCannotCrossAndNoRequestIsLost() {
        let path = "/etc/indicator.conf"
        var t = ProgramTester(Indicator(configPath: path))
        #expect(t.commands == [.readConfig(path)])
        #expect(t.model.configReading)
        // Requests while the first read is out: one more read, after it.
        t.send(.reload)
        t.send(.reload)
        #expect(t.commands.isEmpty)
        t.send(.configRead(path: path, contents: "settle = 1s\n"))
        #expect(t.commands == [.log("config /etc/indicator.conf applied"), .readConfig(path)])
        // The second read's answer: nothing more is asked for.
        t.send(.configRead(path: path, contents: "settle = 2s\n"))
        #expect(t.commands == [.log("config /etc/indicator.conf applied")])
        #expect(!t.model.configReading && !t.model.configRereadWanted)
        #expect(t.model.settings.connectivity.settle == .seconds(2))
        // An unreadable answer ends a read the same way.
        t.send(.reload)
        t.send(.reload)
        t.send(.configUnreadable(path: path, reason: "not a regular file (a FIFO)"))
        #expect(t.commands.last == .readConfig(path))
        #expect(t.model.configReading && !t.model.configRereadWanted)
    }

    @Test func configChangesAreDebouncedOnTheVirtualClock() throws {
        let driver = VirtualDriver()
        var commands: [Indicator.Command] = []
        let path = "/etc/indicator.conf"
        let rt = Runtime(Indicator(format: .json, configPath: path), driver: driver) { c, _ in commands.append(c) }
        try rt.start()
        // The read at start comes back (reads go one at a time).
        try rt.send(.configRead(path: path, contents: ""))
        driver.runUntilIdle()
        commands = []
        let watch = try #require(driver.subscription(FileWatchSource.self, key: path))
        driver.emit(.modified, to: watch)
        driver.advance(by: .milliseconds(50))
        #expect(driver.debounce("config") != nil)
        driver.emit(.modified, to: watch)
        driver.advance(by: .milliseconds(99))
        #expect(commands.isEmpty)
        driver.advance(by: .milliseconds(1))
        #expect(commands == [.readConfig(path)])
    }

    @Test func onceExitsWithTheVerdict() {
        var t = ProgramTester(Indicator(format: .text, once: true))
        #expect(t.subscriptionIDs == [net])
        t.event(online(), from: net)
        #expect(t.commands == [.exit(0)])
    }

    @Test func runsUnderTheRuntimeWithTheVirtualDriver() throws {
        let driver = VirtualDriver()
        let rt = Runtime(Indicator(format: .text), driver: driver)
        try rt.start()
        driver.emit(online("wlan0"), to: net)
        #expect(rt.program.status(rt.model) == "online via wlan0")
        driver.advance(by: .seconds(120))
        #expect(rt.model.minutes == 2)
        driver.emit(ConnectivitySource.Event.failed(.init(operation: "GetNameOwner", reason: "networkd is not running")), to: net)
        #expect(rt.program.status(rt.model) == "unknown: networkd is not running")
    }

    @Test func everyJsonRecordHasTheSameFieldsAndAFailureIsStateUnknown() throws {
        func object(_ line: String?) throws -> [String: Any] {
            let data = Data(try #require(line).utf8)
            return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        }
        var m = Indicator.Model(settings: Settings())
        m.latest = .init(state: .online(via: "eth0"), changedAt: 0)
        let good = try object(Renderer(format: .json, terminal: false).render(m, now: 0))
        m.failure = "networkd is not running"
        let failing = try object(Renderer(format: .json, terminal: false).render(m, now: 0))
        #expect(Set(good.keys) == Set(failing.keys))
        #expect(Set(good.keys) == ["state", "online", "default_route", "backend", "changed_at", "interfaces", "error"])
        #expect(good["error"] is NSNull && good["state"] as? String == "routable")
        #expect(failing["state"] as? String == "unknown" && failing["online"] as? Bool == false)
        #expect(failing["error"] as? String == "networkd is not running" && failing["backend"] as? String == "auto")
        let waybarGood = try object(Renderer(format: .waybar, terminal: false).render(Indicator.Model(settings: Settings()).with(latest: m.latest), now: 0))
        let waybarFailing = try object(Renderer(format: .waybar, terminal: false).render(m, now: 0))
        #expect(Set(waybarGood.keys) == Set(waybarFailing.keys))
        #expect(waybarFailing["class"] as? String == "error" && waybarFailing["alt"] as? String == "unknown")
    }

    @Test func rendersTheDocumentedFormats() {
        var m = Indicator.Model(settings: Settings())
        m.latest = .init(state: .init(state: .routable, online: true, defaultRoute: true,
                                      interfaces: [.init(name: "eth0", index: 2, state: .routable, addresses: ["10.0.0.1/24"])],
                                      backend: .kernel), changedAt: 1_764_511_200_123_000)
        #expect(Renderer(format: .json, terminal: false).render(m, now: 0)
                == #"{"state":"routable","online":true,"default_route":true,"backend":"kernel","changed_at":"2025-11-30T14:00:00.123Z","interfaces":[{"name":"eth0","state":"routable","addresses":["10.0.0.1/24"]}],"error":null}"#)
        #expect(Renderer(format: .waybar, terminal: false).render(m, now: 0)
                == #"{"text":"eth0","tooltip":"online via eth0\neth0: routable 10.0.0.1/24","class":"online","alt":"routable"}"#)
        #expect(Renderer(format: .text, terminal: false).render(m, now: 0) == "online via eth0")
        // An interface without addresses ends its tooltip line with its state, no trailing space.
        var bare = m
        bare.latest?.state.interfaces.append(.init(name: "wlan0", index: 3, state: .noCarrier, addresses: []))
        #expect(Renderer(format: .waybar, terminal: false).render(bare, now: 0)?
                    .contains(#"eth0: routable 10.0.0.1/24\nwlan0: no-carrier""#) == true)
        #expect(Renderer(format: .text, terminal: true).render(m, now: 1_764_511_200_123_000 + 180_000_000)?.hasSuffix("online via eth0 for 3m") == true)
        #expect(rfc3339(0) == "1970-01-01T00:00:00.000Z")
        #expect(rfc3339(-1) == "1969-12-31T23:59:59.999Z")
        #expect(rfc3339(-1_000_000) == "1969-12-31T23:59:59.000Z")
        // Total over Int64 (issue 19, item 5): the extremes render, no trap.
        #expect(rfc3339(.min) == "-290308-12-21T19:59:05.224Z")
        #expect(rfc3339(.max) == "294247-01-10T04:00:54.775Z")
        for (changedAt, now) in [(Int64.min, Int64.max), (.max, .min), (.min, 0), (.max, 0)] {
            var far = m
            far.latest?.changedAt = changedAt
            #expect(Renderer(format: .text, terminal: true).render(far, now: now)?.contains("online via eth0 for ") == true)
            #expect(Renderer(format: .json, terminal: false).render(far, now: now) != nil)
        }
        #expect(parseDuration("1.5s") == .milliseconds(1500) && parseDuration("soon") == nil)
    }
}

extension Indicator.Model {
    func with(latest: ConnectivitySource.Change?) -> Self {
        var copy = self
        copy.latest = latest
        return copy
    }
}

/// logind's PrepareForSleep: silent while the machine prepares for sleep, one
/// fresh report on resume.
@Suite struct IndicatorSleepTests {
    let logindName = TypedSubscriptionID(BusNameSource.self, key: BusNameSource.Configuration(bus: .system, name: Indicator.logind))
    let sleepSignal = TypedSubscriptionID(BusSignalSource.self, key: "sleep")

    func prepare(_ going: Bool) -> BusSignalSource.Event {
        .received(BusSignal(sender: ":1.7", path: "/org/freedesktop/login1", interface: "org.freedesktop.login1.Manager",
                            member: "PrepareForSleep", arguments: [.boolean(going)]))
    }

    @Test func preparingForSleepStopsTheConnectivitySourceAndPrintsNothing() {
        var t = ProgramTester(Indicator(format: .json, followsLogind: true))
        var output = ViewOutput(Renderer(format: .json, terminal: false))
        t.event(online(), from: net)
        #expect(output.next(t.model, now: 0) != nil)
        let tagged = t.message(for: online("late0"), from: net)!
        t.event(prepare(true), from: sleepSignal)
        #expect(t.model.sleeping)
        #expect(t.commands == [.log("the machine is preparing for sleep: paused")])
        #expect(t.subscriptionIDs == [sleep, logindName.id])
        #expect(t.lastPlan.steps.map(\.description).contains("stop connectivity:net"))
        // A report the source queued before it stopped is about the machine
        // before the sleep: rejected.
        t.send(tagged)
        #expect(t.model.latest?.state.primary?.name == "eth0")
        #expect(output.next(t.model, now: 0) == nil)
        #expect(t.program.status(t.model) == "paused: the machine is going to sleep")
    }

    @Test func resumingStartsTheSourceAgainAndPrintsOneFreshReportEvenWhenUnchanged() {
        var t = ProgramTester(Indicator(format: .json, followsLogind: true))
        var output = ViewOutput(Renderer(format: .json, terminal: false))
        t.event(online(), from: net)
        let before = output.next(t.model, now: 0)
        #expect(before != nil)
        t.event(prepare(true), from: sleepSignal)
        t.event(prepare(false), from: sleepSignal)
        #expect(!t.model.sleeping && t.model.wakes == 1)
        #expect(t.commands == [.log("the machine resumed: reading the current state")])
        #expect(t.subscriptionIDs == [net, sleep])
        #expect(t.lastPlan.steps.map(\.description).contains { $0.hasPrefix("start connectivity:net") })
        // Nothing until the restarted source reports.
        #expect(output.next(t.model, now: 0) == nil)
        t.event(online(), from: net)
        #expect(output.next(t.model, now: 0) == before)
        // Then as before: an equal line is not printed twice.
        t.send(.minute)
        #expect(output.next(t.model, now: 0) == nil)
    }

    @Test func aRepeatedOrUnpairedSignalChangesNothing() {
        var t = ProgramTester(Indicator(format: .json, followsLogind: true))
        t.event(prepare(false), from: sleepSignal)
        #expect(!t.model.sleeping && t.model.wakes == 0)
        t.event(prepare(true), from: sleepSignal)
        let phase = t.model.phase
        t.event(prepare(true), from: sleepSignal)
        #expect(t.model.sleeping && t.model.phase == phase)
    }

    @Test func logindLeavingDuringTheSleepResumesWithALogLine() {
        var t = ProgramTester(Indicator(format: .json, followsLogind: true))
        t.event(prepare(true), from: sleepSignal)
        t.event(.appeared(owner: ":1.7"), from: logindName)
        #expect(t.model.sleeping)
        t.event(.vanished, from: logindName)
        #expect(!t.model.sleeping)
        #expect(t.commands == [.log("logind left the bus while the machine was preparing for sleep: resuming")])
        #expect(t.subscriptionIDs == [net, sleep])
    }

    @Test func noSystemBusOrAMalformedSignalIsQuietAndChangesNothingElse() {
        var t = ProgramTester(Indicator(format: .json, followsLogind: true))
        t.event(online(), from: net)
        let model = t.model
        t.event(.failed(SourceFailure(operation: "sd_bus_open_system", code: 2, reason: "No such file or directory")), from: sleepSignal)
        #expect(t.commands.isEmpty)
        #expect(t.model.logindProblem == "No such file or directory")
        t.event(.received(BusSignal(sender: ":1.7", path: "/org/freedesktop/login1", interface: "org.freedesktop.login1.Manager",
                                    member: "PrepareForSleep", arguments: [.string("yes")])), from: sleepSignal)
        #expect(t.commands.isEmpty && !t.model.sleeping)
        #expect(t.model.latest == model.latest && t.model.phase == model.phase)
    }

    @Test func onceAndAnIndicatorNotFollowingLogindHaveNoBusSubscription() {
        #expect(ProgramTester(Indicator(followsLogind: true)).hasSubscription(BusSignalSource.self))
        #expect(!ProgramTester(Indicator(once: true, followsLogind: true)).hasSubscription(BusSignalSource.self))
        #expect(!ProgramTester(Indicator()).hasSubscription(BusSignalSource.self))
    }

    @Test func sleepMessagesRoundTripThroughTheTranscriptCoding() throws {
        for m: Indicator.Message in [.prepareForSleep(true), .prepareForSleep(false), .logindPresent, .logindGone, .logindUnavailable("x")] {
            let data = try JSONEncoder().encode(m)
            let back = try JSONDecoder().decode(Indicator.Message.self, from: data)
            #expect(String(describing: back) == String(describing: m))
        }
    }
}

@Suite struct IndicatorLogindOptionTests {
    @Test func logindIsAutoByDefaultAndTakesOnOrOff() throws {
        #expect(try parseArguments([], directory: "/").get().logind == .auto)
        #expect(try parseArguments(["--logind", "off"], directory: "/").get().logind == .off)
        #expect(try parseArguments(["--logind=on"], directory: "/").get().logind == .on)
        guard case .failure(let e) = parseArguments(["--logind", "maybe"], directory: "/") else {
            Issue.record("--logind maybe was accepted")
            return
        }
        #expect(e.message == "bad value 'maybe' for --logind (accepted: auto, on, off)")
    }

    @Test func theSystemBusSocketIsReadFromTheAddressAsSdBusReadsIt() {
        #expect(systemBusSocket(address: nil) == "/run/dbus/system_bus_socket")
        #expect(systemBusSocket(address: "unix:path=/run/x/bus") == "/run/x/bus")
        #expect(systemBusSocket(address: "unix:guid=1,path=/run/a%2cb/bus;tcp:host=h") == "/run/a,b/bus")
        #expect(systemBusSocket(address: "unix:abstract=foo") == nil)
        #expect(systemBusSocket(address: "tcp:host=localhost,port=1") == nil)
    }
}
