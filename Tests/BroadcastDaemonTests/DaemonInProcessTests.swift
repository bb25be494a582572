import BroadcastKit
import BroadcastService
import ChildProcesses
import Foundation
import Logging
import Testing

@testable import BroadcastDaemon

/// The daemon run from the library in this process: started, driven over its control socket,
/// reloaded with changed outputs and shut down, without spawning `broadcast`.
@Suite(.serialized) struct DaemonInProcessTests {
    @Test func startReloadAndStopInProcess() async throws {
        let dir = try TestDirectory()
        defer { dir.remove() }
        let socket = dir.path("control.sock")
        let file = dir.path("daemon.toml")
        func write(outputs: [String]) throws {
            var text = """
                [video]
                source = "test"
                size = "320x180"
                [audio]
                mic = "test"
                [control]
                socket = "\(socket)"

                """
            for name in outputs { text += "[[output]]\nname = \"\(name)\"\npath = \"\(dir.path("\(name).mkv"))\"\n" }
            try text.write(toFile: file, atomically: true, encoding: .utf8)
        }
        try write(outputs: ["rec", "old"])
        let daemon = Daemon(
            configuration: try DaemonConfiguration.load(path: file, environment: [:]), environment: { [:] },
            metrics: DaemonMetrics(), notifier: SystemdNotifier(environment: [:]), logger: quietLogger)
        let running = runOnOwnThread { try await daemon.run() }
        let client = ControlClient(socketPath: socket)

        // Start: both outputs record.
        let started = try await poll("both outputs recording") { () -> JSONValue? in
            guard let status = Self.status(client), Self.outputStates(status) == ["old": "recording", "rec": "recording"] else { return nil }
            return status
        }
        #expect(started["state"]?.stringValue == "started", "\(started.serialized())")

        // The recording has media in it before the reload.
        let beforeReload = try await poll("media before the reload") { () -> Double? in
            guard let media = Self.status(client)?["media_seconds"]?.numberValue, media >= 1 else { return nil }
            return media
        }

        // Control: pause one output over the socket; the other goes on.
        let paused = try client.send(method: "POST", path: "/v1/outputs/old/pause")
        #expect(paused.status == 200, "\(String(decoding: paused.body, as: UTF8.self))")
        let pausedStatus = try #require(Self.status(client))
        #expect(Self.outputPaused(pausedStatus) == ["old": true, "rec": false], "\(pausedStatus.serialized())")

        // Reload over the socket (`broadcast reload`): "extra" added, "old" removed, "rec"
        // untouched; answered when it is done, with the outputs that run now.
        let watch = daemon.events.subscribe(lastEventID: nil)
        try write(outputs: ["rec", "extra"])
        let reloaded = try client.send(method: "POST", path: "/v1/reload")
        let answer = JSONValue.parse(String(decoding: reloaded.body, as: UTF8.self))
        #expect(reloaded.status == 200, "\(String(decoding: reloaded.body, as: UTF8.self))")
        #expect(answer?["outputs"] == .array([.string("rec"), .string("extra")]), "\(answer?.serialized() ?? "")")
        _ = try await poll("extra added and old removed") { () -> Bool? in
            guard let status = Self.status(client), Self.outputStates(status) == ["extra": "recording", "rec": "recording"] else { return nil }
            return true
        }
        let afterReload = try await poll("media after the reload") { () -> Double? in
            guard let media = Self.status(client)?["media_seconds"]?.numberValue, media >= beforeReload + 1 else { return nil }
            return media
        }

        // A reload of a broken config changes nothing: the outputs go on as they were, and the
        // answer names the file, line and key.
        let good = try String(contentsOfFile: file, encoding: .utf8)
        try good.replacingOccurrences(of: "size = \"320x180\"", with: "size = \"320x181\"").write(toFile: file, atomically: true, encoding: .utf8)
        let refused = try client.send(method: "POST", path: "/v1/reload")
        let refusal = String(decoding: refused.body, as: UTF8.self)
        #expect(refused.status == 400 && refusal.contains("config not reloaded") && refusal.contains("daemon.toml:3") && refusal.contains("video.size"), "\(refused.status): \(refusal)")
        #expect(Self.status(client).map(Self.outputStates) == ["extra": "recording", "rec": "recording"])
        // A SIGHUP's reload (here the library's `reload()`) of the same broken file: refused too.
        daemon.reload()
        #expect(Self.status(client).map(Self.outputStates) == ["extra": "recording", "rec": "recording"])
        // Each reload is an event, with what it did.
        var reloads: [String] = []
        while (daemon.events.queued(watch) ?? 0) > 0, case .event(let event) = await daemon.events.next(watch) {
            if event.type == "reload" {
                let fields = Dictionary(event.fields, uniquingKeysWith: { a, _ in a })
                reloads.append("\(fields["trigger"]?.stringValue ?? "?") \(fields["result"]?.stringValue ?? "?")")
            }
        }
        #expect(reloads == ["POST /v1/reload applied", "POST /v1/reload refused", "SIGHUP refused"], "\(reloads)")
        daemon.events.unsubscribe(watch)

        // What the session counted as lost before the stop (its queue full, no free buffer at the
        // source: a busy host's), and where media time stood then.
        let lastStatus = Self.status(client)
        let lastMedia = lastStatus?["media_seconds"]?.numberValue ?? 0
        let counted = ["queue_full", "source"].reduce(0) { $0 + Int(lastStatus?["types"]?["video"]?["dropped"]?[$1]?.numberValue ?? 0) }

        // Stop: run() returns once the files are finished.
        await daemon.shutdown()
        try await running.value
        #expect(daemon.lastFailure == nil, "\(daemon.lastFailure ?? "")")

        // rec went on in one file across the reload: no second file beside it, and it holds the
        // media recorded before the reload and after it.
        let files = try FileManager.default.contentsOfDirectory(atPath: dir.url.path).filter { $0.hasSuffix(".mkv") }.sorted()
        #expect(files == ["extra.mkv", "old.mkv", "rec.mkv"], "\(files)")
        let recorded = try mediaDuration(dir.path("rec.mkv"))
        #expect(recorded >= afterReload - 0.1, "rec.mkv holds \(recorded) s, the broadcast had \(afterReload) s at the reload's check")
        // Without a gap: a frame every 1/30 s from start to end (constant frame rate), across the
        // reload. A frame missing is one the session counted as lost (a busy host: the source had no
        // free buffer), up to the last status before the stop; never one lost unaccounted.
        let times = try packetTimes(dir.path("rec.mkv"), stream: "v:0")
        let gaps = zip(times, times.dropFirst()).filter { $0.1 < lastMedia - 0.5 }.map { $1 - $0 }
        let missing = gaps.filter { $0 > 2.0 / 30 }.map { Int(($0 * 30).rounded()) - 1 }.reduce(0, +)
        #expect(missing <= counted, "\(missing) frames missing in gaps up to \(gaps.max() ?? 0) s; the session counted \(counted) lost")
        // The others are playable too (finished by the removal and by the stop).
        for name in ["old.mkv", "extra.mkv"] {
            #expect(try mediaDuration(dir.path(name)) > 0, "\(name) is not playable")
        }
    }

