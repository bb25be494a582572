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
        usleep(2_000_000)
        try write(mic: "test:period=21ms")
        daemon.signal(SIGHUP)
        let swapped = daemon.waitForStderr(timeout: 30) { $0.contains("reload: audioMic source now test:period=21ms (was test)") }
        #expect(swapped, "\(daemon.stderrSoFar)")
        usleep(2_000_000)
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
}
