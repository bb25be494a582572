import Atomics
public import Logging
import Synchronization

/// Settings of a session.
public struct SessionOptions: Sendable {
    /// Stop by itself once this much media time has been delivered of every type (nil: until finished).
    public var duration: MediaTime?
    /// Buffers each source may have waiting before it has to drop (realtime) or wait (non-realtime).
    public var queueCapacity: Int
    /// How long (realtime sessions) the session holds a buffer back while another source's queue is
    /// empty, so buffers reach the handler in capture order across types.
    public var reorderWindowNanoseconds: Int64
    public var clock: any BroadcastClock

    public init(
        duration: MediaTime? = nil,
        queueCapacity: Int = 64,
        reorderWindowNanoseconds: Int64 = 60_000_000,
        clock: any BroadcastClock = MonotonicClock()
    ) {
        self.duration = duration
        self.queueCapacity = queueCapacity
        self.reorderWindowNanoseconds = reorderWindowNanoseconds
        self.clock = clock
    }
}

/// Figures about one buffer type, readable from any thread while the session runs.
public struct SampleBufferStatistics: Sendable, Hashable {
    public var delivered: Int = 0
    /// Dropped by the source because the session had not taken earlier buffers yet.
    public var droppedQueueFull: Int = 0
    /// Not delivered by the source itself (its buffers all in use, a device overrun).
    public var droppedBySource: Int = 0
    /// Captured while the broadcast was paused.
    public var droppedPaused: Int = 0
    /// Arrived with a timestamp not after the last one delivered of the same type.
    public var droppedOutOfOrder: Int = 0
    /// End of the last delivered buffer, in media time nanoseconds.
    public var mediaTimeNanoseconds: Int64 = 0
    /// The source's device: capturing, or lost (and how often it was).
    public var sourceHealth = CaptureHealth()

    public init() {}
}

/// How a session ended.
public struct SessionSummary: Sendable {
    public enum Reason: String, Sendable {
        /// `finish()` was called.
        case finished
        /// The requested duration was reached.
        case durationReached
        /// Every source reached its end of stream.
        case sourcesEnded
    }

    public var reason: Reason
    public var statistics: [SampleBufferType: SampleBufferStatistics]
}

/// Runs capture sources and calls one handler with their buffers, strictly serially.
///
/// `run(setupInfo:)` drives everything on the calling thread (the session's thread): it calls
/// `broadcastStarted`, starts the sources, and delivers buffers in capture order across types until
/// the broadcast finishes. `pause()`, `resume()`, `finish()` and `finishBroadcast(with:)` may be called
/// from any thread; the handler hears of them on the session's thread, between two buffers.
///
/// Media time is zero when `broadcastStarted` returns and stands still while paused: what was captured while
/// paused is dropped, and the time spent paused is taken out of every later timestamp, so a
/// recording continues without a gap. Audio is cut at the exact sample where the pause began and ended.
public final class BroadcastSession: @unchecked Sendable {
    private enum Command: Sendable {
        case pause(at: Int64)
        case resume(at: Int64)
        case finish(error: BroadcastError?)
    }

    private struct Counters: Sendable {
        let delivered = ManagedAtomic<Int>(0)
        let droppedPaused = ManagedAtomic<Int>(0)
        let droppedOutOfOrder = ManagedAtomic<Int>(0)
        let mediaTime = ManagedAtomic<Int64>(0)
    }

