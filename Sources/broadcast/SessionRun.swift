import Atomics
import BroadcastKit
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Runs `session` on this thread with SIGINT/SIGTERM/SIGQUIT (finish; a second SIGINT quits at
/// once), SIGUSR1 (pause/resume) and SIGUSR2 (`onSIGUSR2`: save the replay buffers) wired, and the
/// status line going unless `quiet`. Shared by record and stream.
func runWithSignals(
    session: BroadcastSession,
    logger: Logger,
    setupInfo: SetupInfo,
    quiet: Bool,
    onSIGUSR2: (@Sendable () -> Void)? = nil,
    snapshot: @escaping @Sendable () -> StatusLine.Snapshot
) -> Result<SessionSummary, any Error> {
    let interrupts = ManagedAtomic<Int>(0)
    Signals.startWatching { signal in
        switch signal {
        case SIGINT, SIGTERM, SIGQUIT:
            if interrupts.wrappingIncrementThenLoad(ordering: .relaxed) > 1 && signal == SIGINT {
                FileStandardError.write("\nbroadcast: interrupted again, quitting at once\n")
                _exit(130)
            }
            logger.notice("\(Signals.name(signal)): finishing (flushing encoders, writing the trailer)")
            finishOnceStarted(session)
        case SIGUSR1:
            if session.state == .paused {
                if (try? session.resume()) != nil { logger.notice("SIGUSR1: resumed") }
            } else if (try? session.pause()) != nil {
                logger.notice("SIGUSR1: paused")
            }
        case SIGUSR2 where onSIGUSR2 != nil:
            onSIGUSR2?()
        default:
            logger.info("\(Signals.name(signal)) ignored")
        }
    }
    let status = quiet ? nil : StatusLine(snapshot: snapshot)
    let result = Result { try session.run(setupInfo: setupInfo) }
    status?.stop()
    return result
}

/// Finishes `session` once it has something to show. A stop that comes before the session started
/// (it would be refused and lost) or before every source delivered its first buffer (the file
/// would hold a stream without media) waits for that, on a thread of its own so that a second SIGINT still quits at once; at most 3 s,
/// after which the session is finished as soon as it can be.
func finishOnceStarted(_ session: BroadcastSession) {
    @Sendable func ready() -> Bool {
        guard session.state != .idle else { return false }
        // Every source delivered something: each stream of the file has a packet.
        let statistics = session.statistics()
        return !statistics.isEmpty && statistics.values.allSatisfy { $0.delivered > 0 }
    }
    if ready() {
        _ = try? session.finish()
        return
    }
    _ = OSThread(name: "bc-finish") {
        let clock = MonotonicClock()
        let deadline = clock.now() + 3_000_000_000
        while clock.now() < deadline, session.state != .finished, !ready() { usleep(5_000) }
        while session.state != .finished {
            if (try? session.finish()) != nil { return }
            usleep(5_000)
        }
    }
}
