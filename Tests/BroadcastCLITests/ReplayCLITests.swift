import Foundation
import Testing

/// One video packet as ffprobe lists it.
struct ProbedPacket {
    var time: Double
    var size: Int
    var isKeyframe: Bool
    /// CRC32 of the payload: the same packet in two files of the same encode has the same one.
    var hash: String
}

func videoPackets(_ path: String) throws -> [ProbedPacket] {
    let r = try run("/usr/bin/ffprobe", [
        "-v", "error", "-select_streams", "v:0", "-show_data_hash", "CRC32", "-show_entries", "packet=pts_time,size,flags,data_hash",
        "-of", "csv=p=0", path,
    ])
    return r.stdout.split(separator: "\n").compactMap { line in
        let f = line.split(separator: ",").map(String.init)
        guard f.count >= 4, let t = Double(f[0]), let s = Int(f[1]) else { return nil }
        return ProbedPacket(time: t, size: s, isKeyframe: f[2].hasPrefix("K"), hash: f[3])
    }.sorted { $0.time < $1.time }
}

/// Where a saved replay lies in a recording of the same encode: the time (in the recording) of
/// its first video packet, found by the payloads of its first 10 packets (the same packets).
func offsetInRecording(_ replay: [ProbedPacket], recording: [ProbedPacket]) -> Double? {
    let n = min(10, replay.count)
    guard n > 3, recording.count >= n else { return nil }
    let needle = replay.prefix(n).map(\.hash)
    for i in 0...(recording.count - n) where recording[i].hash == needle[0] {
        if Array(recording[i..<(i + n)].map(\.hash)) == needle { return recording[i].time - replay[0].time }
    }
    return nil
}

@Suite(.serialized) struct ReplayCLITests {
    static let frame = 1.0 / 30

    /// record with --replay 5s: SIGUSR2 then SIGINT at once. The saved file is 5 s plus at most a
    /// keyframe interval, starts on a keyframe, ends where the recording ends (the request), its
    /// flashes and beeps line up, and the recording beside it lost nothing.
    @Test func sigusr2SavesTheLastSecondsBesideTheRecording() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let rec = dir.path("rec.mp4")
        let child = try Child(broadcastBinary, [
            "record", rec, "--replay", "5s", "--size", "320x180", "--keyframe-interval", "1s", "--duration", "30s", "--quiet",
        ])
        // 8 s of media after the recording began (its file appears with the first packets): a busy
        // host's start-up time does not eat into them.
        for _ in 0..<600 where !FileManager.default.fileExists(atPath: rec) { usleep(100_000) }
        usleep(8_000_000)
        child.signal(SIGUSR2)
        usleep(30_000)
        child.signal(SIGINT)
        let r = child.wait(timeout: 60)
        #expect(r.status == 0, "exit \(r.status): \(r.stderr)")
        let saved = dir.contents.filter { $0.hasPrefix("replay-") && $0.hasSuffix(".mp4") }
        #expect(saved.count == 1, "\(dir.contents)")
        guard let name = saved.first else { return }
        let file = dir.path(name)
        #expect(r.stderr.contains("saved \(file)"), "\(r.stderr)")
        let p = try probe(file)
        let duration = try #require(p.video?.duration ?? p.formatDuration)
        #expect(duration >= 5 - Self.frame && duration <= 6 + 2 * Self.frame, "replay of \(duration) s")
        try expectDecodesCleanly(file)
        #expect(try mp4TopLevelBoxes(file).prefix(2) == ["ftyp", "moov"], "index in front")
        let packets = try videoPackets(file)
        #expect(packets.first?.isKeyframe == true && packets.first?.time == 0)

        // Where it lies in the recording: it ends where the recording ends, at the request.
        let recording = try videoPackets(rec)
        let offset = try #require(offsetInRecording(packets, recording: recording), "the replay's packets are not in the recording")
        let end = offset + (packets.last?.time ?? 0)
        let recordingEnd = recording.last?.time ?? 0
        #expect(end <= recordingEnd + 0.001 && end >= recordingEnd - 0.5, "replay ends at \(end) s of the recording, which ends at \(recordingEnd)")
        // The recording lost nothing: a frame every 1/30 s.
        let gaps = zip(recording, recording.dropFirst()).map { $1.time - $0.time }
        #expect((gaps.max() ?? 1) < 2 * Self.frame, "the recording has a gap of \(gaps.max() ?? 0) s")
        // Longer than any replay of 5 s could be (5 s plus a keyframe interval): the replay is a part of it.
        #expect(recordingEnd > 6 + Self.frame, "recorded \(recordingEnd) s")

