import Foundation
import Testing

/// What broadcast must never do to a user's files: replace one without being asked, delete one it
/// did not create, put two recordings in one file, hang on a FIFO, or die with its stderr.
@Suite(.serialized) struct FileSafetyTests {
    static let quick = ["--size", "160x96", "--no-realtime", "--duration", "2s", "--quiet"]

    /// The owner, permissions and content of `path`, without following a link.
    func fingerprint(_ path: String) -> String {
        var info = stat()
        guard lstat(path, &info) == 0 else { return "missing" }
        var text = "mode=\(String(info.st_mode, radix: 8)) uid=\(info.st_uid) size=\(info.st_size)"
        if info.st_mode & S_IFMT == S_IFLNK {
            text += " link=" + ((try? FileManager.default.destinationOfSymbolicLink(atPath: path)) ?? "?")
        } else if let data = FileManager.default.contents(atPath: path) {
            text += " content-hash=\(data.hashValue)"
        }
        return text
    }

    @Test func existingFileIsRefusedWithoutOverwrite() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("keep.mp4")
        try "my wedding".write(toFile: file, atomically: false, encoding: .utf8)
        let before = fingerprint(file)
        let r = try broadcast(["record", file] + Self.quick)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
        #expect(r.stderr.contains("exists") && r.stderr.contains("--overwrite"), "\(r.stderr)")
        #expect(fingerprint(file) == before)
        #expect(dir.contents == ["keep.mp4"], "nothing else created: \(dir.contents)")
    }

    /// --overwrite (-y) replaces the file, only when the new recording is complete, and leaves no
    /// temporary file behind.
    @Test(arguments: ["--overwrite", "-y"])
    func overwriteReplacesTheFile(flag: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("old.mp4")
        try "old".write(toFile: file, atomically: false, encoding: .utf8)
        let r = try broadcast(["record", file, flag] + Self.quick)
        #expect(r.status == 0, "exit \(r.status): \(r.stderr)")
        let p = try probe(file)
        #expect(p.video?.codec == "h264" && (p.formatDuration ?? 0) > 1.5, "\(p)")
        #expect(try mp4TopLevelBoxes(file).prefix(2) == ["ftyp", "moov"])
        try expectDecodesCleanly(file)
        #expect(dir.contents == ["old.mp4"], "no temporary file left: \(dir.contents)")
    }

    /// An X display number no server answers on (no socket in /tmp/.X11-unix).
    static func absentDisplay() -> Int {
        (900..<1000).first { !FileManager.default.fileExists(atPath: "/tmp/.X11-unix/X\($0)") } ?? 999
    }

    /// A start whose source fails (an X display that is not there) leaves nothing behind: with -y
    /// the file it was asked to replace is unchanged, without it no empty new file is left. Before:
    /// the file was replaced by a shell without media (262 bytes for .mp4, 681 for .mkv, 0 for .ts)
    /// and a new name kept an empty shell.
    @Test(arguments: ["mp4", "mkv", "ts"])
    func aFailedStartReplacesNothingAndLeavesNothing(ext: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("k.\(ext)")
        try "my wedding".write(toFile: file, atomically: false, encoding: .utf8)
        let before = fingerprint(file)
        let failing = ["--video", "x11::\(Self.absentDisplay())", "--duration", "2s", "--quiet"]
        let replaced = try broadcast(["record", file, "-y"] + failing)
        #expect(replaced.status != 0, "the start did not fail: \(replaced.stderr)")
        #expect(fingerprint(file) == before, "the file asked to be replaced changed: \(fingerprint(file))")
        #expect(dir.contents == ["k.\(ext)"], "left behind: \(dir.contents)")
        let created = try broadcast(["record", dir.path("new.\(ext)")] + failing)
        #expect(created.status != 0, "the start did not fail: \(created.stderr)")
        #expect(dir.contents == ["k.\(ext)"], "left behind: \(dir.contents)")
    }

    /// Every file a run writes is written through the descriptor that created it (`O_EXCL`) and
    /// never opened for writing again by name, so nothing the name points to by then (a link put
    /// there, another file) is truncated or written. Checked on the real binary with strace: a
    /// replacement (its `.partial`, the finalize's temporary file) and a new file. Before: the
    /// `.partial` was reopened by libavformat with O_TRUNC, the temporary file by the finalize.
    @Test func filesAreWrittenOnlyThroughTheDescriptorThatCreatedThem() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        try "old".write(toFile: dir.path("r.mp4"), atomically: false, encoding: .utf8)
        for (file, extra) in [("r.mp4", ["-y"]), ("n.mkv", [])] {
            let trace = dir.path("trace-\(file).txt")
            let r = try run(
                "/usr/bin/strace",
                ["-f", "-qq", "-e", "trace=open,openat,creat", "-o", trace, broadcastBinary, "record", dir.path(file)] + extra + Self.quick)
            #expect(r.status == 0, "exit \(r.status): \(r.stderr)")
            let opens = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n")
                .filter { $0.contains(dir.url.lastPathComponent) && !$0.contains("trace-") }
            let writes = opens.filter { $0.contains("O_WRONLY") || $0.contains("O_RDWR") || $0.contains("creat(") }
            #expect(writes.count == (file == "r.mp4" ? 2 : 1), "\(file): \(opens)")
            for line in writes {
                #expect(line.contains("O_EXCL") && !line.contains("O_TRUNC"), "\(file): \(line)")
            }
            let paths = writes.compactMap { $0.firstMatch(of: /"([^"]+)"/).map { String($0.1) } }
            #expect(Set(paths).count == paths.count, "\(file): a file opened twice for writing: \(writes)")
            try expectDecodesCleanly(dir.path(file))
        }
    }

    /// A read-only file owned by someone else (root) in a world-writable directory: the
    /// run fails (exit 2, before anything is written) and the file is still there, unchanged,
    /// with --overwrite too. Before: the failed open was followed by an unlink of the path.
    @Test func readOnlyFileOfAnotherUserSurvivesAFailedRun() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("keep.mp4")
        try "keep".write(toFile: file, atomically: false, encoding: .utf8)
        chmod(file, 0o444)
        chmod(dir.url.path, 0o777)
        let asOther: [String] = getuid() == 0
            ? ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", broadcastBinary]
            : [broadcastBinary]
        if getuid() != 0 { chmod(dir.url.path, 0o555) }
        defer { chmod(dir.url.path, 0o755) }
        let before = fingerprint(file)
        for extra in [[], ["--overwrite"]] {
            let r = try run(asOther[0], Array(asOther.dropFirst()) + ["record", file] + extra + Self.quick)
            #expect(r.status == 2, "\(extra): exit \(r.status): \(r.stderr)")
            #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
            #expect(fingerprint(file) == before, "\(extra)")
        }
        #expect(dir.contents == ["keep.mp4"], "\(dir.contents)")
    }

    /// A link to /dev/full: the link is followed, the write fails (no space), the link stays.
    @Test func symlinkToDevFullIsUntouched() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let link = dir.path("full.mp4")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: "/dev/full")
        let before = fingerprint(link)
        let r = try broadcast(["record", link] + Self.quick)
        #expect(r.status != 0, "writing to /dev/full cannot succeed: \(r.stderr)")
        #expect(r.stderr.contains("No space left"), "\(r.stderr)")
        #expect(fingerprint(link) == before)
        #expect(dir.contents == ["full.mp4"], "\(dir.contents)")
    }

    /// A link is followed: its target is what gets replaced (with --overwrite), the link stays a
    /// link; a link to nothing is refused.
    @Test func symlinksAreFollowed() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        try FileManager.default.createDirectory(atPath: dir.path("disk"), withIntermediateDirectories: false)
        let target = dir.path("disk/real.mkv")
        try "old".write(toFile: target, atomically: false, encoding: .utf8)
        let link = dir.path("link.mkv")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
        let refused = try broadcast(["record", link] + Self.quick)
        #expect(refused.status == 2, "\(refused.stderr)")
        let replaced = try broadcast(["record", link, "-y"] + Self.quick)
        #expect(replaced.status == 0, "\(replaced.stderr)")
        #expect(fingerprint(link).contains("link=\(target)"))
        #expect((try probe(target).formatDuration ?? 0) > 1.5)
        let disk = try FileManager.default.contentsOfDirectory(atPath: dir.path("disk"))
        #expect(Set(dir.contents) == ["disk", "link.mkv"] && disk == ["real.mkv"], "\(dir.contents) \(disk)")

        let dangling = dir.path("dangling.mp4")
        try FileManager.default.createSymbolicLink(atPath: dangling, withDestinationPath: dir.path("nowhere/x.mp4"))
        let r = try broadcast(["record", dangling] + Self.quick)
        #expect(r.status == 2 && r.stderr.contains("symbolic link"), "\(r.stderr)")
        #expect(fingerprint(dangling).contains("link="))
    }

    /// `--record r.mp4 --output ./r.mp4` (or a path through a linked directory) is one file: refused
    /// before anything starts.
    @Test func twoOutputsWithOneFileAreRefused() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        try FileManager.default.createSymbolicLink(atPath: dir.path("alias"), withDestinationPath: dir.url.path)
        for second in ["./r.mp4", dir.path("alias/r.mp4")] {
            let child = try Child(
                broadcastBinary,
                ["stream", "rtmp://127.0.0.1:1/live/x", "--record", "r.mp4", "--output", second] + Self.quick,
                directory: dir.url)
            let r = child.wait(timeout: 60)
            #expect(r.status == 2, "\(second): exit \(r.status): \(r.stderr)")
            #expect(r.stderr.contains("same file") && r.stderr.split(separator: "\n").count == 1, "\(r.stderr)")
            #expect(!dir.contents.contains("r.mp4"))
        }
    }

    /// A FIFO is written as a stream: every container arrives whole at the reader (MP4 stays
    /// fragmented), the command ends, the FIFO stays. Before: MP4 hung at finalize reading the FIFO back.
    @Test(arguments: ["mp4", "mkv", "ts", "flv"])
    func fifoIsWrittenAsAStream(ext: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let fifo = dir.path("pipe.\(ext)")
        #expect(mkfifo(fifo, 0o644) == 0)
        let got = dir.path("got.\(ext)")
        let reader = try Child("/bin/sh", ["-c", "cat \"$0\" > \"$1\"", fifo, got])
        let r = try broadcast(["record", fifo] + Self.quick, timeout: 60)
        #expect(r.status == 0, "exit \(r.status) (\(r.reason == .uncaughtSignal ? "killed" : "exited")): \(r.stderr)")
        #expect(reader.wait(timeout: 20).status == 0)
        var info = stat()
        #expect(lstat(fifo, &info) == 0 && info.st_mode & S_IFMT == S_IFIFO, "the FIFO is still a FIFO")
        let times = try packetTimes(got, stream: "v:0")
        #expect(times.count >= 55, "\(times.count) video packets")
        try expectDecodesCleanly(got)
    }

    /// SIGPIPE is ignored: with its stderr closed early (`2>&1 | head -2`) the recording goes on and
    /// is finalized. Before: killed by SIGPIPE, an MP4 with no frames.
    @Test func closedStderrDoesNotStopTheRecording() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("p.mp4")
        let r = try run(
            "/bin/bash",
            ["-c", "\"$0\" record \"$1\" --size 160x96 --duration 3s --log-level debug 2>&1 | head -2; exit ${PIPESTATUS[0]}",
             broadcastBinary, file])
        #expect(r.status == 0, "broadcast's exit: \(r.status)")
        #expect(try mp4TopLevelBoxes(file).prefix(2) == ["ftyp", "moov"])
        let p = try probe(file)
        #expect(abs((p.formatDuration ?? 0) - 3) < 0.3, "\(p)")
        try expectDecodesCleanly(file)
    }
}

