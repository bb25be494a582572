import Foundation
import Testing

/// What used to hang or kill the daemon binary (issue 24): a stop asked over the API and by
/// SIGTERM at once, a TCP control port that is taken, a FIFO where the config was, a SIGHUP in
/// its first moments, and configs nested or sized past what it can take.
@Suite(.serialized) struct DaemonHangTests {
    /// `broadcast stop` and SIGTERM at about the same moment (SIGTERM 0 to 90 ms after the stop
    /// is sent): both ask the broadcast to finish and wait for its thread; the daemon exits 0 with
    /// a playable file. Before: the second join of the session thread could wait for ever (2 of 12
    /// here on a quiet machine, 5 of 5 on a busy one; `OSThreadTests` pins the cause).
    @Test func stopAndSigtermAtOnceEnd() throws {
        for round in 0..<10 {
            let dir = try TemporaryDirectory()
            defer { dir.cleanup() }
            let (daemon, socket) = try launchDaemon(dir)
            let up = try waitUntilRecording(socket)
            #expect(up.contains("\"state\":\"recording\""), "\(up)")
            let stop = try Child(broadcastBinary, ["stop", "--socket", socket])
            usleep(UInt32(round * 10_000))
            daemon.signal(SIGTERM)
            let r = daemon.wait(timeout: 60)
            let stopped = stop.wait(timeout: 60)
            #expect(r.reason == .exit && r.status == 0, "round \(round): exit \(r.status) (\(r.reason == .exit ? "exit" : "signal")): \(r.stderr)")
            #expect(stopped.reason == .exit, "round \(round): broadcast stop did not end: \(stopped.stderr)")
            try expectDecodesCleanly(dir.path("rec.mkv"))
        }
    }

    /// A TCP control port another process listens on: exit 1 with one line naming the address
    /// (before: the daemon hung at its start with nothing logged, and SIGTERM did not end it).
    @Test func aTakenControlPortIsExit1WithOneLine() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        // The port, held by this test.
        let holder = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(holder) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let held = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(holder, $0, length) == 0 && getsockname(holder, $0, &length) == 0 }
        }
        #expect(held && listen(holder, 1) == 0)
        let port = UInt16(bigEndian: address.sin_port)
        let (daemon, _) = try launchDaemon(dir, sections: "[video]\nsize = \"320x180\"", tcpPort: Int(port), token: "0123456789abcdef-token")
        let r = daemon.wait(timeout: 60)
        #expect(r.reason == .exit && r.status == 1, "exit \(r.status) (\(r.reason == .exit ? "exit" : "killed: still running after 60 s")): \(r.stderr)")
        let errors = r.stderr.split(separator: "\n").filter { $0.hasPrefix("broadcast: error:") }
        #expect(errors.count == 1 && errors[0].contains("control tcp 127.0.0.1:\(port)"), "\(r.stderr)")
        #expect(!FileManager.default.fileExists(atPath: dir.path("rec.mkv")), "it recorded without its control API")
    }

    /// A FIFO put where the config was: `broadcast reload` is refused at once saying so, the next
    /// action is answered and the recording goes on (before: the reload's open waited for a writer,
    /// and every control action after it waited behind it). A FIFO given at the start: exit 2.
    @Test func aFIFOInsteadOfTheConfigBlocksNothing() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir)
        _ = try waitUntilRecording(socket)
        let file = dir.path("d.toml")
        try FileManager.default.removeItem(atPath: file)
        #expect(mkfifo(file, 0o600) == 0)
        let reload = try broadcast(["reload", "--socket", socket], timeout: 60)
        #expect(reload.status != 0 && reload.stderr.contains("FIFO"), "exit \(reload.status): \(reload.stderr)")
        #expect(!reload.stderr.contains("no answer"), "\(reload.stderr)")
        let pause = try broadcast(["pause", "--socket", socket], timeout: 60)
        #expect(pause.status == 0, "\(pause.stderr)")
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 60)
        #expect(r.status == 0, "\(r.stderr)")

        let atStart = try broadcast(["daemon", "--config", file], timeout: 60)
        #expect(atStart.status == 2 && atStart.stderr.contains("\(file):0: cannot read the config file: it is a FIFO"), "exit \(atStart.status): \(atStart.stderr)")
        #expect(atStart.stderr.split(separator: "\n").count == 1, "\(atStart.stderr)")
    }

    /// A config with a value nested 100 000 deep: exit 2 with file:line (before: SIGSEGV, the
    /// parser's recursion overflowed the stack).
    @Test func aDeeplyNestedConfigIsExit2() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("deep.toml")
        try ("[video]\nsize = \"320x180\"\n[audio]\nx = " + String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000) + "\n")
            .write(toFile: file, atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", file], timeout: 60)
        #expect(r.reason == .exit && r.status == 2, "exit \(r.status): \(r.stderr.prefix(300))")
        #expect(r.stderr.contains("\(file):4: arrays nested more than 32 deep"), "\(r.stderr.prefix(300))")
        #expect(r.stderr.split(separator: "\n").count == 1)
    }

    /// A SIGHUP that arrives before the daemon's handlers are installed waits for them (it is
    /// blocked from the first instructions on) and is taken by them; here it is sent while the daemon is
    /// spawned with it blocked, as a supervisor's thread may hand it over, so it is pending from
    /// the start. Before: the handlers unblocked it before installing themselves, and the default
    /// action ended the daemon (rc 129), as a SIGHUP in the first ~20 ms after exec did.
    @Test func aSighupInTheFirstMomentsIsNotFatal() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        let config = daemonConfig(dir, sections: "[video]\nsize = \"320x180\"")
        try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        let log = dir.path("stderr.txt")
        let pid = try Self.spawnBlocking(SIGHUP, broadcastBinary, ["daemon", "--config", dir.path("d.toml")], stderr: log)
        kill(pid, SIGHUP)
        let up = try waitUntilRecording(socket)
        #expect(up.contains("\"state\":\"recording\""), "\(up) \((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")")
        kill(pid, SIGTERM)
        let status = Self.waitForExit(pid, timeout: 60)
        let stderr = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        // 0: exited with 0 (a signal's death would be its number, 1: SIGHUP).
        #expect(status == 0, "wait status \(status.map { "\($0)" } ?? "none: still running"): \(stderr)")
    }

    /// posix_spawn with `signal` blocked in the child (inherited across exec); stderr to `stderr`.
    static func spawnBlocking(_ signal: Int32, _ path: String, _ arguments: [String], stderr: String) throws -> pid_t {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var mask = sigset_t()
        sigemptyset(&mask)
        sigaddset(&mask, signal)
        posix_spawnattr_setsigmask(&attributes, &mask)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK))
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, stderr, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &actions, &attributes, argv, environ)
        guard rc == 0 else { throw ProbeError(message: "posix_spawn \(path): \(String(cString: strerror(rc)))") }
        return pid
    }

    /// The raw wait status once `pid` exits (killed after `timeout` s: nil).
    static func waitForExit(_ pid: pid_t, timeout: Double) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        var status: Int32 = 0
        while Date() < deadline {
            if waitpid(pid, &status, WNOHANG) == pid { return status }
            usleep(20_000)
        }
        kill(pid, SIGKILL)
        waitpid(pid, &status, 0)
        return nil
    }
}
