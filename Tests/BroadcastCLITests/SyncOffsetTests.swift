import Foundation
import Testing

/// `--mic-offset`, `--app-offset`, `--video-offset` and their live change, end to end: the real
/// binary on the built-in test sources (the pattern flashes white as the tone beeps, once a
/// second), files read back by ffmpeg (white frames, beep onsets) and ffprobe (packet times).
@Suite(.serialized) struct SyncOffsetTests {
    static let frame = 1.0 / 30
    /// One AAC frame at 48 kHz.
    static let aacFrame = 1024.0 / 48_000

    /// Each white frame paired with the nearest beep start: beep − flash (s), with the flash's time.
    static func beepAfterFlash(_ path: String, audioTrack: Int? = nil) throws -> (pairs: [(flash: Double, delay: Double)], summary: String) {
        let flashes = try whiteFrameTimes(path)
        let beeps = try beepStartTimes(path, audioTrack: audioTrack)
        let pairs: [(flash: Double, delay: Double)] = flashes.compactMap { flash in
            guard let beep = beeps.min(by: { abs($0 - flash) < abs($1 - flash) }), abs(beep - flash) < 0.45 else { return nil }
            return (flash, beep - flash)
        }
        let summary = "flashes \(flashes.map { String(format: "%.3f", $0) }), beeps \(beeps.map { String(format: "%.3f", $0) })"
        return (pairs, summary)
    }

    /// The largest step between consecutive packets of one stream, and the smallest (s).
    static func packetSteps(_ path: String, stream: String) throws -> (min: Double, max: Double, count: Int) {
        let times = try packetTimes(path, stream: stream)
        let steps = zip(times, times.dropFirst()).map { $1 - $0 }
        return (steps.min() ?? 0, steps.max() ?? 0, times.count)
    }

    /// Every beep lands `delay` after its white frame, within a frame, from the first second to
    /// the last; the audio track is one continuous run as long as the broadcast.
    @Test(arguments: [
        (["--mic-offset", "200ms"], 0.2),
        (["--mic-offset", "-0.15s"], -0.15),
        (["--video-offset", "200ms"], -0.2),
        (["--video-offset", "-100ms"], 0.1),
    ] as [([String], Double)])
    func everyBeepLandsAtTheOffsetFromItsFlash(arguments: [String], delay: Double) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("offset.mp4")
        let r = try broadcast(["record", file, "--size", "320x180", "--duration", "8s", "--no-realtime", "--quiet"] + arguments)
        #expect(r.status == 0, "record failed: \(r.stderr)")
        try expectDecodesCleanly(file)
        // The flash at 0 s is left out: the file's start is where an offset cuts (an early
        // source's first samples) or fills (a delayed one's silence; MP4 shows a delayed video's
        // first frame from 0), and the beep analysis counts a file opening in silence as a beep.
        let (all, summary) = try Self.beepAfterFlash(file)
        let pairs = all.filter { $0.flash > 0.5 }
        print("\(arguments.joined(separator: " ")): beep − flash \(pairs.map { String(format: "%+.0f ms", 1000 * $0.delay) })")
        // 8 s: a flash each second, less one the offset puts outside the file.
        #expect(pairs.count >= 6, "too few flash/beep pairs: \(summary)")
        for pair in pairs {
            #expect(abs(pair.delay - delay) <= Self.frame, "white frame at \(pair.flash) s: beep \(pair.delay) s after it, not \(delay): \(summary)")
        }
        let audio = try Self.packetSteps(file, stream: "a:0")
        #expect(abs(audio.max - Self.aacFrame) < 0.0005 && abs(audio.min - Self.aacFrame) < 0.0005, "audio packets not back to back: \(audio)")
        if arguments[0] == "--mic-offset" {
            // The audio is cut or filled at the end to where capture ended: as long as the video.
            let p = try probe(file)
            let (a, v) = (try #require(p.audio?.duration), try #require(p.video?.duration))
            #expect(abs(a - v) <= Self.frame, "audio \(a) s, video \(v) s")
        }
    }

