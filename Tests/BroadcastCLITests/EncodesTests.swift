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
        (["--record-audio-bitrate", "256k"], "--record-audio-bitrate applies to the recording: add --record FILE"),
        (["--record", "R", "--record-audio-bitrate", "5"], "invalid --record-audio-bitrate '5'"),
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
        let (daemon, _) = try launchDaemon(
            dir, sections: "[video]\nsize = \"640x360\"\n[encoder]\nvideo_bitrate = \"1M\"\npreset = \"ultrafast\"",
            outputs: recordingOutput(dir, name: "main", file: "main.mkv")
                + recordingOutput(dir, name: "small1", file: "small1.mkv", keys: "size = \"320x180\"\nvideo_bitrate = \"300k\"")
                + recordingOutput(dir, name: "small2", file: "small2.mp4", keys: "video_bitrate = \"300k\"\nsize = \"320x180\""))
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
        ("audio_bitrate = \"5\"", "output.audio_bitrate", "5"),
    ])
    func daemonConfigErrorsNameTheOutputsKey(key: String, name: String, message: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let config = daemonConfig(dir, sections: "[video]\nsize = \"640x360\"", outputs: recordingOutput(dir, keys: key))
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
            daemonConfig(
                dir, sections: "[video]\nsize = \"640x360\"\n[encoder]\npreset = \"ultrafast\"",
                outputs: recordingOutput(dir, name: "main", file: "main.mkv") + recordingOutput(dir, name: "small", file: "small.mkv", keys: small))
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

    /// The sizes of a file's audio packets, track by track (ffprobe): what one encode made.
    static func audioPacketSizes(_ path: String) throws -> [[Int]] {
        let r = try run("/usr/bin/ffprobe", ["-v", "error", "-select_streams", "a", "-show_entries", "packet=stream_index,size", "-of", "csv=p=0", path])
        var tracks: [Int: [Int]] = [:]
        for line in r.stdout.split(separator: "\n") {
            let fields = line.split(separator: ",").compactMap { Int($0) }
            guard fields.count == 2 else { continue }
            tracks[fields[0], default: []].append(fields[1])
        }
        return tracks.keys.sorted().map { tracks[$0]! }
    }

    /// `--record-audio-bitrate` alone: the recording's audio is its own encode at that bitrate, its
    /// video the stream's (no second video encode). The test tone needs few bits whatever the rate
    /// (AAC spends what the signal needs), so the two are compared: 256k gives well over what 64k
    /// gives, where one shared encode gives the same bytes to both.
    @Test func theRecordingHasItsOwnAudioBitrate() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let local = dir.path("local.mkv")
        let r = try broadcast(
            ["stream", "rtmp://127.0.0.1:\(server.port)/live/audio", "--record", local, "--size", "320x180", "--preset", "ultrafast",
             "--audio-bitrate", "64k", "--record-audio-bitrate", "256k", "--duration", "6s"],
            timeout: 120)
        #expect(r.status == 0, "stream failed: \(r.stderr.suffix(3000))")
        server.stop()
        let copy = try #require(server.recordings.first, "nginx recorded nothing")
        #expect(r.stderr.contains("audio: an encode of its own of track 1 at 256 kb/s"), "\(r.stderr.suffix(3000))")
        #expect(!r.stderr.contains("video: an encode of its own"), "\(r.stderr.suffix(3000))")
        let recorded = try Self.audioPacketSizes(local)
        let streamed = try Self.audioPacketSizes(copy)
        #expect(recorded.count == 1 && streamed.count == 1, "\(recorded.count) and \(streamed.count) audio tracks")
        let recordedBytes = recorded.first?.reduce(0, +) ?? 0
        let streamedBytes = streamed.first?.reduce(0, +) ?? 0
        #expect(Double(recordedBytes) > 1.5 * Double(streamedBytes), "the recording's audio \(recordedBytes) B, the stream's \(streamedBytes) B")
        let recording = try probe(local)
        #expect(recording.video?.width == 320, "\(String(describing: recording.video))")
        try expectDecodesCleanly(local)
        try expectDecodesCleanly(copy)
    }

    /// The daemon: `audio_bitrate` on outputs under `audio_tracks = "separate"` encodes each track
    /// they carry again at that rate, once for every output that asks the same (the two 256k files
    /// hold the very same packets), while the others keep the broadcast's audio.
    @Test func daemonOutputsShareAnAudioEncodePerBitrate() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, _) = try launchDaemon(
            dir, sections: twoToneSources + "\n[encoder]\naudio_bitrate = \"64k\"\naudio_tracks = \"separate\"\npreset = \"ultrafast\"",
            outputs: recordingOutput(dir, name: "plain", file: "plain.mkv")
                + recordingOutput(dir, name: "hq1", file: "hq1.mkv", keys: "audio_bitrate = \"256k\"")
                + recordingOutput(dir, name: "hq2", file: "hq2.mkv", keys: "audio_bitrate = \"256k\""))
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        let up = try waitUntilRecording(dir.path("c.sock"))
        let json = try JSONSerialization.jsonObject(with: Data(up.utf8)) as? [String: Any]
        // The video stays one encode: audio_bitrate asks for no video of its own.
        #expect((json?["encodes"] as? [[String: Any]])?.count == 1, "\(up)")
        while try AudioTracksCLITests.mediaSeconds(dir.path("c.sock")) < 4 { usleep(200_000) }
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        let plain = try Self.audioPacketSizes(dir.path("plain.mkv"))
        let hq1 = try Self.audioPacketSizes(dir.path("hq1.mkv"))
        let hq2 = try Self.audioPacketSizes(dir.path("hq2.mkv"))
        #expect(plain.count == 2 && hq1.count == 2 && hq2.count == 2, "tracks: \(plain.count), \(hq1.count), \(hq2.count)")
        #expect(hq1 == hq2, "the two 256k outputs do not hold one encode's packets")
        for (track, (low, high)) in zip(plain, hq1).enumerated() {
            let lowBytes = low.reduce(0, +), highBytes = high.reduce(0, +)
            #expect(Double(highBytes) > 1.5 * Double(lowBytes), "track \(track + 1): 256k \(highBytes) B, 64k \(lowBytes) B")
        }
        for file in ["plain.mkv", "hq1.mkv", "hq2.mkv"] { try expectDecodesCleanly(dir.path(file)) }
    }

    /// `record FILE --output FILE2`: two files from one encode (the very same video packets), each
    /// whole; a URL or the same file twice is refused before anything is made.
    @Test func recordWritesSeveralFilesFromOneEncode() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let r = try broadcast(
            ["record", dir.path("a.mkv"), "--output", dir.path("b.mp4"), "--size", "320x180", "--preset", "ultrafast",
             "--duration", "3s", "--no-realtime"], timeout: 120)
        #expect(r.status == 0, "\(r.stderr.suffix(2000))")
        func videoSizes(_ path: String) throws -> [Substring] {
            try run("/usr/bin/ffprobe", ["-v", "error", "-select_streams", "v", "-show_entries", "packet=size", "-of", "csv=p=0", path])
                .stdout.split(separator: "\n")
        }
        let a = try videoSizes(dir.path("a.mkv")), b = try videoSizes(dir.path("b.mp4"))
        #expect(a.count == 90 && a == b, "\(a.count) and \(b.count) video packets, the same: \(a == b)")
        for refused in [["--output", "rtmp://127.0.0.1/live/x"], ["--output", dir.path("./a.mkv")]] {
            let bad = try broadcast(["record", dir.path("a.mkv"), "-y", "--duration", "1s", "--no-realtime"] + refused)
            #expect(bad.status == 2 && bad.stderr.split(separator: "\n").count == 1, "exit \(bad.status): \(bad.stderr)")
        }
        #expect(try probe(dir.path("a.mkv")).video?.frames == 90, "a refused run left a.mkv as it was")
    }
}
