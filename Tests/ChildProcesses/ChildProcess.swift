public import Foundation
import Synchronization

#if canImport(Glibc)
public import Glibc
#endif

/// A process the tests start (`posix_spawn`) and reap themselves (`waitpid` on its pid alone).
///
/// Why not Foundation's `Process`: on Linux it learns that a child ended when a socket shared
/// with the child becomes readable, then calls a blocking `waitpid` for it, on one thread that
/// serves every `Process`. If that descriptor number is closed and reused elsewhere in the test
/// process (tests run in parallel in one process), or the child closes its end, the thread blocks
/// in `waitpid` on a live child and no other child's exit is seen until that one ends. One
/// `make test` run hung for good that way (Xvfb alive, an xlogo killed but never seen to end,
/// `VirtualDisplay.stop` waiting for it). Here each child is reaped by whoever asks about it, with
/// nothing shared between children.
///
/// The child starts with no blocked signals and every signal's default action (as from a shell:
/// a test's thread may have signals blocked, which `posix_spawn` would otherwise pass on), and
/// with no descriptors but 0, 1 and 2.
public final class ChildProcess: Sendable {
    public let processIdentifier: pid_t
    /// The raw `waitpid` status, once reaped.
    private let reaped = Mutex<Int32?>(nil)

    /// Where a child's standard output or error goes (its input is always /dev/null).
    public enum Output: Sendable {
        case null
        /// A file, created or truncated.
        case file(String)
    }

    public struct SpawnError: Error, CustomStringConvertible {
        public let description: String
    }

    /// - Parameters:
    ///   - executable: a path (no PATH search).
    ///   - environment: the child's whole environment; nil: the test process's.
    public init(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil, directory: String? = nil,
        stdout: Output = .null, stderr: Output = .null, stdin: String = "/dev/null"
    ) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdin, O_RDONLY, 0)
        for (fd, output) in [(Int32(1), stdout), (2, stderr)] {
            switch output {
            case .null: posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", O_WRONLY, 0)
            case .file(let path): posix_spawn_file_actions_addopen(&actions, fd, path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            }
        }
        if let directory {
            guard let addchdir = Self.addchdir else { throw SpawnError(description: "this libc has no posix_spawn_file_actions_addchdir_np") }
            _ = addchdir(&actions, directory)
        }
        _ = Self.addclosefrom?(&actions, 3)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        let envp = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
        defer { for pointer in envp ?? [] { free(pointer) } }

        var pid: pid_t = 0
        let failed = argv.withUnsafeBufferPointer { args in
            if let envp {
                return envp.withUnsafeBufferPointer { posix_spawn(&pid, executable, &actions, &attributes, args.baseAddress!, $0.baseAddress!) }
            }
            return posix_spawn(&pid, executable, &actions, &attributes, args.baseAddress!, environ)
        }
        guard failed == 0 else {
            throw SpawnError(description: "cannot start \(executable): \(String(cString: strerror(failed)))")
        }
        processIdentifier = pid
    }

    deinit {
        // A child nobody waited for: reap it if it has ended, so it is not left a zombie.
        _ = status(blocking: false)
    }

    /// Still running (not yet reaped).
    public var isRunning: Bool { status(blocking: false) == nil }

    /// Sends `signal` while the child is not reaped (a reaped pid may be someone else's by now).
    public func signal(_ signal: Int32) {
        if isRunning { kill(processIdentifier, signal) }
    }

    /// Blocks until the child ends.
    public func waitUntilExit() { _ = status(blocking: true) }

    /// Waits up to `timeout` seconds; true if it ended.
    public func wait(timeout: Double) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while isRunning {
            if Date() >= deadline { return false }
            usleep(10_000)
        }
        return true
    }

    /// The exit code, or the signal that ended it (see `terminationReason`). Only after it ended.
    public var terminationStatus: Int32 {
        guard let status = status(blocking: false) else { preconditionFailure("\(processIdentifier) is still running") }
        return status & 0x7f == 0 ? (status >> 8) & 0xff : status & 0x7f
    }

    public var terminationReason: Process.TerminationReason {
        guard let status = status(blocking: false) else { preconditionFailure("\(processIdentifier) is still running") }
        return status & 0x7f == 0 ? .exit : .uncaughtSignal
    }

    /// The `waitpid` status once the child ended; nil while it runs (when not blocking).
    private func status(blocking: Bool) -> Int32? {
        if let known = reaped.withLock({ $0 }) { return known }
        var status: Int32 = 0
        while true {
            let result = waitpid(processIdentifier, &status, blocking ? 0 : WNOHANG)
            if result == processIdentifier {
                return reaped.withLock { known in
                    if known == nil { known = status }
                    return known
                }
            }
            if result == 0 { return nil }
            if errno == EINTR { continue }
            // ECHILD: another thread reaped it a moment ago and is about to say so.
            for _ in 0..<1000 {
                if let known = reaped.withLock({ $0 }) { return known }
                usleep(1000)
            }
            preconditionFailure("\(processIdentifier) was reaped by someone else")
        }
    }

    /// What `run` saw of a command that ended.
    public struct Finished: Sendable {
        public var status: Int32
        public var reason: Process.TerminationReason
        public var stdout: Data
        public var stderr: Data
        public var output: String { String(decoding: stdout, as: UTF8.self) }
        public var errors: String { String(decoding: stderr, as: UTF8.self) }
    }

    /// Runs a command to its end. Its output goes to files, read afterwards: no pipe can fill up
    /// and stall it.
    public static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil, directory: String? = nil
    ) throws -> Finished {
        let base = NSTemporaryDirectory() + "broadcast-tests-\(UUID().uuidString)"
        defer {
            unlink(base + ".out")
            unlink(base + ".err")
        }
        let child = try ChildProcess(
            executable, arguments, environment: environment, directory: directory, stdout: .file(base + ".out"), stderr: .file(base + ".err"))
        child.waitUntilExit()
        return Finished(
            status: child.terminationStatus, reason: child.terminationReason,
            stdout: FileManager.default.contents(atPath: base + ".out") ?? Data(),
            stderr: FileManager.default.contents(atPath: base + ".err") ?? Data())
    }

    // glibc has both (2.29 and 2.34), but Swift's Glibc module does not declare them.
    private typealias AddChdir = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32
    private typealias AddClosefrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    private static let addchdir: AddChdir? = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addchdir_np")
        .map { unsafeBitCast($0, to: AddChdir.self) }
    private static let addclosefrom: AddClosefrom? = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np")
        .map { unsafeBitCast($0, to: AddClosefrom.self) }
}