    /// Moved through the control API while recording, the microphone's beeps follow each new offset
    /// from the next buffer (one made longer, then one made shorter), in its own track and in the
    /// mix, while the application audio (not moved: 300 ms apart from the microphone, beyond the
    /// mixer's lag allowance) stays on its flashes; every audio track stays one run of back-to-back
    /// packets (silence filled in, the overlap taken out), as long as the video.
    @Test func aLiveChangeMovesTheBeepsAndKeepsEveryTrackContinuous() throws {
        try withRecordingDaemon(sections: """
            [video]
            size = "320x180"
            [audio]
            mic = "test"
            app = "test"
            app_volume = "-6dB"
            [encoder]
            audio_tracks = "both"
            keyframe_interval = "1s"
            """, outputs: { recordingOutput($0, file: "rec.mp4") }) { dir, socket, up, _ in
            let file = dir.path("rec.mp4")
            #expect(up.contains("\"offsets_ms\":{\"video\":0,\"mic\":0,\"app\":0}"), "\(up)")
            let watcher = try #require(SocketConnection(socket))
            watcher.send("GET /v1/events HTTP/1.1\r\n\r\n")
            #expect(watcher.read(until: "event: state"), "\(watcher.text)")
            func mediaSeconds() throws -> Double { try AudioTracksCLITests.mediaSeconds(socket) }
            while try mediaSeconds() < 2.5 { usleep(200_000) }
            let before1 = try mediaSeconds()
            let later = try broadcast(["offset", "mic", "300ms", "--socket", socket])
            let after1 = try mediaSeconds()
            #expect(later.status == 0, "\(later.stderr)")
            #expect(later.stdout.contains("\"offsets_ms\":{\"video\":0,\"mic\":300,\"app\":0}"), "\(later.stdout)")
            #expect(watcher.read(until: "event: offset"), "\(watcher.text)")
            #expect(watcher.text.contains("\"source\":\"mic\",\"offset_ms\":300"), "\(watcher.text)")
            while try mediaSeconds() < after1 + 3.2 { usleep(200_000) }
            let before2 = try mediaSeconds()
            let code = SocketConnection.request(socket, "POST", "/v1/audio/mic/offset?value=100ms")
            let after2 = try mediaSeconds()
            #expect(code == 200)
            while try mediaSeconds() < after2 + 3.2 { usleep(200_000) }
            let stopped = try broadcast(["stop", "--socket", socket])
            #expect(stopped.status == 0, "\(stopped.stderr)")

            try expectDecodesCleanly(file)
            // Flashes well before, between and after the changes (a beep is 50 ms; a flash within
            // half a second of a change can have its beep on either side of it).
            func expected(_ flash: Double) -> Double? {
                if flash < before1 - 0.5 { return 0 }
                if flash > after1 + 0.1 && flash < before2 - 0.5 { return 0.3 }
                if flash > after2 + 0.1 { return 0.1 }
                return nil
            }
            let (mic, summary) = try Self.beepAfterFlash(file, audioTrack: 1)
            var checked: [Double: Int] = [:]
            for pair in mic {
                guard let delay = expected(pair.flash) else { continue }
                checked[delay, default: 0] += 1
                #expect(abs(pair.delay - delay) <= Self.frame, "Microphone: white frame at \(pair.flash) s, beep \(pair.delay) s after, not \(delay) (changes at \(before1)–\(after1) s and \(before2)–\(after2) s): \(summary)")
            }
            #expect(checked[0, default: 0] >= 1 && checked[0.3, default: 0] >= 2 && checked[0.1, default: 0] >= 2, "\(checked): \(summary)")
            let (app, appSummary) = try Self.beepAfterFlash(file, audioTrack: 2)
            #expect(app.count >= 7 && app.allSatisfy { abs($0.delay) <= Self.frame }, "Desktop audio: \(appSummary)")
            // The mix has both: the application's beep on the flash and the microphone's 300 ms
            // later, each exactly when that source's own track has it (a loaded machine's capture
            // can drop a period with a beep in it: then the track and the mix both lack it).
            let mixBeeps = try beepStartTimes(file, audioTrack: 0)
            let micBeeps = try beepStartTimes(file, audioTrack: 1)
            let appBeeps = try beepStartTimes(file, audioTrack: 2)
            let flashes = try whiteFrameTimes(file).filter { expected($0) == 0.3 }
            var both = 0
            for flash in flashes {
                func has(_ beeps: [Double], _ at: Double) -> Bool { beeps.contains { abs($0 - at) <= Self.frame } }
                #expect(has(mixBeeps, flash) == has(appBeeps, flash), "Mix at \(flash): \(mixBeeps); Desktop audio \(appBeeps)")
                #expect(has(mixBeeps, flash + 0.3) == has(micBeeps, flash + 0.3), "Mix at \(flash) + 0.3: \(mixBeeps); Microphone \(micBeeps)")
                if has(mixBeeps, flash) && has(mixBeeps, flash + 0.3) { both += 1 }
            }
            #expect(both >= 2, "flashes with both beeps in the mix: \(both) of \(flashes): \(mixBeeps)")
            let p = try probe(file)
            let video = try #require(p.video?.duration)
            for track in 0..<3 {
                let steps = try Self.packetSteps(file, stream: "a:\(track)")
                #expect(abs(steps.max - Self.aacFrame) < 0.0005 && abs(steps.min - Self.aacFrame) < 0.0005, "audio track \(track): packets not back to back: \(steps)")
                let duration = Double(steps.count) * Self.aacFrame
                #expect(abs(duration - video) <= 2 * Self.frame, "audio track \(track): \(duration) s of packets, video \(video) s")
            }
        }
    }

