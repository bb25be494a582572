import ChildProcesses
import Foundation
import Testing

/// The harness's own child processes (every test that starts a program goes through them).
@Suite struct ChildProcessTests {
    /// Exit codes and signals come back as they were; output lands in the files named; the
    /// directory is the one asked for.
    @Test func statusOutputAndDirectory() throws {
        let exited = try ChildProcess.run("/bin/sh", ["-c", "pwd; echo oops >&2; exit 3"], directory: "/usr")
        #expect(exited.reason == .exit && exited.status == 3)
        #expect(exited.output == "/usr\n" && exited.errors == "oops\n", "\(exited.output) \(exited.errors)")
        let killed = try ChildProcess.run("/bin/sh", ["-c", "kill -KILL $$"])
        #expect(killed.reason == .uncaughtSignal && killed.status == SIGKILL)
        #expect(throws: ChildProcess.SpawnError.self) { try ChildProcess("/nonexistent/program", []) }
    }

    /// A child that lives on does not hold up seeing another one end (Foundation's Process could:
    /// one blocked wait stopped every other exit from being seen).
    @Test func aLongLivedChildDoesNotHoldUpAnother() throws {
        let long = try ChildProcess("/bin/sleep", ["60"])
        defer {
            long.signal(SIGKILL)
            long.waitUntilExit()
        }
        for _ in 0..<20 {
            let short = try ChildProcess("/bin/true", [])
            #expect(short.wait(timeout: 30), "a short child's end was not seen")
        }
        #expect(long.isRunning)
        long.signal(SIGTERM)
        #expect(long.wait(timeout: 30), "SIGTERM did not end sleep")
        #expect(long.terminationReason == .uncaughtSignal && long.terminationStatus == SIGTERM)
    }

    /// A child starts with no blocked signal even when the thread that starts it blocks some, and
    /// with only descriptors 0, 1 and 2.
    @Test func aChildStartsWithNoBlockedSignalsAndNoInheritedDescriptors() throws {
        let open = Glibc.open("/dev/null", O_RDONLY)  // not close-on-exec
        defer { close(open) }
        var blocked = sigset_t()
        sigemptyset(&blocked)
        sigaddset(&blocked, SIGTERM)
        sigaddset(&blocked, SIGUSR1)
        var previous = sigset_t()
        pthread_sigmask(SIG_BLOCK, &blocked, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        // Read by the child itself (a shell would clear its mask before running them).
        let mask = try ChildProcess.run("/bin/grep", ["SigBlk", "/proc/self/status"]).output
        #expect(mask.hasSuffix("0000000000000000\n"), "\(mask)")
        let descriptors = try ChildProcess.run("/bin/ls", ["/proc/self/fd"]).output
        // ls's own directory descriptor is the one past 2.
        #expect(descriptors.split(separator: "\n").sorted() == ["0", "1", "2", "3"], "\(descriptors)")
    }
}
