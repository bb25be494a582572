import Atomics
import BroadcastKit
import BroadcastMedia
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Where media time stands now, for a save asked from another thread (a signal, the control API):
/// "everything up to this moment" is this media time. Written on the session's thread at start,
/// pause and resume; read from any (one atomic reference).
public final class MediaClock: Sendable {
    final class Anchor: AtomicReference, Sendable {
        /// Monotonic clock (ns) at `media`.
        let clock: Int64
        let media: Int64
        let paused: Bool
        init(clock: Int64, media: Int64, paused: Bool) {
            self.clock = clock
            self.media = media
            self.paused = paused
        }
    }

    private let anchor = ManagedAtomic<Anchor?>(nil)
    /// False for a session whose sources run faster than the clock (--no-realtime): media time
    /// then says nothing about the wall clock, and a save takes what was encoded when it is handled.
    let realtime: Bool

    public init(realtime: Bool = true) { self.realtime = realtime }

    func started() { anchor.store(Anchor(clock: MonotonicClock().now(), media: 0, paused: false), ordering: .releasing) }
    /// Media time stands still at `media` (the end of the last buffer delivered before the pause).
    func paused(at media: Int64) { anchor.store(Anchor(clock: MonotonicClock().now(), media: media, paused: true), ordering: .releasing) }
    func resumed() {
        guard let a = anchor.load(ordering: .acquiring) else { return }
        anchor.store(Anchor(clock: MonotonicClock().now(), media: a.media, paused: false), ordering: .releasing)
    }

    /// Media time (ns) now and whether the broadcast is paused; nil before the start or when not realtime.
    public func now() -> (media: Int64, paused: Bool)? {
        guard realtime, let a = anchor.load(ordering: .acquiring) else { return nil }
        if a.paused { return (a.media, true) }
        return (a.media + max(0, MonotonicClock().now() - a.clock), false)
    }
}

/// One save of a replay buffer: asked from any thread, done on the replay output's own threads.
/// `wait` (control plane only) polls its outcome.
public final class ReplaySave: Sendable {
    public struct Outcome: Sendable, Hashable {
        /// The finished file, or nil when the save failed.
        public var path: String?
        /// Seconds of media in the file.
        public var seconds: Double
        /// Less was buffered than asked for (right after the start, say).
        public var isShorter: Bool
        /// Why it failed (nothing buffered, a write error), or nil.
        public var error: String?
    }

    final class Box: AtomicReference, Sendable {
        let outcome: Outcome
        init(_ outcome: Outcome) { self.outcome = outcome }
    }

    public let outputName: String
    /// The last this many seconds (nil: the whole buffer).
    public let seconds: Double?
    /// Media time (ns) the file must reach: captured before the request. nil: what is encoded
    /// when the output's thread takes the request.
    let cut: Int64?
    /// Monotonic ns after which the output stops waiting for packets captured before the cut
    /// (a capture that stalled, the audio a paused encoder holds) and saves what it has.
    let waitUntil: Int64
    /// Asked while the broadcast was paused (its last audio waits in the encoder).
    let whilePaused: Bool
    private let box = ManagedAtomic<Box?>(nil)

    init(outputName: String, seconds: Double?, cut: Int64?, waitUntil: Int64, whilePaused: Bool = false) {
        self.whilePaused = whilePaused
        self.outputName = outputName
        self.seconds = seconds
        self.cut = cut
        self.waitUntil = waitUntil
    }

    /// The outcome once the file is written (or the save failed), else nil.
    public var outcome: Outcome? { box.load(ordering: .acquiring)?.outcome }

    func complete(_ outcome: Outcome) { box.store(Box(outcome), ordering: .releasing) }

    /// Waits up to `timeoutSeconds` for the outcome. Control plane only (it polls).
    public func wait(timeoutSeconds: Double) -> Outcome? {
        let deadline = MonotonicClock().now() + Int64(timeoutSeconds * 1e9)
        while true {
            if let outcome { return outcome }
            if MonotonicClock().now() >= deadline { return nil }
            usleep(5_000)
        }
    }
}

/// A replay output's figures, readable from any thread.
public struct ReplayStatistics: Sendable, Hashable {
    public var bufferedSeconds: Double
    public var bufferedBytes: Int64
    public var limitSeconds: Double
    public var maxBytes: Int64
    public var savesDone: Int
    public var savesFailed: Int
    /// Saves asked for and not finished yet.
    public var savesPending: Int
    public var lastPath: String?
    /// GOPs dropped because of the byte bound.
    public var droppedForMemory: Int
}