    /// The picture moved while recording: 200 ms later, then back to 0. The flashes follow (the
    /// beeps stay), the frames a shorter offset would put back in time are left out, so the video's
    /// timestamps only go forward and the file decodes cleanly.
    @Test func aLiveVideoChangeMovesTheFlashesAndKeepsTimeGoingForward() throws {
        try withRecordingDaemon(outputs: { recordingOutput($0, file: "rec.mkv") }) { dir, socket, _, _ in
            let file = dir.path("rec.mkv")
            func mediaSeconds() throws -> Double { try AudioTracksCLITests.mediaSeconds(socket) }
            while try mediaSeconds() < 2.5 { usleep(200_000) }
            let before1 = try mediaSeconds()
            let later = try broadcast(["offset", "video", "200ms", "--socket", socket])
            let after1 = try mediaSeconds()
            #expect(later.status == 0 && later.stdout.contains("\"offsets_ms\":{\"video\":200,\"mic\":0}"), "\(later.stdout) \(later.stderr)")
            while try mediaSeconds() < after1 + 3.2 { usleep(200_000) }
            let before2 = try mediaSeconds()
            #expect(SocketConnection.request(socket, "POST", "/v1/video/offset?value=0") == 200)
            let after2 = try mediaSeconds()
            while try mediaSeconds() < after2 + 3.2 { usleep(200_000) }
            #expect(try broadcast(["stop", "--socket", socket]).status == 0)

            try expectDecodesCleanly(file)
            // In the file's own order, every video packet after the one before it.
            let r = try run("/usr/bin/ffprobe", ["-v", "error", "-select_streams", "v:0", "-show_entries", "frame=pts_time", "-of", "csv=p=0", file])
            let times = r.stdout.split(separator: "\n").compactMap { Double($0.trimmingCharacters(in: CharacterSet(charactersIn: ", "))) }
            #expect(times.count > 200 && zip(times, times.dropFirst()).allSatisfy { $0 < $1 }, "frame times not increasing: \(times)")
            // Beeps (not moved) against flashes (moved): beep − flash is −200 ms while the video is late.
            let (pairs, summary) = try Self.beepAfterFlash(file)
            var checked: [Double: Int] = [:]
            for pair in pairs {
                let beep = pair.flash + pair.delay
                let delay: Double
                if beep < before1 - 0.5 { delay = 0 } else if beep > after1 + 0.1 && beep < before2 - 0.5 { delay = -0.2 } else if beep > after2 + 0.1 { delay = 0 } else { continue }
                checked[delay, default: 0] += 1
                #expect(abs(pair.delay - delay) <= Self.frame, "beep at \(beep) s: its flash \(-pair.delay) s after it, not \(-delay) (changes at \(before1)–\(after1) s and \(before2)–\(after2) s): \(summary)")
            }
            #expect(checked[0, default: 0] >= 3 && checked[-0.2, default: 0] >= 2, "\(checked): \(summary)")
        }
    }

    /// A reload's new `[audio] mic_offset` and `[video] offset` apply at once ("now"); the control
    /// API's own change to a key the reload did not touch stays.
    @Test func aReloadAppliesChangedOffsetsNow() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        func config(_ video: String, _ audio: String) -> String {
            ["[video]", "size = \"320x180\"", video, "[audio]", "mic = \"test\"", "app = \"test\"", audio,
             "[control]", "socket = \"\(socket)\"", "[[output]]", "name = \"rec\"", "path = \"\(dir.path("rec.mkv"))\""].joined(separator: "\n")
        }
        let daemon = try spawnDaemon(config: config("", "mic_offset = \"-50ms\""), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        let up = try waitUntilRecording(socket)
        #expect(up.contains("\"offsets_ms\":{\"video\":0,\"mic\":-50,\"app\":0}"), "\(up)")
        #expect(try broadcast(["offset", "app", "-0.2s", "--socket", socket]).status == 0)
        try config("offset = \"0.25s\"", "mic_offset = \"120ms\"").write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let r = try broadcast(["reload", "--socket", socket])
        #expect(r.status == 0 && r.stdout.contains("\"applies\":\"now\""), "\(r.stdout) \(r.stderr)")
        let status = try broadcast(["status", "--json", "--socket", socket]).stdout
        #expect(status.contains("\"offsets_ms\":{\"video\":250,\"mic\":120,\"app\":-200}"), "\(status)")
        // A number is seconds: 120 s is out of range, the reload is refused at its line and nothing changes.
        try config("offset = \"0.25s\"", "mic_offset = 120").write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let refused = try broadcast(["reload", "--socket", socket])
        #expect(refused.status == 1 && refused.stderr.contains("d.toml:7: audio.mic_offset: invalid value '120'"), "\(refused.stdout) \(refused.stderr)")
        let unchanged = try broadcast(["status", "--json", "--socket", socket]).stdout
        #expect(unchanged.contains("\"offsets_ms\":{\"video\":250,\"mic\":120,\"app\":-200}"), "\(unchanged)")
    }

