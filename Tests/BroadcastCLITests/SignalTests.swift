import ChildProcesses
import Foundation
import Testing

/// Signals at awkward moments (issue 12, item 13): SIGQUIT, a stop right after the start, and
/// pause/resume toggled fast.
@Suite struct SignalTests {
    static let frame = 1.0 / 30

    /// A `broadcast record` whose standard error can be read while it runs.
    final class Recorder {
        let process: ChildProcess
        let errURL: URL

        init(_ arguments: [String], directory: URL) throws {
            errURL = directory.appendingPathComponent("stderr.txt")
            process = try ChildProcess(broadcastBinary, arguments, directory: directory.path, stderr: .file(errURL.path))
        }

        var stderr: String { (try? String(contentsOf: errURL, encoding: .utf8)) ?? "" }
        func signal(_ s: Int32) { process.signal(s) }

        /// Waits until standard error contains `needle`, at most `timeout` seconds.
        func waitFor(_ needle: String, timeout: Double) -> Bool {
            let deadline = Date().addingTimeInterval(timeout)
            while Date() < deadline {
                if stderr.contains(needle) { return true }
                if !process.isRunning { return stderr.contains(needle) }
                usleep(1_000)
            }
            return false
        }

        /// The exit status, or nil when it was still running after `timeout` s (then it is killed).
        func exitStatus(timeout: Double) -> Int32? {
            guard process.wait(timeout: timeout) else {
                process.signal(SIGKILL)
                process.waitUntilExit()
                return nil
            }
            return process.terminationStatus
        }
    }

