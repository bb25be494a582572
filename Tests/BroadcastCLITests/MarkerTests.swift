import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Markers (issue 38, item 1): `broadcast mark`, `POST /v1/marker` and lines typed to `record`
/// become chapters at the media time they were taken, checked with ffprobe on the real files.
@Suite(.serialized) struct MarkerTests {
    /// One frame of the test sources (30 fps).
    static let frame = 1.0 / 30

    struct Chapter {
        var start: Double
        var title: String
    }

    /// The file's chapters (ffprobe -show_chapters), without the untitled one MP4/MOV start with.
    static func chapters(_ path: String) throws -> [Chapter] {
        let r = try run("/usr/bin/ffprobe", ["-v", "error", "-show_chapters", "-of", "json", path])
        let json = try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any], "\(r.stderr)")
        let list = json["chapters"] as? [[String: Any]] ?? []
        return list.compactMap { c in
            let title = (c["tags"] as? [String: Any])?["title"] as? String ?? ""
            guard !title.isEmpty, let start = Double(c["start_time"] as? String ?? "") else { return nil }
            return Chapter(start: start, title: title)
        }
    }

    /// POST /v1/marker through curl: the HTTP status and the answer.
    static func post(_ socket: String, query: String = "", body: String? = nil) throws -> (Int, [String: Any]) {
        var args = ["-s", "-w", "\n%{http_code}", "--unix-socket", socket, "-X", "POST"]
        if let body { args += ["-H", "Content-Type: application/json", "--data-binary", body] }
        args.append("http://localhost/v1/marker\(query)")
        let r = try run("/usr/bin/curl", args)
        let lines = r.stdout.split(separator: "\n")
        let status = Int(lines.last ?? "") ?? 0
        let answer = (try? JSONSerialization.jsonObject(with: Data(lines.dropLast().joined(separator: "\n").utf8))) as? [String: Any] ?? [:]
        return (status, answer)
    }

    static func status(_ socket: String) throws -> [String: Any] {
        let r = try broadcast(["status", "--socket", socket, "--json"])
        return try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any], "\(r.stderr)")
    }

    /// Expects `file`'s chapters to be `expected` (title, media seconds), each within a frame.
    static func expectChapters(_ file: String, _ expected: [(String, Double)], sourceLocation: SourceLocation = #_sourceLocation) throws {
        let found = try chapters(file)
        #expect(found.map(\.title) == expected.map(\.0), "\(file): \(found)", sourceLocation: sourceLocation)
        for (chapter, (title, time)) in zip(found, expected) {
            #expect(abs(chapter.start - time) <= frame + 0.002, "\(file): \(title) at \(chapter.start) s, taken at \(time) s", sourceLocation: sourceLocation)
        }
    }

    static let outputs = """
        [[output]]
        name = "mkv"
        path = "%DIR%/rec.mkv"
        [[output]]
        name = "mp4"
        path = "%DIR%/rec.mp4"
        [[output]]
        name = "mov"
        path = "%DIR%/rec.mov"

        """

    /// Marks by the CLI (a non-ASCII title), by the API with a JSON body and with ?title=, and
    /// one without a title; both files get them as chapters at the media time each was taken.
    @Test func markersBecomeChaptersInMKVAndMP4() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        // The finished-file command writes what it got in BROADCAST_MARKERS beside the file.
        let hook = #"on_file_finished = ["/bin/sh", "-c", "printf '%s' \"$BROADCAST_MARKERS\" > \"$BROADCAST_FILE.got\""]"#
        let outputs = Self.outputs.replacingOccurrences(of: "%DIR%", with: dir.url.path)
            .replacingOccurrences(of: "rec.mkv\"\n", with: "rec.mkv\"\n\(hook)\n")
        let (daemon, socket) = try launchDaemon(dir, outputs: outputs)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        let watcher = try Child(broadcastBinary, ["status", "--watch", "--json", "--socket", socket])
        defer { watcher.signal(SIGKILL); _ = watcher.wait(timeout: 10) }
        usleep(1_000_000)
        let unicode = "Grüße – 日本語 🎬"
        let cli = try broadcast(["mark", "--socket", socket, unicode])
        #expect(cli.status == 0, "\(cli.stderr)")
        let first = try #require(try JSONSerialization.jsonObject(with: Data(cli.stdout.utf8)) as? [String: Any], "\(cli.stdout)")
        usleep(700_000)
        let (s2, second) = try Self.post(socket, body: #"{"title": "Zweite \"Szene\"\nmit Umbruch"}"#)
        #expect(s2 == 200, "\(second)")
        usleep(700_000)
        let (s3, third) = try Self.post(socket, query: "?title=d%C3%A9j%C3%A0%20vu")
        #expect(s3 == 200, "\(third)")
        usleep(500_000)
        let (s4, fourth) = try Self.post(socket)
        #expect(s4 == 200, "\(fourth)")
        #expect(fourth["title"] as? String == "Marker 4")
        usleep(1_000_000)
        let status = try Self.status(socket)
        let marks = status["marks"] as? [[String: Any]] ?? []
        #expect(marks.compactMap { $0["title"] as? String } == [unicode, "Zweite \"Szene\"\nmit Umbruch", "déjà vu", "Marker 4"])
        for output in status["outputs"] as? [[String: Any]] ?? [] {
            #expect((output["marks"] as? [Any])?.count == 4, "\(output)")
        }
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        let expected = [first, second, third, fourth].map { ($0["title"] as? String ?? "?", $0["media_seconds"] as? Double ?? -1) }
        try Self.expectChapters(dir.path("rec.mkv"), expected)
        try Self.expectChapters(dir.path("rec.mp4"), expected)
        try Self.expectChapters(dir.path("rec.mov"), expected)
        try expectDecodesCleanly(dir.path("rec.mp4"))
        // The command got the markers: "SECONDS<TAB>TITLE" lines, line breaks in a title escaped.
        let got = (try? String(contentsOfFile: dir.path("rec.mkv.got"), encoding: .utf8)) ?? ""
        let lines = got.split(separator: "\n").map { $0.split(separator: "\t", maxSplits: 1) }
        #expect(lines.map { $0.last.map(String.init) ?? "" } == [unicode, #"Zweite "Szene"\nmit Umbruch"#, "déjà vu", "Marker 4"], "\(got)")
        for (line, (_, time)) in zip(lines, expected) {
            #expect(abs((Double(line.first ?? "") ?? -1) - time) <= Self.frame, "\(line)")
        }
        // The marks files beside the recordings go once the chapters are in them.
        #expect(!dir.contents.contains { $0.hasSuffix(".marks") }, "\(dir.contents)")
        // Each marker was an event.
        let events = watcher.stdoutSoFar.split(separator: "\n").filter { $0.contains("\"event\":\"marker\"") }
        #expect(events.count == 4, "\(watcher.stdoutSoFar)")
        #expect(events.first?.contains("\"title\":\"\(unicode)\"") == true, "\(events)")
    }

    /// 409 while nothing records, 400 for a title over 1024 bytes (and one that is not text), and
    /// the CLI without a daemon: one line, nonzero exit.
    @Test func markersRefused() throws {
        try withRecordingDaemon { dir, socket, _, _ in
            let long = String(repeating: "x", count: 10_000)
            let (tooLong, answer) = try Self.post(socket, body: #"{"title": "\#(long)"}"#)
            #expect(tooLong == 400, "\(answer)")
            #expect((answer["error"] as? String)?.contains("1024 bytes") == true, "\(answer)")
            let (notText, answer2) = try Self.post(socket, body: #"{"title": 5}"#)
            #expect(notText == 400, "\(answer2)")
            let cli = try broadcast(["mark", "--socket", socket, long])
            #expect(cli.status != 0 && cli.stderr.contains("1024 bytes"), "\(cli.stderr)")
            let stop = try broadcast(["stop", "--socket", socket])
            #expect(stop.status == 0, "\(stop.stderr)")
            let (idle, answer3) = try Self.post(socket, body: #"{"title": "late"}"#)
            #expect(idle == 409, "\(answer3)")
            #expect((answer3["error"] as? String)?.isEmpty == false, "\(answer3)")
            let cliIdle = try broadcast(["mark", "--socket", socket, "late"])
            #expect(cliIdle.status != 0 && cliIdle.stderr.contains("409"), "\(cliIdle.stderr)")
            _ = dir
        }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let none = try broadcast(["mark", "--socket", dir.path("none.sock"), "x"])
        #expect(none.status != 0)
        #expect(none.stderr.split(separator: "\n").count == 1 && none.stderr.contains("none.sock"), "\(none.stderr)")
    }

    /// Seconds of video in `file` (frames at 30 fps).
    static func videoSeconds(_ file: String) throws -> Double {
        Double(try packetTimes(file, stream: "v:0").count) * frame
    }

    /// A segmented recording: each marker goes into the file written when it was taken, at its
    /// time from that file's start.
    @Test func segmentsGetTheirOwnMarkers() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let outputs = """
            [[output]]
            name = "seg"
            path = "\(dir.path("seg-%s.mkv"))"
            segment = "2s"

            """
        let (daemon, socket) = try launchDaemon(dir, outputs: outputs)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        var taken: [(String, Double)] = []
        for title in ["eins", "zwei", "drei"] {
            usleep(1_300_000)
            let (status, answer) = try Self.post(socket, body: #"{"title": "\#(title)"}"#)
            #expect(status == 200, "\(answer)")
            taken.append((title, answer["media_seconds"] as? Double ?? -1))
        }
        usleep(2_500_000)
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")
        let files = dir.contents.filter { $0.hasPrefix("seg-") && $0.hasSuffix(".mkv") }.sorted {
            $0.count != $1.count ? $0.count < $1.count : $0 < $1
        }
        #expect(files.count >= 3, "\(files)")
        // Each segment's place in the broadcast's media time: the video before it (segments cut
        // at keyframes, nothing lost or repeated), from the first frame's time.
        var start = try packetTimes(dir.path(files[0]), stream: "v:0").first ?? 0
        var found = 0
        for file in files {
            let length = try Self.videoSeconds(dir.path(file))
            let mine = taken.filter { $0.1 >= start && $0.1 < start + length }.map { ($0.0, $0.1 - start) }
            try Self.expectChapters(dir.path(file), mine)
            found += mine.count
            start += length
        }
        #expect(found == 3, "taken at \(taken)")
    }

    /// SIGKILL mid-recording: the marks noted beside the files become chapters when the next
    /// start recovers them, MKV and MP4 alike.
    @Test func markersSurviveSIGKILL() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let config = Self.outputs.replacingOccurrences(of: "%DIR%", with: dir.url.path)
        let (daemon, socket) = try launchDaemon(dir, outputs: config)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        usleep(1_000_000)
        var taken: [(String, Double)] = []
        for title in ["vor dem Absturz ☠", "kurz davor"] {
            let (status, answer) = try Self.post(socket, body: #"{"title": "\#(title)"}"#)
            #expect(status == 200, "\(answer)")
            taken.append((title, answer["media_seconds"] as? Double ?? -1))
            usleep(1_000_000)
        }
        usleep(1_500_000)
        daemon.signal(SIGKILL)
        _ = daemon.wait(timeout: 10)
        #expect(dir.contents.contains(".rec.mkv.marks") && dir.contents.contains(".rec.mp4.marks"), "\(dir.contents)")
        // The next start recovers them (before its own recording, which goes to new names).
        let (again, socket2) = try launchDaemon(dir, outputs: config)
        defer { again.signal(SIGKILL); _ = again.wait(timeout: 10) }
        _ = try waitUntilRecording(socket2)
        #expect(again.stderrSoFar.contains("recovering \(dir.path("rec.mkv"))"), "\(again.stderrSoFar)")
        try Self.expectChapters(dir.path("rec.mkv"), taken)
        try Self.expectChapters(dir.path("rec.mp4"), taken)
        try Self.expectChapters(dir.path("rec.mov"), taken)
        try expectDecodesCleanly(dir.path("rec.mkv"))
        #expect(!dir.contents.contains { $0.hasSuffix(".marks") }, "\(dir.contents)")
    }

    /// `record`: each line on its standard input (a FIFO here, a terminal for a person) is a
    /// marker, titled by the line; an empty line is "Marker N".
    @Test func recordTakesTypedLines() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let fifo = dir.path("keys")
        #expect(mkfifo(fifo, 0o600) == 0)
        let file = dir.path("talk.mkv")
        // Open before the child (read and write: it does not wait for a reader), so the child's
        // open of its end does not wait for a writer inside posix_spawn.
        let fd = open(fifo, O_RDWR)
        #expect(fd >= 0)
        let child = try Child(broadcastBinary, ["record", file, "--size", "320x180", "--duration", "5s"], stdin: fifo)
        defer { child.signal(SIGKILL); _ = child.wait(timeout: 10) }
        usleep(1_500_000)
        for line in ["Folie 2 – Ergebnis ✓\n", "\n"] {
            _ = line.withCString { write(fd, $0, strlen($0)) }
            usleep(1_200_000)
        }
        close(fd)
        let r = child.wait(timeout: 120)
        #expect(r.status == 0, "\(r.stderr)")
        // "marker 1 "TITLE" at 00:00:01.53 of media"
        let logged: [(String, Double)] = r.stderr.split(separator: "\n").compactMap { line in
            guard let m = line.range(of: "marker "), let at = line.range(of: "\" at ", options: .backwards),
                let q = line[m.upperBound...].firstIndex(of: "\"")
            else { return nil }
            let title = String(line[line.index(after: q)..<at.lowerBound])
            let clock = line[at.upperBound...].split(separator: " ").first ?? ""
            let parts = clock.split(separator: ":").compactMap { Double($0) }
            guard parts.count == 3 else { return nil }
            return (title, parts[0] * 3600 + parts[1] * 60 + parts[2])
        }
        #expect(logged.map(\.0) == ["Folie 2 – Ergebnis ✓", "Marker 2"], "\(r.stderr)")
        // The log says the time to the hundredth.
        let found = try Self.chapters(file)
        #expect(found.map(\.title) == logged.map(\.0), "\(found)")
        for (chapter, (title, time)) in zip(found, logged) {
            #expect(abs(chapter.start - time) <= Self.frame + 0.011, "\(title) at \(chapter.start) s, taken at \(time) s")
        }
    }

    /// A replay save gets the markers its window holds, at their time from the save's start; one
    /// taken before the window is not in it.
    @Test func replaySaveHoldsTheMarkersInItsWindow() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "replay"
            replay = "20s"
            path = "\(dir.path("save-%s.mkv"))"

            """)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        usleep(500_000)
        let (s1, before) = try Self.post(socket, body: #"{"title": "draußen"}"#)
        #expect(s1 == 200, "\(before)")
        usleep(3_000_000)
        let (s2, inside) = try Self.post(socket, body: #"{"title": "drinnen ✓"}"#)
        #expect(s2 == 200, "\(inside)")
        usleep(700_000)
        let media = try Self.status(socket)["media_seconds"] as? Double ?? -1
        let saved = try broadcast(["replay", "save", "--socket", socket, "--seconds", "1.5"])
        #expect(saved.status == 0, "\(saved.stderr)")
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(saved.stdout.utf8)) as? [String: Any], "\(saved.stdout)")
        let path = try #require(answer["path"] as? String)
        let seconds = answer["seconds"] as? Double ?? 0
        // Where the save starts in media time: the test pattern flashes white at each whole
        // second of media time, which pins the offset the status and the save's length estimate.
        let white = try #require(try whiteFrameTimes(path).first, "no flash in \(path)")
        let offset = ((media - seconds) + white).rounded() - white
        try Self.expectChapters(path, [("drinnen ✓", (inside["media_seconds"] as? Double ?? -1) - offset)])
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
    }

    /// A mark taken while the broadcast is paused (media time stands still, the file has no gap)
    /// is where the file goes on; one after the resume at its media time.
    @Test func aMarkWhilePausedIsWhereTheFileGoesOn() throws {
        try withRecordingDaemon { dir, socket, _, daemon in
            usleep(1_500_000)
            #expect(try broadcast(["pause", "--socket", socket]).status == 0)
            usleep(800_000)
            let (s1, paused) = try Self.post(socket, body: #"{"title": "in der Pause"}"#)
            #expect(s1 == 200, "\(paused)")
            usleep(800_000)
            #expect(try broadcast(["resume", "--socket", socket]).status == 0)
            usleep(1_500_000)
            let (s2, after) = try Self.post(socket, body: #"{"title": "danach"}"#)
            #expect(s2 == 200, "\(after)")
            usleep(1_000_000)
            daemon.signal(SIGTERM)
            #expect(daemon.wait(timeout: 60).status == 0)
            try Self.expectChapters(dir.path("rec.mkv"), [paused, after].map { ($0["title"] as? String ?? "?", $0["media_seconds"] as? Double ?? -1) })
        }
    }
}
