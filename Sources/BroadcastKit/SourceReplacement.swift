import Atomics

/// The sources a session runs, as `replaceSource` leaves them.
struct LiveSources: Sendable {
    var entries: [(type: SampleBufferType, source: any CaptureSource)]
    /// Every source started: a replacement may begin.
    var started = false
    /// The session is stopping its sources: no replacement any more.
    var closed = false
    /// What replaced sources had dropped and lost, per type (the statistics go on counting).
    var retiredDrops: [SampleBufferType: Int] = [:]
    var retiredLosses: [SampleBufferType: Int] = [:]
}

/// An immutable snapshot of the sources a session runs: `replaceSource` publishes a new one
/// whole through an atomic reference, so the session thread reads it without a lock.
/// `statistics()` reads it too: a read never waits for a replacement under way.
final class SourceList: AtomicReference, Sendable {
    let entries: [(type: SampleBufferType, source: any CaptureSource)]
    /// What the sources replaced before these had dropped and lost, per type.
    let retiredDrops: [SampleBufferType: Int]
    let retiredLosses: [SampleBufferType: Int]

    init(
        _ entries: [(type: SampleBufferType, source: any CaptureSource)],
        retiredDrops: [SampleBufferType: Int] = [:], retiredLosses: [SampleBufferType: Int] = [:]
    ) {
        self.entries = entries
        self.retiredDrops = retiredDrops
        self.retiredLosses = retiredLosses
    }
}

extension BroadcastSession {
    /// Publishes the sources as they are now, for the session thread (release, then the
    /// generation it watches).
    fileprivate func publish(_ live: LiveSources) {
        publishedSources.store(
            SourceList(live.entries, retiredDrops: live.retiredDrops, retiredLosses: live.retiredLosses), ordering: .releasing)
        sourceGeneration.wrappingIncrement(ordering: .releasing)
    }

    /// Replaces the running source of `type` (a reload that changed one device) while the
    /// broadcast, the other sources and the handler go on.
    ///
    /// Runs on the calling thread, not the session's: the old source is stopped completely (its
    /// thread joined, so it pushes nothing more) before `make` builds the new one and it starts
    /// into the same sink. Each sink's ring keeps exactly one producer at a time, and the session
    /// thread takes no lock for it: meanwhile it delivers the other types (a realtime session
    /// holds them at most its reorder window for the empty queue; its ring absorbs the wait).
    /// The handler sees the new source's buffers on the same timeline; nothing tells it of the
    /// change but a new format, if any (a handler converts per buffer).
    ///
    /// `make` runs after the old source stopped and the session delivered what it had queued (at
    /// most `patience`: a V4L2 device is busy until its buffers come back; 10 s covers a starved
    /// machine's queue of 64 frames), so it may open the device the old one
    /// held; a failure is retried for up to `patience` (the device may still be closing; the
    /// fallback gets as long again). When `make` or
    /// the start still fails, `fallback` (the old settings, built anew) is tried, and the error is
    /// thrown either way; when the fallback fails too, the type has no source any more
    /// (its sink ends: the session goes on without it).
    ///
    /// Throws `illegalTransition` unless the broadcast runs (started or paused), and
    /// `invalidArgument` for a type the session has no source of (its types are fixed at start)
    /// or a replacement that is not realtime when the old one was (or the other way round).
    public func replaceSource(
        of type: SampleBufferType,
        with make: () throws -> any CaptureSource,
        fallback: (() throws -> any CaptureSource)? = nil,
        patience: Duration = .seconds(10)
    ) throws {
        let patienceNanoseconds = patience.components.seconds * 1_000_000_000 + patience.components.attoseconds / 1_000_000_000
        try liveSources.withLock { live throws in
            guard live.started, !live.closed, state != .finished else {
                throw BroadcastError(.illegalTransition, "cannot replace the \(type) source: the broadcast is \(state == .finished ? "finished" : "not running")")
            }
            guard let index = live.entries.firstIndex(where: { $0.type == type }) else {
                throw BroadcastError(
                    .invalidArgument, "no \(type) source to replace: the session's types are fixed when it starts (\(live.entries.map(\.type.rawValue).joined(separator: ", ")))")
            }
            let sink = sinks[index]
            if sink.hasEnded {
                throw BroadcastError(.illegalTransition, "cannot replace the \(type) source: it ended, and the session no longer waits for \(type)")
            }
            let old = live.entries[index].source
            // The old producer ends before the new one begins.
            old.stop()
            live.retiredDrops[type, default: 0] += old.droppedCount
            live.retiredLosses[type, default: 0] += old.health.deviceLosses
            // A device stays busy while the session still holds buffers of the old capture (a V4L2
            // stream is closed when its last buffer comes back): wait until the queue is delivered,
            // and try again meanwhile, for up to `replacementPatience`.
            let clock = MonotonicClock()
            let drained = clock.now() + patienceNanoseconds
            while !sink.ring.isEmpty && clock.now() < drained && state != .finished {
                MonotonicClock.sleep(until: clock.now() + 2_000_000)
            }
            func startReplacement(_ build: () throws -> any CaptureSource, until deadline: Int64) throws -> any CaptureSource {
                // A build or a start that fails is tried again until the deadline (the device may
                // still be busy); a source of the other pacing is refused at once: waiting cannot
                // change what it is.
                func retry(after error: any Error) throws {
                    if clock.now() >= deadline || state == .finished { throw error }
                    MonotonicClock.sleep(until: clock.now() + 50_000_000)
                }
                while true {
                    let source: any CaptureSource
                    do { source = try build() } catch { try retry(after: error); continue }
                    guard source.isRealtime == old.isRealtime else {
                        throw BroadcastError(.invalidArgument, "cannot replace the \(type) source \(old.name) with \(source.name): one is realtime, the other not")
                    }
                    do {
                        try source.start(into: sink)
                        return source
                    } catch {
                        try retry(after: error)
                    }
                }
            }
            do {
                live.entries[index].source = try startReplacement(make, until: drained)
                publish(live)
            } catch {
                logger.error("\(type) source: the replacement for \(old.name) failed: \(error)")
                if let fallback {
                    do {
                        live.entries[index].source = try startReplacement(fallback, until: clock.now() + patienceNanoseconds)
                        publish(live)
                        logger.notice("\(type) source: back on \(live.entries[index].source.name)")
                    } catch {
                        logger.error("\(type) source: \(old.name) could not be restarted either (\(error)); the broadcast goes on without \(type)")
                        sink.endOfStream()
                    }
                } else {
                    sink.endOfStream()
                }
                throw error
            }
        }
    }
}

extension BroadcastSession {
    /// The sources capturing now, `replaceSource`'s replacements included.
    public var currentSources: [(type: SampleBufferType, source: any CaptureSource)] {
        liveSources.withLock { $0.entries }
    }
}
