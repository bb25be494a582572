import Atomics
import BroadcastKit
import BroadcastMedia
public import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Runs a user's command for every file an output finishes (a replay saved, a segment closed, a
/// recording stopped): `["/usr/local/bin/upload", "{path}"]`, an argument vector started without a
/// shell, `{path}` and `{name}` replaced in each argument, and the path and output name also in
/// the environment (BROADCAST_FILE, BROADCAST_OUTPUT). The command gets only a small, documented
/// environment (`inheritedEnvironment`: PATH, HOME, locale, ...; never the daemon's secrets such as
/// a STREAM_KEY it expanded into its config) and only descriptors 0-2 (stdin /dev/null, the
/// daemon's stdout and stderr): a command that leaves a process behind holds no socket, log or
/// file of the daemon's. One command at a time per output, on a
/// thread of the hook's own: the next file waits for the previous command, the output never does.
/// The exit status is logged; nothing else depends on it.
///
/// A command still running after `timeout` is killed (SIGTERM, SIGKILL 2 s later) so that one
/// that hangs does not hold back the later files. At the program's end `finishAll(within:)` waits
/// for running and queued commands up to a bound (below systemd's TimeoutStopSec), then cuts the
/// rest short and says which. Each file is noted in its directory's manifest when queued and when
/// its command has run, so the next start runs the commands a stop cut short (`pendingCommands`).
public final class FileFinishedHook: Sendable {
    public let arguments: [String]
    public let outputName: String
    /// How long one command may run before it is killed.
    public let timeout: Duration
    private let manifest: RecordingManifest?
    private let logger: Logger
    private let queue = CommandStack<String>()
    private let running = ManagedAtomic<Bool>(false)
    /// Commands queued or running.
    private let pending = ManagedAtomic<Int>(0)
    /// Set at the program's end once the wait is over: the running command is killed, the queued
    /// ones are not started (they stay pending in the manifest).
    private let cuttingShort = ManagedAtomic<Bool>(false)
    /// Commands started so far and how many exited with status 0.
    let started = ManagedAtomic<Int>(0)
    let succeeded = ManagedAtomic<Int>(0)

    /// The default `timeout`: a long upload, not a hung one.
    public static let defaultTimeout = Duration.seconds(600)
    /// How long the program's end waits for commands: below the shipped unit's TimeoutStopSec (30 s)
    /// with room for finalizing the recordings before it.
    public static let shutdownWait = Duration.seconds(15)

    /// Every hook with commands queued or running, so the program's end can wait for them. Control
    /// plane only (a file finished, the program's end): never touched on the media path.
    private static let active = Mutex<[ObjectIdentifier: FileFinishedHook]>([:])

    public init(arguments: [String], outputName: String, timeout: Duration = FileFinishedHook.defaultTimeout,
                manifest: RecordingManifest? = nil, logger: Logger) {
        precondition(!arguments.isEmpty, "a file-finished command needs at least the program")
        self.arguments = arguments
        self.outputName = outputName
        self.timeout = timeout
        self.manifest = manifest
        self.logger = logger
    }

    /// Queues the command for `path`; returns at once.
    public func fileFinished(_ path: String) {
        manifest?.recordCommandPending(path, output: outputName)
        queue(path)
    }

    private func queue(_ path: String) {
        // Listed and counted in one step, so the drain's unlisting (below) never misses a command.
        Self.active.withLock {
            $0[ObjectIdentifier(self)] = self
            pending.wrappingIncrement(ordering: .acquiringAndReleasing)
        }
        queue.push(path)
        // The thread runs while there is work and ends when the queue is empty.
        if !running.exchange(true, ordering: .acquiringAndReleasing) {
            OSThread(name: "bc-file-hook") { [self] in drain() }.detach()
        }
    }

    /// Runs the commands an earlier run of the program queued and did not run (cut short at its end,
    /// or a crash): from the manifest, for this output, in the order the files were finished.
    public func runPendingCommands() {
        guard let manifest else { return }
        let missed = manifest.pendingCommands(output: outputName).filter { access($0, F_OK) == 0 }
        for path in missed {
            logger.notice("on_file_finished for \(outputName): running the command a previous run did not for \(path)")
            queue(path)
        }
    }

    private func drain() {
        while true {
            var batch = queue.takeAll()
            if batch.isEmpty {
                running.store(false, ordering: .releasing)
                // A path queued between the last look and the store above finds running false and
                // starts a thread of its own only if this one is gone: look once more.
                batch = queue.takeAll()
                if batch.isEmpty {
                    // Nothing queued or running: no longer one the program's end waits for.
                    Self.active.withLock { if pending.load(ordering: .acquiring) == 0 { $0[ObjectIdentifier(self)] = nil } }
                    return
                }
                if running.exchange(true, ordering: .acquiringAndReleasing) {
                    // Another thread took over; hand the paths back to it.
                    for path in batch { queue.push(path) }
                    return
                }
            }
            for path in batch {
                if cuttingShort.load(ordering: .acquiring) {
                    logger.warning("on_file_finished for \(outputName) (\(path)): not run, the program is ending; the next start runs it")
                } else if run(path) {
                    manifest?.recordCommandRun(path, output: outputName)
                }
                pending.wrappingDecrement(ordering: .acquiringAndReleasing)
            }
        }
    }