/// A replay output's counters: written by its threads, read by any (atomics only).
final class ReplayStatus: Sendable {
    let bufferedNanoseconds = ManagedAtomic<Int64>(0)
    let bufferedBytes = ManagedAtomic<Int64>(0)
    let savesAsked = ManagedAtomic<Int>(0)
    let savesDone = ManagedAtomic<Int>(0)
    let savesFailed = ManagedAtomic<Int>(0)
    let droppedForMemory = ManagedAtomic<Int>(0)
    let lastPath = ManagedAtomic<OutputStatus.Text?>(nil)
    /// Save requests for the output's thread (any thread pushes).
    let requests = CommandStack<ReplaySave>()
}

extension Output {
    /// Whether this output is a replay buffer.
    public var isReplay: Bool { configuration.replay != nil }

    /// Asks for a save of the replay buffer: everything up to now (the output waits for what was
    /// captured before this call), the last `seconds` of it (nil: all). Returns at once; the file
    /// is written on the output's own thread. nil when this is not a replay output.
    /// `upTo` sets the media time (ns) the file ends at instead of now (tests, offline sessions).
    public func saveReplay(seconds: Double? = nil, upTo cut: Int64? = nil) -> ReplaySave? {
        guard configuration.replay != nil else { return nil }
        let now = MonotonicClock().now()
        if feed.closed.load(ordering: .acquiring) {
            let save = ReplaySave(outputName: name, seconds: seconds, cut: nil, waitUntil: now)
            save.complete(.init(path: nil, seconds: 0, isShorter: true, error: "replay \(name): the output has finished"))
            return save
        }
        let position = mediaClock.now()
        // Packets captured before now reach the output within a few frames; a paused encoder
        // holds its last audio frame until the resume, so a paused broadcast waits less.
        let wait: Int64 = position?.paused == true ? 300_000_000 : 3_000_000_000
        let save = ReplaySave(
            outputName: name, seconds: seconds, cut: cut ?? position?.media, waitUntil: cut != nil ? .max : now + wait,
            whilePaused: position?.paused == true)
        replayStatus.savesAsked.wrappingIncrement(ordering: .relaxed)
        replayStatus.requests.push(save)
        feed.dataWakeup.wake()
        return save
    }

    public func replayStatistics() -> ReplayStatistics? {
        guard let settings = configuration.replay else { return nil }
        let s = replayStatus
        let done = s.savesDone.load(ordering: .relaxed)
        let failed = s.savesFailed.load(ordering: .relaxed)
        return ReplayStatistics(
            bufferedSeconds: Double(s.bufferedNanoseconds.load(ordering: .relaxed)) / 1e9,
            bufferedBytes: s.bufferedBytes.load(ordering: .relaxed),
            limitSeconds: settings.seconds,
            maxBytes: settings.maxBytes,
            savesDone: done,
            savesFailed: failed,
            savesPending: max(0, s.savesAsked.load(ordering: .relaxed) - done - failed),
            lastPath: s.lastPath.load(ordering: .acquiring)?.value,
            droppedForMemory: s.droppedForMemory.load(ordering: .relaxed)
        )
    }
}

/// A replay buffer: keeps the last N seconds of the encode (the packets themselves, refcounted,
/// no copies) and writes them to a file when asked.
///
/// Two threads: the output's thread takes packets from the feed into the buffer, keeps it within
/// its bounds and turns each request into the list of packets to write, once it holds what was
/// captured before the request; a writer thread of the output writes those lists one after the
/// other through `Recording` (the same muxing and MP4 finalizing as any recording). So a slow disk
/// delays only the next save, never the buffer, capture or the other outputs; saves queue in order.
final class ReplayWorker: OutputWorker, @unchecked Sendable {
    /// A save's length in nanoseconds: more than the buffer can hold means all of it, so a length
    /// beyond Int64's range (a library caller's 1e10 s) is all of it too, never a trap.
    static func nanoseconds(_ seconds: Double) -> Int64 {
        let nanoseconds = (seconds * 1e9).rounded()
        return nanoseconds < 0x1p63 ? Int64(max(nanoseconds, 0)) : .max
    }

    private struct Job: @unchecked Sendable {
        let save: ReplaySave
        let selection: ReplayBuffer<EncodedPacket>.Selection?
        let note: String?
        /// The markers within the saved window, in the file's time.
        var marks: [RecordingMark] = []
    }

