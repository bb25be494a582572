import Foundation
import Testing

/// `broadcast status` for people against a running daemon: on a terminal (a pseudo-terminal made
/// by script(1)) a summary whose figures move, with `--watch` states changing as events arrive;
/// without a terminal, or with `--json`, the JSON document as before; a recording's bitrate is
/// what it writes, not 0.
@Suite(.serialized) struct StatusViewTests {
    static let outputs = """
        [[output]]
        name = "rec"
        path = "rec.mkv"
        [[output]]
        name = "live"
        url = "rtmp://127.0.0.1:1/live/STATUSKEY"

        """

    /// Runs `broadcast ARGS` under a pseudo-terminal 80 columns wide.
    static func onTerminal(_ arguments: [String]) throws -> Child {
        let command = (["COLUMNS=80", broadcastBinary] + arguments).map { "'\($0)'" }.joined(separator: " ")
        return try Child("/usr/bin/script", ["-q", "-f", "-e", "-c", "env " + command, "/dev/null"])
    }

    /// The frames a watch view drew so far (each starts by clearing the screen).
    static func frames(_ text: String) -> [String] {
        lines(text).components(separatedBy: "\u{1B}[H\u{1B}[2J").filter { $0.contains("broadcast: ") }
    }

    /// A terminal's lines end in CR LF (one Character in Swift, so never split at "\n").
    static func lines(_ text: String) -> String { text.replacingOccurrences(of: "\r\n", with: "\n") }

    static func mediaTime(_ frame: String) -> String? {
        guard let line = frame.split(separator: "\n").first(where: { $0.hasPrefix("broadcast: ") }),
              let at = line.range(of: "media ") else { return nil }
        return String(line[at.upperBound...].prefix { $0 != " " })
    }

    @Test func summaryOnATerminalJSONOtherwiseAndARecordingsBitrate() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: Self.outputs.replacingOccurrences(of: "rec.mkv", with: dir.path("rec.mkv")))
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)

        // Not a terminal: the JSON document, as scripts read it; --json the same.
        var recordingBitrate = 0.0
        for _ in 0..<150 where recordingBitrate <= 0 {
            let r = try broadcast(["status", "--socket", socket], timeout: 30)
            let document = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]
            let outputs = document?["outputs"] as? [[String: Any]] ?? []
            recordingBitrate = outputs.first { $0["name"] as? String == "rec" }?["bitrate"] as? Double ?? 0
            if recordingBitrate <= 0 { usleep(200_000) }
        }
        #expect(recordingBitrate > 0, "the recording's bitrate while it records")
        let json = try broadcast(["status", "--json", "--socket", socket], timeout: 30)
        #expect(json.status == 0 && json.stdout.hasPrefix("{\"state\":\"started\""), "\(json.stdout) \(json.stderr)")

        // On a terminal: the summary.
        let summary = try Self.onTerminal(["status", "--socket", socket]).wait(timeout: 60)
        #expect(summary.status == 0, "\(summary.stdout) \(summary.stderr)")
        let text = Self.lines(summary.stdout)
        #expect(text.contains("broadcast: started") && text.contains("fps") && text.contains("kbit/s"), "\(text)")
        #expect(text.contains("memory:") && text.contains("budget"), "\(text)")
        #expect(text.split(separator: "\n").contains { $0.contains("rec ") && $0.contains("recording") }, "\(text)")
        #expect(text.contains(dir.path("rec.mkv")) || text.contains("rec.mkv"), "\(text)")
        #expect(text.contains("rtmp://127.0.0.1:1/live/****") && !text.contains("STATUSKEY"), "\(text)")
        #expect(!text.contains("{\"state\""), "JSON on a terminal: \(text)")
        for line in text.split(separator: "\n") {
            #expect(line.count <= 80, "wider than 80 columns: \(line)")
        }

        // --watch on a terminal: figures refreshed (media time moves), a pause shows as it happens.
        let watch = try Self.onTerminal(["status", "--watch", "--socket", socket])
        defer { watch.signal(SIGKILL); _ = watch.wait(timeout: 10) }
        var media: Set<String> = []
        for _ in 0..<300 where media.count < 3 {
            media = Set(Self.frames(watch.stdoutSoFar).compactMap(Self.mediaTime))
            usleep(200_000)
        }
        #expect(media.count >= 3, "media time moving in the watch view: \(media)")
        let paused = try broadcast(["pause", "--output", "rec", "--socket", socket], timeout: 30)
        #expect(paused.status == 0, "\(paused.stderr)")
        var shown = false
        for _ in 0..<300 where !shown {
            shown = Self.frames(watch.stdoutSoFar).contains { frame in
                frame.split(separator: "\n").contains { $0.hasPrefix("  rec ") && $0.contains(" paused ") }
                    && frame.contains("rec paused")
            }
            if !shown { usleep(200_000) }
        }
        #expect(shown, "the pause in the view and its event listed: \(Self.frames(watch.stdoutSoFar).last ?? "no frame")")

        // The daemon's end ends the view (exit 0).
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
        let ended = watch.wait(timeout: 60)
        #expect(ended.status == 0, "the watch after the daemon stopped: \(ended.status) \(ended.stderr)")
    }
}
