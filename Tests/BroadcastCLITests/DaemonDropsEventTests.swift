import Foundation
import Testing

/// Drops crossing a threshold are events (issue 14's list of event kinds): a live output whose
/// server froze (nginx-rtmp stopped with SIGSTOP) drops from its backlog, and `/v1/events` says so
/// with the count; the recording beside it, which drops nothing, has no such event.
@Suite(.serialized) struct DaemonDropsEventTests {
    @Test func aStalledLiveOutputsDropsAreAnEvent() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "live"
            url = "rtmp://127.0.0.1:\(server.port)/live/drops"
            [[output]]
            name = "rec"
            path = "\(dir.path("rec.mkv"))"
            """)
        defer {
            daemon.signal(SIGTERM)
            _ = daemon.wait(timeout: 30)
        }
        _ = try waitUntilRecording(socket)
        var seenStatus: [StallTests.LiveStatus] = []
        let live = try StallTests().poll(socket, seconds: 30, seen: &seenStatus) { $0.state == "live" && $0.bitrate > 0 }
        try #require(live != nil, "never live: \(seenStatus.last.map { "\($0)" } ?? "no status")")
        let watcher = try #require(SocketConnection(socket))
        watcher.send("GET /v1/events HTTP/1.1\r\n\r\n")
        #expect(watcher.read(until: "event: state"), "\(watcher.text)")
        let pid = try #require(Int32((try String(contentsOfFile: server.pidFile, encoding: .utf8)).trimmingCharacters(in: .whitespacesAndNewlines)))
        kill(pid, SIGSTOP)
        var frozen = true
        defer { if frozen { kill(pid, SIGCONT) } }
        // The backlog drops engage some seconds into the stall (see StallTests); the event follows.
        // (A busy host may drop captured buffers too: a `drops` event of a type may come first.)
        let seen = watcher.read(until: "\"output\":\"live\",\"dropped\"")
        kill(pid, SIGCONT)
        frozen = false
        #expect(seen, "no drops event while the server was frozen: \(watcher.text.suffix(2000))")
        let drops = watcher.events.filter { $0.type == "drops" }
        let first = try #require(drops.first { $0.data.contains("\"output\":\"live\"") }, "\(drops)")
        let count = first.data.firstMatch(of: /"dropped":(\d+)/).flatMap { Int($0.1) } ?? 0
        #expect(count >= 1, "\(first.data)")
        // The status agrees: the live output's drops are at least what the event said.
        let status = try broadcast(["status", "--socket", socket]).stdout
        #expect(status.contains("\"name\":\"live\""), "\(status)")
        #expect(!drops.contains { $0.data.contains("\"output\":\"rec\"") }, "the recording drops nothing: \(drops)")
    }
}