    private let output: Output
    private let settings: ReplaySettings
    private let pathTemplate: String
    private let hasVideo: Bool
    private let hasAudio: Bool
    private let streams: [StreamDescription]
    private let logger: Logger
    private let hook: FileFinishedHook?
    private let jobs = CommandStack<Job>()
    private let jobWakeup: Wakeup
    private let intakeEnded = ManagedAtomic<Bool>(false)

    init(output: Output, settings: ReplaySettings, pathTemplate: String, streams: [StreamDescription], hook: FileFinishedHook?, logger: Logger) throws(BroadcastError) {
        self.jobWakeup = try Wakeup()
        self.output = output
        self.settings = settings
        self.pathTemplate = pathTemplate
        self.streams = streams
        self.hasVideo = streams.contains { $0.parameters.mediaType == .video }
        self.hasAudio = streams.contains { $0.parameters.mediaType == .audio }
        self.hook = hook
        self.logger = logger
    }

    // MARK: The output's thread: the buffer

    /// The output thread's state: the buffer, the saves asked for and not yet handed to the writer,
    /// and where the packets stand (that thread alone touches it).
    private struct Intake {
        var buffer: ReplayBuffer<EncodedPacket>
        var pending: [ReplaySave] = []
        var awaitingKeyframe = false
        var join: PauseJoin
        var newestVideo: Int64 = .min
        var newestAudio: Int64 = .min
        var lastOverflows = 0
        /// Markers taken from the output, waiting for the packet at their time.
        var waitingMarks: [Output.PendingMark] = []
        /// Markers placed, in the buffer's time (the shift taken off), oldest first.
        var marks: [RecordingMark] = []
        /// Where (encoder's time) the stretch being buffered began: the first packet, the last resume.
        var stretchStart: Int64 = .min
    }

    func run() {
        let status = output.status
        let replay = output.replayStatus
        let feed = output.feed
        status.set(.recording)
        status.everDelivered.store(true, ordering: .releasing)
        let writer = OSThread(name: "bc-replay-save") { [self] in writeJobs() }
        var intake = Intake(buffer: ReplayBuffer<EncodedPacket>(settings: settings), join: PauseJoin(streamCount: streams.streamIndexSpan))
        while true {
            intake.pending += replay.requests.takeAll()
            intake.buffer.holdEnd = intake.pending.first.flatMap { $0.cut }.map { $0 - intake.join.shift }
            let took = take(upTo: 256, into: &intake)
            publish(&intake)
            let ended = feed.ended.load(ordering: .acquiring) && feed.ring.isEmpty
            let now = MonotonicClock().now()
            handOverDueSaves(&intake, ended: ended, now: now)
            if ended && took == 0 && intake.pending.isEmpty {
                // A request that came in at the very end is still served.
                let late = replay.requests.takeAll()
                if late.isEmpty { break }
                intake.pending += late
                continue
            }
            if took == 0 {
                let timeout: Int64 = intake.pending.first.map { max(1_000_000, min(200_000_000, $0.waitUntil - now)) } ?? 200_000_000
                feed.waitForPackets(timeout: .nanoseconds(timeout))
            }
        }
        intake.buffer.removeAll()
        replay.bufferedNanoseconds.store(0, ordering: .relaxed)
        replay.bufferedBytes.store(0, ordering: .relaxed)
        intakeEnded.store(true, ordering: .releasing)
        jobWakeup.wake()
        writer.join()
        status.set(.finished)
        feed.close()
    }