        // Its flashes fall on whole seconds of the broadcast, and the beeps with them.
        let flashes = try whiteFrameTimes(file)
        let beeps = try beepStartTimes(file)
        #expect(flashes.count >= 4, "white frames at \(flashes)")
        for flash in flashes {
            let t = flash + offset
            #expect(abs(t - t.rounded()) <= Self.frame + 0.002, "white frame at \(t) s of the broadcast")
        }
        for beep in beeps where beep > 0.05 {
            let nearest = flashes.min { abs($0 - beep) < abs($1 - beep) } ?? .infinity
            #expect(abs(nearest - beep) <= 2 * Self.frame, "beep at \(beep), white frame at \(nearest)")
        }
    }

    /// stream + record + --replay 5s, two SIGUSR2 in a row mid-broadcast: two complete saves, and
    /// the stream and the recording beside the buffer lost nothing.
    @Test func savesBesideAStreamAndARecordingLoseNothing() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let local = dir.path("local.mp4")
        let url = "rtmp://127.0.0.1:\(server.port)/live/replaytest"
        let child = try Child(broadcastBinary, [
            "stream", url, "--record", local, "--replay", "5s", "--size", "320x180", "--preset", "ultrafast",
            "--video-bitrate", "1M", "--keyframe-interval", "1s", "--duration", "12s",
        ])
        usleep(7_000_000)
        child.signal(SIGUSR2)
        usleep(200_000)
        child.signal(SIGUSR2)
        let r = child.wait(timeout: 60)
        #expect(r.status == 0, "stream failed: \(r.stderr.suffix(3000))")
        server.stop()
        let saved = dir.contents.filter { $0.hasPrefix("replay-") }.sorted()
        #expect(saved.count == 2, "\(dir.contents)")
        for name in saved {
            let p = try probe(dir.path(name))
            let duration = try #require(p.video?.duration ?? p.formatDuration)
            #expect(duration >= 5 - Self.frame && duration <= 6 + 2 * Self.frame, "\(name): \(duration) s")
            try expectDecodesCleanly(dir.path(name))
        }
        let encoded = try StreamTests.encodedFrames(r, local, nominal: 360)
        let recorded = try probe(local)
        #expect(recorded.video?.frames == encoded, "local recording: \(recorded.video?.frames ?? 0) of \(encoded) frames")
        let copy = try #require(server.recordings.first)
        let frames = try #require(try probe(copy).video?.frames)
        #expect(Double(frames) >= 0.97 * Double(encoded), "the server got \(frames) of \(encoded) frames")
    }

    @Test(arguments: [
        (["--replay-max-memory", "10M"], "--replay-max-memory and --replay-path need --replay"),
        (["--replay", "0s"], "invalid --replay '0s'"),
        (["--replay", "30s", "--replay-max-memory", "lots"], "invalid --replay-max-memory 'lots'"),
        // Sizes a value may spell but no budget fits (the plan's message overflowed: exit 132).
        (["--replay", "30s", "--replay-max-memory", "900000T"], "invalid --replay-max-memory '900000T': expected a size from 1M to 1T"),
        (["--replay", "30s", "--replay-max-memory", "1000000T"], "invalid --replay-max-memory '1000000T'"),
        (["--replay", "30s", "--replay-path", "/tmp/replay.txt"], "invalid --replay-path '/tmp/replay.txt'"),
    ] as [([String], String)])
    func badReplayOptionsExit2(arguments: [String], expected: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let r = try broadcast(["record", dir.path("x.mp4"), "--duration", "1s"] + arguments, timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains(expected), "\(r.stderr)")
        #expect(dir.contents.isEmpty)
    }
}

