import Foundation
import Testing

@Suite(.serialized) struct DaemonSourceReloadTests {
    /// A reload that changes only the microphone swaps that source while video, the recording and
    /// its file go on: one file, no gap in its video, audio to its end; a size change waits for the
    /// next start and says so.
    @Test func changingTheAudioSourceKeepsVideoRunning() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        func write(mic: String, size: String = "320x180") throws {
            let config = """
                [video]
                source = "test"
                size = "\(size)"
                [audio]
                mic = "\(mic)"
                [encoder]
                keyframe_interval = "1s"
                [control]
                socket = "\(socket)"
                [[output]]
                name = "rec"
                path = "\(dir.path("rec-%H%M%S.mkv"))"
                """
            try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        }
        try write(mic: "test")
        let daemon = try Child(broadcastBinary, ["daemon", "--config", dir.path("d.toml")])
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        let start = try Self.microphone(socket)
        usleep(2_000_000)
        let beforeSwap = try Self.microphone(socket)
        try write(mic: "test:period=21ms")
        daemon.signal(SIGHUP)
        let swapped = daemon.waitForStderr(timeout: 30) { $0.contains("reload: audioMic source now test:period=21ms (was test)") }
        #expect(swapped, "\(daemon.stderrSoFar)")
        usleep(500_000)
        let afterSwap = try Self.microphone(socket)
        usleep(2_000_000)
        let later = try Self.microphone(socket)
        // The new source is the one delivering: the tone's buffers per second of media went from
        // 100 (10 ms periods) to about 48 (21 ms), whatever the host's speed.
        let before = Self.buffersPerSecond(start, beforeSwap), after = Self.buffersPerSecond(afterSwap, later)
        #expect(before > 80 && before < 120, "\(before) buffers a second before the swap (\(start), \(beforeSwap))")
        #expect(after > 35 && after < 60, "\(after) buffers a second after it (\(afterSwap), \(later))")
        // The encoder's size cannot change while it runs: refused with a line, the rest goes on.
        try write(mic: "test:period=21ms", size: "640x360")
        daemon.signal(SIGHUP)
        let deferred = daemon.waitForStderr(timeout: 30) { $0.contains("this applies at the next start") }
        #expect(deferred, "\(daemon.stderrSoFar)")
        usleep(1_000_000)
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 30)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(!r.stderr.contains("config not reloaded"), "\(r.stderr)")
        let recordings = dir.contents.filter { $0.hasPrefix("rec-") }
        #expect(recordings.count == 1, "the recording was not interrupted: \(recordings)")
        guard let rec = recordings.first else { return }
        let times = try packetTimes(dir.path(rec), stream: "v:0")
        let gaps = zip(times, times.dropFirst()).map { $1 - $0 }
        #expect((gaps.max() ?? 1) < 2.0 / 30, "video has a gap of \(gaps.max() ?? 0) s")
        #expect(times.count > 4 * 30, "\(times.count) frames")
        let p = try probe(dir.path(rec))
        #expect(p.video?.width == 320, "the size stayed until the next start")
        // Audio runs to the end: the swap's moment without samples is filled, not cut.
        let audioTimes = try packetTimes(dir.path(rec), stream: "a:0")
        let audioGaps = zip(audioTimes, audioTimes.dropFirst()).map { $1 - $0 }
        #expect((audioGaps.max() ?? 1) < 0.1, "audio has a gap of \(audioGaps.max() ?? 0) s")
        #expect(abs((audioTimes.last ?? 0) - (times.last ?? 0)) < 0.25, "audio ends at \(audioTimes.last ?? 0) s, video at \(times.last ?? 0) s")
        try expectDecodesCleanly(dir.path(rec))
    }

    /// The session's microphone figures: buffers delivered and seconds of media.
    static func microphone(_ socket: String) throws -> (delivered: Double, media: Double) {
        let r = try broadcast(["status", "--socket", socket], timeout: 30)
        let json = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]
        let mic = (json?["types"] as? [String: Any])?["audioMic"] as? [String: Any]
        return (mic?["delivered"] as? Double ?? 0, mic?["media_seconds"] as? Double ?? 0)
    }

    static func buffersPerSecond(_ a: (delivered: Double, media: Double), _ b: (delivered: Double, media: Double)) -> Double {
        b.media > a.media ? (b.delivered - a.delivered) / (b.media - a.media) : 0
    }
}