@Suite(.serialized) struct DaemonFileSafetyTests {
    /// Two daemon outputs with one path: a config error naming the file and line.
    @Test func twoOutputsWithOnePathAreAConfigError() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let outputs = recordingOutput(dir, name: "a", file: "r.mp4") + "[[output]]\nname = \"b\"\npath = \"\(dir.url.path)/./r.mp4\""
        let r = try launchDaemon(dir, sections: "", outputs: outputs).daemon.wait(timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("\(dir.path("d.toml")):6: output.path:") && r.stderr.contains("same file"), "\(r.stderr)")
        #expect(dir.contents == ["d.toml"], "\(dir.contents)")
    }

    /// The daemon's start fails (its X display is not there), twice, as systemd's
    /// Restart=on-failure would run it: the file an `overwrite = true` output was to replace is
    /// unchanged, and the output that would have taken a new name beside an existing file leaves
    /// no empty file (before: `keep-2.mp4`, `keep-3.mp4`, ... one shell per start).
    @Test func daemonAFailedStartLeavesNothingBehind() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        for name in ["replace.mp4", "keep.mp4"] {
            try "my wedding".write(toFile: dir.path(name), atomically: false, encoding: .utf8)
        }
        let before = ["replace.mp4", "keep.mp4"].map { FileSafetyTests().fingerprint(dir.path($0)) }
        let sections = "[video]\nsource = \"x11::\(FileSafetyTests.absentDisplay())\"\nsize = \"320x180\""
        let outputs = recordingOutput(dir, name: "replace", file: "replace.mp4", keys: "overwrite = true")
            + recordingOutput(dir, name: "beside", file: "keep.mp4")
        for attempt in 1...2 {
            let r = try launchDaemon(dir, sections: sections, outputs: outputs).daemon.wait(timeout: 60)
            #expect(r.status == 1, "attempt \(attempt): exit \(r.status): \(r.stderr)")
            #expect(r.stderr.contains("could not start"), "attempt \(attempt): \(r.stderr)")
        }
        #expect(["replace.mp4", "keep.mp4"].map { FileSafetyTests().fingerprint(dir.path($0)) } == before)
        let media = dir.contents.filter { $0.hasSuffix(".mp4") }.sorted()
        #expect(media == ["keep.mp4", "replace.mp4"], "left behind: \(dir.contents)")
    }

    /// `overwrite = true` replaces the file at the path (when complete); without it an existing file
    /// is kept and the recording takes a new name beside it.
    @Test func daemonOverwriteOrNewName() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        try "old a".write(toFile: dir.path("a.mkv"), atomically: false, encoding: .utf8)
        try "old b".write(toFile: dir.path("b.mkv"), atomically: false, encoding: .utf8)
        let (daemon, socket) = try launchDaemon(
            dir, outputs: recordingOutput(dir, name: "a", file: "a.mkv") + recordingOutput(dir, name: "b", file: "b.mkv", keys: "overwrite = true"))
        _ = try waitUntilRecording(socket)
        usleep(2_000_000)
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 30)
        #expect(r.status == 0, "\(r.stderr)")
        #expect((try? String(contentsOfFile: dir.path("a.mkv"), encoding: .utf8)) == "old a")
        #expect((try probe(dir.path("a-2.mkv")).video?.frames ?? 0) > 30)
        #expect((try probe(dir.path("b.mkv")).video?.frames ?? 0) > 30)
        // Besides the daemon's own dot files (its lock, its list of files written).
        #expect(Set(dir.contents.filter { !$0.hasPrefix(".") }) == ["a.mkv", "a-2.mkv", "b.mkv", "d.toml"], "\(dir.contents)")
    }

    /// Outputs added by SIGHUP start at zero in every container, and their duration is what they
    /// hold. Before: MKV, TS and FLV started at the broadcast's time (MKV: 6.9 s for 3 s).
    @Test func outputsAddedBySighupStartAtZero() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        usleep(3_000_000)
        let exts = ["mkv", "ts", "flv", "mp4"]
        let config = try String(contentsOfFile: dir.path("d.toml"), encoding: .utf8)
            + exts.map { recordingOutput(dir, name: "added-\($0)", file: "added.\($0)") }.joined()
        try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        daemon.signal(SIGHUP)
        usleep(3_000_000)
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 30)
        #expect(r.status == 0, "\(r.stderr)")
        for ext in exts {
            let file = dir.path("added.\(ext)")
            let video = try packetTimes(file, stream: "v:0")
            let audio = try packetTimes(file, stream: "a:0")
            let first = min(video.first ?? 99, audio.first ?? 99)
            #expect(first < 0.2, "\(ext) starts at \(first) s")
            let content = (video.last ?? 0) - (video.first ?? 0) + 1.0 / 30
            let duration = try probe(file).formatDuration ?? 0
            #expect(content > 1 && abs(duration - content) < 0.3, "\(ext): duration \(duration) s for \(content) s of video")
            try expectDecodesCleanly(file)
        }
    }
}
