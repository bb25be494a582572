import Foundation
import Testing

/// What the daemon lets out and in (issue 24, items 4 and 5): the control token rotates at a
/// reload; [control] changes a reload cannot apply are refused, saying "restart needed".
@Suite(.serialized) struct DaemonSecretTests {
    static func config(_ dir: TemporaryDirectory, port: Int?, token: String, socket: String? = nil) -> String {
        daemonConfig(dir, sections: "[video]\nsize = \"320x180\"", socket: socket, tcpPort: port, token: token)
    }

    /// The descriptors above 2 of process `pid` without O_CLOEXEC in their fdinfo flags, with what they are.
    static func inheritableDescriptors(of pid: Int32) -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
        return names.filter { name in
            guard let fd = Int(name), fd > 2,
                let info = try? String(contentsOfFile: "/proc/\(pid)/fdinfo/\(name)", encoding: .utf8),
                let line = info.split(separator: "\n").first(where: { $0.hasPrefix("flags:") }),
                let flags = Int(line.dropFirst("flags:".count).trimmingCharacters(in: .whitespaces), radix: 8)
            else { return false }
            return flags & 0o2000000 == 0
        }.map { name in "\(name) -> \((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(name)")) ?? "?")" }
    }

    static func statusCode(port: Int, token: String) throws -> String {
        try run("/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Authorization: Bearer \(token)",
            "http://127.0.0.1:\(port)/v1/status"]).stdout
    }

    /// A reload with a new token: the old one is 401 at once, the new one 200, without a restart.
    /// A reload that moves the socket or the TCP listener is refused (restart needed), and the
    /// token stays what it was.
    @Test func reloadRotatesTheTokenAndRefusesWhatNeedsARestart() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let port = try freePort()
        let old = "old-token-0123456789"
        let new = "new-token-9876543210"
        let daemon = try spawnDaemon(config: Self.config(dir, port: port, token: old), in: dir)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        var up = false
        for _ in 0..<300 where !up {
            up = (try? Self.statusCode(port: port, token: old)) == "200"
            if !up { usleep(100_000) }
        }
        #expect(up, "the TCP listener never answered 200 with the token")

        try Self.config(dir, port: port, token: new).write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let reload = try broadcast(["reload", "--socket", dir.path("c.sock")], timeout: 60)
        #expect(reload.status == 0, "\(reload.stdout) \(reload.stderr)")
        #expect(try Self.statusCode(port: port, token: old) == "401", "the old token still works")
        #expect(try Self.statusCode(port: port, token: new) == "200", "the new token does not work")

        // Another TCP port, no TCP listener, another socket path: refused, restart needed; the
        // token is still the new one.
        let otherPort = try freePort()
        for (changed, key) in [
            (Self.config(dir, port: otherPort, token: old), "control.tcp"),
            (Self.config(dir, port: nil, token: old), "control.tcp"),
            (Self.config(dir, port: port, token: old, socket: dir.path("other.sock")), "control.socket"),
        ] {
            try changed.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
            let refused = try broadcast(["reload", "--socket", dir.path("c.sock")], timeout: 60)
            #expect(refused.status == 1, "\(refused.stdout) \(refused.stderr)")
            #expect(refused.stderr.contains("\(dir.path("d.toml")):") && refused.stderr.contains("\(key): changed")
                && refused.stderr.contains("restart needed"), "\(refused.stderr)")
            #expect(try Self.statusCode(port: port, token: new) == "200", "a refused reload changed the token")
            #expect(try Self.statusCode(port: port, token: old) == "401", "a refused reload changed the token")
        }
        daemon.signal(SIGTERM)
        let ended = daemon.wait(timeout: 60)
        #expect(ended.status == 0, "\(ended.stderr.suffix(2000))")
        #expect(!ended.stderr.contains(old) && !ended.stderr.contains(new), "a token in the log")
    }

    /// A daemon at --log-level debug streaming to nginx-rtmp with its key from ${STREAM_KEY}:
    /// FFmpeg's debug lines ("Sending publish command for ...") reach the log scrubbed, the key
    /// is nowhere in it. The replay output's on_file_finished command (`sleep 40`, looked at from
    /// outside through /proc) has only the documented environment (no STREAM_KEY) and descriptors
    /// 0-2; left behind when the daemon exits, it holds nothing of the daemon's: the TCP control
    /// port is closed.
    @Test func noSecretInTheDebugLogOrTheHooks() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let key = "sk-env-5d1e7a90c3"
        let port = try freePort()
        let socket = dir.path("c.sock")
        let config = daemonConfig(
            dir, tcpPort: port, token: "token-0123456789abcdef",
            outputs: streamOutput(url: "rtmp://127.0.0.1:\(server.port)/live/${STREAM_KEY}")
                + "[[output]]\nname = \"replay\"\nreplay = \"5s\"\npath = \"\(dir.path("replay-%H%M%S.mp4"))\"\non_file_finished = [\"/bin/sleep\", \"40\"]\n")
        try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let daemon = try Child(
            broadcastBinary, ["daemon", "--config", dir.path("d.toml"), "--log-level", "debug"], environment: ["STREAM_KEY": key])
        var hook: Int32?
        defer {
            daemon.signal(SIGKILL)
            _ = daemon.wait(timeout: 10)
            if let hook { kill(hook, SIGKILL) }
        }
        // Live, and the server has the stream: the publish (and its debug lines) happened.
        let live = daemon.waitForStderr(timeout: 60) { $0.contains("stream rtmp://127.0.0.1:\(server.port)/live/****: live") }
        #expect(live, "\(daemon.stderrSoFar.suffix(3000))")
        usleep(2_000_000)
        let saved = try broadcast(["replay", "save", "--socket", socket], timeout: 60)
        #expect(saved.status == 0, "\(saved.stderr)")
        for _ in 0..<600 where hook == nil {
            hook = Int32(try run("/usr/bin/pgrep", ["-P", "\(daemon.pid)", "-x", "sleep"]).stdout.split(separator: "\n").first ?? "")
            if hook == nil { usleep(100_000) }
        }
        let pid = try #require(hook, "the hook never ran: \(daemon.stderrSoFar.suffix(2000))")
        let environ = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/environ"))) ?? Data()
        let environment = environ.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        #expect(environment.contains("BROADCAST_OUTPUT=replay") && environment.contains { $0.hasPrefix("BROADCAST_FILE=\(dir.path("replay-"))") },
            "\(environment)")
        #expect(!environment.contains { $0.contains(key) || $0.hasPrefix("STREAM_KEY=") }, "the hook got the key: \(environment)")
        let allowed: Set<String> = [
            "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS",
            "DISPLAY", "WAYLAND_DISPLAY", "BROADCAST_FILE", "BROADCAST_OUTPUT", "BROADCAST_MARKERS",
        ]
        let names = environment.compactMap { $0.split(separator: "=").first.map(String.init) }
        #expect(names.allSatisfy { allowed.contains($0) || $0.hasPrefix("LC_") }, "\(names)")
        let descriptors = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").sorted()
        #expect(descriptors == ["0", "1", "2"], "the hook's descriptors: \(descriptors)")
        // The daemon's own descriptors above 2 are all close-on-exec (SwiftNIO's included), once
        // no control connection is open (an accepted one is NIO's and only lives for a request).
        var inheritable: [String] = []
        for _ in 0..<300 {
            inheritable = Self.inheritableDescriptors(of: daemon.pid)
            if inheritable.isEmpty { break }
            usleep(100_000)
        }
        #expect(inheritable.isEmpty, "descriptors of the daemon without close-on-exec: \(inheritable)")

        daemon.signal(SIGTERM)
        let ended = daemon.wait(timeout: 60)
        #expect(ended.status == 0, "\(ended.stderr.suffix(2000))")
        #expect(ended.stderr.contains("Sending publish command for '****'"), "FFmpeg's debug lines are missing: \(ended.stderr.suffix(3000))")
        #expect(!ended.stderr.contains(key), "the key in the log: \(ended.stderr.split(separator: "\n").filter { $0.contains(key) })")
        // The hook (still running at the stop) was waited for, then stopped with its process group;
        // it held none of the daemon's sockets meanwhile, and the port is closed.
        #expect(ended.stderr.contains("not done after"), "the command cut short at the end: \(ended.stderr.suffix(2000))")
        let fd = connectLocal(port)
        #expect(fd < 0, "the control port is still listening after the daemon exited")
        if fd >= 0 { close(fd) }
    }

    /// A url without a scheme is refused at its line without being echoed (main took it for a
    /// recording path and failed at start naming it); the command line does the same.
    @Test func schemeLessURLIsRefusedWithoutEchoingIt() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let key = "sk-plain-81c4be20f7"
        let file = dir.path("bad.toml")
        try daemonConfig(dir, sections: "", outputs: streamOutput(url: "example.com/live/\(key)"))
            .write(toFile: file, atomically: true, encoding: .utf8)
        let daemon = try broadcast(["daemon", "--config", file], timeout: 30)
        #expect(daemon.status == 2, "exit \(daemon.status): \(daemon.stderr)")
        #expect(daemon.stderr.contains("\(file):5: output.url: not a stream URL"), "\(daemon.stderr)")
        #expect(!daemon.stderr.contains(key), "\(daemon.stderr)")
        // A broken ${ in a url or token is not echoed either.
        try daemonConfig(dir, sections: "", outputs: streamOutput(url: "rtmp://h/live/\(key)${X"))
            .write(toFile: file, atomically: true, encoding: .utf8)
        let unterminated = try broadcast(["daemon", "--config", file], timeout: 30)
        #expect(unterminated.status == 2 && unterminated.stderr.contains("\(file):5: output.url: unterminated ${"), "\(unterminated.stderr)")
        #expect(!unterminated.stderr.contains(key), "\(unterminated.stderr)")
        let stream = try broadcast(["stream", "example.com/live/\(key)", "--duration", "1s"], timeout: 30)
        #expect(stream.status == 2 && stream.stderr.contains("not a stream URL"), "\(stream.stderr)")
        #expect(!stream.stderr.contains(key), "\(stream.stderr)")
    }
}
