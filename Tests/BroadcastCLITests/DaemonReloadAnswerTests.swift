import Foundation
import Testing

/// A reload answers, per output and source, what really happened, and ends no output it was not
/// asked to end (issue 23 item 3); removed outputs give their descriptors back, and a process out of
/// descriptors gets an error, not a trap (issue 24 item 7). Against the real daemon.
@Suite(.serialized) struct DaemonReloadAnswerTests {
    /// The config `launchDaemon` writes, with `video` as the video source.
    static func config(_ dir: TemporaryDirectory, video: String = "test", outputs: String) -> String {
        """
        [video]
        source = "\(video)"
        size = "320x180"
        [encoder]
        keyframe_interval = "1s"
        [control]
        socket = "\(dir.path("c.sock"))"

        """ + outputs
    }

    static func recording(_ name: String, _ path: String, extra: String = "") -> String {
        "[[output]]\nname = \"\(name)\"\npath = \"\(path)\"\n\(extra)\n"
    }

    /// `broadcast reload`: its exit status, the answer as JSON, and stderr.
    static func reload(_ dir: TemporaryDirectory, _ config: String) throws -> (status: Int32, answer: [String: Any], stderr: String) {
        try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let r = try broadcast(["reload", "--socket", dir.path("c.sock")], timeout: 120)
        let answer = (try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8))) as? [String: Any] ?? [:]
        return (r.status, answer, r.stdout + r.stderr)
    }

    /// What the answer says became of `output`.
    static func change(_ answer: [String: Any], _ output: String) -> (result: String?, reason: String?) {
        let entry = (answer["changes"] as? [[String: Any]])?.first { $0["output"] as? String == output }
        return (entry?["result"] as? String, entry?["reason"] as? String)
    }

    /// The status's entry for `output` (nil when the broadcast has no such output).
    static func output(_ dir: TemporaryDirectory, _ name: String) throws -> [String: Any]? {
        let r = try broadcast(["status", "--socket", dir.path("c.sock")], timeout: 30)
        let json = (try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8))) as? [String: Any]
        return (json?["outputs"] as? [[String: Any]])?.first { $0["name"] as? String == name }
    }

    /// Waits (at most a minute) until `name`'s byte count passes `bytes`: it is still recording.
    static func keepsRecording(_ dir: TemporaryDirectory, _ name: String, past bytes: Double) throws -> Bool {
        for _ in 0..<300 {
            if let o = try output(dir, name), o["state"] as? String == "recording", (o["bytes"] as? Double ?? 0) > bytes { return true }
            usleep(200_000)
        }
        return false
    }

    /// Adding a key to an `overwrite = true` recording gives its replacement the same file: the
    /// recording goes on with its old settings and the answer says so (it was refused against
    /// itself, ended, and the answer said "applied").
    @Test func anOverwriteRecordingWhoseReplacementWantsItsFileGoesOn() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let rec = Self.recording("rec", dir.path("rec.mkv"), extra: "overwrite = true")
        let daemon = try spawnDaemon(config: Self.config(dir, outputs: rec), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        // The event says the same as the answer (it said "applied").
        let watcher = try Child(broadcastBinary, ["status", "--watch", "--json", "--socket", dir.path("c.sock")])
        defer { watcher.signal(SIGKILL) }
        // Following before the reload: its first line (the state) says the stream is open (a loaded
        // host started the watcher after the reload's event, which it then never saw).
        for _ in 0..<600 where !watcher.stdoutSoFar.contains("\n") { usleep(100_000) }
        #expect(watcher.stdoutSoFar.contains("\n"), "the watcher printed nothing")
        let r = try Self.reload(dir, Self.config(dir, outputs: Self.recording("rec", dir.path("rec.mkv"), extra: "overwrite = true\nsegment = \"1h\"")))
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.answer["complete"] as? Bool == false, "\(r.stderr)")
        let rec1 = Self.change(r.answer, "rec")
        #expect(rec1.result == "kept" && rec1.reason?.contains("same file") == true, "\(r.stderr)")
        #expect(r.answer["outputs"] as? [String] == ["rec"], "\(r.stderr)")
        let bytes = try Self.output(dir, "rec")?["bytes"] as? Double ?? .infinity
        #expect(try Self.keepsRecording(dir, "rec", past: bytes), "the recording stopped: \(daemon.stderrSoFar)")
        daemon.signal(SIGTERM)
        let end = daemon.wait(timeout: 60)
        #expect(end.status == 0, "\(end.stderr)")
        let events = watcher.wait(timeout: 60).stdout
        let reloadEvent = events.split(separator: "\n").first { $0.contains("\"event\":\"reload\"") } ?? ""
        #expect(reloadEvent.contains("\"result\":\"partly applied\"") && reloadEvent.contains("\"result\":\"kept\""), "\(events)")
        #expect(dir.contents.filter { $0.hasSuffix(".mkv") } == ["rec.mkv"], "\(dir.contents)")
        try expectDecodesCleanly(dir.path("rec.mkv"))
    }

    /// A `url` without a scheme passed the config check and was then dropped (a reload answered
    /// "applied" without it): it is refused at its line, and the key is not echoed.
    @Test func aURLWithoutASchemeIsRefusedAtItsLine() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let rec = Self.recording("rec", dir.path("rec.mkv"))
        let daemon = try spawnDaemon(config: Self.config(dir, outputs: rec), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        let config = Self.config(dir, outputs: rec + "[[output]]\nname = \"live\"\nurl = \"example.com/live/hunter2key\"\n")
        let line = config.split(separator: "\n", omittingEmptySubsequences: false).firstIndex { $0.hasPrefix("url =") }.map { $0 + 1 } ?? 0
        let r = try Self.reload(dir, config)
        #expect(r.status == 1, "\(r.stderr)")
        #expect(r.stderr.contains("config not reloaded: \(dir.path("d.toml")):\(line): output.url"), "\(r.stderr)")
        #expect(!r.stderr.contains("hunter2key"), "\(r.stderr)")
        #expect(try Self.output(dir, "rec")?["state"] as? String == "recording")
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
    }

    /// Outputs that cannot start: a changed recording whose new file cannot be written (its path
    /// is a directory) goes on as it was, "kept"; a new one that cannot start is "failed", and so
    /// is one whose entry cannot be made (its dated directory is a file); the unchanged one
    /// "unchanged". (The changed one was ended and the new one dropped without a
    /// word, and the answer said "applied".)
    @Test func outputsThatCannotStartAreKeptOrReported() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        try FileManager.default.createDirectory(atPath: dir.path("taken.mkv"), withIntermediateDirectories: false)
        try FileManager.default.createDirectory(atPath: dir.path("taken2.mkv"), withIntermediateDirectories: false)
        // A file where this year's directory of a `%Y/` template goes: the entry cannot be made.
        let year = "\(Calendar.current.component(.year, from: Date()))"
        FileManager.default.createFile(atPath: dir.path(year), contents: Data("not a directory".utf8))
        let other = Self.recording("other", dir.path("other.mkv"))
        let daemon = try spawnDaemon(config: Self.config(dir, outputs: Self.recording("rec", dir.path("rec.mkv")) + other), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        let bytes = try Self.output(dir, "rec")?["bytes"] as? Double ?? .infinity
        let r = try Self.reload(
            dir,
            Self.config(
                dir,
                outputs: Self.recording("rec", dir.path("taken.mkv"), extra: "overwrite = true") + other
                    + Self.recording("extra", dir.path("taken2.mkv"), extra: "overwrite = true")
                    + Self.recording("dated", dir.path("%Y/dated.mkv"))))
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.answer["complete"] as? Bool == false, "\(r.stderr)")
        #expect(Self.change(r.answer, "rec").result == "kept", "\(r.stderr)")
        #expect(Self.change(r.answer, "rec").reason?.isEmpty == false, "\(r.stderr)")
        #expect(Self.change(r.answer, "other").result == "unchanged", "\(r.stderr)")
        #expect(Self.change(r.answer, "extra").result == "failed", "\(r.stderr)")
        #expect(Self.change(r.answer, "dated").result == "failed", "\(r.stderr)")
        #expect(Self.change(r.answer, "dated").reason?.contains("not a directory") == true, "\(r.stderr)")
        #expect(r.answer["outputs"] as? [String] == ["rec", "other"], "\(r.stderr)")
        #expect(try Self.keepsRecording(dir, "rec", past: bytes), "rec stopped: \(daemon.stderrSoFar)")
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        try expectDecodesCleanly(dir.path("rec.mkv"))
    }

    /// While the broadcast is paused, a reload's outputs apply at once (they waited for the
    /// resume, though the answer said now): the new output is in the status before the resume.
    @Test func outputsChangeWhilePaused() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let rec = Self.recording("rec", dir.path("rec.mkv"))
        let daemon = try spawnDaemon(config: Self.config(dir, outputs: rec), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        let paused = try broadcast(["pause", "--socket", dir.path("c.sock")])
        #expect(paused.status == 0, "\(paused.stderr)")
        let r = try Self.reload(dir, Self.config(dir, outputs: rec + Self.recording("extra", dir.path("extra.mkv"))))
        #expect(r.status == 0 && r.answer["complete"] as? Bool == true, "\(r.stderr)")
        #expect(Self.change(r.answer, "extra").result == "added" && Self.change(r.answer, "rec").result == "unchanged", "\(r.stderr)")
        // Still paused, and the output is there.
        let status = try broadcast(["status", "--socket", dir.path("c.sock")]).stdout
        #expect(status.contains("\"state\":\"paused\""), "\(status)")
        #expect(try Self.output(dir, "extra") != nil, "\(status)")
        // Removed while paused too: gone before the resume.
        let removed = try Self.reload(dir, Self.config(dir, outputs: rec))
        #expect(Self.change(removed.answer, "extra").result == "removed", "\(removed.stderr)")
        #expect(try Self.output(dir, "extra") == nil)
        #expect(try broadcast(["resume", "--socket", dir.path("c.sock")]).status == 0)
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        try expectDecodesCleanly(dir.path("rec.mkv"))
    }

    /// A reload to a display that cannot be opened: the old source is back and the answer says
    /// "kept" with the reason (it said "applied"); the recording goes on.
    @Test func aSourceThatCannotOpenIsReportedKept() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let rec = Self.recording("rec", dir.path("rec.mkv"))
        let daemon = try spawnDaemon(config: Self.config(dir, outputs: rec), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        try Self.config(dir, video: "x11::987", outputs: rec).write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let reloading = try Child(broadcastBinary, ["reload", "--socket", dir.path("c.sock")])
        // The status answers while the swap is under way (the replacement is retried for 10 s
        // before the old source comes back): reads never wait on a swap (issue 24 item 8).
        #expect(daemon.waitForStderr(timeout: 60) { $0.contains("reload: swapping the video source: test → X11 display :987") })
        let during = try broadcast(["status", "--socket", dir.path("c.sock")], timeout: 120)
        let answeredDuringSwap = reloading.process.isRunning
        #expect(during.status == 0 && answeredDuringSwap, "the status waited for the swap: \(during.stdout) \(during.stderr)")
        let done = reloading.wait(timeout: 120)
        let r = (status: done.status, answer: (try? JSONSerialization.jsonObject(with: Data(done.stdout.utf8))) as? [String: Any] ?? [:], stderr: done.stdout + done.stderr)
        #expect(r.status == 0 && r.answer["complete"] as? Bool == false, "\(r.stderr)")
        let sources = r.answer["sources"] as? [[String: Any]] ?? []
        #expect(sources.count == 1 && sources.first?["result"] as? String == "kept", "\(r.stderr)")
        #expect((sources.first?["reason"] as? String)?.isEmpty == false, "\(r.stderr)")
        #expect(Self.change(r.answer, "rec").result == "unchanged", "\(r.stderr)")
        let bytes = try Self.output(dir, "rec")?["bytes"] as? Double ?? .infinity
        #expect(try Self.keepsRecording(dir, "rec", past: bytes))
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
    }

    /// Polls `condition` every 100 ms until it holds (at most `seconds`).
    static func waitUntil(seconds: Double, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while !condition() {
            if Date() > deadline { return false }
            usleep(100_000)
        }
        return true
    }

    /// The daemon's open descriptors.
    static func descriptors(_ pid: Int32) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    /// Ten reloads adding an output and ten removing it: the daemon holds no more descriptors
    /// afterwards than before (each removed output kept about four until the broadcast ended).
    @Test func addingAndRemovingOutputsLeaksNoDescriptors() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let rec = Self.recording("rec", dir.path("rec.mkv"))
        let daemon = try spawnDaemon(config: Self.config(dir, outputs: rec), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        func pair(_ i: Int) throws {
            let added = try Self.reload(dir, Self.config(dir, outputs: rec + Self.recording("x", dir.path("x\(i).mkv"))))
            #expect(Self.change(added.answer, "x").result == "added", "\(added.stderr)")
            let removed = try Self.reload(dir, Self.config(dir, outputs: rec))
            #expect(Self.change(removed.answer, "x").result == "removed", "\(removed.stderr)")
        }
        // One pair first: whatever the first reload opens for good (its config read, a client) is in the baseline.
        try pair(0)
        // The fewest seen over three seconds: the removed output's thread may still be finishing.
        var before = Int.max
        for _ in 0..<30 {
            before = min(before, Self.descriptors(daemon.pid))
            usleep(100_000)
        }
        #expect(before > 0)
        for i in 1...10 { try pair(i) }
        var after = Int.max
        let settled = Self.waitUntil(seconds: 60) {
            after = Self.descriptors(daemon.pid)
            return after <= before
        }
        #expect(settled, "\(before) descriptors before ten add/remove pairs, \(after) after")
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        for i in 0...10 { try expectDecodesCleanly(dir.path("x\(i).mkv")) }
    }

    /// A start out of descriptors (RLIMIT_NOFILE lowered with prlimit, forty outputs): the
    /// broadcast does not start, exit 1 with the reason (it trapped in `Wakeup.init`: exit 132).
    @Test func aStartOutOfDescriptorsIsAnErrorNotATrap() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let many = (0..<40).map { Self.recording("x\($0)", dir.path("x\($0).mkv")) }.joined()
        try Self.config(dir, outputs: many).write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let r = try Child("/usr/bin/prlimit", ["--nofile=100:100", broadcastBinary, "daemon", "--config", dir.path("d.toml")]).wait(timeout: 120)
        #expect(r.reason == .exit && r.status == 1, "exit \(r.status) (\(r.reason)): \(r.stderr.suffix(2000))")
        #expect(r.stderr.contains("the broadcast could not start: cannot make a wake-up pipe"), "\(r.stderr.suffix(2000))")
        #expect(dir.contents.filter { $0.hasSuffix(".mkv") } == [], "\(dir.contents)")
    }

    /// Out of descriptors (RLIMIT_NOFILE lowered with prlimit): outputs a reload adds that cannot
    /// get their wake-up pipes are "failed" with the reason, and the daemon goes on (it trapped in
    /// `Wakeup.init`: "cannot make a wake-up pipe").
    @Test func outOfDescriptorsIsAnErrorNotATrap() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let rec = Self.recording("rec", dir.path("rec.mkv"))
        try Self.config(dir, outputs: rec).write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let daemon = try Child("/usr/bin/prlimit", ["--nofile=160:160", broadcastBinary, "daemon", "--config", dir.path("d.toml")])
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(dir.path("c.sock"))
        let many = (0..<40).map { Self.recording("x\($0)", dir.path("x\($0).mkv")) }.joined()
        let r = try Self.reload(dir, Self.config(dir, outputs: rec + many))
        #expect(r.status == 0, "\(r.stderr)")
        let results = (0..<40).map { Self.change(r.answer, "x\($0)") }
        let failed = results.filter { $0.result == "failed" }
        #expect(!failed.isEmpty, "\(r.stderr)")
        #expect(failed.allSatisfy { $0.reason?.isEmpty == false }, "\(r.stderr)")
        #expect(r.answer["complete"] as? Bool == false)
        // The daemon is alive and recording; taking the outputs out again frees what they held.
        let bytes = try Self.output(dir, "rec")?["bytes"] as? Double ?? .infinity
        #expect(try Self.keepsRecording(dir, "rec", past: bytes), "\(daemon.stderrSoFar)")
        let back = try Self.reload(dir, Self.config(dir, outputs: rec))
        #expect(back.status == 0 && back.answer["outputs"] as? [String] == ["rec"], "\(back.stderr)")
        let again = try Self.reload(dir, Self.config(dir, outputs: rec + Self.recording("y", dir.path("y.mkv"))))
        #expect(Self.change(again.answer, "y").result == "added", "\(again.stderr)")
        daemon.signal(SIGTERM)
        let end = daemon.wait(timeout: 60)
        #expect(end.status == 0, "exit \(end.status) (\(end.reason)): \(end.stderr.suffix(2000))")
        #expect(!end.stderr.contains("Fatal error"), "\(end.stderr.suffix(2000))")
    }
}
