import Foundation
import Testing

/// The package's root (this file is Tests/BroadcastCLITests/WHIPTests.swift).
private let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// A WHIP endpoint on aiortc (an independent WebRTC implementation, from PyPI) on 127.0.0.1:
/// scripts/whip-endpoint.py in the virtualenv `make deps` makes (.build/whip-venv, with aiortc and
/// aiohttp); a test installs nothing. It decodes what arrives and answers GET /state with what it saw.
final class WHIPEndpoint {
    /// The virtualenv's python, once seen to import aiortc and aiohttp; otherwise why not.
    static let python: Result<String, ProbeError> = {
        let venv = packageRoot.appendingPathComponent(".build/whip-venv").path
        let python = venv + "/bin/python"
        guard FileManager.default.isExecutableFile(atPath: python) else {
            return .failure(ProbeError(message: "no \(python): the WHIP tests' WebRTC peer is missing; run make deps"))
        }
        do {
            let r = try run(python, ["-c", "import aiortc, aiohttp"])
            guard r.status == 0 else {
                return .failure(ProbeError(message: "\(python) cannot import aiortc and aiohttp (\(r.stderr)); run make deps"))
            }
        } catch {
            return .failure(ProbeError(message: "\(python) did not run (\(error)); run make deps"))
        }
        return .success(python)
    }()

    let port: Int
    let token: String?
    /// The answer's DTLS role: "active" (aiortc's own choice) or "passive".
    let setup: String
    private(set) var child: Child

    init(port: Int? = nil, token: String?, setup: String = "active") throws {
        self.port = try port ?? freePort()
        self.token = token
        self.setup = setup
        child = try Self.start(port: self.port, token: token, setup: setup)
    }

    private static func start(port: Int, token: String?, setup: String) throws -> Child {
        let script = packageRoot.appendingPathComponent("scripts/whip-endpoint.py").path
        var arguments = [script, "--port", "\(port)", "--setup", setup]
        if let token { arguments += ["--token", token] }
        let child = try Child(python.get(), arguments)
        let deadline = Date().addingTimeInterval(60)
        while !child.stdoutSoFar.contains("listening") {
            guard child.process.isRunning, Date() < deadline else {
                throw ProbeError(message: "the WHIP endpoint did not start: \(child.stderrSoFar)")
            }
            usleep(50_000)
        }
        return child
    }

    /// Kills the endpoint without a word to its peers (no BYE, no close) and starts a new one on
    /// the same port, which knows nothing of the old sessions.
    func restart() throws {
        child.signal(SIGKILL)
        _ = child.wait()
        child = try Self.start(port: port, token: token, setup: setup)
    }

    var url: String { "whip+http://127.0.0.1:\(port)/whip/cam" }

    func state() throws -> [String: Any] {
        let r = try run("/usr/bin/curl", ["-sf", "http://127.0.0.1:\(port)/state"])
        guard r.status == 0, let object = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any] else {
            throw ProbeError(message: "GET /state: \(r.status) \(r.stderr)")
        }
        return object
    }

    func number(_ key: String) throws -> Double { (try state()[key] as? NSNumber)?.doubleValue ?? 0 }

    /// Sends a PLI on the video track; false while there is none yet.
    func sendPLI() throws -> Bool {
        try run("/usr/bin/curl", ["-sf", "-X", "POST", "http://127.0.0.1:\(port)/pli"]).status == 0
    }

    /// Drops `fraction` of the RTP packets that arrive from now on, before aiortc handles them:
    /// its receiver reports count them as lost.
    func setLoss(_ fraction: Double) throws {
        let r = try run("/usr/bin/curl", ["-sf", "-X", "POST", "http://127.0.0.1:\(port)/loss?fraction=\(fraction)"])
        guard r.status == 0 else { throw ProbeError(message: "POST /loss: \(r.status) \(r.stderr)") }
    }

    /// Polls until `condition` holds (a guard against hanging, not a measurement).
    func waitFor(timeout: Double = 60, _ condition: ([String: Any]) -> Bool) throws -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if condition(try state()) { return true }
            usleep(200_000)
        }
        return false
    }

    func stop() {
        child.signal(SIGTERM)
        _ = child.wait(timeout: 10)
    }
}