    /// Adds up to `limit` packets from the feed to the buffer: none while paused (the buffer is
    /// kept), from a keyframe after a pause, joined to what came before without a gap. Returns how
    /// many were taken.
    private func take(upTo limit: Int, into intake: inout Intake) -> Int {
        let status = output.status
        var took = 0
        while took < limit, let packet = output.feed.pop() {
            took += 1
            let pts = packet.ptsNanoseconds
            let end = pts + max(0, packet.durationNanoseconds)
            if packet.mediaType == .video { intake.newestVideo = max(intake.newestVideo, end) } else { intake.newestAudio = max(intake.newestAudio, end) }
            if output.isPaused {
                if status.current != .paused { status.set(.paused) }
                status.drop(.paused)
                intake.awaitingKeyframe = true
                continue
            }
            let isStart = packet.isKeyframe && (packet.mediaType == .video || !hasVideo)
            let dts = packet.dtsNanoseconds
            if intake.awaitingKeyframe {
                guard isStart else {
                    status.drop(.paused)
                    continue
                }
                intake.awaitingKeyframe = false
                intake.join.resume(at: dts)
                intake.stretchStart = dts
                status.set(.recording)
            }
            // A packet that would go back in its stream (audio begun just before the keyframe
            // a resume joined at) belongs to the paused time: a save could not write it.
            guard intake.join.admit(stream: packet.streamIndex, dts: dts, end: end) else {
                status.drop(.paused)
                continue
            }
            intake.buffer.append(
                .init(
                    packet: packet, isVideo: packet.mediaType == .video, isStart: isStart, pts: pts, dts: dts,
                    end: end, shift: intake.join.shift, payloadBytes: packet.size))
            if intake.stretchStart == .min { intake.stretchStart = dts }
            if !intake.waitingMarks.isEmpty || output.pendingMarks.load(ordering: .relaxed) != nil { placeMarks(upTo: dts, &intake) }
            status.sent(packet)
        }
        return took
    }

    /// Places the markers taken at or before `dts` in the buffer's time (as a recording does), and
    /// forgets those older than anything a save could still hold.
    private func placeMarks(upTo dts: Int64, _ intake: inout Intake) {
        if let taken = output.pendingMarks.exchange(nil, ordering: .acquiring) { intake.waitingMarks += taken.marks }
        var later: [Output.PendingMark] = []
        for mark in intake.waitingMarks {
            guard mark.media <= dts else {
                later.append(mark)
                continue
            }
            intake.marks.append(RecordingMark(nanoseconds: max(mark.media, intake.stretchStart) - intake.join.shift, title: mark.title))
        }
        intake.waitingMarks = later
        if let newest = intake.join.lastEnd {
            let oldest = newest - intake.buffer.limitNanoseconds - 60_000_000_000
            intake.marks.removeAll { $0.nanoseconds < oldest }
        }
    }

    /// The buffer's figures for the status, and the warning when one keyframe interval overflowed it.
    private func publish(_ intake: inout Intake) {
        let replay = output.replayStatus
        let buffer = intake.buffer
        if buffer.overflows != intake.lastOverflows {
            if intake.lastOverflows == 0 {
                logger.warning(
                    "replay \(output.name): one keyframe interval is more than max_memory (\(settings.maxBytes) bytes): the buffer was emptied; raise the limit or shorten the keyframe interval")
            }
            intake.lastOverflows = buffer.overflows
        }
        replay.bufferedNanoseconds.store(buffer.bufferedNanoseconds, ordering: .relaxed)
        replay.bufferedBytes.store(buffer.bytes, ordering: .relaxed)
        replay.droppedForMemory.store(buffer.gopsDroppedForMemory + buffer.overflows, ordering: .relaxed)
    }

    /// Hands the saves whose packets are in (or that waited long enough, or that the end or a pause
    /// makes due) to the writer, in order: one waiting for its packets holds the next.
    private func handOverDueSaves(_ intake: inout Intake, ended: Bool, now: Int64) {
        while let save = intake.pending.first {
            let covered: Bool
            if let cut = save.cut {
                covered = (!hasVideo || intake.newestVideo >= cut) && (!hasAudio || intake.newestAudio >= cut)
            } else {
                covered = true
            }
            guard covered || ended || output.isPaused || now >= save.waitUntil else { break }
            intake.pending.removeFirst()
            let wanted = save.seconds.map { Self.nanoseconds($0) }
            let selection = intake.buffer.selection(cut: save.cut, nanoseconds: wanted)
            let empty =
                intake.buffer.overflows > 0 && intake.buffer.isEmpty
                ? "nothing buffered: one keyframe interval is more than max_memory (\(settings.maxBytes) bytes)"
                : "nothing buffered yet to save"
            let note =
                covered || output.isPaused || save.whilePaused
                ? nil : "saved without the last packets asked for (none came within the wait)"
            // Markers in the window: at their time from the save's start.
            let marks = selection.map { selection in
                intake.marks.compactMap { mark -> RecordingMark? in
                    let time = mark.nanoseconds - selection.base
                    guard time >= 0, time <= selection.durationNanoseconds else { return nil }
                    return RecordingMark(nanoseconds: time, title: mark.title)
                }
            } ?? []
            jobs.push(Job(save: save, selection: selection, note: selection == nil ? empty : note, marks: marks))
            jobWakeup.wake()
        }
    }

