import Foundation
import Testing

/// issue 26 item 4: named layouts in the daemon's config, switched while recording.
@Suite(.serialized) struct SceneTests {
    static let grey75 = [191, 191, 191]
    static let magenta = [191, 0, 191]

    /// The base is the 320x180 pattern (bars 40 px: x 160..200 is magenta); scene `corner` draws a
    /// 160x90 pattern in the bottom-right quarter (bars 20 px: its x 0..20 is white), `plain` nothing.
    static func config(_ dir: TemporaryDirectory, stream: String? = nil) -> String {
        """
        [video]
        source = "test"
        size = "320x180"
        [audio]
        mic = "none"
        [control]
        socket = "\(dir.path("c.sock"))"
        [scenes]
        corner = ["test?x=160,y=90,width=160,height=90"]
        plain = []
        [[output]]
        name = "rec"
        path = "\(dir.path("scenes.mkv"))"
        """ + (stream.map { "\n[[output]]\nname = \"live\"\nurl = \"\($0)\"" } ?? "")
    }

    static func framesEncoded(_ socket: String) throws -> Int {
        let r = try broadcast(["status", "--socket", socket, "--json"], timeout: 30)
        return SamePipelineTests.videoFramesEncoded(r.stdout) ?? 0
    }

    static func waitForFrames(_ socket: String, atLeast count: Int) throws {
        for _ in 0..<600 {
            if try framesEncoded(socket) >= count { return }
            usleep(100_000)
        }
    }

    /// A scene name too long for a request line is refused with why (issue 35 item 22): it was a
    /// 400 with an empty body, and `broadcast scene` printed "the daemon refused: " and nothing.
    @Test func aTooLongSceneNameIsRefusedWithWhy() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        let daemon = try spawnDaemon(config: Self.config(dir), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        let long = try broadcast(["scene", String(repeating: "a", count: 10_000), "--socket", socket], timeout: 30)
        #expect(long.status == 1, "\(long.stderr)")
        let line = long.stderr.split(separator: "\n").first { $0.contains("the daemon refused") }.map(String.init) ?? long.stderr
        #expect(line.contains("exceed \(8 * 1024) bytes"), "\(line)")
        #expect(try broadcast(["scene", "plain", "--socket", socket], timeout: 30).status == 0, "the daemon goes on")
    }

    @Test func switchingScenesWhileRecordingChangesThePictureWithoutAGap() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        let daemon = try spawnDaemon(config: Self.config(dir), in: dir)
        _ = try waitUntilRecording(socket)
        let watcher = try #require(SocketConnection(socket))
        watcher.send("GET /v1/events HTTP/1.1\r\n\r\n")
        let before = try broadcast(["status", "--socket", socket, "--json"], timeout: 30)
        #expect(before.stdout.contains("\"scene\":\"corner\""), "the first scene at the start: \(before.stdout)")
        try Self.waitForFrames(socket, atLeast: 45)

        let switched = try broadcast(["scene", "plain", "--socket", socket], timeout: 30)
        #expect(switched.status == 0, "scene plain: \(switched.stderr)")
        #expect(watcher.read(until: "event: scene"), "a scene event: \(watcher.text)")
        let event = watcher.events.first { $0.type == "scene" }
        #expect(event?.data.contains("\"name\":\"plain\"") == true && event?.data.contains("\"was\":\"corner\"") == true, "\(String(describing: event))")
        let after = try broadcast(["status", "--socket", socket, "--json"], timeout: 30)
        #expect(after.stdout.contains("\"scene\":\"plain\""), "\(after.stdout)")
        let metrics = try #require(SocketConnection(socket))
        metrics.send("GET /metrics HTTP/1.1\r\n\r\n")
        _ = metrics.readToEnd()
        #expect(metrics.text.contains("broadcast_scene{scene=\"plain\"} 1"), "\(metrics.text)")
        #expect(metrics.text.contains("broadcast_scene{scene=\"corner\"} 0"), "\(metrics.text)")