/// The replay and on_file_finished keys of a daemon config: a bad one is exit 2 with file:line: key.
@Suite(.serialized) struct DaemonReplayConfigTests {
    @Test(arguments: [
        ("name = \"r\"\nurl = \"rtmp://h/app/key\"\nreplay = \"30s\"", "6: output.replay: a replay buffer needs path"),
        ("name = \"r\"\npath = \"/tmp/r.mp4\"\nmax_memory = \"200M\"", "6: output.max_memory: applies to replay buffers"),
        ("name = \"r\"\npath = \"/tmp/r.mp4\"\nreplay = \"30s\"\nmax_memory = \"lots\"", "7: output.max_memory: expected a size from 1M to 1T"),
        ("name = \"r\"\npath = \"/tmp/r.mp4\"\nreplay = \"30s\"\nmax_memory = \"950000T\"", "7: output.max_memory: expected a size from 1M to 1T"),
        ("name = \"r\"\npath = \"/tmp/r.mp4\"\nreplay = \"soon\"", "6: output.replay: "),
        ("name = \"r\"\npath = \"/tmp/r.mp4\"\nreplay = \"30s\"\nsegment = \"1h\"", "6: output.replay: a replay buffer has no segment"),
        ("name = \"r\"\npath = \"/tmp/r.mp4\"\non_file_finished = \"/bin/upload {path}\"", "6: output.on_file_finished: expected an argument vector"),
        ("name = \"r\"\npath = \"/tmp/r.mp4\"\non_file_finished = [\"bin/upload\", \"{path}\"]", "6: output.on_file_finished: the program must be an absolute path"),
        ("name = \"r\"\nurl = \"rtmp://h/app/key\"\non_file_finished = [\"/bin/true\"]", "6: output.on_file_finished: applies to outputs that write files"),
    ] as [(String, String)])
    func badReplayKeysAreRefused(output: String, expected: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("bad.toml")
        try "[control]\nsocket = \"\(dir.path("c.sock"))\"\n[[output]]\n\(output)\n".write(toFile: file, atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", file], timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("\(file):\(expected)"), "expected '\(file):\(expected)' in: \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
    }
}

/// The daemon's replay output: saves from `broadcast replay save`, the status, and the
/// finished-file command.
@Suite(.serialized) struct DaemonReplayTests {
    static let frame = 1.0 / 30

    func json(_ text: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
    }

    func mediaSeconds(_ socket: String) throws -> Double {
        json(try broadcast(["status", "--socket", socket]).stdout)["media_seconds"] as? Double ?? -1
    }

    func replayStatus(_ socket: String) throws -> [String: Any] {
        let outputs = json(try broadcast(["status", "--socket", socket]).stdout)["outputs"] as? [[String: Any]] ?? []
        return outputs.first { $0["name"] as? String == "replay" } ?? [:]
    }

