import Foundation
import Testing

/// An encode per quality (issue 36 item 1): an output may ask for its own size and rate; outputs
/// that ask the same share one encode, the others keep the broadcast's. Against the real binary,
/// nginx-rtmp, and ffprobe reading what each output got.
@Suite(.serialized) struct EncodesTests {
    /// Video bits per second of a file: its video packets' bytes over their span (ffprobe).
    static func videoBitrate(_ path: String) throws -> Double {
        let r = try run("/usr/bin/ffprobe", ["-v", "error", "-select_streams", "v", "-show_entries", "packet=size,pts_time", "-of", "csv=p=0", path])
        var bytes = 0.0
        var times: [Double] = []
        for line in r.stdout.split(separator: "\n") {
            let fields = line.split(separator: ",")
            guard fields.count >= 2, let time = Double(fields[0]), let size = Double(fields[1]) else { continue }
            bytes += size
            times.append(time)
        }
        guard let first = times.min(), let last = times.max(), last > first else { return 0 }
        return bytes * 8 / (last - first)
    }

    /// "broadcast: NAME: finished, N video and M audio packets, ..." → N.
    static func videoPacketsSent(_ stderr: String, output: String) -> Int? {
        let line = stderr.split(separator: "\n").last { $0.hasPrefix("broadcast: \(output): finished, ") }
        return line.flatMap { Int($0.split(separator: "finished, ").last?.split(separator: " ").first ?? "") }
    }