    private let handler: any BroadcastSampleHandler
    private let sources: [(type: SampleBufferType, source: any CaptureSource)]
    private let options: SessionOptions
    let logger: Logger
    private let clock: any BroadcastClock
    /// Sequence number << 8 | lifecycle state: a transition is one compare-and-swap.
    private let stateWord = ManagedAtomic<UInt64>(UInt64(SessionLifecycle.State.idle.rawValue))
    private let commands = CommandStack<(sequence: UInt64, command: Command)>()
    /// `requestControl()` was called: the handler's `controlRequested()` is due.
    private let controlAsked = ManagedAtomic<Bool>(false)
    /// The session thread sleeps on it; made by `run` (a pipe the system may refuse), nil before.
    private let wakeupSlot = ManagedAtomic<WakeupBox?>(nil)
    private final class WakeupBox: AtomicReference, Sendable {
        let wakeup: Wakeup
        init(_ wakeup: Wakeup) { self.wakeup = wakeup }
    }
    private let counters: [SampleBufferType: Counters]
    /// Set once the sinks exist; read by `statistics()` from other threads.
    private let sinksReady = ManagedAtomic<Bool>(false)
    private(set) var sinks: [SourceSink] = []
    /// The sources capturing now (`replaceSource` swaps one): the control plane's lock, which
    /// serialises replacements against start and stop. The session thread never takes it: it
    /// reads `publishedSources`.
    let liveSources: Mutex<LiveSources>
    /// The sources as of the last replacement, an immutable list published whole (release) and
    /// read by the session thread (acquire) when `sourceGeneration` moved: no lock on its side.
    let publishedSources: ManagedAtomic<SourceList>
    /// Bumped after each replacement is published, so the session thread looks again.
    let sourceGeneration = ManagedAtomic<Int>(0)

    /// Creates a session; nothing is captured until ``run(setupInfo:)``.
    ///
    /// - Parameters:
    ///   - handler: called serially on the thread that calls `run`.
    ///   - sources: at most one source per buffer type.
    ///   - options: duration limit, queue sizes, reorder window.
    ///   - logger: the session's own log lines (start, stop, per-type statistics).
    public init(
        handler: any BroadcastSampleHandler,
        sources: [(type: SampleBufferType, source: any CaptureSource)],
        options: SessionOptions = SessionOptions(),
        logger: Logger = Logger(label: "broadcast.session")
    ) {
        precondition(
            Set(sources.map(\.type)).count == sources.count,
            "a session takes at most one source per buffer type"
        )
        self.handler = handler
        self.sources = sources
        self.options = options
        self.logger = logger
        self.clock = options.clock
        var counters: [SampleBufferType: Counters] = [:]
        for type in SampleBufferType.allCases { counters[type] = Counters() }
        self.counters = counters
        self.liveSources = Mutex(LiveSources(entries: sources))
        self.publishedSources = ManagedAtomic(SourceList(sources))
    }

    public var state: SessionLifecycle.State {
        SessionLifecycle.State(rawValue: UInt8(stateWord.load(ordering: .acquiring) & 0xff))!
    }

    /// Applies `event` to the lifecycle atomically; returns the transition's sequence number.
    @discardableResult
    private func transition(_ event: SessionLifecycle.Event) throws(BroadcastError) -> UInt64 {
        var word = stateWord.load(ordering: .acquiring)
        while true {
            let state = SessionLifecycle.State(rawValue: UInt8(word & 0xff))!
            let next: SessionLifecycle.State
            switch SessionLifecycle.next(from: state, on: event) {
            case .success(let s): next = s
            case .failure(let error): throw error
            }
            let sequence = (word >> 8) + 1
            let (exchanged, original) = stateWord.compareExchange(
                expected: word,
                desired: sequence << 8 | UInt64(next.rawValue),
                ordering: .acquiringAndReleasing
            )
            if exchanged { return sequence }
            word = original
        }
    }

    private func send(_ command: Command, sequence: UInt64) {
        commands.push((sequence, command))
        wakeupSlot.load(ordering: .acquiring)?.wakeup.wake()
    }

    /// Pauses delivery; the handler gets `broadcastPaused`. Throws unless the broadcast is running.
    public func pause() throws(BroadcastError) {
        let now = clock.now()
        send(.pause(at: now), sequence: try transition(.pause))
    }

    /// Resumes delivery; the handler gets `broadcastResumed`. Throws unless the broadcast is paused.
    public func resume() throws(BroadcastError) {
        let now = clock.now()
        send(.resume(at: now), sequence: try transition(.resume))
    }

    /// Ends the broadcast normally: `run` stops the sources, calls `broadcastFinished` and returns.
    public func finish() throws(BroadcastError) {
        send(.finish(error: nil), sequence: try transition(.finish))
    }

