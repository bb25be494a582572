import Foundation
import Testing

/// `--audio-tracks`, per-source volume and mute, end to end: the real binary on the built-in test
/// sources (a beep on each audio source with every white frame), files read back by ffprobe and
/// ffmpeg, RTMP through the local nginx, mute through the daemon's control API.
@Suite(.serialized) struct AudioTracksCLITests {
    static let frame = 1.0 / 30

    /// Titles of the audio streams of a file, in order (MP4/MOV: the handler name; MKV: the title).
    static func audioTitles(_ path: String) throws -> [String?] {
        let r = try run("/usr/bin/ffprobe", ["-v", "error", "-select_streams", "a", "-show_entries", "stream=index:stream_tags=title,handler_name", "-of", "json", path])
        let json = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]
        return (json?["streams"] as? [[String: Any]] ?? []).map { stream in
            let tags = stream["tags"] as? [String: Any] ?? [:]
            return (tags["title"] ?? tags["handler_name"]) as? String
        }
    }

    /// Each audio track's beeps against the white frames, within a frame, all through the file.
    static func expectEveryTrackInSync(_ path: String, tracks: Int, atLeast: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let flashes = try whiteFrameTimes(path)
        #expect(flashes.count >= atLeast, "\(path): white frames at \(flashes)", sourceLocation: sourceLocation)
        for track in 0..<tracks {
            let beeps = try beepStartTimes(path, audioTrack: track)
            #expect(beeps.count >= atLeast, "\(path) track \(track): beeps at \(beeps)", sourceLocation: sourceLocation)
            for (flash, beep) in zip(flashes, beeps) {
                #expect(abs(flash - beep) <= Self.frame, "\(path) track \(track): white frame at \(flash) s, beep at \(beep) s", sourceLocation: sourceLocation)
            }
        }
    }

    @Test(arguments: [("mp4", "separate"), ("mkv", "both"), ("ts", "both"), ("mov", "separate")])
    func recordsATrackPerSourceTitledAndInSync(container: String, mode: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("tracks.\(container)")
        let r = try broadcast([
            "record", file, "--size", "320x180", "--audio-app", "test", "--audio-tracks", mode, "--duration", "5s", "--no-realtime", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let titles = try Self.audioTitles(file)
        let expected: [String?] = mode == "both" ? ["Mix", "Microphone", "Desktop audio"] : ["Microphone", "Desktop audio"]
        if container == "ts" {
            // MPEG-TS: FFmpeg's muxer writes no per-stream title; the tracks come in the same order.
            #expect(titles.count == expected.count, "\(titles)")
        } else {
            #expect(titles == expected)
        }
        try expectDecodesCleanly(file)
        try Self.expectEveryTrackInSync(file, tracks: expected.count, atLeast: 5)
    }

    /// `--mute-mic`: the microphone's track is silence from the start, the application's beeps.
    @Test func startsMutedFromTheCommandLine() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("muted.mkv")
        let r = try broadcast([
            "record", file, "--size", "320x180", "--audio-app", "test", "--audio-tracks", "separate", "--mute-mic", "--duration", "4s", "--no-realtime", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        #expect(try Self.maxVolume(file, audioTrack: 0) < -60, "the microphone's track is silence")
        #expect(try Self.maxVolume(file, audioTrack: 1) > -10, "the application's beeps")
        #expect(try beepStartTimes(file, audioTrack: 1).count >= 3)
    }

    /// A source's own track is clipped after its gain, as the mix is: at +20 dB the microphone's
    /// beeps (about -6 dBFS as captured) are cut at full scale in its own track as in the mix
    /// (issue 35 item 11: the mix decoded at +6 dBFS, the Microphone track at +14). Measured in
    /// float (astats: volumedetect converts to 16 bits, which clips); a clipped tone still decodes
    /// above 0 dBFS from AAC's ringing, the same in both tracks.
    @Test func everyTrackIsClippedAfterItsGain() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("loud.mkv")
        let r = try broadcast([
            "record", file, "--size", "320x180", "--audio-app", "test", "--audio-tracks", "both", "--mic-volume", "+20dB",
            "--duration", "3s", "--no-realtime", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let mix = try Self.peakLevel(file, audioTrack: 0)
        let microphone = try Self.peakLevel(file, audioTrack: 1)
        let app = try Self.peakLevel(file, audioTrack: 2)
        #expect(microphone <= mix + 1, "Microphone \(microphone) dBFS, Mix \(mix) dBFS")
        #expect(microphone > app + 3, "Microphone \(microphone) dBFS is not louder than Desktop audio \(app) dBFS")
    }

    /// The peak of one audio track in dBFS, decoded to float (astats), so a peak above full scale shows.
    static func peakLevel(_ path: String, audioTrack: Int) throws -> Double {
        let r = try run("/usr/bin/ffmpeg", ["-nostdin", "-hide_banner", "-nostats", "-i", path, "-map", "0:a:\(audioTrack)", "-af", "astats=measure_perchannel=none", "-f", "null", "-"])
        let line = r.stderr.split(separator: "\n").last { $0.contains("Peak level dB: ") } ?? ""
        let value = line.split(separator: "Peak level dB: ").last.map { $0.trimmingCharacters(in: .whitespaces) }
        return try #require(value.flatMap { Double($0) }, "\(r.stderr)")
    }

    /// The loudest sample of one audio track, in dBFS (ffmpeg's volumedetect; -91 for digital
    /// silence); `from`/`to`: only that stretch (seconds of the file).
    static func maxVolume(_ path: String, audioTrack: Int, from: Double? = nil, to: Double? = nil) throws -> Double {
        let range = (from.map { ["-ss", "\($0)"] } ?? []) + (to.map { ["-to", "\($0)"] } ?? [])
        let r = try run("/usr/bin/ffmpeg", ["-nostdin", "-hide_banner", "-nostats"] + range + ["-i", path, "-map", "0:a:\(audioTrack)", "-af", "volumedetect", "-f", "null", "-"])
        let line = r.stderr.split(separator: "\n").first { $0.contains("max_volume: ") } ?? ""
        let value = line.split(separator: "max_volume: ").last?.split(separator: " ").first
        return try #require(value.flatMap { Double($0) }, "\(r.stderr)")
    }

    /// RTMP (FLV) carries one audio track: the server gets the mix, in sync, while the local
    /// recording of the same encode has a track per source.
    @Test func rtmpGetsTheMixWhileTheRecordingHasATrackPerSource() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let local = dir.path("local.mkv")
        let r = try broadcast(
            ["stream", "rtmp://127.0.0.1:\(server.port)/live/tracks", "--record", local, "--audio-app", "test", "--audio-tracks", "separate",
             "--size", "320x180", "--preset", "ultrafast", "--video-bitrate", "1M", "--duration", "8s"],
            timeout: 60)
        #expect(r.status == 0, "stream failed: \(r.stderr.suffix(3000))")
        server.stop()
        let copy = try #require(server.recordings.first, "nginx recorded nothing")
        #expect(try Self.audioTitles(copy).count == 1)
        try Self.expectEveryTrackInSync(copy, tracks: 1, atLeast: 6)
        #expect(try Self.audioTitles(local) == ["Microphone", "Desktop audio"])
        try Self.expectEveryTrackInSync(local, tracks: 2, atLeast: 7)
    }

    /// SRT carries MPEG-TS, which holds every track: the receiver gets what was asked.
    @Test func srtGetsEveryTrackAsked() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let port = try freePort()
        let received = dir.path("received.ts")
        let receiver = try srtReceiver(port: port, into: received)
        usleep(1_000_000)
        let r = try broadcast(
            ["stream", "srt://127.0.0.1:\(port)?mode=caller", "--audio-app", "test", "--audio-tracks", "both",
             "--size", "320x180", "--preset", "ultrafast", "--video-bitrate", "1M", "--duration", "6s"],
            timeout: 60)
        let rr = receiver.wait(timeout: 20)
        #expect(r.status == 0, "exit \(r.status): \(r.stderr.suffix(3000))")
        #expect(try Self.audioTitles(received).count == 3, "receiver: \(rr.stderr)")
        try Self.expectEveryTrackInSync(received, tracks: 3, atLeast: 4)
    }

    @Test(arguments: [
        (["--audio-tracks", "stereo"], "invalid --audio-tracks 'stereo': accepted are mixed, separate and both"),
        (["--mic-volume", "30dB"], "invalid --mic-volume '30dB': expected decibels from -60dB to +20dB"),
        (["--app-volume", "loud"], "invalid --app-volume 'loud': expected decibels from -60dB to +20dB"),
    ] as [([String], String)])
    func badValuesExit2WithOneLine(arguments: [String], message: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let r = try broadcast(["record", dir.path("x.mkv"), "--duration", "1s", "--no-realtime"] + arguments)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
        #expect(r.stderr.contains(message), "\(r.stderr)")
        #expect(dir.contents.isEmpty)
    }

    /// `broadcast mute mic` while recording both tracks: answered with the state, an `audio` event,
    /// the microphone's beeps end in its own track from then on, the application's track and the
    /// mix go on beeping; unknown sources and actions are refused (exit 2, HTTP 400).
    @Test func muteThroughTheControlAPISilencesThatSource() throws {
        try withRecordingDaemon(sections: """
            [video]
            size = "320x180"
            [audio]
            mic = "test"
            app = "test"
            app_volume = "-6dB"
            [encoder]
            audio_tracks = "both"
            """) { dir, socket, up, _ in
            let file = dir.path("rec.mkv")
            #expect(up.contains("\"audio\":{\"mic\":{\"muted\":false,\"volume_db\":0},\"app\":{\"muted\":false,\"volume_db\":-6}}"), "\(up)")
            let watcher = try #require(SocketConnection(socket))
            watcher.send("GET /v1/events HTTP/1.1\r\n\r\n")
            #expect(watcher.read(until: "event: state"), "\(watcher.text)")
            // Media time before the request and after its answer: the mute lands between them.
            func mediaSeconds() throws -> Double { try Self.mediaSeconds(socket) }
            var before = try mediaSeconds()
            while before < 2.5 {
                usleep(200_000)
                before = try mediaSeconds()
            }
            let muted = try broadcast(["mute", "mic", "--socket", socket])
            let after = try mediaSeconds()
            #expect(muted.status == 0, "\(muted.stderr)")
            #expect(muted.stdout.contains("\"mic\":{\"muted\":true"), "\(muted.stdout)")
            #expect(watcher.read(until: "event: audio"), "\(watcher.text)")
            #expect(watcher.text.contains("\"source\":\"mic\",\"state\":\"muted\""), "\(watcher.text)")

            let wrongSource = try broadcast(["mute", "speaker", "--socket", socket])
            #expect(wrongSource.status == 2, "\(wrongSource.stderr)")
            #expect(wrongSource.stderr.contains("invalid source 'speaker': accepted are mic and app"), "\(wrongSource.stderr)")
            #expect(SocketConnection.request(socket, "POST", "/v1/audio/speaker/mute") == 400)
            #expect(SocketConnection.request(socket, "POST", "/v1/audio/mic/louder") == 400)
            #expect(SocketConnection.request(socket, "GET", "/v1/audio/mic/mute") == 405)

            // Three more beeps, then the end.
            while try mediaSeconds() < after + 3.2 { usleep(200_000) }
            let stopped = try broadcast(["stop", "--socket", socket])
            #expect(stopped.status == 0, "\(stopped.stderr)")
            let idle = try broadcast(["unmute", "mic", "--socket", socket])
            #expect(idle.status == 1 && idle.stderr.contains("cannot unmute mic: no broadcast is running"), "\(idle.stderr)")
            #expect(SocketConnection.request(socket, "POST", "/v1/audio/mic/unmute") == 409)

            #expect(try Self.audioTitles(file) == ["Mix", "Microphone", "Desktop audio"])
            let mix = try beepStartTimes(file, audioTrack: 0)
            let mic = try beepStartTimes(file, audioTrack: 1)
            let app = try beepStartTimes(file, audioTrack: 2)
            // A beep is 50 ms: one that began before the answer may still sound after it.
            #expect(mic.contains { $0 < before - 0.1 }, "the microphone beeped before the mute: \(mic)")
            #expect(!mic.contains { $0 > after + 0.1 }, "the microphone beeped after the mute (answered at \(after) s): \(mic)")
            #expect(app.filter { $0 > after + 0.1 }.count >= 2, "the application goes on: \(app)")
            #expect(mix.filter { $0 > after + 0.1 }.count >= 2, "the mix goes on with the application: \(mix)")
            // The mix: both sources before (0.5 + 0.25 at the beeps, about -2.5 dBFS), the application
            // alone after (0.25, -12 dBFS).
            let mixBefore = try Self.maxVolume(file, audioTrack: 0, to: before - 0.1)
            let mixAfter = try Self.maxVolume(file, audioTrack: 0, from: after + 0.1)
            #expect(mixBefore > -5 && mixAfter < -9 && mixAfter > -15, "the mix peaks at \(mixBefore) dBFS before the mute, \(mixAfter) after")
        }
    }

    /// A source the broadcast does not have cannot be muted (400, one line); the status lists only
    /// the sources there are.
    @Test func anAbsentSourceIsRefused() throws {
        try withRecordingDaemon { _, socket, up, _ in
            #expect(up.contains("\"audio\":{\"mic\":{\"muted\":false,\"volume_db\":0}}"), "\(up)")
            let r = try broadcast(["mute", "app", "--socket", socket])
            #expect(r.status == 1 && r.stderr.contains("cannot mute app: the broadcast has no app audio"), "\(r.stderr)")
            #expect(SocketConnection.request(socket, "POST", "/v1/audio/app/mute") == 400)
        }
    }

    /// A reload applies a changed `mic_mute`/`app_volume` at once; a level it does not change stays
    /// as the control API left it.
    @Test func reloadAppliesChangedLevelsOnly() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        func config(_ audio: String) -> String {
            ["[video]", "size = \"320x180\"", "[audio]", "mic = \"test\"", "app = \"test\"", audio,
             "[control]", "socket = \"\(socket)\"", "[[output]]", "name = \"rec\"", "path = \"\(dir.path("rec.mkv"))\""].joined(separator: "\n")
        }
        let daemon = try spawnDaemon(config: config(""), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        let up = try waitUntilRecording(socket)
        #expect(up.contains("\"mic\":{\"muted\":false"), "\(up)")
        func reload(_ audio: String) throws -> String {
            try config(audio).write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
            let r = try broadcast(["reload", "--socket", socket])
            #expect(r.status == 0, "\(r.stderr)")
            return try broadcast(["status", "--json", "--socket", socket]).stdout
        }
        let muted = try reload("mic_mute = true")
        #expect(muted.contains("\"mic\":{\"muted\":true,\"volume_db\":0}"), "\(muted)")
        let unmuted = try broadcast(["unmute", "mic", "--socket", socket])
        #expect(unmuted.status == 0 && unmuted.stdout.contains("\"mic\":{\"muted\":false"), "\(unmuted.stdout)")
        let other = try reload("mic_mute = true\napp_volume = -3")
        #expect(other.contains("\"mic\":{\"muted\":false,\"volume_db\":0},\"app\":{\"muted\":false,\"volume_db\":-3}"), "\(other)")
    }

    /// `mic_denoise` changed by a reload applies at the next start, and the answer says so: the
    /// suppressor is made with the encode (its state allocated at the start).
    @Test func reloadDefersMicDenoiseToTheNextStart() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        func config(_ audio: String) -> String {
            ["[video]", "size = \"320x180\"", "[audio]", "mic = \"test\"", "app = \"none\"", audio,
             "[control]", "socket = \"\(socket)\"", "[[output]]", "name = \"rec\"", "path = \"\(dir.path("rec.mkv"))\""].joined(separator: "\n")
        }
        let daemon = try spawnDaemon(config: config(""), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        try config("mic_denoise = true").write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let r = try broadcast(["reload", "--socket", socket])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stdout.contains("\"applies\":\"partly\""), "\(r.stdout)")
        #expect(r.stdout.contains("[audio] mic_denoise false → true: the running broadcast keeps its microphone's noise suppression as it started; this applies at the next start"), "\(r.stdout)")
    }

    /// `[audio] mic_denoise = true`: the daemon's broadcast denoises its microphone (it says so at
    /// the start) and records as usual.
    @Test func daemonDenoisesTheMicrophoneWithTheConfigKey() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        let config = ["[video]", "size = \"320x180\"", "[audio]", "mic = \"test\"", "app = \"none\"", "mic_denoise = true",
                      "[control]", "socket = \"\(socket)\"", "[[output]]", "name = \"rec\"", "path = \"\(dir.path("rec.mkv"))\""].joined(separator: "\n")
        let daemon = try spawnDaemon(config: config, in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        Thread.sleep(forTimeInterval: 2)
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr.suffix(2000))")
        #expect(r.stderr.contains("microphone noise suppression on"), "\(r.stderr.suffix(2000))")
        try expectDecodesCleanly(dir.path("rec.mkv"))
        #expect(try beepStartTimes(dir.path("rec.mkv")).count >= 1, "the test tone's beeps are in the recording")
    }

    /// The daemon's media time (`media_seconds` of its status).
    static func mediaSeconds(_ socket: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> Double {
        let r = try broadcast(["status", "--json", "--socket", socket])
        let json = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]
        return try #require(json?["media_seconds"] as? Double, "\(r.stdout)", sourceLocation: sourceLocation)
    }

    /// A daemon recording `separate` tracks with the microphone at -60 dB (the application's beeps
    /// at full level), its socket in `dir`, `extra` outputs after the recording.
    static func separateTracksConfig(_ dir: TemporaryDirectory, tracks: String = "separate", extra: String = "") -> String {
        ["[video]", "size = \"320x180\"", "[audio]", "mic = \"test\"", "app = \"test\"", "mic_volume = -60",
         "[encoder]", "audio_tracks = \"\(tracks)\"", "keyframe_interval = \"1s\"",
         "[control]", "socket = \"\(dir.path("c.sock"))\"", "[[output]]", "name = \"rec\"", "path = \"\(dir.path("rec.mkv"))\"", extra,
        ].joined(separator: "\n")
    }

    /// An FLV output added by a reload under `separate` gets the mix, like one configured at the
    /// start (issue 35 item 9: it got the first track, the microphone's, at -65.9 dBFS while the
    /// mix is the application's beeps at about -5).
    @Test func anFLVOutputAddedByAReloadGetsTheMix() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let daemon = try spawnDaemon(config: Self.separateTracksConfig(dir), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        let output = ["[[output]]", "name = \"flv\"", "path = \"\(dir.path("added.flv"))\""].joined(separator: "\n")
        let r = try DaemonReloadAnswerTests.reload(dir, Self.separateTracksConfig(dir, extra: output))
        #expect(r.status == 0, "\(r.stderr)")
        #expect(DaemonReloadAnswerTests.change(r.answer, "flv").result == "added", "\(r.stderr)")
        // Three beeps on the added output.
        let added = try Self.mediaSeconds(dir.path("c.sock"))
        while try Self.mediaSeconds(dir.path("c.sock")) < added + 3.2 { usleep(200_000) }
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        #expect(try Self.audioTitles(dir.path("added.flv")).count == 1)
        let flv = try Self.maxVolume(dir.path("added.flv"), audioTrack: 0)
        let microphone = try Self.maxVolume(dir.path("rec.mkv"), audioTrack: 0)
        let app = try Self.maxVolume(dir.path("rec.mkv"), audioTrack: 1)
        #expect(flv > app - 6, "the added FLV's audio peaks at \(flv) dBFS; the application's track at \(app), the microphone's at \(microphone)")
        #expect(try beepStartTimes(dir.path("added.flv"), audioTrack: 0).count >= 2)
    }

    /// A reload that changes `audio_tracks` says the running broadcast keeps its tracks until the
    /// next start (issue 35 item 10: it answered "applies": "now" and nothing changed).
    @Test func aReloadOfTheTracksSaysNextStart() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let daemon = try spawnDaemon(config: Self.separateTracksConfig(dir, tracks: "mixed"), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        let r = try DaemonReloadAnswerTests.reload(dir, Self.separateTracksConfig(dir, tracks: "both"))
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.answer["applies"] as? String != "now", "\(r.stderr)")
        #expect(r.answer["complete"] as? Bool == false, "\(r.stderr)")
        let later = (r.answer["next_start"] as? [String]) ?? []
        #expect(later.contains { $0.contains("audio_tracks") && $0.contains("mixed") && $0.contains("both") }, "\(r.stderr)")
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        #expect(try Self.audioTitles(dir.path("rec.mkv")).count == 1, "the running recording keeps its one track")
    }
}
