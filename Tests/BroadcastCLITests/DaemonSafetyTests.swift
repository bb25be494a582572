import Foundation
import Testing

/// The daemon never touches what is not its own: one daemon per directory, retention and crash
/// recovery only on files it wrote (its manifest), never on a file another process has open.
@Suite(.serialized) struct DaemonSafetyTests {
    /// "N video frames, M audio frames encoded" from the daemon's last log line.
    static func framesEncoded(_ stderr: String) -> Int {
        Int(stderr.firstMatch(of: /(\d+) video frames, \d+ audio frames encoded/)?.1 ?? "-1") ?? -1
    }

    static func setModified(_ path: String, secondsAgo: Int) {
        var times = [timespec(tv_sec: time(nil) - secondsAgo, tv_nsec: 0), timespec(tv_sec: time(nil) - secondsAgo, tv_nsec: 0)]
        utimensat(AT_FDCWD, path, &times, 0)
    }

    /// A second daemon on the same config exits 2 naming the first one's pid, before it touches
    /// anything: the first one's recording keeps every frame it encoded. (Before: the second
    /// "recovered" the live MP4, finalizing and renaming it under the first one's feet.)
    @Test func secondDaemonOnTheSameConfigLeavesTheFirstRecordingAlone() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (first, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "rec"
            path = "\(dir.path("rec.mp4"))"
            """)
        defer { first.signal(SIGKILL); _ = first.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        usleep(2_500_000)
        let second = try Child(broadcastBinary, ["daemon", "--config", dir.path("d.toml")]).wait(timeout: 60)
        #expect(second.status == 2, "exit \(second.status): \(second.stderr)")
        let lines = second.stderr.split(separator: "\n")
        #expect(lines.count == 1, "one line expected: \(second.stderr)")
        #expect(second.stderr.contains("pid \(first.process.processIdentifier)"), "\(second.stderr)")
        usleep(2_000_000)
        let status = try broadcast(["status", "--socket", socket])
        #expect(status.status == 0, "the first daemon's control socket is gone: \(status.stderr)")
        first.signal(SIGTERM)
        let r = first.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        let encoded = Self.framesEncoded(r.stderr)
        let frames = try probe(dir.path("rec.mp4")).video?.frames ?? 0
        #expect(encoded > 100 && frames == encoded, "\(frames) frames in the file, \(encoded) encoded")
        try expectDecodesCleanly(dir.path("rec.mp4"))
    }

    /// Retention deletes only this output's own old segments: an unrelated old file in the same
    /// directory (`my-wedding.mp4`), and one that merely looks like a segment, survive.
    @Test func retentionDeletesOnlyFilesThisOutputWrote() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let outputs = """
            [[output]]
            name = "rec"
            path = "\(dir.path("%H%M%S.mp4"))"
            segment = "1s"
            retain_for = "1h"
            """
        let strangers = ["my-wedding.mp4", "996060.mp4"]
        for name in strangers {
            FileManager.default.createFile(atPath: dir.path(name), contents: Data(repeating: 7, count: 1000))
            Self.setModified(dir.path(name), secondsAgo: 7200)
        }
        // A first run leaves segments of its own; they are made two hours old.
        let (first, socket) = try launchDaemon(dir, outputs: outputs)
        _ = try waitUntilRecording(socket)
        usleep(2_500_000)
        first.signal(SIGTERM)
        let r1 = first.wait(timeout: 60)
        #expect(r1.status == 0, "\(r1.stderr)")
        let own = dir.contents.filter { $0.hasSuffix(".mp4") && !strangers.contains($0) }
        #expect(own.count >= 2, "segments: \(own)")
        for name in own { Self.setModified(dir.path(name), secondsAgo: 7200) }
        let (second, _) = try launchDaemon(dir, outputs: outputs)
        _ = try waitUntilRecording(socket)
        usleep(2_500_000)
        second.signal(SIGTERM)
        let r2 = second.wait(timeout: 60)
        #expect(r2.status == 0, "\(r2.stderr)")
        for name in strangers {
            #expect(FileManager.default.fileExists(atPath: dir.path(name)), "\(name) was deleted: \(r2.stderr)")
        }
        for name in own {
            #expect(!FileManager.default.fileExists(atPath: dir.path(name)), "own old segment \(name) was kept")
        }
        #expect(dir.contents.contains { $0.hasSuffix(".mp4") && !strangers.contains($0) && !own.contains($0) }, "no new segment")
    }

    /// Two outputs in one directory whose names overlap: "cam" (`cam.mp4`, 1 s segments, a size
    /// limit that keeps only the newest) and "screen" (`cam-%H%M%S.mp4`, one file). cam's
    /// retention leaves screen's recording alone (before: `cam-HHMMSS.mp4` passed for cam's
    /// `-N`, and was deleted while being written), and cam never gives a name out twice (before:
    /// cam.mp4, cam-2.mp4, then cam.mp4 again once retention had deleted it).
    @Test func oneOutputsRetentionLeavesAnothersRecordingAndNamesAreNotReused() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "cam"
            path = "\(dir.path("cam.mp4"))"
            segment = "1s"
            retain_bytes = "1"
            [[output]]
            name = "screen"
            path = "\(dir.path("cam-%H%M%S.mp4"))"
            """)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        let segments = { (log: String) in log.matches(of: /recording cam: next segment (\S+)/).map { String($0.1) } }
        let enough = daemon.waitForStderr(timeout: 120) { segments($0).count >= 6 }
        #expect(enough, "cam did not start 6 segments: \(daemon.stderrSoFar)")
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        let names = [dir.path("cam.mp4")] + segments(r.stderr)
        #expect(Set(names).count == names.count, "a name was given out twice: \(names)")
        let screen = dir.contents.filter { $0.wholeMatch(of: /cam-\d{6}\.mp4/) != nil }
        try #require(screen.count == 1, "screen's recording: \(dir.contents); \(r.stderr)")
        let encoded = Self.framesEncoded(r.stderr)
        let frames = try probe(dir.path(screen[0])).video?.frames ?? 0
        #expect(encoded > 0 && frames == encoded, "screen's file holds \(frames) frames of \(encoded) encoded")
        try expectDecodesCleanly(dir.path(screen[0]))
        #expect(!r.stderr.contains("deleted \(dir.path(screen[0]))"), "\(r.stderr)")
        // Retention went on with cam's own files: only the newest is left.
        #expect(r.stderr.contains("retention: deleted \(dir.path("cam.mp4"))"), "\(r.stderr)")
        let cam = dir.contents.filter { $0.hasSuffix(".mp4") && !screen.contains($0) }
        #expect(cam == [String(names.last!.split(separator: "/").last!)], "\(cam)")
    }

    /// Conversions in the directories (`%Y/%m/...`) make those directories. A recording that a
    /// SIGKILL left fragmented is not repaired while another process has it open, and is once
    /// nobody has; the temporary file of an interrupted finalize beside it is removed, while a
    /// look-alike beside no file of ours stays.
    @Test func orphansAreRepairedOnlyWhenNobodyHasThemOpen() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let outputs = """
            [[output]]
            name = "rec"
            path = "\(dir.path("%Y/%m/crash-%H%M%S.mp4"))"
            """
        let (first, socket) = try launchDaemon(dir, outputs: outputs)
        _ = try waitUntilRecording(socket)
        usleep(3_000_000)
        first.signal(SIGKILL)
        _ = first.wait(timeout: 10)
        #expect(!FileManager.default.fileExists(atPath: dir.path("%Y")), "a literal %Y directory")
        let year = try #require(dir.contents.first { $0.count == 4 && $0.allSatisfy(\.isNumber) }, "\(dir.contents)")
        let month = try #require(
            (try? FileManager.default.contentsOfDirectory(atPath: dir.path(year)))?.first, "no month directory")
        let monthDirectory = dir.path("\(year)/\(month)")
        let orphanName = try #require(
            (try FileManager.default.contentsOfDirectory(atPath: monthDirectory)).first { $0.hasPrefix("crash-") })
        let orphan = "\(monthDirectory)/\(orphanName)"
        #expect(try mp4TopLevelBoxes(orphan).contains("moof"), "expected a fragmented file after SIGKILL")
        // What a second SIGINT during finalize leaves, and a look-alike that is not ours.
        let leftover = "\(monthDirectory)/.\(orphanName).finalizing.mp4"
        let stranger = "\(monthDirectory)/.holiday.mp4.finalizing.mp4"
        for path in [leftover, stranger] { FileManager.default.createFile(atPath: path, contents: Data(repeating: 1, count: 100)) }

        // Another process has the orphan open: it is left alone.
        let holder = try Child("/bin/sh", ["-c", "exec sleep 60 < \"$0\"", orphan])
        defer { holder.signal(SIGKILL); _ = holder.wait(timeout: 10) }
        usleep(300_000)
        usleep(1_100_000)  // the next recording gets another name
        let (second, _) = try launchDaemon(dir, outputs: outputs)
        _ = try waitUntilRecording(socket)
        second.signal(SIGTERM)
        let r2 = second.wait(timeout: 60)
        #expect(r2.status == 0, "\(r2.stderr)")
        #expect(r2.stderr.contains("not recovering \(orphan)"), "\(r2.stderr)")
        #expect(r2.stderr.contains("process \(holder.process.processIdentifier) has it open"), "\(r2.stderr)")
        #expect(try mp4TopLevelBoxes(orphan).contains("moof"), "a file another process has open was rewritten")
        #expect(!FileManager.default.fileExists(atPath: leftover), "the interrupted finalize's temporary file is still there")
        #expect(FileManager.default.fileExists(atPath: stranger), "a temporary-looking file that is not ours was removed")

        // Nobody has it open any more: repaired at the next start.
        holder.signal(SIGKILL)
        _ = holder.wait(timeout: 10)
        let (third, _) = try launchDaemon(dir, outputs: outputs)
        _ = try waitUntilRecording(socket)
        third.signal(SIGTERM)
        let r3 = third.wait(timeout: 60)
        #expect(r3.status == 0, "\(r3.stderr)")
        #expect(r3.stderr.contains("recovering \(orphan)"), "\(r3.stderr)")
        let boxes = try mp4TopLevelBoxes(orphan)
        #expect(!boxes.contains("moof") && boxes.contains("moov"), "not repaired: \(boxes)")
        try expectDecodesCleanly(orphan)
        #expect(try probe(orphan).video?.frames ?? 0 >= 60)
    }

    /// A config written on Windows (CRLF, a byte order mark) starts the daemon.
    @Test func configWithCRLFAndAByteOrderMarkStarts() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        let config = "\u{FEFF}[video]\r\nsize = \"320x180\"\r\n[control]\r\nsocket = \"\(socket)\"\r\n[[output]]\r\nname = \"rec\"\r\npath = \"\(dir.path("rec.mkv"))\"\r\n"
        let daemon = try spawnDaemon(config: config, in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        let up = try waitUntilRecording(socket)
        #expect(up.contains("\"name\":\"rec\""), "\(up)")
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
    }

    /// A config over 1 MiB is refused with a reason, not "Success".
    @Test func oversizedConfigSaysWhy() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("big.toml")
        try String(repeating: "# padding padding padding padding padding padding padding padding\n", count: 20_000)
            .write(toFile: file, atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", file], timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("\(file):0: cannot read the config file: it is larger than 1 MiB"), "\(r.stderr)")
        #expect(!r.stderr.contains("Success"))
        #expect(r.stderr.split(separator: "\n").count == 1)
    }

    /// An output that failed and is then removed by SIGHUP no longer counts: the remaining healthy
    /// recording goes on. (Before: failures ever seen were compared with the current number of
    /// outputs, so 1 failed >= 1 output ended the broadcast.)
    @Test func removingAFailedOutputLeavesTheOthersRunning() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let keep = """
            [[output]]
            name = "rec"
            path = "\(dir.path("rec.mkv"))"
            """
        let doomed = """

            [[output]]
            name = "doomed"
            path = "\(dir.path("sub/seg-%H%M%S.mkv"))"
            segment = "1s"
            """
        try FileManager.default.createDirectory(atPath: dir.path("sub"), withIntermediateDirectories: true)
        let (daemon, socket) = try launchDaemon(dir, outputs: keep + doomed)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        // The next segment cannot be created: a file where its directory was.
        try FileManager.default.removeItem(atPath: dir.path("sub"))
        FileManager.default.createFile(atPath: dir.path("sub"), contents: Data("not a directory".utf8))
        var status = ""
        for _ in 0..<100 {
            status = try broadcast(["status", "--socket", socket]).stdout
            if status.contains("\"name\":\"doomed\",\"kind\":\"recording\"") && status.contains("\"state\":\"failed\"") { break }
            usleep(100_000)
        }
        #expect(status.contains("\"state\":\"failed\""), "the output did not fail: \(status)")
        // Reload without it (written as the whole config launchDaemon writes, minus the output),
        // with `broadcast reload` (SIGHUP's twin that answers).
        let config = try String(contentsOfFile: dir.path("d.toml"), encoding: .utf8).replacingOccurrences(of: doomed, with: "")
        // A config with an error first: `broadcast reload` says where (exit 1) and nothing changes.
        try config.replacingOccurrences(of: "keyframe_interval = \"1s\"", with: "keyframe_interval = \"1 fortnight\"")
            .write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let refused = try broadcast(["reload", "--socket", socket])
        #expect(refused.status == 1 && refused.stderr.contains("config not reloaded: \(dir.path("d.toml")):4: encoder.keyframe_interval"),
            "exit \(refused.status): \(refused.stderr)")
        // Then the good one: answered once applied (no sleep needed), with the outputs now.
        try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let reloaded = try broadcast(["reload", "--socket", socket])
        #expect(reloaded.status == 0 && reloaded.stdout.contains("\"outputs\":[\"rec\"]"), "exit \(reloaded.status): \(reloaded.stdout) \(reloaded.stderr)")
        let after = try broadcast(["status", "--socket", socket])
        #expect(after.stdout.contains("\"state\":\"started\""), "the broadcast ended: \(after.stdout) \(after.stderr)")
        #expect(!after.stdout.contains("\"name\":\"doomed\""), "\(after.stdout)")
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(!r.stderr.contains("every output failed"), "\(r.stderr)")
        try expectDecodesCleanly(dir.path("rec.mkv"))
    }

    /// Crash recovery runs before READY=1; before each file it finalizes, the daemon asks systemd
    /// for more time (EXTEND_TIMEOUT_USEC), so a long orphan does not get it killed at start.
    @Test func recoveryAsksSystemdForMoreTime() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let outputs = """
            [[output]]
            name = "rec"
            path = "\(dir.path("crash-%H%M%S.mp4"))"
            """
        let (first, socket) = try launchDaemon(dir, outputs: outputs)
        _ = try waitUntilRecording(socket)
        usleep(2_000_000)
        first.signal(SIGKILL)
        _ = first.wait(timeout: 10)
        usleep(1_100_000)  // the next recording gets another name
        let notify = try NotifyListener(directory: dir)
        let second = try Child(broadcastBinary, ["daemon", "--config", dir.path("d.toml")], environment: ["NOTIFY_SOCKET": notify.path])
        defer { second.signal(SIGKILL); _ = second.wait(timeout: 10) }
        let messages = notify.wait(for: "READY=1", seconds: 30)
        let extend = messages.firstIndex { $0.contains("EXTEND_TIMEOUT_USEC=") }
        let ready = messages.firstIndex { $0.contains("READY=1") }
        #expect(extend != nil && ready != nil && extend! < ready!, "\(messages)")
        second.signal(SIGTERM)
        let r = second.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stderr.contains("recovering "), "\(r.stderr)")
    }

    /// A SIGHUP that adds a recording in a directory another daemon holds is refused as a whole;
    /// the running outputs go on.
    @Test func reloadIntoAnotherDaemonsDirectoryIsRefused() throws {
        let a = try TemporaryDirectory()
        let b = try TemporaryDirectory()
        defer { a.cleanup(); b.cleanup() }
        let (other, otherSocket) = try launchDaemon(b, outputs: "[[output]]\nname = \"theirs\"\npath = \"\(b.path("theirs.mkv"))\"\n")
        defer { other.signal(SIGKILL); _ = other.wait(timeout: 10) }
        let (daemon, socket) = try launchDaemon(a, outputs: "[[output]]\nname = \"mine\"\npath = \"\(a.path("mine.mkv"))\"\n")
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(otherSocket)
        _ = try waitUntilRecording(socket)
        let config = try String(contentsOfFile: a.path("d.toml"), encoding: .utf8)
            + "\n[[output]]\nname = \"intruder\"\npath = \"\(b.path("intruder-%H%M%S.mkv"))\"\n"
        try config.write(toFile: a.path("d.toml"), atomically: true, encoding: .utf8)
        daemon.signal(SIGHUP)
        usleep(2_000_000)
        let status = try broadcast(["status", "--socket", socket]).stdout
        #expect(!status.contains("intruder"), "\(status)")
        #expect(!b.contents.contains { $0.hasPrefix("intruder") }, "\(b.contents)")
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stderr.contains("SIGHUP: config not reloaded: \(b.path("")) is in use by another broadcast daemon (pid \(other.process.processIdentifier)")
                || r.stderr.contains("SIGHUP: config not reloaded: \(b.url.path) is in use by another broadcast daemon (pid \(other.process.processIdentifier)"),
                "\(r.stderr)")
        other.signal(SIGTERM)
        #expect(other.wait(timeout: 60).status == 0)
    }
}