    /// `stream --record` with `--record-*`: the stream keeps --size and --video-bitrate, the
    /// recording has its own size and bitrate, and each has every frame it was sent. A recording
    /// larger than the stream makes the picture the recording's size (captured once, at the larger),
    /// and the stream's encode scales it down.
    @Test(arguments: [((640, 360), 1_200_000, (320, 180), 300_000), ((320, 180), 300_000, (640, 360), 1_200_000)])
    func theRecordingHasItsOwnEncodeBesideTheStream(stream: (Int, Int), streamRate: Int, record: (Int, Int), recordRate: Int) throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let local = dir.path("local.mkv")
        let r = try broadcast(
            ["stream", "rtmp://127.0.0.1:\(server.port)/live/encodes", "--record", local, "--size", "\(stream.0)x\(stream.1)",
             "--video-bitrate", "\(streamRate / 1000)k", "--preset", "ultrafast", "--record-size", "\(record.0)x\(record.1)",
             "--record-video-bitrate", "\(recordRate / 1000)k", "--record-rate-control", "cbr", "--duration", "8s"],
            timeout: 120)
        #expect(r.status == 0, "stream failed: \(r.stderr.suffix(3000))")
        server.stop()
        let copy = try #require(server.recordings.first, "nginx recorded nothing")
        let streamed = try probe(copy)
        let recording = try probe(local)
        #expect(streamed.video?.width == stream.0 && streamed.video?.height == stream.1, "the stream: \(String(describing: streamed.video))")
        #expect(recording.video?.width == record.0 && recording.video?.height == record.1, "the recording: \(String(describing: recording.video))")
        let streamBits = try Self.videoBitrate(copy)
        let recordingBits = try Self.videoBitrate(local)
        #expect(streamBits > 0.6 * Double(streamRate) && streamBits < 1.4 * Double(streamRate), "the stream's video: \(Int(streamBits)) b/s, asked \(streamRate)")
        #expect(recordingBits > 0.6 * Double(recordRate) && recordingBits < 1.4 * Double(recordRate), "the recording's video: \(Int(recordingBits)) b/s, asked \(recordRate)")
        let sent = try #require(Self.videoPacketsSent(r.stderr, output: local), "\(r.stderr)")
        #expect(recording.video?.frames == sent, "the recording has \(recording.video?.frames ?? 0) of \(sent) frames")
        try expectDecodesCleanly(local)
        try expectDecodesCleanly(copy)
    }

    /// What cannot be an output's encode is refused before anything starts: exit 2, one line.
    @Test(arguments: [
        (["--record-size", "320x180"], "--record-size applies to the recording: add --record FILE"),
        (["--record", "R", "--size", "640x360", "--record-size", "1280x240"], "one must hold the other"),
        (["--record", "R", "--record-size", "321x180"], "invalid --record-size '321x180'"),
        (["--record", "R", "--record-size", "0x0"], "invalid --record-size '0x0'"),
        (["--record", "R", "--record-video-bitrate", "5"], "invalid --record-video-bitrate '5'"),
        (["--record", "R", "--record-rate-control", "fast"], "invalid --record-rate-control 'fast'"),
        (["--min-video-bitrate", "500k"], "--min-video-bitrate applies to --adaptive streams: add --adaptive"),
        (["--adaptive", "--min-video-bitrate", "5M"], "invalid --min-video-bitrate 5000k: above the output's video bitrate (3000k)"),
        (["--adaptive", "--min-video-bitrate", "fast"], "invalid --min-video-bitrate 'fast'"),
    ] as [([String], String)])
    func badEncodesExit2WithOneLine(arguments: [String], message: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let r = try broadcast(
            ["stream", "srt://127.0.0.1:9?mode=caller", "--duration", "1s", "--no-realtime"] + arguments.map { $0 == "R" ? dir.path("r.mkv") : $0 })
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
        #expect(r.stderr.contains(message), "\(r.stderr)")
        #expect(dir.contents.isEmpty)
    }

    /// The daemon: `[[output]]` keys of [encoder]'s names give an output its own encode; two
    /// outputs that ask the same share it, and the status shows each encode with its outputs.
    @Test func daemonOutputsShareAnEncodePerQuality() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let config = """
            [video]
            size = "640x360"
            [encoder]
            video_bitrate = "1M"
            preset = "ultrafast"
            [control]
            socket = "\(dir.path("c.sock"))"
            [[output]]
            name = "main"
            path = "\(dir.path("main.mkv"))"
            [[output]]
            name = "small1"
            path = "\(dir.path("small1.mkv"))"
            size = "320x180"
            video_bitrate = "300k"
            [[output]]
            name = "small2"
            path = "\(dir.path("small2.mp4"))"
            video_bitrate = "300k"
            size = "320x180"
            """
        let daemon = try spawnDaemon(config: config, in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        let up = try waitUntilRecording(dir.path("c.sock"))
        let json = try JSONSerialization.jsonObject(with: Data(up.utf8)) as? [String: Any]
        let encodes = try #require(json?["encodes"] as? [[String: Any]], "\(up)")
        #expect(encodes.count == 2, "\(encodes)")
        #expect(encodes.first?["size"] as? String == "640x360" && encodes.first?["outputs"] as? [String] == ["main"], "\(encodes)")
        #expect(encodes.last?["size"] as? String == "320x180" && encodes.last?["outputs"] as? [String] == ["small1", "small2"], "\(encodes)")
        while try AudioTracksCLITests.mediaSeconds(dir.path("c.sock")) < 3 { usleep(200_000) }
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        let main = try probe(dir.path("main.mkv"))
        #expect(main.video?.width == 640, "\(String(describing: main.video))")
        for small in ["small1.mkv", "small2.mp4"] {
            let p = try probe(dir.path(small))
            #expect(p.video?.width == 320 && p.video?.height == 180, "\(small): \(String(describing: p.video))")
            #expect(p.video?.frames == main.video?.frames, "\(small): \(p.video?.frames ?? 0) frames, main \(main.video?.frames ?? 0)")
        }
    }

    /// A config error names the file, the line and the output's key: a size larger than the
    /// picture, an odd size, a bad bitrate.
    @Test(arguments: [
        ("size = \"1280x720\"", "output.size", "larger than the picture (640x360)"),
        ("size = \"321x180\"", "output.size", "even"),
        ("video_bitrate = \"5\"", "output.video_bitrate", "from 8k"),
        ("crf = 99", "output.crf", "99"),
        ("adaptive = true", "output.adaptive", "adaptive is for live outputs"),
    ])
    func daemonConfigErrorsNameTheOutputsKey(key: String, name: String, message: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let config = """
            [video]
            size = "640x360"
            [control]
            socket = "\(dir.path("c.sock"))"
            [[output]]
            name = "rec"
            path = "\(dir.path("rec.mkv"))"
            \(key)
            """
        try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", dir.path("d.toml")], timeout: 60)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("d.toml:8: \(name):"), "\(r.stderr)")
        #expect(r.stderr.contains(message), "\(r.stderr)")
    }

    /// A reload that changes an output's encode replaces that output alone (its new encode starts
    /// on a keyframe), the other goes on untouched, and an encode no output takes any more is gone.
    /// A reload asking for a size larger than the picture is refused at its line; the outputs go on.
    @Test func aReloadChangesOneOutputsEncodeAlone() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        func config(_ small: String) -> String {
            """
            [video]
            size = "640x360"
            [encoder]
            preset = "ultrafast"
            [control]
            socket = "\(dir.path("c.sock"))"
            [[output]]
            name = "main"
            path = "\(dir.path("main.mkv"))"
            [[output]]
            name = "small"
            path = "\(dir.path("small.mkv"))"
            \(small)
            """
        }
        let daemon = try spawnDaemon(config: config("size = \"320x180\""), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        let r = try DaemonReloadAnswerTests.reload(dir, config("size = \"480x270\"\nvideo_bitrate = \"500k\""))
        #expect(r.status == 0, "\(r.stderr)")
        #expect(DaemonReloadAnswerTests.change(r.answer, "main").result == "unchanged", "\(r.stderr)")
        #expect(DaemonReloadAnswerTests.change(r.answer, "small").result == "replaced", "\(r.stderr)")
        let status = try broadcast(["status", "--json", "--socket", dir.path("c.sock")]).stdout
        let encodes = (try JSONSerialization.jsonObject(with: Data(status.utf8)) as? [String: Any])?["encodes"] as? [[String: Any]] ?? []
        #expect(encodes.map { $0["size"] as? String } == ["640x360", "480x270"], "\(encodes)")
        #expect(encodes.last?["outputs"] as? [String] == ["small"], "\(encodes)")
        let refused = try DaemonReloadAnswerTests.reload(dir, config("size = \"1280x720\""))
        #expect(refused.status != 0, "\(refused.stderr)")
        #expect(refused.stderr.contains("d.toml:13: output.size: ") && refused.stderr.contains("larger than the picture (640x360)"), "\(refused.stderr)")
        while try AudioTracksCLITests.mediaSeconds(dir.path("c.sock")) < 3 { usleep(200_000) }
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        // The replacement records beside the first file (a new name: nothing is overwritten).
        let widths = try dir.contents.filter { $0.hasPrefix("small") }.sorted().map { try probe(dir.path($0)).video?.width }
        #expect(widths.count == 2 && widths.contains(320) && widths.contains(480), "\(dir.contents): \(widths)")
        #expect(try probe(dir.path("main.mkv")).video?.width == 640)
        try expectDecodesCleanly(dir.path("main.mkv"))
    }
}