    @Test func aShutdownBeforeTheStartEndsTheRun() async throws {
        let dir = try TestDirectory()
        defer { dir.remove() }
        let file = dir.path("daemon.toml")
        try """
            [video]
            size = "320x180"
            [control]
            socket = "\(dir.path("c.sock"))"
            [daemon]
            autostart = false
            [[output]]
            name = "rec"
            path = "\(dir.path("rec.mkv"))"
            """.write(toFile: file, atomically: true, encoding: .utf8)
        let daemon = Daemon(
            configuration: try DaemonConfiguration.load(path: file, environment: [:]), environment: { [:] },
            metrics: DaemonMetrics(), notifier: SystemdNotifier(environment: [:]), logger: quietLogger)
        await daemon.shutdown()
        try await daemon.run()
        #expect(!FileManager.default.fileExists(atPath: dir.path("rec.mkv")))
    }

    /// Pausing an output is asked for: what it leaves out is no `drops` event (before: a paused
    /// recording's `paused` count crossed 1, 2, 4, ... and fired an event each time). Once the
    /// broadcast is stopped the status no longer says its source is capturing, and after a start
    /// that failed (an X display that is not there) it says the source failed.
    @Test func aPauseIsNoDropsEventAndAStoppedSourceIsNotCapturing() async throws {
        let dir = try TestDirectory()
        defer { dir.remove() }
        let socket = dir.path("control.sock")
        let file = dir.path("daemon.toml")
        func write(source: String) throws {
            try """
                [video]
                source = "\(source)"
                size = "320x180"
                [audio]
                mic = "test"
                [control]
                socket = "\(socket)"
                [[output]]
                name = "rec"
                path = "\(dir.path("rec.mkv"))"
                """.write(toFile: file, atomically: true, encoding: .utf8)
        }
        try write(source: "test")
        let daemon = Daemon(
            configuration: try DaemonConfiguration.load(path: file, environment: [:]), environment: { [:] },
            metrics: DaemonMetrics(), notifier: SystemdNotifier(environment: [:]), logger: quietLogger)
        let running = runOnOwnThread { try await daemon.run() }
        let client = ControlClient(socketPath: socket)
        _ = try await poll("rec recording") { Self.status(client).flatMap { Self.outputStates($0)["rec"] == "recording" ? true : nil } }
        let watch = daemon.events.subscribe(lastEventID: nil)
        #expect(try client.send(method: "POST", path: "/v1/outputs/rec/pause").status == 200)
        // Packets left out while paused: enough to have crossed several powers of two.
        let left = try await poll("packets left out by the pause") { () -> Double? in
            guard case .array(let outputs)? = Self.status(client)?["outputs"],
                let paused = outputs.first?["drops"]?["paused"]?.numberValue, paused >= 64
            else { return nil }
            return paused
        }
        #expect(try client.send(method: "POST", path: "/v1/outputs/rec/resume").status == 200)
        _ = try await poll("rec recording again") { Self.status(client).flatMap { Self.outputStates($0)["rec"] == "recording" ? true : nil } }
        // The events are published by a watcher that looks every so often: the stop waits until
        // it has published the resume (on a busy host it could see paused, then finished).
        var events: [ControlEvent] = []
        func outputStatesSeen() -> [String] {
            events.filter { $0.type == "output" }.compactMap { Dictionary($0.fields, uniquingKeysWith: { a, _ in a })["state"]?.stringValue }
        }
        let resumeSeen = Date().addingTimeInterval(120)
        while !(outputStatesSeen().contains("paused") && outputStatesSeen().last == "recording") && Date() < resumeSeen {
            if (daemon.events.queued(watch) ?? 0) > 0, case .event(let event) = await daemon.events.next(watch) {
                events.append(event)
            } else {
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        #expect(try client.send(method: "POST", path: "/v1/broadcast/stop").status == 200)
        let stopped = try await poll("the broadcast finished") { Self.status(client).flatMap { $0["state"]?.stringValue == "finished" ? $0 : nil } }
        #expect(stopped["types"]?["video"]?["source_state"]?.stringValue == "stopped", "\(stopped.serialized())")
        // The same source, but on a display that is not there: the start fails.
        let display = (900..<1000).first { !FileManager.default.fileExists(atPath: "/tmp/.X11-unix/X\($0)") } ?? 999
        try write(source: "x11::\(display)")
        #expect(try client.send(method: "POST", path: "/v1/reload").status == 200)
        let start = try client.send(method: "POST", path: "/v1/broadcast/start")
        #expect(start.status != 200, "\(String(decoding: start.body, as: UTF8.self))")
        let failed = try #require(Self.status(client))
        #expect(failed["types"]?["video"]?["source_state"]?.stringValue == "failed", "\(failed.serialized())")
        // Every event up to the reload's (published after everything before it) is in.
        let deadline = Date().addingTimeInterval(120)
        while !events.contains(where: { $0.type == "reload" }) && Date() < deadline {
            if (daemon.events.queued(watch) ?? 0) > 0, case .event(let event) = await daemon.events.next(watch) {
                events.append(event)
            } else {
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        #expect(events.contains { $0.type == "reload" }, "no reload event: \(events.map(\.type))")
        daemon.events.unsubscribe(watch)
        let states = outputStatesSeen()
        #expect(states.contains("paused") && states.contains("recording"), "\(states)")
        let drops = events.filter { $0.type == "drops" }.map { Dictionary($0.fields, uniquingKeysWith: { a, _ in a }) }
        #expect(!drops.contains { $0["output"] != nil }, "drops events for a pause (\(left) packets left out): \(drops)")
        await daemon.shutdown()
        _ = try? await running.value
    }

    static func status(_ client: ControlClient) -> JSONValue? {
        guard let reply = try? client.send(method: "GET", path: "/v1/status"), reply.status == 200 else { return nil }
        return JSONValue.parse(String(decoding: reply.body, as: UTF8.self))
    }

    /// Output name → paused.
    static func outputPaused(_ status: JSONValue) -> [String: Bool] {
        guard case .array(let outputs)? = status["outputs"] else { return [:] }
        var paused: [String: Bool] = [:]
        for output in outputs {
            if let name = output["name"]?.stringValue, case .bool(let value)? = output["paused"] { paused[name] = value }
        }
        return paused
    }

    /// Output name → state.
    static func outputStates(_ status: JSONValue) -> [String: String] {
        guard case .array(let outputs)? = status["outputs"] else { return [:] }
        var states: [String: String] = [:]
        for output in outputs {
            if let name = output["name"]?.stringValue { states[name] = output["state"]?.stringValue ?? "?" }
        }
        return states
    }
}

/// Config errors from the library: typed file, line and key, from the document's own positions.
@Suite struct DaemonConfigurationTests {
    @Test(arguments: [
        ("[video]\nsize = \"320x180\"\nfps = 0", 3, "video.fps", "invalid value '0'"),
        ("[encoder]\npreset = \"warp\"", 2, "encoder.preset", "unknown encoder.preset 'warp'"),
        ("[video]\nsize = \"320x180\"\n\n[audio]\nperiod = \"1s\"", 5, "audio.period", "invalid value '1s': must be from 2ms to 200ms"),
        ("[video]\nsource = \"/dev/nothing-here\"", 2, "video.source", "no video device /dev/nothing-here"),
        ("[limits]\nmemory = \"12M\"", 2, "limits.memory", "'12M': expected a size from 16M to 1T"),
        ("[video]\nsize = \"320x180\"\n[encoder]\nframe_rate_mode = \"vfr\"\n[[output]]\nname = \"live\"\nurl = \"rtmp://127.0.0.1/live/x\"",
         4, "encoder.frame_rate_mode", "encoder.frame_rate_mode vfr is for files only"),
    ] as [(String, Int, String, String)])
    func aConfigErrorNamesFileLineAndKey(text: String, line: Int, key: String, message: String) throws {
        let dir = try TestDirectory()
        defer { dir.remove() }
        let file = dir.path("bad.toml")
        try (text + "\n[[output]]\nname = \"a\"\npath = \"\(dir.path("a.mkv"))\"\n").write(toFile: file, atomically: true, encoding: .utf8)
        do {
            _ = try DaemonConfiguration.load(path: file, environment: [:])
            Issue.record("\(text) was accepted")
        } catch {
            #expect(error.file == file)
            #expect(error.line == line, "\(error)")
            #expect(error.key == key, "\(error)")
            #expect(error.message.contains(message), "\(error)")
            #expect(error.description.hasPrefix("\(file):\(line): \(key): "), "\(error)")
        }
    }

    /// The flag and the key of one option go through one parser: the same text is accepted or
    /// refused by both, each naming itself.
    @Test func flagAndKeyShareOneParser() throws {
        #expect(throws: OptionError.self) { try Options.size.parse("12x") }
        do {
            _ = try Options.size.parse("12x")
        } catch {
            #expect(error.description == "invalid --size '12x': expected WIDTHxHEIGHT, e.g. 1280x720")
            #expect(error.configMessage == "invalid value '12x': expected WIDTHxHEIGHT, e.g. 1280x720")
        }
        #expect(try Options.size.parse("320x180") == VideoSize(width: 320, height: 180))
        // Every [video], [audio], [encoder] and [limits] key is one option's key.
        for (table, settings) in DaemonConfiguration.optionKeys {
            for (key, setting) in settings {
                #expect(setting.name.key == "\(table).\(key)")
                #expect(setting.name.flag.hasPrefix("--"))
            }
        }
        let keys = DaemonConfiguration.optionKeys.values.flatMap { $0.values.map(\.name.flag) }
        #expect(Set(keys).count == keys.count, "two keys set one flag")
    }

    @Test func theConfigIsTyped() throws {
        let dir = try TestDirectory()
        defer { dir.remove() }
        let file = dir.path("ok.toml")
        try """
            [video]
            size = "320x180"
            fps = "30000/1001"
            [encoder]
            video_bitrate = "2500k"
            tune = "none"
            rate_control = "crf"
            crf = 20
            [limits]
            memory = "1G"
            [[output]]
            name = "a"
            path = "\(dir.path("a.mkv"))"
            """.write(toFile: file, atomically: true, encoding: .utf8)
        let config = try DaemonConfiguration.load(path: file, environment: [:])
        #expect(config.sources.size == VideoSize(width: 320, height: 180))
        #expect(config.sources.frameRate.numerator == 30000 && config.sources.frameRate.denominator == 1001)
        #expect(config.encoder.videoBitrate == 2_500_000)
        #expect(config.encoder.tune == nil)
        #expect(config.encoder.rateControl == .crf && config.encoder.crf == 20)
        #expect(config.memoryBudget == 1 << 30)
        #expect(config.outputs.map(\.name) == ["a"])
        #expect(config.lines["video.fps"] == 3)
    }
}

/// Every option refuses nonsense in the command line's words and, said about its key, without
/// its flag: the config never shows a flag the user did not write.
@Suite struct OptionSpecTests {
    static func check<Value>(_ spec: OptionSpec<Value>) -> (OptionName, (String) throws -> Void) {
        (spec.name, { _ = try spec.parse($0) })
    }

    static var all: [(OptionName, (String) throws -> Void)] { [
        check(Options.video), check(Options.audioMic), check(Options.audioApp), check(Options.audioPeriod),
        check(Options.size), check(Options.fps), check(Options.videoInput), check(Options.videoFormat),
        check(Options.videoBitrate), check(Options.audioBitrate), check(Options.encoder), check(Options.preset),
        check(Options.tune), check(Options.rateControl), check(Options.crf), check(Options.keyframeInterval),
        check(Options.frameRateMode), check(Options.profile), check(Options.threads), check(Options.memoryBudget),
    ] }

    @Test func nonsenseIsRefusedInEachSpelling() {
        for (name, parse) in Self.all {
            do {
                try parse("no such value!")
                Issue.record("\(name.flag) accepted 'no such value!'")
            } catch let error as OptionError {
                #expect(error.option == name)
                #expect(error.description.contains(name.flag), "\(error.description)")
                #expect(!error.configMessage.contains(name.flag), "\(error.configMessage)")
                #expect(error.configMessage.contains("no such value!"), "\(error.configMessage)")
            } catch {
                Issue.record("\(name.flag): \(error) is not an OptionError")
            }
        }
    }

    @Test func defaultsParse() {
        // The settings' defaults are the specs' default texts, parsed (a bad one would trap here).
        let sources = SourceSettings()
        #expect(sources.video == .test(bt601: nil, stallAfter: nil) && sources.audioApp == AudioSourceSpec.none)
        #expect(sources.frameRate.numerator == 30 && sources.frameRate.denominator == 1)
        #expect(sources.audioPeriodNanoseconds == 21_000_000)
        let encoder = EncoderSettings()
        #expect(encoder.videoBitrate == 3_000_000 && encoder.audioBitrate == 128_000 && encoder.crf == 23)
        #expect(encoder.tune == "zerolatency" && encoder.preset == "veryfast" && encoder.keyframeInterval.seconds == 2)
    }
}

// MARK: Support

/// Warnings and errors only: the daemon's info lines would bury the test output.
let quietLogger: Logger = {
    var logger = Logger(label: "test.daemon")
    logger.logLevel = .warning
    return logger
}()

struct TestDirectory {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("broadcast-daemon-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    /// Removes only this test's own directory.
    func remove() { try? FileManager.default.removeItem(at: url) }
}

struct Timeout: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out waiting for \(what)" }
}

/// Polls `condition` every 100 ms until it gives a value; generous (a busy machine is slow), and
/// the wait ends as soon as the condition holds.
/// The waiting is done on a thread of its own (`TestExecutors.waits`): queued behind the other
/// tests on the cooperative pool, it would find its deadline passed when it next ran.
func poll<T>(_ what: String, seconds: Double = 300, _ condition: () -> T?) async throws -> T {
    try await withTaskExecutorPreference(TestExecutors.waits) {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let value = condition() { return value }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw Timeout(what: what)
    }
}

/// The container's duration in seconds, as ffprobe reads it (0 when it cannot).
func mediaDuration(_ path: String) throws -> Double {
    Double(try ffprobe(["-show_entries", "format=duration", "-of", "csv=p=0", path]).trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
}

/// Presentation times (s) of every packet of one stream ("v:0" or "a:0"), in order.
func packetTimes(_ path: String, stream: String) throws -> [Double] {
    try ffprobe(["-select_streams", stream, "-show_entries", "packet=pts_time", "-of", "csv=p=0", path])
        .split(separator: "\n").compactMap { Double($0.trimmingCharacters(in: CharacterSet(charactersIn: " ,"))) }.sorted()
}

/// What ffprobe prints on standard output (errors only on standard error).
func ffprobe(_ arguments: [String]) throws -> String {
    try ChildProcess.run("/usr/bin/ffprobe", ["-v", "error"] + arguments).output
}