    /// Ends the broadcast with an error (ReplayKit's finishBroadcastWithError): `run` throws it.
    public func finishBroadcast(with error: BroadcastError) throws(BroadcastError) {
        send(.finish(error: error), sequence: try transition(.finish))
    }

    /// Asks for a call of the handler's `controlRequested()` on the session's thread, between two
    /// buffers, also while the broadcast is paused (when no buffer reaches the handler). Returns at
    /// once; calls asked before the turn came are one call. From any thread.
    public func requestControl() {
        controlAsked.store(true, ordering: .releasing)
        wakeupSlot.load(ordering: .acquiring)?.wakeup.wake()
    }

    /// Marks the session finished from inside `run` (duration reached, a failure), whatever the state.
    private func forceFinished() {
        _ = try? transition(.finish)
    }

    /// How the session thread's sleeps ended: by a source's (or a command's) wake-up, or by a timeout.
    public var wakeupStatistics: WakeupStatistics { wakeupSlot.load(ordering: .acquiring)?.wakeup.statistics ?? WakeupStatistics() }

    /// A snapshot of the per-type figures. Never waits: the sources are read from the list the
    /// last replacement published (an atomic reference), not under the replacement's lock, so a
    /// swap that takes seconds (a device draining) holds up no status, metrics or watchdog read.
    public func statistics() -> [SampleBufferType: SampleBufferStatistics] {
        let ready = sinksReady.load(ordering: .acquiring)
        let live = publishedSources.load(ordering: .acquiring)
        var result: [SampleBufferType: SampleBufferStatistics] = [:]
        for (type, c) in counters {
            guard sources.contains(where: { $0.type == type }) else { continue }
            var s = SampleBufferStatistics()
            s.delivered = c.delivered.load(ordering: .relaxed)
            s.droppedPaused = c.droppedPaused.load(ordering: .relaxed)
            s.droppedOutOfOrder = c.droppedOutOfOrder.load(ordering: .relaxed)
            s.mediaTimeNanoseconds = c.mediaTime.load(ordering: .relaxed)
            if ready, let sink = sinks.first(where: { $0.type == type }) {
                s.droppedQueueFull = sink.droppedFull.load(ordering: .relaxed)
            }
            if let source = live.entries.first(where: { $0.type == type })?.source {
                // Replaced sources' figures stay counted: a replacement does not take drops back.
                s.droppedBySource = source.droppedCount + live.retiredDrops[type, default: 0]
                s.sourceHealth = source.health
                s.sourceHealth.deviceLosses += live.retiredLosses[type, default: 0]
            }
            result[type] = s
        }
        return result
    }

