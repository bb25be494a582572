import Atomics
import BroadcastKit
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Runs `session` on this thread with SIGINT/SIGTERM (finish; a second SIGINT quits at once) and
/// SIGUSR1 (pause/resume) wired, and the status line going unless `quiet`. Shared by record and stream.
func runWithSignals(
    session: BroadcastSession,
    logger: Logger,
    setupInfo: SetupInfo,
    quiet: Bool,
    snapshot: @escaping @Sendable () -> StatusLine.Snapshot
) -> Result<SessionSummary, any Error> {
    let interrupts = ManagedAtomic<Int>(0)
    Signals.startWatching { signal in
        switch signal {
        case SIGINT, SIGTERM:
            if interrupts.wrappingIncrementThenLoad(ordering: .relaxed) > 1 && signal == SIGINT {
                FileStandardError.write("\nbroadcast: interrupted again, quitting at once\n")
                _exit(130)
            }
            logger.notice("\(Signals.name(signal)): finishing (flushing encoders, writing the trailer)")
            _ = try? session.finish()
        case SIGUSR1:
            if session.state == .paused {
                if (try? session.resume()) != nil { logger.notice("SIGUSR1: resumed") }
            } else if (try? session.pause()) != nil {
                logger.notice("SIGUSR1: paused")
            }
        default:
            logger.info("\(Signals.name(signal)) ignored")
        }
    }
    let status = quiet ? nil : StatusLine(snapshot: snapshot)
    let result = Result { try session.run(setupInfo: setupInfo) }
    status?.stop()
    return result
}
