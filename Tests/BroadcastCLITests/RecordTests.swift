import Foundation
import Testing

/// `broadcast record` end to end, each output checked by ffprobe/ffmpeg decoding it.
@Suite(.serialized) struct RecordTests {
    static let frame = 1.0 / 30

    @Test(arguments: ["mp4", "mkv", "mov", "ts", "flv"])
    func everyContainerHasTheRequestedMedia(container: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("out.\(container)")
        let r = try broadcast(["record", file, "--size", "640x360", "--fps", "30", "--duration", "10s", "--no-realtime", "--quiet"])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let p = try probe(file)
        let video = try #require(p.video)
        let audio = try #require(p.audio)
        #expect(video.codec == "h264")
        #expect(audio.codec == "aac")
        #expect(video.width == 640 && video.height == 360)
        let frames = try #require(video.frames)
        #expect(abs(frames - 300) <= 1, "\(frames) frames for 10 s at 30 fps")
        let duration = try #require(video.duration ?? p.formatDuration)
        #expect(abs(duration - 10) <= Self.frame + 0.001, "video duration \(duration) s")
        try expectDecodesCleanly(file)
        #expect(dir.contents == ["out.\(container)"], "only the recording is left: \(dir.contents)")
    }

    @Test func audioAndVideoStayInSync() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("sync.mp4")
        let r = try broadcast(["record", file, "--size", "640x360", "--duration", "10s", "--no-realtime", "--quiet"])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let flashes = try whiteFrameTimes(file)
        let beeps = try beepStartTimes(file)
        #expect(flashes.count == 10, "white frames at \(flashes)")
        #expect(beeps.count == 10, "beeps at \(beeps)")
        // Every beep has its white frame within one frame, from the first second to the last (no drift).
        for (flash, beep) in zip(flashes, beeps) {
            #expect(abs(flash - beep) <= Self.frame, "white frame at \(flash) s, beep at \(beep) s")
        }
    }

    /// Audio alone: a playable file, and the summary line gives its real size (finishing writes
    /// most of such a file, and the size used to be read before that).
    @Test func audioOnlyRecordingAndItsSize() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("voice.mp4")
        let r = try broadcast(["record", file, "--video", "none", "--duration", "3s", "--no-realtime"])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let p = try probe(file)
        #expect(p.video == nil)
        let audio = try #require(p.audio)
        #expect(audio.codec == "aac")
        let duration = try #require(audio.duration ?? p.formatDuration)
        #expect(abs(duration - 3) < 0.05, "audio duration \(duration) s")
        let size = try #require(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int)
        let summary = (r.stdout + r.stderr).split(separator: "\n").first { $0.contains("recorded ") }.map(String.init) ?? ""
        #expect(summary.contains(" \(size / 1024) KiB"), "file of \(size) bytes; summary: '\(summary)'")
        try expectDecodesCleanly(file)
    }

    @Test func mp4IsFinalizedWithTheIndexAtTheFront() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("final.mp4")
        let r = try broadcast(["record", file, "--size", "320x180", "--duration", "3s", "--no-realtime", "--quiet"])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let boxes = try mp4TopLevelBoxes(file)
        let moov = try #require(boxes.firstIndex(of: "moov"))
        let mdat = try #require(boxes.firstIndex(of: "mdat"))
        #expect(moov < mdat, "moov should precede mdat: \(boxes)")
        #expect(!boxes.contains("moof"), "a finalized file is not fragmented: \(boxes)")
    }

    /// SIGUSR1 at 3 s, again at 6 s, 10 s of media: the file holds 10 s without a gap or a jump.
    @Test func pauseLeavesNoGap() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("paused.mkv")
        let child = try Child(broadcastBinary, ["record", file, "--size", "320x180", "--duration", "10s"])
        usleep(3_000_000)
        child.signal(SIGUSR1)
        usleep(3_000_000)
        child.signal(SIGUSR1)
        let r = child.wait(timeout: 60)
        #expect(r.status == 0, "record failed: \(r.stderr)")
        #expect(r.stderr.contains("paused") && r.stderr.contains("resumed"))
        let p = try probe(file)
        let frames = try #require(p.video?.frames)
        #expect(abs(frames - 300) <= 1, "\(frames) frames")
        let video = try packetTimes(file, stream: "v:0")
        let gaps = zip(video, video.dropFirst()).map { $1 - $0 }
        // Under two frame periods: a frame captured less than a period after the last one before
        // the pause is dropped at the resume (so timestamps stay a period apart), and the next is
        // then less than two periods on; + 2 ms for MKV's millisecond timestamps and capture jitter.
        #expect((gaps.max() ?? 1) < 2 * Self.frame + 0.002, "a gap of \(gaps.max() ?? 0) s between frames")
        #expect(abs((video.last ?? 0) - (video.first ?? 0) - (10 - Self.frame)) < 2 * Self.frame)
        let audio = try packetTimes(file, stream: "a:0")
        let audioGaps = zip(audio, audio.dropFirst()).map { $1 - $0 }
        #expect((audioGaps.max() ?? 1) < 1024.0 / 48_000 + 0.002, "audio gap of \(audioGaps.max() ?? 0) s")
        // The sync marks survive the pause: white frames and beeps still line up.
        for (flash, beep) in zip(try whiteFrameTimes(file), try beepStartTimes(file)) {
            #expect(abs(flash - beep) <= Self.frame, "white frame at \(flash) s, beep at \(beep) s")
        }
    }

    @Test func sigintFinalizesTheFile() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("interrupted.mp4")
        let child = try Child(broadcastBinary, ["record", file, "--size", "320x180"])
        usleep(3_000_000)
        child.signal(SIGINT)
        let r = child.wait(timeout: 30)
        #expect(r.status == 0 && r.reason == .exit, "exit \(r.status): \(r.stderr)")
        try expectDecodesCleanly(file)
        let boxes = try mp4TopLevelBoxes(file)
        #expect(!boxes.contains("moof") && boxes.firstIndex(of: "moov")! < boxes.firstIndex(of: "mdat")!, "\(boxes)")
        let duration = try #require(try probe(file).formatDuration)
        #expect(duration > 2 && duration < 6, "duration \(duration) s after SIGINT at about 3 s")
    }

    @Test func secondSigintQuitsAtOnceAndTheFileStillPlays() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("quit.mp4")
        // A slow preset keeps the first SIGINT's flush busy long enough for the second to matter.
        let child = try Child(broadcastBinary, ["record", file, "--size", "320x180", "--keyframe-interval", "1s"])
        usleep(4_000_000)
        child.signal(SIGINT)
        child.signal(SIGINT)
        let r = child.wait(timeout: 30)
        #expect(r.status == 0 || r.status == 130, "exit \(r.status): \(r.stderr)")
        let frames = try #require(try probe(file).video?.frames)
        #expect(frames >= 60, "only \(frames) frames decode")
    }

    /// SIGKILL after 8 s: everything up to about 2 s before the kill decodes.
    @Test func sigkillLeavesAPlayableRecording() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("killed.mp4")
        let child = try Child(broadcastBinary, ["record", file, "--size", "320x180"])
        usleep(8_000_000)
        child.signal(SIGKILL)
        let r = child.wait(timeout: 30)
        #expect(r.reason == .uncaughtSignal)
        let p = try probe(file)
        let frames = try #require(p.video?.frames)
        #expect(frames >= 6 * 30, "only \(frames) frames decode after a kill at 8 s")
        #expect(try p.audio?.frames ?? 0 > 0)
    }
}
