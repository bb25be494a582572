import Foundation
import Testing

/// on_file_finished at the daemon's end and when a command hangs: the last files' commands are
/// waited for (a bounded wait), a command past hook_timeout is stopped so later files go on, and
/// what a stop cut short runs at the next start.
@Suite(.serialized) struct HookShutdownTests {
    /// A shell script as the hook: `body` with $1 the file's path.
    static func hook(_ dir: TemporaryDirectory, _ name: String, _ body: String) throws -> String {
        let path = dir.path(name)
        try "#!/bin/sh\n\(body)\n".write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o755)
        return path
    }

    static func outputs(_ dir: TemporaryDirectory, hook: String, extra: String = "") -> String {
        """
        [[output]]
        name = "rec"
        path = "\(dir.path("seg-%H%M%S.mkv"))"
        segment = "1s"
        on_file_finished = ["\(hook)", "{path}"]
        \(extra)
        """
    }

    static func lines(_ path: String) -> [String] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    static func segments(_ dir: TemporaryDirectory) -> [String] {
        dir.contents.filter { $0.hasPrefix("seg-") && $0.hasSuffix(".mkv") }.map { dir.path($0) }.sorted()
    }

    /// Starts a daemon whose segments of 1 s run `hook`, lets it write `files` segment files, and
    /// stops it (SIGTERM); returns how it ended.
    static func record(_ dir: TemporaryDirectory, hook: String, files: Int) throws -> ProcessResult {
        let (daemon, socket) = try launchDaemon(dir, outputs: outputs(dir, hook: hook))
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        for _ in 0..<600 where segments(dir).count < files { usleep(100_000) }
        daemon.signal(SIGTERM)
        return daemon.wait(timeout: 120)
    }

    /// SIGTERM while commands are queued and running (each takes 1 s): the daemon waits for
    /// them, so every file it finished has had its command (before: the queue was dropped at exit).
    @Test func theLastFilesCommandsRunBeforeTheDaemonExits() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let ran = dir.path("ran.log")
        let hook = try Self.hook(dir, "slow.sh", "sleep 1; echo \"$1\" >> '\(ran)'")
        // Four segments finished, a fifth begun: their commands queue up behind the slow first one.
        let r = try Self.record(dir, hook: hook, files: 5)
        #expect(r.status == 0, "\(r.stderr.suffix(3000))")
        let finished = Self.segments(dir)
        let done = Set(Self.lines(ran))
        #expect(finished.count >= 5, "segments: \(finished)")
        #expect(Set(finished).isSubset(of: done), "commands not run for \(Set(finished).subtracting(done).sorted()); log: \(r.stderr.suffix(3000))")
    }

    /// A command that hangs is stopped after hook_timeout: the later files' commands run.
    @Test func aHangingCommandIsStoppedAfterHookTimeout() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let ran = dir.path("ran.log")
        let marker = dir.path("hung-once")
        // The first command hangs; every later one records its file.
        let hook = try Self.hook(dir, "hang.sh", "if [ ! -e '\(marker)' ]; then touch '\(marker)'; sleep 600; fi; echo \"$1\" >> '\(ran)'")
        let (daemon, socket) = try launchDaemon(dir, outputs: Self.outputs(dir, hook: hook, extra: "hook_timeout = \"2s\""))
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        var done: [String] = []
        for _ in 0..<900 where done.count < 2 {
            done = Self.lines(ran)
            usleep(100_000)
        }
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 90)
        #expect(done.count >= 2, "later files' commands ran: \(done); \(r.stderr.suffix(3000))")
        #expect(r.stderr.contains("hook_timeout"), "the stop said why: \(r.stderr.suffix(3000))")
        #expect(r.status == 0, "\(r.stderr.suffix(3000))")
    }

    /// Commands still running when the wait at the end is over are stopped and noted; the next
    /// start runs them (and only them) for the files that are still there.
    @Test func commandsCutShortRunAtTheNextStart() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let ran = dir.path("ran.log")
        let stuck = try Self.hook(dir, "stuck.sh", "sleep 600")
        let r1 = try Self.record(dir, hook: stuck, files: 3)
        #expect(r1.status == 0, "\(r1.stderr.suffix(3000))")
        #expect(r1.stderr.contains("not done after"), "the cut said so: \(r1.stderr.suffix(3000))")
        let finished = Set(Self.segments(dir))
        // The next start, with a command that works: the files the first run finished get theirs.
        let quick = try Self.hook(dir, "quick.sh", "echo \"$1\" >> '\(ran)'")
        let (second, _) = try launchDaemon(dir, outputs: Self.outputs(dir, hook: quick))
        defer { second.signal(SIGKILL); _ = second.wait(timeout: 10) }
        var done: Set<String> = []
        for _ in 0..<600 where !finished.isSubset(of: done) {
            done = Set(Self.lines(ran))
            usleep(100_000)
        }
        second.signal(SIGTERM)
        let r2 = second.wait(timeout: 90)
        #expect(r2.status == 0, "\(r2.stderr.suffix(3000))")
        #expect(finished.isSubset(of: done), "not run at the next start: \(finished.subtracting(done).sorted()); \(r2.stderr.suffix(2000))")
        #expect(r2.stderr.contains("a previous run did not"), "\(r2.stderr.suffix(2000))")
    }
}
