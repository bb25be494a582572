// Signals reach the program through a self-pipe: the handler only writes the signal's number to a
// pipe (async-signal-safe), and a thread of ours reads it and does the real work (finish the
// session, toggle pause). This works whichever thread the kernel picks to take the signal, which
// matters because the Swift runtime may have started threads before main runs.
import BroadcastKit
import CProcessShim
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The pipe's write end, set once in `Signals.install()` before any handler can run.
nonisolated(unsafe) private var signalPipeWrite: Int32 = -1

enum Signals {
    /// SIGQUIT is handled as SIGTERM (a clean finish): left to the Swift runtime it printed a
    /// crash report and stalled the capture, and the process went on.
    static let handled = [SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGQUIT, SIGUSR2]
    nonisolated(unsafe) private static var pipeRead: Int32 = -1

    /// Installs the handlers. Call first thing in main.
    static func install() {
        // A closed stdout/stderr (`broadcast record x.mp4 2>&1 | head -2`) must not end a recording:
        // writes to it fail with EPIPE, which every writer here ignores.
        signal(SIGPIPE, SIG_IGN)
        // Both ends close-on-exec; the write end non-blocking (a full pipe must not block the
        // handler), the read end blocking (its thread waits in read). A process that cannot make
        // the pipe (out of descriptors at its start) stops here: without it a signal would end it
        // without finishing the file.
        let ends: (readEnd: FileDescriptor, writeEnd: FileDescriptor)
        do {
            ends = try FileDescriptor.pipe(options: .closeOnExec)
        } catch {
            preconditionFailure("cannot make the signal pipe: \(error)")
        }
        let flags = fcntl(ends.writeEnd.rawValue, F_GETFL)
        guard flags >= 0, fcntl(ends.writeEnd.rawValue, F_SETFL, flags | O_NONBLOCK) == 0 else {
            preconditionFailure("cannot make the signal pipe non-blocking: \(Errno(rawValue: errno))")
        }
        pipeRead = ends.readEnd.rawValue
        signalPipeWrite = ends.writeEnd.rawValue
        // Handlers first, then the signals unblocked: they were blocked at exec (CProcessShim's
        // .preinit_array entry) or by a parent (a test runner's thread, a supervisor: the mask is
        // inherited across exec), and one pending since then is taken by its handler now. Unblocked
        // before the handlers were in place, a SIGHUP in the first moments ended the process (rc 129).
        assert(CBroadcast_early_signals_blocked() != 0, "the handled signals were not blocked at exec")
        for signal in handled {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { number in
                // The interrupted code may be about to read errno: a failed write here (EAGAIN,
                // the pipe full) must not change it. A plain write(2): it is async-signal-safe,
                // swift-system's (which boxes its error, an allocation) would not be.
                let saved = errno
                var byte = UInt8(truncatingIfNeeded: number)
                _ = write(signalPipeWrite, &byte, 1)
                errno = saved
            }
            action.sa_flags = SA_RESTART
            sigemptyset(&action.sa_mask)
            sigaction(signal, &action, nil)
        }
        var set = sigset_t()
        sigemptyset(&set)
        for signal in handled { sigaddset(&set, signal) }
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }

    /// Calls `react` on a dedicated thread for every signal received, until the process exits.
    @discardableResult
    static func startWatching(_ react: @escaping @Sendable (Int32) -> Void) -> OSThread {
        let fd = FileDescriptor(rawValue: pipeRead)
        return OSThread(name: "bc-signals") {
            var byte: UInt8 = 0
            // Interrupted reads are retried; an error or the end of the pipe ends the thread.
            while (try? withUnsafeMutableBytes(of: &byte, { try fd.read(into: $0, retryOnInterrupt: true) })) == 1 {
                react(Int32(byte))
            }
        }
    }

    static func name(_ signal: Int32) -> String {
        switch signal {
        case SIGINT: "SIGINT"
        case SIGTERM: "SIGTERM"
        case SIGHUP: "SIGHUP"
        case SIGUSR1: "SIGUSR1"
        case SIGQUIT: "SIGQUIT"
        case SIGUSR2: "SIGUSR2"
        default: "signal \(signal)"
        }
    }
}
