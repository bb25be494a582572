import BroadcastKit
import BroadcastService
import Foundation
import PropertyBased
import Testing

@testable import BroadcastDaemon

/// A hostile client against a running daemon (in this process, so a trap anywhere fails the run):
/// every value a request carries is parsed by the same range-checked parsers as the command line
/// and the config, and answered with one line, never a crash.
@Suite(.serialized) struct ControlAPIAdversarialTests {
    /// A running daemon with a replay output ("replay") and a recording ("rec"), its client, and
    /// the config file.
    struct Running {
        let daemon: Daemon
        let task: Task<Void, any Error>
        let client: ControlClient
        let file: String
        let dir: TestDirectory

        func stop() async throws {
            await daemon.shutdown()
            try await task.value
            dir.remove()
        }
    }

    static func config(_ dir: TestDirectory, outputs: String? = nil) -> String {
        """
        [video]
        source = "test"
        size = "320x180"
        [encoder]
        keyframe_interval = "1s"
        [audio]
        mic = "test"
        [control]
        socket = "\(dir.path("control.sock"))"

        """
            + (outputs
                ?? """
                [[output]]
                name = "replay"
                path = "\(dir.path("replay-%H%M%S.mkv"))"
                replay = "5s"
                [[output]]
                name = "rec"
                path = "\(dir.path("rec.mkv"))"

                """)
    }

    static func start(outputs: String? = nil) async throws -> Running {
        let dir = try TestDirectory()
        let file = dir.path("daemon.toml")
        try config(dir, outputs: outputs).write(toFile: file, atomically: true, encoding: .utf8)
        let daemon = Daemon(
            configuration: try DaemonConfiguration.load(path: file, environment: [:]), environment: { [:] },
            metrics: DaemonMetrics(), notifier: SystemdNotifier(environment: [:]), logger: quietLogger)
        let task = runOnOwnThread { try await daemon.run() }
        let client = ControlClient(socketPath: dir.path("control.sock"))
        _ = try await poll("the broadcast running") { () -> Bool? in
            guard let status = DaemonInProcessTests.status(client), status["state"]?.stringValue == "started",
                case let states = DaemonInProcessTests.outputStates(status), !states.isEmpty,
                states.values.allSatisfy({ $0 == "recording" })
            else { return nil }
            return true
        }
        return Running(daemon: daemon, task: task, client: client, file: file, dir: dir)
    }

