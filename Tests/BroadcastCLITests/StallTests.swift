import Foundation
import Testing

/// A server that stops taking data (nginx-rtmp frozen with SIGSTOP) must not look live: the output
/// says "stalled", its backlog grows, backlog drops engage, and it is live again when the server
/// takes data again (issue 12, item 10). Before: "live", full bitrate, backlog 0 for 12 s.
@Suite(.serialized) struct StallTests {
    struct LiveStatus {
        var state: String
        var backlog: Double
        var bitrate: Double
        var drops: [String: Double]
        var error: String?
        var totalDrops: Double { drops.values.reduce(0, +) }
    }

    /// The live output's status from the daemon's control API, or nil when it did not answer.
    func liveStatus(_ socket: String) throws -> LiveStatus? {
        let r = try broadcast(["status", "--socket", socket], timeout: 30)
        guard r.status == 0, let json = try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any],
            let outputs = json["outputs"] as? [[String: Any]], let o = outputs.first(where: { $0["kind"] as? String == "live" })
        else { return nil }
        return LiveStatus(
            state: o["state"] as? String ?? "", backlog: o["backlog_ms"] as? Double ?? 0, bitrate: o["bitrate"] as? Double ?? 0,
            drops: o["drops"] as? [String: Double] ?? [:], error: o["error"] as? String)
    }

    /// Polls the status (every 100 ms) until `condition` holds, at most `seconds`; every answer goes into `seen`.
    func poll(_ socket: String, seconds: Double, seen: inout [LiveStatus], until condition: (LiveStatus) -> Bool) throws -> LiveStatus? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let s = try liveStatus(socket) {
                seen.append(s)
                if condition(s) { return s }
            }
            usleep(100_000)
        }
        return nil
    }

    @Test func frozenServerIsReportedStalledAndRecovers() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "live"
            url = "rtmp://127.0.0.1:\(server.port)/live/stall"
            """)
        defer {
            daemon.signal(SIGTERM)
            _ = daemon.wait(timeout: 30)
        }
        var seen: [LiveStatus] = []
        let live = try poll(socket, seconds: 30, seen: &seen) { $0.state == "live" && $0.bitrate > 0 }
        try #require(live != nil, "never live: \(seen.last.map { "\($0)" } ?? "no status")")
        usleep(2_000_000)

        let pid = try #require(Int32((try String(contentsOfFile: server.pidFile, encoding: .utf8)).trimmingCharacters(in: .whitespacesAndNewlines)))
        kill(pid, SIGSTOP)
        var frozen = true
        defer { if frozen { kill(pid, SIGCONT) } }
        // The kernel's buffers take the first second or so; then a write blocks. The write timeout
        // is 10 s: the stall must be seen well before it.
        seen = []
        let stalled = try poll(socket, seconds: 8, seen: &seen) { $0.state == "stalled" }
        try #require(stalled != nil, "never stalled with the server frozen: \(seen.map { "\($0.state) \($0.backlog)ms" })")
        #expect(stalled!.bitrate == 0, "a stalled output sends nothing: \(stalled!)")
        usleep(2_000_000)
        let later = try #require(try liveStatus(socket))
        #expect(later.state == "stalled", "\(later)")
        #expect(later.backlog > stalled!.backlog + 1_000, "the backlog should grow while nothing is sent: \(stalled!.backlog) ms, then \(later.backlog) ms")
        #expect((later.drops["backlog"] ?? 0) + (later.drops["backlog-ref"] ?? 0) > 0, "backlog drops should engage: \(later.drops)")

        kill(pid, SIGCONT)
        frozen = false
        seen = []
        let back = try poll(socket, seconds: 20, seen: &seen) { $0.state == "live" && $0.backlog < 1_000 }
        #expect(back != nil, "not live again after the server woke up: \(seen.map { "\($0.state) \($0.backlog)ms" })")
    }

    /// Frozen past the write timeout: the connection is given up with a message saying what
    /// happened (before: FFmpeg's "Immediate exit requested"), and it reconnects once the server
    /// is back.
    @Test func frozenPastTheTimeoutSaysItTimedOut() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let child = try Child(
            broadcastBinary,
            ["stream", "rtmp://127.0.0.1:\(server.port)/live/t", "--size", "320x180", "--timeout", "3s", "--duration", "30s"],
            directory: dir.url)
        usleep(5_000_000)
        let pid = try #require(Int32((try String(contentsOfFile: server.pidFile, encoding: .utf8)).trimmingCharacters(in: .whitespacesAndNewlines)))
        kill(pid, SIGSTOP)
        usleep(9_000_000)
        kill(pid, SIGCONT)
        let r = child.wait(timeout: 90)
        #expect(r.stderr.contains("stalled"), "\(r.stderr)")
        #expect(r.stderr.contains("timed out after 3.0 s"), "\(r.stderr)")
        #expect(!r.stderr.contains("Immediate exit requested"), "\(r.stderr)")
        let summary = try #require(outputSummary(r.stderr, target: "rtmp://127.0.0.1:\(server.port)/live/****"))
        let reconnects = summary.range(of: "reconnects=").map { Int(summary[$0.upperBound...].prefix { $0.isNumber }) ?? 0 } ?? 0
        #expect(reconnects >= 1, "it should have reconnected once the server was back: \(summary)")
    }
}