    /// A save's path template with conversions in its directories makes them, as a recording's does
    /// (a save into `%Y/%m/` failed: "No such file or directory").
    @Test func savesIntoDirectoriesTheTemplateNames() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "replay"
            replay = "4s"
            path = "\(dir.path("saves"))/%Y/%m/%H-%M-%S.mp4"
            """)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        usleep(1_500_000)
        let saved = try broadcast(["replay", "save", "--socket", socket])
        #expect(saved.status == 0, "\(saved.stdout) \(saved.stderr)")
        let path = json(saved.stdout)["path"] as? String ?? ""
        let parts = path.dropFirst(dir.path("saves/").count).split(separator: "/")
        #expect(parts.count == 3 && parts[0].count == 4 && parts[1].count == 2, "saved at \(path)")
        #expect(FileManager.default.fileExists(atPath: path), "\(path)")
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
    }

    /// A replay buffer names its encode like any output: its saves have its own size and the
    /// recording beside it keeps the broadcast's; the status lists the two encodes.
    @Test func aReplayBufferHasAnEncodeOfItsOwn() throws {
        try withRecordingDaemon(sections: "[video]\nsize = \"640x360\"\n[encoder]\npreset = \"ultrafast\"\nkeyframe_interval = \"1s\"",
            outputs: { dir in
                """
                [[output]]
                name = "rec"
                path = "\(dir.path("rec.mkv"))"
                [[output]]
                name = "replay"
                replay = "3s"
                path = "\(dir.path("save-%H%M%S.mkv"))"
                size = "320x180"
                video_bitrate = "400k"
                """
            }) { dir, socket, status, daemon in
            let encodes = json(status)["encodes"] as? [[String: Any]] ?? []
            #expect(encodes.map { $0["size"] as? String } == ["640x360", "320x180"], "\(status)")
            #expect(encodes.last?["outputs"] as? [String] == ["replay"], "\(encodes)")
            while try mediaSeconds(socket) < 4 { usleep(200_000) }
            let saved = try broadcast(["replay", "save", "--socket", socket], timeout: 60)
            #expect(saved.status == 0, "\(saved.stdout) \(saved.stderr)")
            let path = try #require(json(saved.stdout)["path"] as? String, "\(saved.stdout)")
            daemon.signal(SIGTERM)
            #expect(daemon.wait(timeout: 60).status == 0)
            let save = try probe(path)
            #expect(save.video?.width == 320 && save.video?.height == 180, "the save: \(String(describing: save.video))")
            #expect((save.formatDuration ?? 0) >= 3 - Self.frame, "the save holds \(save.formatDuration ?? 0) s")
            #expect(try probe(dir.path("rec.mkv")).video?.width == 640)
            try expectDecodesCleanly(path)
        }
    }

    @Test func savesOnRequestWithHooksPausesAndErrors() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        // Saves go to a directory whose name has spaces and quotes; the hook must get it intact.
        let saves = dir.path("saved 'single' \"double\" dir")
        let hookLog = dir.path("hook.log")
        let hook = dir.path("hook script.sh")
        // Slow (0.7 s), and failing (exit 3) on its second run; it logs each path on a line of its own.
        try """
            #!/bin/sh
            # One at a time per output: a second run while one is going is an overlap.
            mkdir '\(dir.path("lock-"))'"$2" 2>/dev/null || echo OVERLAP >> '\(hookLog)'
            printf '%s|%s|%s\\n' "$1" "$2" "$BROADCAST_FILE" >> '\(hookLog)'
            sleep 0.7
            rmdir '\(dir.path("lock-"))'"$2"
            n=$(wc -l < '\(hookLog)')
            [ "$n" -eq 2 ] && exit 3
            exit 0
            """.write(toFile: hook, atomically: true, encoding: .utf8)
        chmod(hook, 0o755)
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "rec"
            path = "\(dir.path("rec.mp4"))"
            on_file_finished = ["\(hook)", "{path}", "{name}"]
            [[output]]
            name = "replay"
            replay = "4s"
            max_memory = "64M"
            path = "\(saves.replacing("\"", with: "\\\""))/%H-%M-%S.mp4"
            on_file_finished = ["\(hook)", "{path}", "{name}"]
            """)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        let up = try waitUntilRecording(socket)
        #expect(up.contains("\"kind\":\"replay\""), "\(up)")

        // Right after the start: less than 4 s is there (on a quiet host); the file is shorter and
        // says so. A busy host may have buffered 4 s by the time the save comes: then it is not.
        let early = try broadcast(["replay", "save", "--socket", socket])
        #expect(early.status == 0, "\(early.stderr)")
        let earlyAnswer = json(early.stdout)
        let earlySeconds = earlyAnswer["seconds"] as? Double ?? 0
        let saidShorter = earlyAnswer["shorter_than_asked"] as? Bool
        #expect(earlySeconds > 0 && (earlySeconds < 3.99 ? saidShorter == true : earlySeconds > 4 ? saidShorter == false : saidShorter != nil), "\(early.stdout)")
        var paths: [String] = []
        if let p = earlyAnswer["path"] as? String { paths.append(p) }

        usleep(5_500_000)
        let before = try mediaSeconds(socket)
        let main = try broadcast(["replay", "save", "--name", "replay", "--socket", socket])
        let after = try mediaSeconds(socket)
        #expect(main.status == 0, "\(main.stderr)")
        let mainPath = json(main.stdout)["path"] as? String ?? ""
        #expect(mainPath.hasPrefix(saves + "/"), "\(main.stdout)")
        paths.append(mainPath)

        // Two at once: both answered with a complete file of its own.
        let first = try Child(broadcastBinary, ["replay", "save", "--seconds", "2", "--socket", socket])
        let second = try Child(broadcastBinary, ["replay", "save", "--socket", socket])
        let r1 = first.wait(timeout: 60)
        let r2 = second.wait(timeout: 60)
        #expect(r1.status == 0 && r2.status == 0, "\(r1.stderr) \(r2.stderr)")
        let p1 = json(r1.stdout)["path"] as? String ?? ""
        let p2 = json(r2.stdout)["path"] as? String ?? ""
        #expect(!p1.isEmpty && !p2.isEmpty && p1 != p2, "\(r1.stdout) \(r2.stdout)")
        paths += [p1, p2]