/// "N video and M audio packets" from `broadcast stream`'s summary line for the output (the
/// WHIP tests against aiortc and against Janus).
func packetsSent(_ stderr: String) -> (video: Int, audio: Int)? {
    guard let line = stderr.split(separator: "\n").first(where: { $0.hasPrefix("broadcast: whip+http") }),
        let range = line.firstRange(of: " video and ")
    else { return nil }
    let video = line[..<range.lowerBound].split(separator: " ").last.flatMap { Int($0) }
    let audio = line[range.upperBound...].split(separator: " ").first.flatMap { Int($0) }
    guard let video, let audio else { return nil }
    return (video, audio)
}

private func number(_ state: [String: Any], _ key: String) -> Double { (state[key] as? NSNumber)?.doubleValue ?? 0 }

/// The WHIP output against aiortc on loopback: media decoded there, sync, PLI, reconnect,
/// refusal, DELETE.
@Suite(.serialized) struct WHIPTests {
    static let token = "whip-test-token-7f3a9c"

    @Test func mediaReachesAnIndependentWebRTCPeerInSync() throws {
        let endpoint = try WHIPEndpoint(token: Self.token)
        defer { endpoint.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let r = try broadcast(
            ["stream", endpoint.url, "--whip-token", Self.token, "--duration", "12s", "--size", "320x240", "--quiet",
             "--record", dir.path("copy.mkv")], timeout: 120)
        #expect(r.status == 0, "\(r.stderr)")
        // The recording beside it keeps AAC: Opus is WHIP's alone.
        let recording = try probe(dir.path("copy.mkv"))
        #expect(recording.audio?.codec == "aac" && recording.video?.codec == "h264", "\(recording)")
        let state = try endpoint.state()
        let sent = try #require(packetsSent(r.stderr), "\(r.stderr)")
        let decoded = Int(number(state, "video_frames"))
        print("WHIP: \(decoded) of \(sent.video) video frames decoded by aiortc, \(Int(number(state, "audio_frames"))) Opus frames")
        #expect(sent.video >= 200)
        #expect(Double(decoded) >= 0.95 * Double(sent.video), "\(decoded) of \(sent.video) frames decoded")
        // The tone, in Opus.
        #expect((state["audio_codec"] as? String)?.lowercased().hasPrefix("opus/48000") == true, "\(state)")
        #expect((state["video_codec"] as? String)?.lowercased().hasPrefix("h264/90000") == true, "\(state)")
        #expect(number(state, "beeps") >= 8, "\(state)")
        // Each white frame against the nearest beep onset, both on the sender's clock.
        let offsets = (state["sync_offsets"] as? [Double] ?? []).filter { abs($0) < 0.5 }
        print("WHIP: A/V offsets (beep - white frame): \(offsets.map { String(format: "%.1f ms", $0 * 1000) }); white runs: \(state["white_runs"] ?? [])")
        #expect(offsets.count >= 8, "\(state)")
        #expect(offsets.allSatisfy { abs($0) <= 0.040 }, "\(offsets)")
        // One session, ended with a DELETE when the stream stopped.
        #expect(number(state, "posts") == 1)
        #expect(number(state, "deletes") == 1)
        // The token is a secret like a stream key.
        #expect(!r.stderr.contains(Self.token) && !r.stdout.contains(Self.token))
    }

    /// aiortc's own answer is setup:active with ECDSA cipher suites only, as a browser's DTLS
    /// client may be: webrtcbin's default RSA certificate never completed that handshake ("ICE/DTLS
    /// did not connect"); with an ECDSA P-256 one both roles carry the media.
    @Test(arguments: ["active", "passive"])
    func eitherDTLSRoleCarriesTheMedia(setup: String) throws {
        let endpoint = try WHIPEndpoint(token: Self.token, setup: setup)
        defer { endpoint.stop() }
        let r = try broadcast(
            ["stream", endpoint.url, "--whip-token", Self.token, "--duration", "6s", "--size", "320x240", "--quiet"], timeout: 120)
        #expect(r.status == 0, "\(r.stderr)")
        let state = try endpoint.state()
        #expect(state["setup"] as? String == setup, "\(state)")
        let sent = try #require(packetsSent(r.stderr), "\(r.stderr)")
        #expect(sent.video > 0 && number(state, "video_frames") > 0 && number(state, "audio_frames") > 0, "\(state)")
        #expect(number(state, "sessions") == 1 && number(state, "deletes") == 1, "\(state)")
    }

    @Test func keyframeOnTheViewersPLI() throws {
        let endpoint = try WHIPEndpoint(token: Self.token)
        defer { endpoint.stop() }
        let stream = try Child(
            broadcastBinary,
            ["stream", endpoint.url, "--whip-token", Self.token, "--duration", "40s", "--size", "320x240", "--keyframe-interval", "60s", "--quiet"])
        defer { _ = stream.wait(timeout: 5) }
        #expect(try endpoint.waitFor { number($0, "video_frames") >= 60 })
        // Encoder-made keyframes so far: the one the stream started on (the white frames' scene
        // cuts are not counted).
        let before = try endpoint.number("forced_keyframes")
        var sent = false
        let deadline = Date().addingTimeInterval(30)
        while !sent, Date() < deadline {
            sent = try endpoint.sendPLI()
            if !sent { usleep(200_000) }
        }
        #expect(sent)
        var delay: Double?
        _ = try endpoint.waitFor(timeout: 30) { state in
            delay = (state["forced_keyframe_after_pli"] as? NSNumber)?.doubleValue
            return delay != nil
        }
        print("WHIP: keyframe \(delay.map { String(format: "%.0f ms", $0 * 1000) } ?? "never") after the PLI (forced before: \(Int(before)))")
        #expect(delay != nil, "no keyframe answered the PLI")
        stream.signal(SIGINT)
        #expect(stream.wait(timeout: 60).status == 0)
    }

    @Test func survivesTheEndpointsRestart() throws {
        let endpoint = try WHIPEndpoint(token: Self.token)
        defer { endpoint.stop() }
        let stream = try Child(
            broadcastBinary,
            ["stream", endpoint.url, "--whip-token", Self.token, "--duration", "90s", "--size", "320x240", "--timeout", "5s", "--quiet"])
        #expect(try endpoint.waitFor { number($0, "video_frames") >= 30 })
        try endpoint.restart()
        // The output finds the session gone (no RTCP), DELETEs it, and offers the new endpoint a
        // new one, where media is decoded again.
        #expect(try endpoint.waitFor(timeout: 60) { number($0, "video_frames") >= 30 })
        stream.signal(SIGINT)
        let r = stream.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        // At least the one reconnect (a loaded host may starve the endpoint's RTCP past the timeout once more).
        let summary = r.stderr.split(separator: "\n").first { $0.hasPrefix("broadcast: whip+http") } ?? ""
        let reconnects = summary.firstRange(of: "reconnects=").flatMap { Int(summary[$0.upperBound...].prefix { $0.isNumber }) } ?? 0
        #expect(reconnects >= 1, "\(r.stderr)")
        let state = try endpoint.state()
        #expect(number(state, "sessions") >= 1 && number(state, "refused") == 0, "\(state)")
    }

    /// The daemon's WHIP output (`token = "${WHIP_TOKEN}"`): RTCP's round-trip time and loss in
    /// /v1/status and /metrics, the token in neither; the DELETE when the daemon stops.
    @Test func daemonReportsRTCPFiguresAndKeepsTheTokenSecret() throws {
        let endpoint = try WHIPEndpoint(token: Self.token)
        defer { endpoint.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(
            dir, sections: "[video]\nsize = \"320x240\"", outputs: streamOutput(name: "webrtc", url: endpoint.url, keys: "token = \"${WHIP_TOKEN}\""),
            environment: ["WHIP_TOKEN": Self.token])
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        func get(_ path: String) -> String {
            (try? run("/usr/bin/curl", ["-s", "--unix-socket", socket, "http://localhost\(path)"]))?.stdout ?? ""
        }
        var webrtc: [String: Any] = [:]
        var status = ""
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            status = get("/v1/status")
            if let json = try? JSONSerialization.jsonObject(with: Data(status.utf8)) as? [String: Any],
                let output = (json["outputs"] as? [[String: Any]])?.first, let figures = output["webrtc"] as? [String: Any],
                figures["round_trip_ms"] is NSNumber, figures["packets_lost"] is NSNumber
            {
                webrtc = figures
                break
            }
            usleep(250_000)
        }
        print("WHIP: daemon status webrtc = \(webrtc)")
        #expect(!webrtc.isEmpty, "no RTCP figures in the status: \(status)")
        let metrics = get("/metrics")
        #expect(metrics.contains("broadcast_output_round_trip_seconds{output=\"webrtc\"}"), "\(metrics)")
        #expect(metrics.contains("broadcast_output_packets_lost{output=\"webrtc\"}"))
        #expect(metrics.contains("broadcast_output_keyframe_requests_total{output=\"webrtc\"}"))
        #expect(!status.contains(Self.token) && !metrics.contains(Self.token))
        daemon.signal(SIGTERM)
        let ended = daemon.wait(timeout: 60)
        #expect(ended.status == 0, "\(ended.stderr.suffix(2000))")
        #expect(!ended.stderr.contains(Self.token))
        #expect(try endpoint.number("deletes") == 1)
    }

    /// What WebRTC cannot take is refused before anything starts: exit 2, one line.
    @Test(arguments: [
        (["whip+http://127.0.0.1:1/whip/x", "--tune", "none"], "WebRTC takes no B-frames"),
        (["rtmp://127.0.0.1:1/live/x", "--whip-token", "t0ken-abc"], "--whip-token applies to whip+https://"),
        (["whip+http://127.0.0.1:1/whip/x", "--audio-mic", "test", "--audio-tracks", "separate"], "WHIP sends the mix"),
    ])
    func unsuitableSettingsAreRefused(arguments: [String], mentions: String) throws {
        let r = try broadcast(["stream"] + arguments + ["--duration", "1s", "--size", "320x240"], timeout: 60)
        #expect(r.status == 2, "\(r.stderr)")
        #expect(r.stderr.contains(mentions), "\(r.stderr)")
    }

    /// A token on an output that is not WHIP is a config error at its line.
    @Test func aTokenOnAnRTMPOutputIsAConfigError() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, _) = try launchDaemon(dir, sections: "", outputs: streamOutput(url: "rtmp://127.0.0.1:1/live/key", keys: "token = \"t0ken-abc\""))
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 2, "\(r.stderr)")
        #expect(r.stderr.contains("d.toml:6: output.token: token applies to whip+https://"), "\(r.stderr)")
    }

    @Test func aWrongTokenIsRefusedWithoutARetryStorm() throws {
        let endpoint = try WHIPEndpoint(token: Self.token)
        defer { endpoint.stop() }
        let wrong = "not-the-token-4b1d"
        let r = try broadcast(
            ["stream", endpoint.url, "--whip-token", wrong, "--duration", "60s", "--size", "320x240", "--quiet"], timeout: 120)
        #expect(r.status == 1)
        #expect(r.stderr.contains("refused the session 3 times in a row"), "\(r.stderr)")
        #expect(r.stderr.contains("HTTP 401"))
        let state = try endpoint.state()
        #expect(number(state, "posts") == 3, "\(state)")
        #expect(number(state, "refused") == 3)
        #expect(!r.stderr.contains(wrong))
    }
}
