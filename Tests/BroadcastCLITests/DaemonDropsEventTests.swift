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

/// The issue's scripted sequence on a real daemon and a real nginx-rtmp: the live output goes live,
/// the recording is paused and resumed, the server is killed (the live output reconnects) and
/// started again (live again), the broadcast stops. One events client sees those changes in that
/// order, with ids without gaps.
@Suite(.serialized) struct DaemonScriptedEventsTests {
    @Test func aScriptedSequenceArrivesInOrderWithoutGaps() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "live"
            url = "rtmp://127.0.0.1:\(server.port)/live/script"
            [[output]]
            name = "rec"
            path = "\(dir.path("rec.mkv"))"
            """)
        defer {
            daemon.signal(SIGKILL)
            _ = daemon.wait(timeout: 10)
        }
        _ = try waitUntilRecording(socket)
        let watcher = try #require(SocketConnection(socket))
        watcher.send("GET /v1/events HTTP/1.1\r\n\r\n")
        #expect(watcher.read(until: "event: state"), "\(watcher.text)")
        #expect(watcher.read(until: "\"name\":\"live\",\"state\":\"live\"") || watcher.text.contains("\"state\":\"live\""), "never live: \(watcher.text.suffix(2000))")
        #expect(SocketConnection.request(socket, "POST", "/v1/outputs/rec/pause") == 200)
        #expect(watcher.read(until: "\"name\":\"rec\",\"state\":\"paused\""), "\(watcher.text.suffix(2000))")
        #expect(SocketConnection.request(socket, "POST", "/v1/outputs/rec/resume") == 200)
        #expect(watcher.read(until: "\"name\":\"rec\",\"state\":\"recording\""), "\(watcher.text.suffix(2000))")
        server.stop(signal: SIGKILL)
        #expect(watcher.read(until: "\"name\":\"live\",\"state\":\"reconnecting\""), "no reconnecting: \(watcher.text.suffix(2000))")
        let liveState = "\"name\":\"live\",\"state\":\"live\""
        let timesLive = watcher.text.components(separatedBy: liveState).count - 1
        try server.start()
        #expect(watcher.read(until: liveState, occurrences: timesLive + 1), "not live again: \(watcher.text.suffix(2000))")
        #expect(SocketConnection.request(socket, "POST", "/v1/broadcast/stop") == 200)
        #expect(watcher.read(until: "\"state\":\"finished\""), "\(watcher.text.suffix(2000))")
        let events = watcher.events
        let ids = events.map(\.id)
        #expect(ids.first.map { Array($0..<($0 + UInt64(ids.count))) } == ids, "ids with gaps: \(ids)")
        // The script's changes, in its order (other events, e.g. connecting or drops, may come between).
        let script = [
            "\"name\":\"rec\",\"state\":\"paused\"", "\"name\":\"rec\",\"state\":\"recording\"",
            "\"name\":\"live\",\"state\":\"reconnecting\"", "\"name\":\"live\",\"state\":\"live\"", "\"state\":\"finished\"",
        ]
        var next = 0
        for event in events.dropFirst() where next < script.count && event.data.contains(script[next]) { next += 1 }
        #expect(next == script.count, "the script's events in order, \(next) of \(script.count) found: \(events.map(\.data))")
    }
}