        // During a pause of the broadcast, and across it.
        #expect(try broadcast(["pause", "--socket", socket]).status == 0)
        usleep(1_000_000)
        let during = try broadcast(["replay", "save", "--socket", socket])
        #expect(during.status == 0, "\(during.stderr)")
        let duringPath = json(during.stdout)["path"] as? String ?? ""
        paths.append(duringPath)
        #expect(try broadcast(["resume", "--socket", socket]).status == 0)
        usleep(2_000_000)
        let across = try broadcast(["replay", "save", "--socket", socket])
        #expect(across.status == 0, "\(across.stderr)")
        let acrossPath = json(across.stdout)["path"] as? String ?? ""
        paths.append(acrossPath)

        // Not a replay output: a clear error, exit 1.
        let wrong = try broadcast(["replay", "save", "--name", "rec", "--socket", socket])
        #expect(wrong.status == 1 && wrong.stderr.contains("output rec is not a replay buffer"), "\(wrong.stderr)")
        let nope = try broadcast(["replay", "save", "--name", "nope", "--socket", socket])
        #expect(nope.status == 1 && nope.stderr.contains("no output named nope"), "\(nope.stderr)")

        let status = try replayStatus(socket)
        #expect(status["saves_done"] as? Double == Double(paths.count), "\(status)")
        #expect(status["last_saved_path"] as? String == acrossPath, "\(status)")
        #expect((status["buffered_seconds"] as? Double ?? 0) >= 4, "\(status)")
        #expect((status["buffered_bytes"] as? Double ?? 0) > 0, "\(status)")
        let metrics = try run("/usr/bin/curl", ["-s", "--unix-socket", socket, "http://localhost/metrics"]).stdout
        #expect(metrics.contains("broadcast_replay_saves_done{output=\"replay\"} \(paths.count)"), "\(metrics)")
        #expect(metrics.contains("broadcast_replay_buffered_bytes{output=\"replay\"}"), "\(metrics)")
        #expect(metrics.contains("broadcast_resident_bytes ") && metrics.contains("broadcast_replay_buffers_bytes "), "\(metrics)")
        let memory = json(try broadcast(["status", "--socket", socket]).stdout)["memory"] as? [String: Any] ?? [:]
        let resident = memory["resident_bytes"] as? Double ?? 0
        let buffers = memory["replay_buffers_bytes"] as? Double ?? 0
        #expect(buffers > 0 && resident > buffers, "\(memory)")

        #expect(try broadcast(["stop", "--socket", socket]).status == 0)

        for path in paths {
            let p = try probe(path)
            #expect(p.video != nil && p.audio != nil, "\(path)")
            try expectDecodesCleanly(path)
            #expect(try videoPackets(path).first?.isKeyframe == true, "\(path) starts on a keyframe")
            let times = try packetTimes(path, stream: "v:0")
            let gaps = zip(times, times.dropFirst()).map { $1 - $0 }
            #expect((gaps.max() ?? 1) < 2 * Self.frame, "\(path): a gap of \(gaps.max() ?? 0) s")
        }
        // The main save: 4 s plus at most a keyframe interval, ending between the two status reads.
        let mainPackets = try videoPackets(mainPath)
        let mainDuration = (mainPackets.last?.time ?? 0) + Self.frame
        #expect(mainDuration >= 4 - Self.frame && mainDuration <= 5 + 2 * Self.frame, "\(mainDuration) s")
        let recording = try videoPackets(dir.path("rec.mp4"))
        if let offset = offsetInRecording(mainPackets, recording: recording) {
            let end = offset + mainDuration
            #expect(end >= before - 0.15 && end <= after + 0.05, "ends at \(end) s, asked between \(before) and \(after)")
        } else {
            Issue.record("the main save's packets are not in the recording")
        }
        let seconds2 = (try videoPackets(p1).last?.time ?? 0) + Self.frame
        #expect(seconds2 >= 2 - Self.frame && seconds2 <= 3 + 2 * Self.frame, "--seconds 2 gave \(seconds2) s")
        // Across the pause: more than the 2 s since the resume, no gap (checked above).
        let acrossDuration = (try videoPackets(acrossPath).last?.time ?? 0) + Self.frame
        #expect(acrossDuration >= 4 - Self.frame, "across the pause: \(acrossDuration) s")