        let unknown = try broadcast(["scene", "nope", "--socket", socket], timeout: 30)
        #expect(unknown.status != 0, "an unknown scene is refused")
        #expect(unknown.stderr.contains("no scene named nope: scenes are corner, plain"), "\(unknown.stderr)")

        let now = try Self.framesEncoded(socket)
        try Self.waitForFrames(socket, atLeast: now + 45)
        let file = dir.path("scenes.mkv")
        try DaemonEventsTests.expectEveryFrame(file, daemon: daemon)
        let duration = try #require(try probe(file).formatDuration)
        let first = try rgbPixels(file, at: 0.5, width: 320, height: 180, points: [(170, 112), (180, 60)])
        #expect(near(first[0], Self.grey75), "the corner scene's layer at 0.5 s: \(first)")
        let last = try rgbPixels(file, at: Self.awayFromTheFlash(duration - 0.4), width: 320, height: 180, points: [(170, 112), (180, 60)])
        #expect(near(last[0], Self.magenta) && near(last[1], Self.magenta), "the plain scene: the base alone: \(last)")
    }

    /// `time`, or a little before it when it falls on the test pattern's white frame at a whole
    /// second (a loaded run's file ended 0.4 s after one: its pixels read white, not the scene).
    static func awayFromTheFlash(_ time: Double) -> Double {
        let fraction = time - time.rounded(.down)
        return fraction < 0.1 || fraction > 0.95 ? time - 0.25 : time
    }

    /// The same switch while streaming to a real RTMP server beside the recording: the stream, too,
    /// has a frame every period (but those the daemon counted dropped) and changes picture.
    @Test func switchingScenesWhileStreamingKeepsEveryFrameOnTheStream() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        let daemon = try spawnDaemon(config: Self.config(dir, stream: "rtmp://127.0.0.1:\(server.port)/live/scenes"), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        try Self.waitForFrames(socket, atLeast: 60)
        let switched = try broadcast(["scene", "plain", "--socket", socket], timeout: 30)
        #expect(switched.status == 0, "scene plain: \(switched.stderr)")
        let now = try Self.framesEncoded(socket)
        try Self.waitForFrames(socket, atLeast: now + 60)
        let status = try broadcast(["status", "--socket", socket, "--json"], timeout: 30).stdout
        #expect(status.contains("\"name\":\"live\"") && status.contains("\"state\":\"live\""), "the stream is live: \(status)")
        daemon.signal(SIGTERM)
        let exited = daemon.wait(timeout: 60)
        #expect(exited.status == 0, "exit \(exited.status): \(exited.stderr.suffix(2000))")
        server.stop()
        let copy = try #require(server.recordings.first, "nginx recorded nothing")
        let frames = try packetTimes(copy, stream: "v:0")
        #expect(frames.count > 100, "\(frames.count) frames on the stream")
        let gaps = zip(frames, frames.dropFirst()).map { $1 - $0 }
        // FLV keeps milliseconds: 33.3 can read 34.
        let missing = gaps.filter { $0 > 1.0 / 30 + 0.0015 }.map { Int(($0 * 30).rounded()) - 1 }.reduce(0, +)
        #expect(missing <= countedVideoDrops(exited.stderr), "\(missing) frames missing on the stream (gaps up to \(gaps.max() ?? 0) s)")
        let duration = try #require(try probe(copy).formatDuration)
        let first = try rgbPixels(copy, at: 0.5, width: 320, height: 180, points: [(170, 112)])
        #expect(near(first[0], Self.grey75), "the corner scene's layer on the stream at 0.5 s: \(first)")
        let last = try rgbPixels(copy, at: Self.awayFromTheFlash(duration - 0.4), width: 320, height: 180, points: [(170, 112)])
        #expect(near(last[0], Self.magenta), "the plain scene on the stream: the base alone: \(last)")
        try expectDecodesCleanly(copy)
    }

    @Test func badScenesAreRefusedWithFileLineAndKey() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        for (text, expected) in [
            ("[video]\nlayers = [\"test?x=1\"]\n[scenes]\na = []\n[[output]]\nname = \"o\"\npath = \"/tmp/o.mkv\"", ":2: video.layers: [video] layers and [scenes] are both set"),
            ("[scenes]\nb = [\"test?fit=maybe\"]\n[[output]]\nname = \"o\"\npath = \"/tmp/o.mkv\"", ":2: scenes.b: invalid value 'test?fit=maybe': fit=maybe"),
            ("[scenes]\nc = \"test\"\n[[output]]\nname = \"o\"\npath = \"/tmp/o.mkv\"", ":2: scenes.c: expected an array"),
        ] {
            let file = dir.path("bad.toml")
            try text.write(toFile: file, atomically: true, encoding: .utf8)
            let r = try broadcast(["daemon", "--config", file], timeout: 30)
            #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
            #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
            #expect(r.stderr.contains(file + expected), "expected '\(expected)' in: \(r.stderr)")
        }
    }

    /// issue 35 item 16: a layer's loss is not invisible: a `layer` event says it is lost and shows
    /// its slate, another that it is back; the status lists each layer of the scene with its source
    /// state, what shows, its losses and drops, and /metrics has them by layer.
    @Test func aLostLayerIsSeenInTheEventsStatusAndMetrics() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let sections = """
            [video]
            source = "test"
            size = "320x180"
            layers = ["test:lost=1s-4s?x=0,y=0,width=160,height=90,on_loss=slate", "test?x=160,y=90,width=160,height=90"]
            [audio]
            mic = "none"
            """
        let (daemon, socket) = try launchDaemon(dir, sections: sections)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        // Every event since the start (the history), whenever this connects.
        let watcher = try #require(SocketConnection(socket))
        watcher.send("GET /v1/events HTTP/1.1\r\nLast-Event-ID: 0\r\n\r\n")
        // The first layer lost, its slate shown; then back, its picture shown (other layer events,
        // a picture's first showing at the start, may come before).
        func layerEvents() -> [[String: Any]] {
            watcher.events.filter { $0.type == "layer" }.compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.data.utf8))) as? [String: Any]
            }
        }
        func isFirst(_ event: [String: Any], _ state: String, _ shown: String) -> Bool {
            event["index"] as? Int == 1 && event["state"] as? String == state && event["shown"] as? String == shown
        }
        var seenBack = false
        for count in 1...64 where !seenBack {
            guard watcher.read(until: "event: layer", occurrences: count) else { break }
            let events = layerEvents()
            if let lost = events.firstIndex(where: { isFirst($0, "device-lost", "slate") }) {
                seenBack = events[(lost + 1)...].contains { isFirst($0, "capturing", "picture") }
            }
        }
        #expect(seenBack, "a layer event when it is lost (its slate shown), then one when it is back: \(layerEvents())")
        let status = try broadcast(["status", "--socket", socket, "--json"], timeout: 30).stdout
        let parsed = (try? JSONSerialization.jsonObject(with: Data(status.utf8))) as? [String: Any]
        let layers = parsed?["layers"] as? [[String: Any]] ?? []
        #expect(layers.map { $0["index"] as? Int } == [1, 2], "each layer of the scene: \(status)")
        let first = layers.first ?? [:]
        #expect(
            first["source_state"] as? String == "capturing" && first["shown"] as? String == "picture" && first["device_losses"] as? Int == 1
                && first["dropped"] as? Int != nil,
            "the first layer, back, lost once: \(first)")
        let metrics = try #require(SocketConnection(socket))
        metrics.send("GET /metrics HTTP/1.1\r\n\r\n")
        _ = metrics.readToEnd()
        let lines = metrics.text.split(separator: "\n")
        func value(_ prefix: String) -> Double? {
            lines.first { $0.hasPrefix(prefix) }.flatMap { $0.split(separator: " ").last }.flatMap { Double($0) }
        }
        #expect(value("broadcast_layer_device_losses_total{layer=\"1\"") == 1, "\(metrics.text)")
        #expect(value("broadcast_layer_device_lost{layer=\"1\"") == 0, "\(metrics.text)")
        #expect(value("broadcast_layer_shown{layer=\"1\"") == 1, "\(metrics.text)")
        #expect(value("broadcast_layer_dropped_total{layer=\"2\"") != nil, "\(metrics.text)")
    }
}
