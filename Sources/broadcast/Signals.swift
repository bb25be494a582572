// Signals are taken synchronously on a thread of their own (sigwait), never in a handler, so the
// reaction can do real work: finish the session, toggle pause.
import BroadcastKit

#if canImport(Glibc)
import Glibc
#endif

enum Signals {
    /// Blocks SIGINT, SIGTERM, SIGHUP and SIGUSR1 in this thread and every thread it starts later.
    /// Call first thing in main, before any other thread exists.
    static func blockForSigwait() {
        var set = handledSet()
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    private static func handledSet() -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        for s in [SIGINT, SIGTERM, SIGHUP, SIGUSR1] { sigaddset(&set, s) }
        return set
    }

    /// Calls `react` on a dedicated thread for every signal received, until the process exits.
    @discardableResult
    static func startWatching(_ react: @escaping @Sendable (Int32) -> Void) -> OSThread {
        OSThread {
            var set = handledSet()
            while true {
                var signal: Int32 = 0
                if sigwait(&set, &signal) == 0 { react(signal) }
            }
        }
    }

    static func name(_ signal: Int32) -> String {
        switch signal {
        case SIGINT: "SIGINT"
        case SIGTERM: "SIGTERM"
        case SIGHUP: "SIGHUP"
        case SIGUSR1: "SIGUSR1"
        default: "signal \(signal)"
        }
    }
}