    @Test(arguments: [
        (["--mic-offset", "3s"], "invalid --mic-offset '3s': expected an offset from -2s to +2s"),
        (["--app-offset", "-2.5s"], "invalid --app-offset '-2.5s': expected an offset from -2s to +2s"),
        (["--video-offset", "soon"], "invalid --video-offset 'soon': expected an offset from -2s to +2s"),
        (["--mic-offset", "--5ms"], "invalid --mic-offset '--5ms': expected an offset from -2s to +2s"),
    ] as [([String], String)])
    func badOffsetsExit2WithOneLine(arguments: [String], message: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let r = try broadcast(["record", dir.path("x.mkv"), "--duration", "1s", "--no-realtime"] + arguments)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
        #expect(r.stderr.contains(message), "\(r.stderr)")
        #expect(dir.contents.isEmpty)
    }

    @Test(arguments: [
        ("[audio]\nmic = \"test\"\nmic_offset = \"2.5s\"", "d.toml:8: audio.mic_offset: invalid value '2.5s': expected an offset from -2s to +2s"),
        ("[video]\nsize = \"320x180\"\noffset = \"later\"", "d.toml:8: video.offset: invalid value 'later': expected an offset from -2s to +2s"),
    ])
    func badOffsetsInTheConfigNameTheirLine(section: String, message: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let config = """
            [control]
            socket = "\(dir.path("c.sock"))"
            [[output]]
            name = "rec"
            path = "\(dir.path("rec.mkv"))"
            \(section)
            """
        try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", dir.path("d.toml")], timeout: 60)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains(message), "\(r.stderr)")
    }

    /// The control API refuses an offset out of range or malformed with 400 and the range, the
    /// CLI with exit 2; a source the broadcast has not is a 400 too.
    @Test func badOffsetsAreRefusedByTheAPI() throws {
        try withRecordingDaemon { _, socket, _, _ in
            for value in ["3s", "-2001ms", "abc", ""] {
                let c = try #require(SocketConnection(socket))
                c.send("POST /v1/audio/mic/offset?value=\(value) HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
                _ = c.readToEnd()
                #expect(c.text.hasPrefix("HTTP/1.1 400"), "\(value): \(c.text)")
                #expect(c.text.contains("from -2s to +2s"), "\(value): \(c.text)")
            }
            #expect(SocketConnection.request(socket, "POST", "/v1/audio/app/offset?value=10ms") == 400)
            #expect(SocketConnection.request(socket, "POST", "/v1/audio/speaker/offset?value=10ms") == 400)
            #expect(SocketConnection.request(socket, "GET", "/v1/video/offset") == 405)
            #expect(SocketConnection.request(socket, "POST", "/v1/video/offset?value=-40ms") == 200)
            // The value as the body, plain text.
            let c = try #require(SocketConnection(socket))
            c.send("POST /v1/audio/mic/offset HTTP/1.1\r\nContent-Length: 6\r\n\r\n+150ms")
            _ = c.readToEnd()
            #expect(c.text.hasPrefix("HTTP/1.1 200") && c.text.contains("\"offsets_ms\":{\"video\":-40,\"mic\":150}"), "\(c.text)")
            let cli = try broadcast(["offset", "mic", "2.5s", "--socket", socket])
            #expect(cli.status == 2 && cli.stderr.contains("invalid mic offset '2.5s': expected an offset from -2s to +2s"), "\(cli.stderr)")
            let negative = try broadcast(["offset", "mic", "-20ms", "--socket", socket])
            #expect(negative.status == 0 && negative.stdout.contains("\"mic\":-20"), "\(negative.stdout) \(negative.stderr)")
        }
    }
}