    /// Runs the broadcast on the calling thread until it finishes. Throws an `illegalTransition`
    /// error when the session has already run, the handler's error when it aborts, or a source's
    /// error when one cannot start or fails.
    public func run(setupInfo: SetupInfo = SetupInfo()) throws -> SessionSummary {
        let startSequence = try transition(.start)
        // The pipes first: a process out of descriptors refuses the start with an error.
        let wakeup: Wakeup
        var spaceWakeups: [Wakeup] = []
        do {
            wakeup = try Wakeup()
            for _ in sources { spaceWakeups.append(try Wakeup()) }
        } catch {
            forceFinished()
            throw error
        }
        // Before anything can block on it (a command sent from now on wakes it).
        wakeupSlot.store(WakeupBox(wakeup), ordering: .releasing)
        do {
            try handler.broadcastStarted(setupInfo: setupInfo)
        } catch {
            forceFinished()
            throw error
        }
        // Media time zero is when the handler is ready, just before the sources start: the time a
        // handler takes to set up (opening encoders and outputs is slow on a small machine) is not
        // a gap at the start of every recording.
        let startTime = clock.now()

        let realtime = sources.contains { $0.source.isRealtime }
        sinks = zip(sources, spaceWakeups).map {
            SourceSink(
                type: $0.type,
                clock: clock,
                startTime: startTime,
                capacity: options.queueCapacity,
                sessionWakeup: wakeup,
                spaceWakeup: $1,
                onFailure: { [weak self] error in _ = try? self?.finishBroadcast(with: error) }
            )
        }
        sinksReady.store(true, ordering: .releasing)
        var started: [any CaptureSource] = []
        for (index, entry) in sources.enumerated() {
            do {
                try entry.source.start(into: sinks[index])
                started.append(entry.source)
            } catch {
                logger.error("\(entry.type) source \(entry.source.name) failed to start: \(error)")
                for sink in sinks { sink.requestStop() }
                for s in started { s.stop() }
                forceFinished()
                liveSources.withLock { $0.closed = true }
                handler.broadcastFinished()
                throw error
            }
        }
        // From here `replaceSource` may swap one (the sinks exist and every source runs).
        liveSources.withLock { $0.started = true }

        var loop = DeliveryLoop(
            session: self,
            startTime: startTime,
            realtime: realtime,
            wakeup: wakeup,
            nextSequence: startSequence + 1
        )
        let outcome = loop.run()
        forceFinished()

        for sink in sinks { sink.requestStop() }
        // Waits for a replacement under way; none starts after this.
        let running = liveSources.withLock { live in
            live.closed = true
            return live.entries
        }
        for entry in running { entry.source.stop() }
        for sink in sinks {
            while let buffer = sink.ring.pop() { buffer.backing?.release() }
        }
        handler.broadcastFinished()
        for (type, s) in statistics().sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
            logger.info(
                "\(type): \(s.delivered) delivered, \(Double(s.mediaTimeNanoseconds / 1_000_000) / 1000) s of media; dropped: \(s.droppedQueueFull) queue full, \(s.droppedBySource) by the source, \(s.droppedOutOfOrder) out of order, \(s.droppedPaused) paused"
            )
        }
        switch outcome {
        case .failure(let error):
            throw error
        case .success(let reason):
            return SessionSummary(reason: reason, statistics: statistics())
        }
    }

    /// The session thread's state while delivering: pause intervals, per-type progress.
    private struct DeliveryLoop {
        let session: BroadcastSession
        let startTime: Int64
        let realtime: Bool
        let wakeup: Wakeup
        /// Closed pauses as capture-clock intervals [start, end), oldest first.
        var pauses: [(start: Int64, end: Int64)] = []
        /// Capture time at which the current pause began, if paused.
        var pausedAt: Int64?
        /// A pause asked for at this capture time, waiting until what was captured before it is out.
        var pendingPause: Int64?
        /// Clock time just before the commands were last taken: a resume not seen yet was asked for
        /// after it, so only what was captured entirely before it may be dropped as paused.
        var commandsTakenAt: Int64 = .min
        /// Delivery stopped for a buffer type: its sink ended or the duration was reached.
        var done: Set<SampleBufferType> = []
        var lastPTS: [SampleBufferType: Int64] = [:]
        /// Per video type, the last frame delivered: its capture time and duration (a frame period).
        var lastFrame: [SampleBufferType: (capture: Int64, duration: Int64)] = [:]
        /// Types whose last buffer was dropped here: the next one delivered says everything changed.
        var changesLost: Set<SampleBufferType> = []
        /// The earliest capture time a type's next buffer can have: the end of its last buffer for
        /// audio (continuous), half a frame after its last frame for video (a frame period apart).
        /// A buffer captured before it need not wait for that type's empty queue.
        var nextCapture: [SampleBufferType: Int64] = [:]
        let durationNanoseconds: Int64?
        /// The health each source last reported to the handler.
        var reportedHealth: [SampleBufferType: CaptureHealth] = [:]
        /// The sources whose health is watched, as of `sourceGeneration` = `sourcesSeen`.
        var sources: [(type: SampleBufferType, source: any CaptureSource)]
        var sourcesSeen = 0
        /// The sequence number of the next command to apply: every transition after the start is
        /// a command, numbered by its compare-and-swap, so the numbers have no gaps.
        var nextSequence: UInt64
        /// Commands taken whose turn has not come: a later one can be pushed before an earlier one
        /// (two threads between their compare-and-swap and their push), and may be taken alone.
        var early: [(sequence: UInt64, command: Command)] = []

        init(session: BroadcastSession, startTime: Int64, realtime: Bool, wakeup: Wakeup, nextSequence: UInt64) {
            self.session = session
            self.wakeup = wakeup
            self.nextSequence = nextSequence
            self.startTime = startTime
            self.realtime = realtime
            self.durationNanoseconds = session.options.duration.flatMap { $0.isNumeric ? $0.nanoseconds : nil }
            self.sources = session.sources
        }

        /// Takes a replaced source's place in the health watch: one atomic load per turn, and
        /// after a replacement the published list (an atomic reference; no lock).
        private mutating func refreshSources() {
            let generation = session.sourceGeneration.load(ordering: .acquiring)
            guard generation != sourcesSeen else { return }
            sources = session.publishedSources.load(ordering: .acquiring).entries
            sourcesSeen = generation
        }

        mutating func run() -> Result<SessionSummary.Reason, BroadcastError> {
            /// Commands taken but not applied yet: they wait while a pause is pending.
            var queued: [Command] = []
            while true {
                // Control first: the handler hears of pause/resume/finish between two buffers.
                if let end = applyCommands(&queued) { return end }
                if session.controlAsked.load(ordering: .relaxed), session.controlAsked.exchange(false, ordering: .acquiring) {
                    session.handler.controlRequested()
                }
                if beginPendingPause() { continue }
                // Device loss and return reach the handler between two buffers, like control.
                reportHealthChanges()
                if let pausedAt {
                    // Non-realtime sources simply wait; realtime capture goes on and is dropped.
                    if realtime { dropCapturedWhilePaused(since: pausedAt) }
                    sleep(timeout: nil)
                    continue
                }
                switch nextInCaptureOrder() {
                case .finished(let reason):
                    return .success(reason)
                case .wait(let timeout):
                    sleep(timeout: timeout)
                case .ready(let sink):
                    if let failure = deliverNext(from: sink) { return .failure(failure) }
                }
            }
        }

        /// Takes the commands sent since the last turn and applies them in order, up to a pause that
        /// must wait for what was captured before it. Returns how the run ends, if a command ends it.
        private mutating func applyCommands(_ queued: inout [Command]) -> Result<SessionSummary.Reason, BroadcastError>? {
            commandsTakenAt = session.clock.now()
            // In sequence order across batches: a resume never reaches the handler before the
            // pause it follows, whichever thread pushed first.
            early += session.commands.takeAll()
            early.sort { $0.sequence < $1.sequence }
            while let first = early.first, first.sequence == nextSequence {
                queued.append(first.command)
                early.removeFirst()
                nextSequence += 1
            }
            while pendingPause == nil, !queued.isEmpty {
                switch queued.removeFirst() {
                case .pause(let at):
                    if realtime {
                        // First deliver what was captured before the pause (audio up to its sample).
                        pendingPause = at
                    } else {
                        pausedAt = at
                        session.handler.broadcastPaused()
                    }
                case .resume(let at):
                    if let start = pausedAt, realtime { pauses.append((start, max(start, at))) }
                    pausedAt = nil
                    session.handler.broadcastResumed()
                case .finish(let error):
                    if let error { return .failure(error) }
                    return .success(.finished)
                }
            }
            return nil
        }

        /// A pending pause begins once what was captured before it went out: true when it did now.
        private mutating func beginPendingPause() -> Bool {
            guard let pause = pendingPause, everythingBeforeDelivered(pause) else { return false }
            pendingPause = nil
            pausedAt = pause
            session.handler.broadcastPaused()
            return true
        }

        /// Tells the handler of each source whose health changed since it last heard.
        private mutating func reportHealthChanges() {
            refreshSources()
            for (type, source) in sources {
                let health = source.health
                if health != reportedHealth[type, default: CaptureHealth()] {
                    reportedHealth[type] = health
                    session.handler.sourceHealthChanged(health, of: type)
                }
            }
        }

        /// What the delivery loop does next.
        enum Next {
            /// Every source ended (or the duration was reached).
            case finished(SessionSummary.Reason)
            /// Sleep until woken, or at most this long (nil: no limit).
            case wait(Int64?)
            /// This queue's head is the next buffer in capture order.
            case ready(SourceSink)
        }

        /// The next buffer in capture order across types, or how long to wait for one: an empty
        /// queue whose next buffer could have been captured earlier holds the others back (without
        /// limit when nothing is realtime, within the reorder window otherwise).
        private mutating func nextInCaptureOrder() -> Next {
            var best: SourceSink?
            var bestTime = Int64.max
            // The earliest capture time an empty queue's next buffer can have.
            var earliestFromEmpty = Int64.max
            for sink in session.sinks where !done.contains(sink.type) {
                // `ended` before the ring: a source pushes its last buffers, then ends (release);
                // read the other way round, a ring found empty just before those buffers came and
                // `ended` read just after would lose them.
                let ended = sink.hasEnded
                sink.betweenEndAndRingForTesting?()
                if let head = sink.ring.peek() {
                    // While a pause is pending only what was captured before it goes out.
                    if let pause = pendingPause, head.captureTime >= pause { continue }
                    if head.captureTime < bestTime {
                        best = sink
                        bestTime = head.captureTime
                    }
                } else if ended {
                    done.insert(sink.type)
                } else {
                    earliestFromEmpty = min(earliestFromEmpty, nextCapture[sink.type] ?? .min)
                }
            }
            guard let sink = best else {
                if done.count == session.sinks.count {
                    return .finished(durationNanoseconds != nil ? .durationReached : .sourcesEnded)
                }
                if let pause = pendingPause {
                    // Wait for the rest captured before the pause, within the reorder window.
                    return .wait(max(1_000_000, pause + session.options.reorderWindowNanoseconds - session.clock.now()))
                }
                return .wait(nil)
            }
            // An empty queue holds the best buffer back only if its next buffer could come first:
            // a video frame captured in the middle of an audio period waits for that period, not
            // for the one after it.
            if earliestFromEmpty <= bestTime {
                if !realtime { return .wait(nil) }
                let age = session.clock.now() - bestTime
                if age < session.options.reorderWindowNanoseconds {
                    return .wait(session.options.reorderWindowNanoseconds - age)
                }
            }
            return .ready(sink)
        }

        /// Takes `sink`'s head and hands it to the handler; returns the error that ends the run.
        private mutating func deliverNext(from sink: SourceSink) -> BroadcastError? {
            var taken = sink.ring.pop()
            sink.tookBuffer()
            let backing = taken?.backing
            let error = deliverTaken(taken!, from: sink)
            // The buffer is gone before its backing goes back: a source that reuses what the
            // buffer shared (the composite's changed regions) finds no one else holding it.
            taken = nil
            backing?.release()
            return error
        }

        private mutating func deliverTaken(_ buffer: CapturedBuffer, from sink: SourceSink) -> BroadcastError? {
            let length = buffer.duration.nanoseconds ?? 0
            if case .audio = buffer.format {
                nextCapture[sink.type] = buffer.captureTime + length
            } else {
                nextCapture[sink.type] = buffer.captureTime + length / 2
            }
            do {
                try deliver(buffer, of: sink.type, cutAt: pendingPause)
                return nil
            } catch let error as BroadcastError {
                return error
            } catch {
                return BroadcastError(.handlerAborted, "the handler aborted: \(error)")
            }
        }

        private func sleep(timeout: Int64?) {
            wakeup.prepareToSleep()
            // Anything that arrived between the last look and now would otherwise wait for the timeout.
            // Without a timeout the loop waits for any buffer; with one (the reorder window) it waits
            // for the empty queues, while another queue's head is already there: that head alone
            // must not cancel the wake-up, or the first buffer to fill an empty queue is seen only
            // when the whole window has passed.
            let arrived =
                timeout == nil
                ? session.sinks.contains(where: { !$0.ring.isEmpty && !done.contains($0.type) })
                : session.sinks.allSatisfy { done.contains($0.type) || $0.hasEnded || !$0.ring.isEmpty }
            if (arrived && pausedAt == nil) || session.controlAsked.load(ordering: .relaxed) {
                wakeup.cancelSleep()
                return
            }
            wakeup.sleep(timeoutNanoseconds: timeout ?? 250_000_000)
        }

        /// True when every source has delivered what it captured before `pause` (its next buffer starts
        /// at or after it, or it ended), or the reorder window has passed: a source that far behind
        /// keeps its older buffers for after the resume.
        private func everythingBeforeDelivered(_ pause: Int64) -> Bool {
            if session.clock.now() - pause >= session.options.reorderWindowNanoseconds { return true }
            return session.sinks.allSatisfy { sink in
                if done.contains(sink.type) || sink.hasEnded { return true }
                guard let head = sink.ring.peek() else { return false }
                return head.captureTime >= pause
            }
        }

        /// Drops buffers captured entirely after the pause began; earlier ones wait for the resume.
        /// A buffer that ends after the commands were last read stays too: a resume may have come
        /// before its end, which the next turn of the loop will see.
        private mutating func dropCapturedWhilePaused(since pauseStart: Int64) {
            for sink in session.sinks {
                while let head = sink.ring.peek(), head.captureTime >= pauseStart,
                    head.captureTime + (head.duration.nanoseconds ?? 0) <= commandsTakenAt
                {
                    _ = sink.ring.pop()
                    sink.tookBuffer()
                    head.backing?.release()
                    changesLost.insert(sink.type)
                    session.counters[sink.type]!.droppedPaused.wrappingIncrement(ordering: .relaxed)
                }
            }
        }

        /// Pause time taken out of media time for something captured at `time`.
        private func pausedBefore(_ time: Int64) -> Int64 {
            var total: Int64 = 0
            for p in pauses where p.end <= time { total += p.end - p.start }
            return total
        }

        /// Hands `buffer` to the handler: the parts captured outside pauses and inside the duration,
        /// with media times. Audio is cut at sample precision; a video frame is all or nothing.
        private mutating func deliver(_ buffer: CapturedBuffer, of type: SampleBufferType, cutAt pause: Int64? = nil) throws {
            let counters = session.counters[type]!
            // Until a buffer of this type is delivered, assume it is not: any return before the
            // handler call below leaves the next buffer saying everything changed.
            let changedRegions = changesLost.contains(type) ? nil : buffer.changedRegions
            // Lost on the way (the source's or the queue's drop, said by the sink) or here (out of
            // order, paused): the handler hears this buffer follows a loss.
            let followsLoss = buffer.followsLoss || changesLost.contains(type)
            changesLost.insert(type)
            let start = buffer.captureTime
            let durationNs = buffer.duration.nanoseconds ?? 0
            guard start >= startTime else {
                counters.droppedOutOfOrder.wrappingIncrement(ordering: .relaxed)
                return
            }

            let end = start + max(durationNs, 0)
            guard !pauses.isEmpty else {
                // No pause so far (the steady state): one piece, and no array for it.
                var to = end
                if let pause, case .audio = buffer.format {
                    // A pause is beginning: audio stops at its exact sample.
                    guard start < pause else { return }
                    to = min(end, pause)
                }
                try deliverPiece(of: buffer, type, from: start, to: to, changedRegions: changedRegions, followsLoss: followsLoss)
                return
            }

            // The buffer's capture interval less every pause, as pieces [from, to).
            var pieces: [(from: Int64, to: Int64)] = [(start, end)]
            for p in pauses {
                pieces = pieces.flatMap { piece -> [(from: Int64, to: Int64)] in
                    if case .video = buffer.format {
                        // A frame is an instant: kept unless it was captured inside the pause.
                        return (piece.from >= p.start && piece.from < p.end) ? [] : [piece]
                    }
                    var out: [(from: Int64, to: Int64)] = []
                    if piece.from < p.start { out.append((piece.from, min(piece.to, p.start))) }
                    if piece.to > p.end { out.append((max(piece.from, p.end), piece.to)) }
                    return out
                }
            }
            if pieces.isEmpty {
                counters.droppedPaused.wrappingIncrement(ordering: .relaxed)
                return
            }
            if let pause, case .audio = buffer.format {
                // A pause is beginning: audio stops at its exact sample.
                pieces = pieces.compactMap { $0.from < pause ? ($0.from, min($0.to, pause)) : nil }
            }
            for piece in pieces {
                guard try deliverPiece(of: buffer, type, from: piece.from, to: piece.to, changedRegions: changedRegions, followsLoss: followsLoss)
                else { return }
            }
        }

        /// Hands the handler the part of `buffer` captured in [from, to) (outside every pause).
        /// Returns false when the duration is reached: nothing more of this type goes out.
        @discardableResult
        private mutating func deliverPiece(
            of buffer: CapturedBuffer, _ type: SampleBufferType, from: Int64, to: Int64, changedRegions: [PixelRegion]?,
            followsLoss: Bool
        ) throws -> Bool {
            let counters = session.counters[type]!
            var pts = from - startTime - pausedBefore(from)
            var sample = slice(buffer, from: from, to: to)
            if let limit = durationNanoseconds {
                if pts >= limit {
                    done.insert(type)
                    return false
                }
                if case .audio = buffer.format, pts + sample.durationNs > limit {
                    sample = slice(buffer, from: from, to: from + (limit - pts))
                }
            }
            if let last = lastPTS[type], pts <= last {
                counters.droppedOutOfOrder.wrappingIncrement(ordering: .relaxed)
                return true
            }
            if case .video = buffer.format, let last = lastPTS[type], let previous = lastFrame[type],
                pts - last < previous.duration, pausedBefore(from) != pausedBefore(previous.capture)
            {
                // A pause between the two frames took out a stretch that is not a whole number of
                // frames: this one would fall less than a frame period after the one before it, and
                // anything counting in frames (1/fps) would give both one timestamp. It goes; the next
                // one is between one and two periods after the last. (Decided here, where capture
                // times are known: a frame captured before the pause can arrive after the resume.)
                counters.droppedPaused.wrappingIncrement(ordering: .relaxed)
                return true
            }
            lastPTS[type] = pts
            if case .video = buffer.format { lastFrame[type] = (from, sample.durationNs) }
            if case .video = buffer.format, let limit = durationNanoseconds, pts + sample.durationNs > limit {
                sample.durationNs = limit - pts
            }
            pts = max(pts, 0)
            let sampleBuffer = SampleBuffer(
                format: buffer.format,
                presentationTime: MediaTime(nanoseconds: pts),
                duration: MediaTime(nanoseconds: sample.durationNs),
                planes: sample.planes,
                frameCount: sample.frameCount,
                changedRegions: changedRegions,
                followsLoss: followsLoss
            )
            changesLost.remove(type)
            try session.handler.processSampleBuffer(sampleBuffer, of: type)
            counters.delivered.wrappingIncrement(ordering: .relaxed)
            counters.mediaTime.store(pts + sample.durationNs, ordering: .relaxed)
            return true
        }

        /// The part of `buffer` captured in [from, to): whole for video, whole samples for audio.
        private func slice(_ buffer: CapturedBuffer, from: Int64, to: Int64)
            -> (planes: [Plane], frameCount: Int, durationNs: Int64)
        {
            guard case .audio(let audio) = buffer.format, buffer.frameCount > 0 else {
                return (buffer.planes, buffer.frameCount, to - from)
            }
            let rate = Int64(audio.sampleRate)
            let first = Int(min(Int64(buffer.frameCount), ((from - buffer.captureTime) * rate + 500_000_000) / 1_000_000_000))
            let end = Int(min(Int64(buffer.frameCount), ((to - buffer.captureTime) * rate + 500_000_000) / 1_000_000_000))
            let frames = max(0, end - first)
            if first == 0 && frames == buffer.frameCount {
                return (buffer.planes, frames, (Int64(frames) * 1_000_000_000 + rate / 2) / rate)
            }
            let bytesPerFrame = audio.sampleFormat.isPlanar ? audio.sampleFormat.bytesPerSample : audio.bytesPerFrame
            let planes = buffer.planes.map {
                Plane(base: $0.base + first * bytesPerFrame, count: frames * bytesPerFrame, bytesPerRow: frames * bytesPerFrame)
            }
            return (planes, frames, (Int64(frames) * 1_000_000_000 + rate / 2) / rate)
        }
    }
}