    /// Every byte but the unreserved ones %-escaped: the value arrives as it was generated.
    static func escaped(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out += "%" + (byte < 16 ? "0" : "") + String(byte, radix: 16, uppercase: true)
            }
        }
        return out
    }

    /// The answer is one line of JSON (an error names itself in it).
    static func isOneLine(_ body: [UInt8]) -> Bool {
        let text = String(decoding: body, as: UTF8.self)
        return text.hasSuffix("\n") && !text.dropLast().contains("\n") && JSONValue.parse(text) != nil
    }

    /// Pieces of numbers and durations, and the spellings that broke a parser before (1e10, 9.3e9
    /// and 1e308 seconds trapped converting to nanoseconds: exit 132).
    static let tokens: [String] = [
        "0", "1", "2", "5", "9", "30", "240", "3650", ".", "e", "E", "e-", "e+", "-", "+", ":", "ms", "s", "m", "h", "d",
        "nan", "inf", "0x1p", " ", "1e10", "9.3e9", "1e308", "1e309", "1e-400", "4.9e-324", "9223372036854775807",
        "18446744073709551616", "315360000", "315360001", "½", "é", "\u{0}", "&", "=", "%", "+", "/",
    ]

    static let values = Gen<String?>.element(of: tokens).map { $0! }.array(of: 1...5).map { $0.joined() }

    /// `seconds` of both save endpoints, whatever it is: 200 when `broadcast replay save --seconds`
    /// would take it, else 400 with one line naming the value; the daemon goes on either way.
    @Test func everySecondsValueIsParsedOrRefusedWithOneLine() async throws {
        let running = try await Self.start()
        var answered = (saved: 0, refused: 0)
        await propertyCheck(count: 150, input: Self.values, Gen.bool) { value, named in
            let path = (named ? "/v1/outputs/replay/save" : "/v1/replay/save") + "?seconds=" + Self.escaped(value)
            guard let answer = try? running.client.send(method: "POST", path: path) else {
                Issue.record("no answer to POST \(path)")
                return
            }
            let accepted = (try? Values.duration(value, option: "seconds")) != nil
            #expect(answer.status == (accepted ? 200 : 400), "POST \(path): \(answer.status) \(String(decoding: answer.body, as: UTF8.self))")
            #expect(Self.isOneLine(answer.body), "POST \(path): \(String(decoding: answer.body, as: UTF8.self))")
            if answer.status == 400 {
                #expect(String(decoding: answer.body, as: UTF8.self).contains("seconds"), "POST \(path)")
                answered.refused += 1
            } else {
                answered.saved += 1
            }
        }
        // The values that trapped, each by name.
        for value in ["1e10", "9.3e9", "1e308", "1e309", "-1", "0", "nan", "inf"] {
            let answer = try running.client.send(method: "POST", path: "/v1/replay/save?seconds=\(Self.escaped(value))")
            let text = String(decoding: answer.body, as: UTF8.self)
            #expect(answer.status == 400 && text.contains("invalid seconds '\(value)'") && Self.isOneLine(answer.body), "\(value): \(text)")
        }
        #expect(answered.saved > 0 && answered.refused > 0, "\(answered)")
        #expect(DaemonInProcessTests.status(running.client)?["state"]?.stringValue == "started")
        try await running.stop()
    }

    /// The routes an unknown path's 404 lists are routes the daemon has (each alternative of a
    /// `{a,b}`; those with a `{name}` are left out): HEAD on each is answered, by anything but 404.
    @Test func theRoutesA404ListsExist() async throws {
        let running = try await Self.start()
        let unknown = try running.client.send(method: "GET", path: "/v1/nope")
        let text = String(decoding: unknown.body, as: UTF8.self)
        #expect(unknown.status == 404, "\(text)")
        let listed = try #require(text.firstRange(of: "(see ").map { text[$0.upperBound...].prefix { $0 != ")" } }, "\(text)")
        var paths: [String] = []
        for item in listed.split(separator: ", ") {
            let route = String(item.split(separator: " ")[0])
            guard !route.contains("{name}") else { continue }
            if let open = route.firstIndex(of: "{"), let close = route.firstIndex(of: "}") {
                paths += route[route.index(after: open)..<close].split(separator: ",").map { String(route[..<open] + $0 + route[route.index(after: close)...]) }
            } else {
                paths.append(route)
            }
        }
        #expect(paths.count >= 10 && paths.contains("/v1/preview.jpg") && paths.contains("/v1/broadcast/stop"), "\(paths)")
        for path in paths {
            let answer = try running.client.send(method: "HEAD", path: path)
            #expect(answer.status != 404, "HEAD \(path): 404, yet the 404 lists it")
        }
        try await running.stop()
    }

    /// Any method on any endpoint, with any query and body: an answer of one line with a status
    /// the API documents, never a crash; the broadcast runs on.
    @Test func anyRequestToAnyEndpointGetsOneLine() async throws {
        let running = try await Self.start()
        let methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"]
        let paths = [
            "/v1/status", "/metrics", "/v1/broadcast/start", "/v1/broadcast/pause", "/v1/broadcast/resume", "/v1/broadcast/nope",
            "/v1/outputs/rec/pause", "/v1/outputs/rec/resume", "/v1/outputs/rec/save", "/v1/outputs/nope/pause",
            "/v1/outputs/replay/save", "/v1/outputs//save", "/v1/outputs/rec", "/v1/replay/save", "/v1/reload", "/v1", "/",
        ]
        let request = zip(
            Gen<String?>.element(of: methods).map { $0! }, Gen<String?>.element(of: paths).map { $0! },
            zip(Gen<String?>.element(of: ["seconds", "seconds", "name", "", "%"]).map { $0! }, Self.values).array(of: 0...3),
            Self.values.array(of: 0...2))
        var statuses: Set<Int> = []
        await propertyCheck(count: 300, input: request) { generated in
            let (method, path, query, body) = generated
            let target = path + (query.isEmpty ? "" : "?" + query.map { Self.escaped($0) + "=" + Self.escaped($1) }.joined(separator: "&"))
            guard let answer = try? running.client.send(method: method, path: target, body: Array(body.joined().utf8)) else {
                Issue.record("no answer to \(method) \(target)")
                return
            }
            statuses.insert(answer.status)
            #expect([200, 400, 404, 405, 409].contains(answer.status), "\(method) \(target): \(answer.status)")
            // /metrics and the page (`/`) are documents of many lines.
            if method != "HEAD" && !((path == "/metrics" || path == "/") && answer.status == 200) {
                #expect(Self.isOneLine(answer.body), "\(method) \(target): \(String(decoding: answer.body, as: UTF8.self))")
            }
        }
        // The generation reached the routes (a 400 needs a POST of a bad `seconds` to a save
        // endpoint, about 1 in 90 requests: the test above covers it).
        #expect(statuses.isSuperset(of: [200, 404, 405]), "\(statuses.sorted())")
        // Whatever was paused, the broadcast still runs and answers.
        _ = try? running.client.send(method: "POST", path: "/v1/broadcast/resume")
        #expect(DaemonInProcessTests.status(running.client)?["state"]?.stringValue == "started")
        try await running.stop()
    }

    /// A reload with a config the daemon cannot take is refused with one line (400) and the
    /// broadcast goes on: a replay limit no budget fits (900000T-1000000T overflowed the memory
    /// plan: exit 132), a value nested 100 000 deep (the parser's recursion overflowed the stack:
    /// SIGSEGV), a FIFO where the file was (the open blocked every control action after it).
    @Test func aReloadOfAnUnusableConfigIsRefusedAndTheBroadcastGoesOn() async throws {
        let running = try await Self.start()
        let good = try String(contentsOfFile: running.file, encoding: .utf8)
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        let bad: [(String, String)] = [
            (good.replacingOccurrences(of: "replay = \"5s\"", with: "replay = \"5s\"\nmax_memory = \"900000T\""), "output.max_memory: expected a size from 1M to 1T"),
            (good.replacingOccurrences(of: "replay = \"5s\"", with: "replay = \"5s\"\nmax_memory = \"1000000T\""), "output.max_memory"),
            (good.replacingOccurrences(of: "[audio]\n", with: "[audio]\nx = \(deep)\n"), "nested more than 32 deep"),
        ]
        for (text, expected) in bad {
            try text.write(toFile: running.file, atomically: true, encoding: .utf8)
            let answer = try running.client.send(method: "POST", path: "/v1/reload")
            let body = String(decoding: answer.body, as: UTF8.self)
            #expect(answer.status == 400 && body.contains(expected) && Self.isOneLine(answer.body), "\(answer.status): \(body.prefix(300))")
        }
        // A FIFO: refused at once, and the next action is answered.
        try FileManager.default.removeItem(atPath: running.file)
        #expect(mkfifo(running.file, 0o600) == 0)
        let fifo = try running.client.send(method: "POST", path: "/v1/reload")
        #expect(fifo.status == 400 && String(decoding: fifo.body, as: UTF8.self).contains("FIFO"), "\(String(decoding: fifo.body, as: UTF8.self))")
        #expect(try running.client.send(method: "POST", path: "/v1/outputs/rec/pause").status == 200)
        #expect(try running.client.send(method: "POST", path: "/v1/outputs/rec/resume").status == 200)
        let status = try await poll("both outputs recording") { () -> JSONValue? in
            guard let status = DaemonInProcessTests.status(running.client),
                DaemonInProcessTests.outputStates(status) == ["replay": "recording", "rec": "recording"]
            else { return nil }
            return status
        }
        #expect(status["state"]?.stringValue == "started")
        try await running.stop()
    }

    /// /metrics: HEAD is answered like GET (as /v1/status is), without the body (NIO's response
    /// encoder drops a HEAD's body; this pins it); the series of an output a reload
    /// removed go; a counter grows by all of a new broadcast's figures (before, by what they grew
    /// past the last broadcast's, so a new broadcast counted short).
    @Test func metricsFollowOutputsAndBroadcasts() async throws {
        let dir = try TestDirectory()
        let outputs = { (names: [String]) in
            names.map { "[[output]]\nname = \"\($0)\"\npath = \"\(dir.path("\($0)-%H%M%S%f.mkv"))\"\n" }.joined()
        }
        let running = try await Self.start(outputs: outputs(["rec", "old"]))
        defer { dir.remove() }
        func metrics() throws -> String { String(decoding: try running.client.send(method: "GET", path: "/metrics").body, as: UTF8.self) }
        func value(_ series: String, in text: String) -> Double? {
            text.split(separator: "\n").first { $0.hasPrefix(series + " ") }.flatMap { Double($0.split(separator: " ").last ?? "") }
        }
        for path in ["/metrics", "/v1/status", "/"] {
            let head = try running.client.send(method: "HEAD", path: path)
            #expect(head.status == 200 && head.body.isEmpty, "HEAD \(path): \(head.status), \(head.body.count) bytes of body")
        }
        let first = try metrics()
        #expect(first.contains("output=\"old\""), "\(first)")

        // A reload without "old": its series are gone from the next scrape.
        try Self.config(running.dir, outputs: outputs(["rec"])).write(toFile: running.file, atomically: true, encoding: .utf8)
        #expect(try running.client.send(method: "POST", path: "/v1/reload").status == 200)
        _ = try await poll("old removed") { DaemonInProcessTests.status(running.client).map(DaemonInProcessTests.outputStates) == ["rec": "recording"] ? true : nil }
        let afterReload = try metrics()
        #expect(!afterReload.contains("output=\"old\""), "\(afterReload)")
        #expect(afterReload.contains("output=\"rec\""))

        // A new broadcast: the counter grows by all it encodes.
        let frames = "broadcast_video_frames_encoded_total"
        let before = try #require(value(frames, in: try metrics()))
        let lastOfTheFirst = try #require(DaemonInProcessTests.status(running.client)?["video_frames_encoded"]?.numberValue)
        #expect(try running.client.send(method: "POST", path: "/v1/broadcast/stop").status == 200)
        #expect(try running.client.send(method: "POST", path: "/v1/broadcast/start").status == 200)
        let encoded = try await poll("the new broadcast past the last one's frames") { () -> Double? in
            guard let n = DaemonInProcessTests.status(running.client)?["video_frames_encoded"]?.numberValue, n > lastOfTheFirst + 30 else { return nil }
            return n
        }
        let after = try #require(value(frames, in: try metrics()))
        #expect(after >= before + encoded, "\(frames) went from \(before) to \(after) while the new broadcast encoded at least \(encoded)")
        try await running.stop()
    }
}