    /// At the program's end: waits for every hook's running and queued commands up to `bound`,
    /// then kills what still runs and leaves the queued ones for the next start (each said in the
    /// log). Returns how many commands were cut short.
    @discardableResult
    public static func finishAll(within bound: Duration, logger: Logger) -> Int {
        let hooks = active.withLock { Array($0.values) }
        let deadline = MonotonicInstant.now() + bound
        func left() -> Int { hooks.reduce(0) { $0 + max(0, $1.pending.load(ordering: .acquiring)) } }
        var waiting = left()
        if waiting > 0 { logger.notice("waiting up to \(bound) for \(waiting) on_file_finished command(s)") }
        while waiting > 0, MonotonicInstant.now() < deadline {
            usleep(50_000)
            waiting = left()
        }
        guard waiting > 0 else { return 0 }
        logger.warning("on_file_finished: \(waiting) command(s) not done after \(bound): the running ones are stopped, the queued ones run at the next start")
        for hook in hooks { hook.cuttingShort.store(true, ordering: .releasing) }
        // The threads see the flag within a poll (the running command is signalled, the queue skipped).
        let stopped = MonotonicInstant.now() + .seconds(5)
        while left() > 0, MonotonicInstant.now() < stopped { usleep(50_000) }
        return waiting
    }

    /// The argument vector for `path`.
    public func argv(for path: String) -> [String] {
        arguments.map { $0.replacing("{path}", with: path).replacing("{name}", with: outputName) }
    }