    /// SIGQUIT finishes like SIGTERM: the file is finalized and the summary printed (before, the
    /// Swift runtime's crash handler printed a backtrace, capture stalled and the process went on).
    @Test func sigquitFinishesCleanly() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let recorder = try Recorder(["record", "quit.mp4", "--size", "320x180"], directory: dir.url)
        #expect(recorder.waitFor("recording to", timeout: 30))
        usleep(1_500_000)
        recorder.signal(SIGQUIT)
        let status = recorder.exitStatus(timeout: 30)
        let stderr = recorder.stderr
        #expect(status == 0, "exit \(status.map { "\($0)" } ?? "none: still running 30 s after SIGQUIT"): \(stderr)")
        #expect(!stderr.contains("crashed"), "\(stderr)")
        #expect(stderr.contains("SIGQUIT: finishing") && stderr.contains("recorded quit.mp4"), "\(stderr)")
        try expectDecodesCleanly(dir.path("quit.mp4"))
        let frames = try #require(try probe(dir.path("quit.mp4")).video?.frames)
        #expect(frames >= 30, "only \(frames) frames")
    }

    /// SIGINT the moment the recording is opened, before the first frame: the file plays (it holds
    /// what was captured until the first frame) and the summary is printed. Before, the file was an
    /// MP4 of 262 bytes with no playable stream.
    @Test func stopRightAfterTheStartLeavesAPlayableFile() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let recorder = try Recorder(["record", "early.mp4", "--size", "320x180"], directory: dir.url)
        #expect(recorder.waitFor("recording to", timeout: 30))
        recorder.signal(SIGINT)
        let status = recorder.exitStatus(timeout: 30)
        let stderr = recorder.stderr
        #expect(status == 0, "exit \(status.map { "\($0)" } ?? "none: still running 30 s after SIGINT"): \(stderr)")
        #expect(stderr.contains("recorded early.mp4"), "no summary: \(stderr)")
        let p = try probe(dir.path("early.mp4"))
        #expect((p.video?.frames ?? 0) >= 1, "no video frame in the file: \(p.streams)")
        #expect(!stderr.contains("codec frame size is not set") && !stderr.contains("unspecified pixel format"), "\(stderr)")
        try expectDecodesCleanly(dir.path("early.mp4"))
    }

    /// SIGINT at moments spread over the start-up (before the handlers, before the session runs,
    /// while it opens): the process always ends, and leaves no file or one that plays. A SIGINT
    /// that came before the session ran used to be lost: the recording went on for ever.
    @Test func stopDuringStartupAlwaysEnds() throws {
        // How long the start takes on this machine now.
        let probeDir = try TemporaryDirectory()
        defer { probeDir.cleanup() }
        let started = Date()
        let first = try Recorder(["record", "t.mp4", "--size", "320x180"], directory: probeDir.url)
        #expect(first.waitFor("recording to", timeout: 30))
        let startup = Date().timeIntervalSince(started)
        first.signal(SIGINT)
        #expect(first.exitStatus(timeout: 30) == 0)

        for step in 0..<10 {
            let dir = try TemporaryDirectory()
            defer { dir.cleanup() }
            let recorder = try Recorder(["record", "s.mp4", "--size", "320x180"], directory: dir.url)
            usleep(UInt32(startup * Double(step + 3) / 10 * 1e6))
            recorder.signal(SIGINT)
            let status = recorder.exitStatus(timeout: 30)
            #expect(status != nil, "still running 30 s after a SIGINT at \(step + 3)/10 of the start-up: \(recorder.stderr)")
            let file = dir.path("s.mp4")
            if FileManager.default.fileExists(atPath: file) {
                #expect((try? probe(file))?.video?.frames ?? 0 >= 1, "an unplayable file after SIGINT at \(step + 3)/10: \(recorder.stderr)")
            }
        }
    }

    /// `broadcast daemon` with SIGTERM at moments spread over its start-up (before its signal
    /// handlers, during recovery and the control socket, while the broadcast opens, around the
    /// first frame): it always ends; once its handlers are up it exits 0 (a clean finish), and it
    /// leaves no recording or one that plays, with no half-written file beside it.
    @Test func daemonStopDuringStartupAlwaysEnds() throws {
        func spawn(_ dir: TemporaryDirectory) throws -> Child {
            try launchDaemon(dir, outputs: "[[output]]\nname = \"rec\"\npath = \"\(dir.path("rec.mp4"))\"\n").daemon
        }
        // How long this machine takes from the spawn to "broadcast started" now.
        let probeDir = try TemporaryDirectory()
        defer { probeDir.cleanup() }
        let started = Date()
        let first = try spawn(probeDir)
        #expect(first.waitForStderr(timeout: 60) { $0.contains("broadcast started") }, "\(first.stderrSoFar)")
        let startup = Date().timeIntervalSince(started)
        first.signal(SIGTERM)
        #expect(first.wait(timeout: 60).status == 0)

        for step in 0..<12 {
            let dir = try TemporaryDirectory()
            defer { dir.cleanup() }
            let daemon = try spawn(dir)
            let at = startup * Double(step) / 10
            usleep(UInt32(at * 1e6))
            daemon.signal(SIGTERM)
            let r = daemon.wait(timeout: 60)
            let moment = "SIGTERM \(String(format: "%.2f", at)) s after the spawn (start-up \(String(format: "%.2f", startup)) s)"
            #expect(!(r.reason == .uncaughtSignal && r.status == SIGKILL), "still running 60 s after a \(moment): \(r.stderr)")
            let handled = r.reason == .exit
            if handled {
                #expect(r.status == 0, "exit \(r.status) after a \(moment): \(r.stderr)")
            }
            let file = dir.path("rec.mp4")
            if FileManager.default.fileExists(atPath: file) {
                // Before the handlers were installed the default action ends the process: nothing
                // may have been recorded then.
                #expect(handled, "killed by a \(moment) with a recording begun: \(r.stderr)")
                #expect((try? probe(file))?.video?.frames ?? 0 >= 1, "an unplayable recording after a \(moment): \(r.stderr)")
                try expectDecodesCleanly(file)
            }
            let leftovers = dir.contents.filter { $0.contains("finalizing") || $0.contains("partial") }
            #expect(leftovers.isEmpty, "half-written files \(leftovers) after a \(moment): \(r.stderr)")
        }
    }

    /// 50 SIGUSR1 toggles in about 2 s: every video frame stays at least a frame period after the
    /// one before, so players and transcoders that count in frames see increasing timestamps
    /// (before: "non monotonically increasing dts" decoding the file with ffmpeg's defaults).
    @Test func fastPauseTogglingKeepsTimestampsIncreasing() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("toggled.mp4")
        let recorder = try Recorder(["record", file, "--size", "320x180", "-q"], directory: dir.url)
        usleep(1_500_000)
        // Uneven intervals (a fixed sequence): a pause that is not a whole number of frames.
        var seed: UInt64 = 0x9E37_79B9_7F4A_7C15
        for _ in 0..<50 {
            recorder.signal(SIGUSR1)
            seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            usleep(UInt32(5_000 + (seed >> 33) % 70_000))
        }
        usleep(1_000_000)
        recorder.signal(SIGINT)
        #expect(recorder.exitStatus(timeout: 30) == 0, "\(recorder.stderr)")
        let times = try packetTimes(file, stream: "v:0")
        #expect(times.count > 30)
        let closest = zip(times, times.dropFirst()).map { $1 - $0 }.min() ?? 0
        // More than half a frame apart: distinct frames at the output rate (before the fix, frames
        // around a pause shared a time). Not a whole frame: on a busy machine a frame captured late
        // is followed by one on time, a few ms closer than the period, pause or not.
        #expect(closest > Self.frame / 2, "two video frames \(closest) s apart")
        // ffmpeg's defaults (a 1/fps time base for the null output), not the test helper's.
        let r = try run("/usr/bin/ffmpeg", ["-nostdin", "-v", "error", "-i", file, "-f", "null", "-"])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r.stderr)")
    }
}