    // MARK: The writer thread: saves

    private func writeJobs() {
        while true {
            jobWakeup.prepareToSleep()
            let batch = jobs.takeAll()
            if batch.isEmpty {
                if intakeEnded.load(ordering: .acquiring) {
                    jobWakeup.cancelSleep()
                    // One last look: a job pushed just before the end.
                    let last = jobs.takeAll()
                    if last.isEmpty { return }
                    for job in last { write(job) }
                    continue
                }
                jobWakeup.sleep(timeout: .milliseconds(200))
                continue
            }
            jobWakeup.cancelSleep()
            for job in batch { write(job) }
        }
    }

    private func write(_ job: Job) {
        let replay = output.replayStatus
        guard let selection = job.selection, !selection.entries.isEmpty else {
            replay.savesFailed.wrappingIncrement(ordering: .relaxed)
            let message = "replay \(output.name): \(job.note ?? "nothing buffered yet to save")"
            logger.error("\(message)")
            job.save.complete(.init(path: nil, seconds: 0, isShorter: true, error: message))
            return
        }
        // With the daemon's manifest a name is given out once, and a save a crash left
        // fragmented is finalized at the next start.
        let manifest = output.configuration.manifest
        let path = RecordingRetention.nextPath(pathTemplate, manifest: manifest)
        let started = MonotonicClock().now()
        do throws(BroadcastError) {
            // Conversions in the directories (`%Y/%m/%d-%H%M%S.mp4`) name directories to create, as
            // for recordings.
            if let problem = RecordingTemplate.makeParentDirectories(of: path) {
                throw BroadcastError(.outputFailed, "replay \(output.name): \(problem)")
            }
            let recording = try Recording(path: path, streams: streams, logger: logger)
            manifest?.recordCreated(recording, owner: output.name)
            do throws(BroadcastError) {
                for entry in selection.entries {
                    try recording.write(entry.packet, shiftNanoseconds: entry.shift + selection.base)
                }
                for mark in job.marks { recording.addMark(mark) }
            } catch {
                // Incomplete: this save's own new file goes.
                recording.discard()
                throw error
            }
            do throws(BroadcastError) {
                try recording.finish()
            } catch {
                // Every packet is in: what finishing left (fragmented when the finalize failed) plays and stays.
                var info = stat()
                guard lstat(path, &info) == 0, info.st_size > 0 else { throw error }
                throw BroadcastError(
                    .outputFailed, "\(error.message) (the save is kept as it is, fragmented: \(path))")
            }
        } catch {
            replay.savesFailed.wrappingIncrement(ordering: .relaxed)
            output.status.setError(error.message)
            logger.error("replay \(output.name): save failed: \(error.message)")
            job.save.complete(.init(path: nil, seconds: 0, isShorter: false, error: error.message))
            return
        }
        // This save worked: an earlier failure is no longer the output's state.
        output.status.clearError()
        let seconds = Double(selection.durationNanoseconds) / 1e9
        let asked = job.save.seconds ?? settings.seconds
        var message = "replay \(output.name): saved \(path): \(String(format1: seconds)) s"
        if selection.isShorter { message += " (less than the \(String(format1: asked)) s asked for was buffered)" }
        if let note = job.note { message += "; \(note)" }
        if let cut = job.save.cut { message += "; asked at \(String(format1: Double(cut) / 1e9)) s of media" }
        message += ", written in \(Double((MonotonicClock().now() - started) / 1_000_000) / 1000) s"
        logger.notice("\(message)")
        replay.lastPath.store(OutputStatus.Text(path), ordering: .releasing)
        // The output's bytes are what its saves wrote (the buffer is in the status of its own).
        var info = stat()
        if stat(path, &info) == 0 { output.status.bytes.wrappingIncrement(by: Int64(info.st_size), ordering: .relaxed) }
        replay.savesDone.wrappingIncrement(ordering: .relaxed)
        job.save.complete(.init(path: path, seconds: seconds, isShorter: selection.isShorter, error: nil))
        output.fileFinished(path)
    }
}

extension EncodedPacket {
    /// Presentation time in nanoseconds.
    var ptsNanoseconds: Int64 { Int64((presentationSeconds * 1e9).rounded()) }
}

extension String {
    /// One decimal: 30.0, 4.5.
    init(format1 value: Double) {
        let tenths = Int((value * 10).rounded())
        self = "\(tenths / 10).\(abs(tenths % 10))"
    }
}