        // The hook ran once per save and per finished recording, one at a time, with the exact paths.
        var hookLines: [String] = []
        for _ in 0..<100 {
            hookLines = ((try? String(contentsOfFile: hookLog, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
                .filter { $0 != "OVERLAP" }
            if hookLines.count >= paths.count + 1 { break }
            usleep(200_000)
        }
        let expected = paths.map { "\($0)|replay|\($0)" } + ["\(dir.path("rec.mp4"))|rec|\(dir.path("rec.mp4"))"]
        #expect(Set(hookLines) == Set(expected), "hook got \(hookLines), expected \(expected)")
        // In the order saved (the two asked at once in either order).
        let replayLines = hookLines.filter { $0.contains("|replay|") }.map { String($0.split(separator: "|")[0]) }
        #expect(replayLines == paths || replayLines == [paths[0], paths[1], paths[3], paths[2], paths[4], paths[5]], "in order: \(replayLines)")
        #expect(!((try? String(contentsOfFile: hookLog, encoding: .utf8)) ?? "").contains("OVERLAP"), "two commands of one output ran at once")
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 30)
        #expect(r.stderr.contains("exited with status 3"), "the failing hook is logged: \(r.stderr)")
    }

    /// Resident memory of a process (kB).
    func residentKilobytes(_ pid: Int32) -> Int {
        let text = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = text.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
    }

    /// 6 Mbit/s CBR (a keyframe interval is ~750 kB) and a 60 s buffer, with max_memory = 2M and
    /// beside it the same daemon with 1G: the bounded buffer stays under 2 MB, the process's memory
    /// is lower than the unbounded one's by about what the buffers differ (the accounting is what
    /// the process really holds), and a save holds what fits, saying it is shorter. (Each daemon
    /// in a directory of its own: one daemon per directory. Both with a 2G memory budget: a 1G
    /// replay buffer counts against the budget, and equal budgets give equal queues and pools.)
    @Test func theByteBoundHoldsInTheProcess() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        var daemons: [(Child, String)] = []
        defer { for (d, _) in daemons { d.signal(SIGKILL); _ = d.wait(timeout: 10) } }
        for memory in ["2M", "1G"] {
            let socket = dir.path("c\(memory).sock")
            try """
                [video]
                size = "640x360"
                [encoder]
                keyframe_interval = "1s"
                video_bitrate = "6M"
                rate_control = "cbr"
                [control]
                socket = "\(socket)"
                [limits]
                memory = "2G"
                [[output]]
                name = "replay"
                replay = "60s"
                max_memory = "\(memory)"
                path = "\(dir.path("\(memory)/\(memory)-%H-%M-%S.mp4"))"
                """.write(toFile: dir.path("\(memory).toml"), atomically: true, encoding: .utf8)
            daemons.append((try Child(broadcastBinary, ["daemon", "--config", dir.path("\(memory).toml")]), socket))
        }
        let (bounded, socket) = daemons[0]
        let (unbounded, otherSocket) = daemons[1]
        _ = try waitUntilRecording(socket)
        _ = try waitUntilRecording(otherSocket)
        var most: Double = 0
        for _ in 0..<15 {
            usleep(1_000_000)
            most = max(most, try replayStatus(socket)["buffered_bytes"] as? Double ?? 0)
        }
        let small = residentKilobytes(bounded.process.processIdentifier)
        let large = residentKilobytes(unbounded.process.processIdentifier)
        let status = try replayStatus(socket)
        let otherBytes = try replayStatus(otherSocket)["buffered_bytes"] as? Double ?? 0
        #expect(most > 1_000_000 && most <= 2 * 1_048_576, "buffered \(most) bytes")
        #expect((status["gops_dropped_for_memory"] as? Double ?? 0) > 0, "\(status)")
        let accounted = (otherBytes - (status["buffered_bytes"] as? Double ?? 0)) / 1024
        #expect(accounted > 5_000, "the unbounded buffer holds \(otherBytes) bytes")
        #expect(Double(large - small) > accounted / 2, "RSS \(small) kB bounded, \(large) kB unbounded; buffers differ by \(Int(accounted)) kB")
        let save = try broadcast(["replay", "save", "--socket", socket])
        #expect(save.status == 0, "\(save.stderr)")
        let answer = json(save.stdout)
        #expect(answer["shorter_than_asked"] as? Bool == true, "\(save.stdout)")
        let seconds = answer["seconds"] as? Double ?? 0
        #expect(seconds > 1 && seconds < 3.5, "saved \(seconds) s")
        try expectDecodesCleanly(answer["path"] as? String ?? "/nonexistent")
    }
}