    /// glibc's posix_spawn_file_actions_addclosefrom_np (2.34 and later), which Swift's Glibc
    /// module does not declare (it is under _GNU_SOURCE): found at run time.
    private typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32
    private static let addCloseFrom: AddCloseFrom? = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np").map {
        unsafeBitCast($0, to: AddCloseFrom.self)
    }

    /// The variables a command inherits from the daemon (when set): where things are and the
    /// locale, and the desktop session's addresses (a user service's command may notify the user);
    /// everything else, a secret the config took from the environment among it, is left out.
    public static let inheritedEnvironment: Set<String> = [
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR",
        "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "WAYLAND_DISPLAY",
    ]

    /// The inherited part of a command's environment: `inheritedEnvironment` and the locale's
    /// LC_* variables from `environ`, PATH set to a default when missing.
    static func environment(inheriting environ: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> [String] {
        var kept: [String] = []
        var pointer = environ
        while let entry = pointer?.pointee {
            let text = String(cString: entry)
            if let eq = text.firstIndex(of: "=") {
                let name = text[..<eq]
                if inheritedEnvironment.contains(String(name)) || name.hasPrefix("LC_") { kept.append(text) }
            }
            pointer = pointer.map { $0 + 1 }
        }
        if !kept.contains(where: { $0.hasPrefix("PATH=") }) { kept.append("PATH=/usr/local/bin:/usr/bin:/bin") }
        return kept
    }

    /// The markers of the file at `path` for BROADCAST_MARKERS: its titled chapters, one a line,
    /// `SECONDS<TAB>TITLE` (seconds with three decimals; in the title `\\`, tab and line breaks
    /// escaped as in the marks file), at most 100 000 bytes (the file's chapters hold them all).
    static func markers(of path: String) -> String {
        guard let container = try? Recording.container(for: path), container.holdsChapters,
            let chapters = Muxer.chapters(in: path)
        else { return "" }
        var text = ""
        for chapter in chapters where !chapter.title.isEmpty {
            let mark = RecordingMark(nanoseconds: chapter.start, title: chapter.title)
            let line = RecordingMarksSidecar.line(mark)
            let ms = (chapter.start + 500_000) / 1_000_000
            let fraction = String(ms % 1000)
            let seconds = "\(ms / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction
            let entry = seconds + line[line.firstIndex(of: "\t")!...]
            guard text.utf8.count + entry.utf8.count <= 100_000 else { break }
            text += entry
        }
        return text
    }

    /// Runs the command for `path`; false when it was cut short at the program's end (it stays
    /// pending for the next start).
    private func run(_ path: String) -> Bool {
        let argv = argv(for: path)
        started.wrappingIncrement(ordering: .relaxed)
        let start = MonotonicClock().now()
        let environment = Self.environment(inheriting: environ) + ["BROADCAST_FILE=\(path)", "BROADCAST_OUTPUT=\(outputName)"]
            + ["BROADCAST_MARKERS=\(Self.markers(of: path))"]
        let cArgv = argv.map { strdup($0) } + [nil]
        let cEnv = environment.map { strdup($0) } + [nil]
        defer {
            for p in cArgv { free(p) }
            for p in cEnv { free(p) }
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        // Whatever was opened without close-on-exec (a library's socket or epoll) stays here too.
        if let closeFrom = Self.addCloseFrom {
            guard closeFrom(&actions, 3) == 0 else {
                logger.error("on_file_finished for \(outputName) (\(path)): cannot run \(argv[0]): posix_spawn_file_actions_addclosefrom_np failed")
                return true
            }
        } else {
            ProcessDescriptors.markCloseOnExec()
        }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Our threads may block signals; the command starts with none blocked and default actions.
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        // A process group of its own: a command stopped at hook_timeout or at the program's end is
        // stopped with what it started (a shell's `sleep`, an uploader's children).
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))
        var pid: pid_t = 0
        let rc =
            argv[0].contains("/")
            ? posix_spawn(&pid, argv[0], &actions, &attributes, cArgv, cEnv)
            : posix_spawnp(&pid, argv[0], &actions, &attributes, cArgv, cEnv)
        guard rc == 0 else {
            logger.error("on_file_finished for \(outputName) (\(path)): cannot run \(argv[0]): \(String(cString: strerror(rc)))")
            return true
        }
        let (status, stopped) = waitForExit(pid, path: path)
        let seconds = Double((MonotonicClock().now() - start) / 1_000_000) / 1000
        if stopped == .programEnding {
            logger.warning("on_file_finished for \(outputName) (\(path)): \(argv[0]) stopped after \(seconds) s, the program is ending; the next start runs it again")
            return false
        }
        let signal = status & 0x7f
        if signal == 0 {
            let code = (status >> 8) & 0xff
            if code == 0 {
                succeeded.wrappingIncrement(ordering: .relaxed)
                logger.info("on_file_finished for \(outputName) (\(path)): \(argv[0]) exited 0 after \(seconds) s")
            } else {
                logger.error("on_file_finished for \(outputName) (\(path)): \(argv[0]) exited with status \(code) after \(seconds) s")
            }
        } else {
            let why = stopped == .timedOut ? " (it ran longer than hook_timeout \(timeout))" : ""
            logger.error("on_file_finished for \(outputName) (\(path)): \(argv[0]) killed by signal \(signal) after \(seconds) s\(why)")
        }
        return true
    }

    private enum Stopped { case no, timedOut, programEnding }

    /// Waits for the command to exit; past `timeout`, or when the program's end cuts it short,
    /// sends SIGTERM, and SIGKILL 2 s later. (A poll every 20 ms on the hook's own thread.)
    private func waitForExit(_ pid: pid_t, path: String) -> (status: Int32, stopped: Stopped) {
        let limit = MonotonicInstant.now() + timeout
        var status: Int32 = 0
        var stopped = Stopped.no
        var terminatedAt: MonotonicInstant?
        var killed = false
        while true {
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid { return (status, stopped) }
            if r < 0 && errno != EINTR { return (status, stopped) }
            let now = MonotonicInstant.now()
            if terminatedAt == nil {
                if cuttingShort.load(ordering: .acquiring) {
                    stopped = .programEnding
                } else if now >= limit {
                    stopped = .timedOut
                    logger.warning("on_file_finished for \(outputName) (\(path)): still running after hook_timeout \(timeout): stopping it")
                }
                if stopped != .no {
                    kill(-pid, SIGTERM)
                    terminatedAt = now
                }
            } else if let at = terminatedAt, !killed, now >= at + .seconds(2) {
                kill(-pid, SIGKILL)
                killed = true
            }
            usleep(20_000)
        }
    }
}

/// This process's open descriptors.
public enum ProcessDescriptors {
    /// Marks every descriptor above 2 close-on-exec; returns how many were not. Ours are opened so
    /// (O_CLOEXEC, SOCK_CLOEXEC, pipe2, fopen's "e"); SwiftNIO opens its epoll and its sockets
    /// without it, so the daemon marks them once its listeners are bound. (A command the daemon
    /// runs has everything above 2 closed anyway: see `FileFinishedHook`.)
    @discardableResult
    public static func markCloseOnExec() -> Int {
        guard let directory = opendir("/proc/self/fd") else { return 0 }
        defer { closedir(directory) }
        let own = dirfd(directory)
        var marked = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard let fd = Int32(name), fd > 2, fd != own else { continue }
            let flags = fcntl(fd, F_GETFD)
            if flags >= 0, flags & FD_CLOEXEC == 0, fcntl(fd, F_SETFD, flags | FD_CLOEXEC) == 0 { marked += 1 }
        }
        return marked
    }
}
