import Atomics
public import BroadcastKit
import BroadcastMedia
import Logging

/// What an output is doing.
public enum OutputState: Int, Sendable, Hashable, CustomStringConvertible {
    /// Not started yet.
    case idle
    /// A live output opening its first connection.
    case connecting
    /// A live output sending.
    case live
    /// A live output whose server takes no data: a write has blocked for a second or more (the
    /// backlog grows and drops engage; after the timeout the connection counts as dead).
    case stalled
    /// A live output that lost its connection (or never got one) and is trying again.
    case reconnecting
    /// A file output writing.
    case recording
    /// Paused: packets are discarded until resume, which restarts on a keyframe.
    case paused
    /// Gave up (a failed write to a file, a stream the server refuses): the other outputs go on.
    case failed
    /// Finished cleanly.
    case finished

    public var description: String {
        switch self {
        case .idle: "idle"
        case .connecting: "connecting"
        case .live: "live"
        case .stalled: "stalled"
        case .reconnecting: "reconnecting"
        case .recording: "recording"
        case .paused: "paused"
        case .failed: "failed"
        case .finished: "finished"
        }
    }
}

/// A snapshot of one output, readable from any thread.
public struct OutputStatistics: Sendable, Hashable {
    public var name: String
    /// The path or redacted URL.
    public var target: String
    public var isLive: Bool
    public var state: OutputState
    /// Failed connection attempts in a row (the n of "reconnecting n").
    public var attempt: Int
    /// Times the output came back after losing its connection.
    public var reconnects: Int
    public var videoPacketsSent: Int
    public var audioPacketsSent: Int
    public var bytesSent: Int64
    /// Bits per second sent over the last second.
    public var bitrate: Int
    /// Media waiting to be sent (ms): the newest packet encoded minus the next to send.
    public var backlogMilliseconds: Int
    public var maxBacklogMilliseconds: Int
    /// Packets not sent, by reason (only reasons that happened).
    public var drops: [DropReason: Int]
    /// The latest error (redacted), if any.
    public var lastError: String?
    /// WebRTC (WHIP) outputs, from the viewer's RTCP receiver reports: round-trip time, packets
    /// lost and the fraction lost in the last report; and its keyframe requests (PLI/FIR). nil for
    /// other outputs and until a report came.
    public var roundTripMilliseconds: Double? = nil
    public var packetsLost: Int? = nil
    public var fractionLost: Double? = nil
    public var keyframeRequests: Int? = nil
    /// An adaptive output: the video bitrate its encode is asked for now, and its maximum. nil otherwise.
    public var targetBitrate: Int? = nil
    public var maximumBitrate: Int? = nil

    public var totalDrops: Int { drops.values.reduce(0, +) }
}

/// An output's counters and state: written by its thread, read by any (atomics only).
final class OutputStatus: Sendable {
    final class Text: AtomicReference, Sendable {
        let value: String
        init(_ value: String) { self.value = value }
    }

    let state = ManagedAtomic<Int>(OutputState.idle.rawValue)
    let attempt = ManagedAtomic<Int>(0)
    let reconnects = ManagedAtomic<Int>(0)
    let videoPackets = ManagedAtomic<Int>(0)
    let audioPackets = ManagedAtomic<Int>(0)
    let bytes = ManagedAtomic<Int64>(0)
    let bitrate = ManagedAtomic<Int>(0)
    let backlog = ManagedAtomic<Int64>(0)
    let maxBacklog = ManagedAtomic<Int64>(0)
    /// The path's backlog beyond the queue, where the transport tells (SRT: its unacknowledged
    /// timespan; RTMP: how long ago the oldest byte its TCP socket holds was written), ns; what
    /// an adaptive output's controller adds to the queue's.
    let transportBacklog = ManagedAtomic<Int64>(0)
    /// What the path took over the last ~0.3 s, bits per second, where the transport tells (RTMP:
    /// bytes handed to the socket less those it still holds, while it held some); -1 unknown.
    let pathBitrate = ManagedAtomic<Int>(-1)
    let drops: [ManagedAtomic<Int>] = DropReason.allCases.map { _ in ManagedAtomic<Int>(0) }
    let lastError = ManagedAtomic<Text?>(nil)
    /// A recording's file being written (a new one after each segment, or after a full disk).
    let file = ManagedAtomic<Text?>(nil)
    /// Whether the output ever delivered anything (a live output that went live at least once).
    let everDelivered = ManagedAtomic<Bool>(false)
    /// WebRTC outputs (RTCP): -1 until known.
    let roundTripMicroseconds = ManagedAtomic<Int>(-1)
    let packetsLost = ManagedAtomic<Int>(-1)
    let fractionLostPPM = ManagedAtomic<Int>(-1)
    let keyframeRequests = ManagedAtomic<Int>(0)
    /// WebRTC outputs: receiver reports seen (counted after `fractionLostPPM` and
    /// `roundTripMicroseconds` took the report's figures).
    let receiverReports = ManagedAtomic<Int>(0)
    /// An adaptive output's video bitrate asked of its encode now, and the most it may be (0: not adaptive).
    let targetBitrate = ManagedAtomic<Int>(0)
    let maximumBitrate = ManagedAtomic<Int>(0)

    var current: OutputState { OutputState(rawValue: state.load(ordering: .acquiring)) ?? .idle }
    func set(_ s: OutputState) { state.store(s.rawValue, ordering: .releasing) }
    func drop(_ reason: DropReason, count: Int = 1) {
        drops[reason.rawValue].wrappingIncrement(by: count, ordering: .relaxed)
    }
    func setError(_ text: String) { lastError.store(Text(text), ordering: .releasing) }
    func clearError() { lastError.store(nil, ordering: .releasing) }
    func setFile(_ path: String) { file.store(Text(path), ordering: .releasing) }
    func setBacklog(_ nanoseconds: Int64) {
        backlog.store(nanoseconds, ordering: .relaxed)
        if nanoseconds > maxBacklog.load(ordering: .relaxed) { maxBacklog.store(nanoseconds, ordering: .relaxed) }
    }
    func sent(_ packet: EncodedPacket) {
        switch packet.mediaType {
        case .video: videoPackets.wrappingIncrement(ordering: .relaxed)
        case .audio: audioPackets.wrappingIncrement(ordering: .relaxed)
        }
    }
}

/// The hand-off from the session's thread (the producer) to an output's thread (the consumer):
/// a bounded lock-free ring and two wake-ups, one per direction.
final class PacketFeed: Sendable {
    let ring: SPSCRing<EncodedPacket>
    /// The output's thread sleeps here when the ring is empty.
    let dataWakeup: Wakeup
    /// A lossless producer sleeps here when the ring is full.
    let spaceWakeup: Wakeup
    /// No more packets will come.
    let ended = ManagedAtomic<Bool>(false)
    /// The consumer stopped taking packets (it failed or finished): the producer stops pushing.
    let closed = ManagedAtomic<Bool>(false)
    /// A lossy producer could not push: the consumer must restart on a keyframe.
    let overflowed = ManagedAtomic<Bool>(false)
    /// dts (ns) of the newest packet pushed: what the backlog is measured against.
    let newestDTS = ManagedAtomic<Int64>(0)

    /// Throws `outOfResources` when the process has no descriptors left for the two pipes.
    init(capacity: Int) throws(BroadcastError) {
        ring = SPSCRing(capacity: capacity)
        dataWakeup = try Wakeup()
        spaceWakeup = try Wakeup()
    }

    /// Consumer: waits until a packet is there, the feed ended, or `timeout` passed (nil: no limit).
    func waitForPackets(timeout: Duration?) {
        dataWakeup.prepareToSleep()
        if !ring.isEmpty || ended.load(ordering: .acquiring) {
            dataWakeup.cancelSleep()
            return
        }
        dataWakeup.sleep(timeout: timeout)
    }

    /// Consumer: the next packet, telling a lossless producer there is room.
    func pop() -> EncodedPacket? {
        guard let p = ring.pop() else { return nil }
        spaceWakeup.wake()
        return p
    }

    func close() {
        closed.store(true, ordering: .releasing)
        spaceWakeup.wake()
        while ring.pop() != nil {}
    }
}

/// One output of the encode on a thread of its own behind a bounded queue, so a slow disk or a
/// dead network never stalls capture or the other outputs.
///
/// The daemon's handle: `statistics()`, `pause()` and `resume()` may be called from any thread.
/// Start, `offer` and finish are the encoding handler's, on the session's thread.
public final class Output: @unchecked Sendable {
    public let name: String
    /// Distinct for every output the process makes: one removed and added again under its name
    /// is another (its counters start from zero again).
    public let serial = Output.made.wrappingIncrementThenLoad(ordering: .relaxed)
    private static let made = ManagedAtomic<UInt64>(0)
    public let destination: OutputDestination
    public let configuration: OutputConfiguration
    let status = OutputStatus()
    let feed: PacketFeed
    /// Set by an output that needs a keyframe (after a reconnect, a resume); the encoding handler
    /// checks it on the session's thread before every video frame.
    let keyframeRequest: ManagedAtomic<Bool>
    let paused = ManagedAtomic<Bool>(false)
    /// When a finishing live output must stop sending; nil until it is finishing.
    let finishBy = FinishDeadline()
    private let failedOutputs: ManagedAtomic<Int>
    let logger: Logger
    /// Replay outputs: their figures and save requests, and where media time stands for a save.
    let replayStatus = ReplayStatus()
    let mediaClock: MediaClock
    /// The command run for every file this output finishes, if configured.
    let fileFinishedHook: FileFinishedHook?
    /// Files this output finished (segments, recordings, replay saves) and the last one's path,
    /// for the control plane's events: two atomic stores per file, nothing the output waits on.
    private let filesFinished = ManagedAtomic<Int>(0)
    private let lastFinishedFile = ManagedAtomic<OutputStatus.Text?>(nil)
    /// The packet stream indices this output carries, as bits (set by the encoding handler
    /// before the output starts; an FLV output carries one audio track of several). Session thread only.
    var carriedStreams: UInt64 = .max
    /// Session thread only.
    private var thread: OSThread?
    private var worker: (any OutputWorker)?
    /// Set by the output's thread as it ends: `join()` no longer waits.
    private let exited = ManagedAtomic<Bool>(false)
    private var lossless: Bool { !destination.isLive }
    /// A WHIP output: WebRTC, with Opus audio (read per audio packet by the session's thread).
    public let isWebRTC: Bool

    init(
        configuration: OutputConfiguration,
        keyframeRequest: ManagedAtomic<Bool>,
        failedOutputs: ManagedAtomic<Int>,
        logger: Logger,
        mediaClock: MediaClock = MediaClock()
    ) throws(BroadcastError) {
        self.mediaClock = mediaClock
        self.fileFinishedHook = configuration.onFileFinished.flatMap {
            $0.isEmpty
                ? nil
                : FileFinishedHook(
                    arguments: $0, outputName: configuration.name, timeout: configuration.hookTimeout,
                    manifest: configuration.manifest ?? Self.replayManifest(configuration.destination),
                    logger: logger)
        }
        self.configuration = configuration
        self.name = configuration.name
        self.destination = configuration.destination
        if case .live(let url) = configuration.destination { isWebRTC = url.scheme.isWHIP } else { isWebRTC = false }
        self.keyframeRequest = keyframeRequest
        self.failedOutputs = failedOutputs
        self.logger = logger
        switch configuration.destination {
        case .file: feed = try PacketFeed(capacity: configuration.fileQueueCapacity)
        case .live: feed = try PacketFeed(capacity: configuration.live.queueCapacity)
        }
    }

    /// The path or redacted URL: for a recording, the file it writes now (a segment's, the one it
    /// went on in after a full disk).
    public var target: String {
        if case .file = destination, let file = status.file.load(ordering: .acquiring) { return file.value }
        return destination.description
    }
    public var state: OutputState { status.current }

    public func statistics() -> OutputStatistics {
        var drops: [DropReason: Int] = [:]
        for reason in DropReason.allCases {
            let n = status.drops[reason.rawValue].load(ordering: .relaxed)
            if n > 0 { drops[reason] = n }
        }
        return OutputStatistics(
            name: name,
            target: target,
            isLive: destination.isLive,
            state: status.current,
            attempt: status.attempt.load(ordering: .relaxed),
            reconnects: status.reconnects.load(ordering: .relaxed),
            videoPacketsSent: status.videoPackets.load(ordering: .relaxed),
            audioPacketsSent: status.audioPackets.load(ordering: .relaxed),
            bytesSent: status.bytes.load(ordering: .relaxed),
            bitrate: status.bitrate.load(ordering: .relaxed),
            backlogMilliseconds: Int(status.backlog.load(ordering: .relaxed) / 1_000_000),
            maxBacklogMilliseconds: Int(status.maxBacklog.load(ordering: .relaxed) / 1_000_000),
            drops: drops,
            lastError: status.lastError.load(ordering: .acquiring)?.value,
            roundTripMilliseconds: Self.known(status.roundTripMicroseconds).map { Double($0) / 1000 },
            packetsLost: Self.known(status.packetsLost),
            fractionLost: Self.known(status.fractionLostPPM).map { Double($0) / 1e6 },
            keyframeRequests: isWebRTC ? status.keyframeRequests.load(ordering: .relaxed) : nil,
            targetBitrate: Self.known(status.targetBitrate, unset: 0),
            maximumBitrate: Self.known(status.maximumBitrate, unset: 0)
        )
    }

    private static func known(_ figure: ManagedAtomic<Int>, unset: Int = -1) -> Int? {
        let value = figure.load(ordering: .relaxed)
        return value <= unset ? nil : value
    }

    /// An adaptive output's encode moved its bitrate to `target` of `maximum` (session thread).
    func adapted(to target: Int, of maximum: Int) {
        status.maximumBitrate.store(maximum, ordering: .relaxed)
        status.targetBitrate.store(target, ordering: .relaxed)
    }

    /// What an adaptive output's controller reads at each frame (session thread; atomics only):
    /// the backlog (ns: the queue's and, where the transport tells, the path's), the bits per
    /// second the socket took over the last second, and what the path itself took lately (nil
    /// where the transport does not say).
    var congestion: (backlog: Int64, sentBitsPerSecond: Int, pathBitsPerSecond: Int?) {
        let path = status.pathBitrate.load(ordering: .relaxed)
        return (
            status.backlog.load(ordering: .relaxed) + status.transportBacklog.load(ordering: .relaxed), status.bitrate.load(ordering: .relaxed),
            path >= 0 ? path : nil
        )
    }

    /// A WebRTC output's receiver reports (session thread; atomics only): how many came, and the
    /// newest's fraction lost and round-trip time (ns; nil unknown). 0 reports for other outputs.
    var receiverReport: (count: Int, fractionLost: Double, roundTrip: Int64?) {
        let count = status.receiverReports.load(ordering: .acquiring)
        let fraction = Double(max(0, status.fractionLostPPM.load(ordering: .relaxed))) / 1e6
        let rtt = status.roundTripMicroseconds.load(ordering: .relaxed)
        return (count, fraction, rtt > 0 ? Int64(rtt) * 1000 : nil)
    }


    /// Discards packets until `resume()`.
    public func pause() {
        paused.store(true, ordering: .releasing)
        feed.dataWakeup.wake()
    }

    /// Takes packets again from the next keyframe (asked of the encoder at once).
    public func resume() {
        paused.store(false, ordering: .releasing)
        keyframeRequest.store(true, ordering: .releasing)
        feed.dataWakeup.wake()
    }

    public var isPaused: Bool { paused.load(ordering: .acquiring) }

    // MARK: Markers

    /// A marker asked for: the session's media time (ns) it was taken at, and its title.
    struct PendingMark: Sendable {
        let media: Int64
        let title: String
    }

    final class PendingMarks: AtomicReference, Sendable {
        let marks: [PendingMark]
        init(_ marks: [PendingMark]) { self.marks = marks }
    }

    final class MarkList: AtomicReference, Sendable {
        let marks: [RecordingMark]
        init(_ marks: [RecordingMark]) { self.marks = marks }
    }

    /// Markers asked from any thread, not yet taken by the output's thread (nil: none; what the
    /// worker checks per packet is this one load).
    let pendingMarks = ManagedAtomic<PendingMarks?>(nil)
    /// The markers of the file being written, as its thread placed them (any thread reads).
    let placedMarks = ManagedAtomic<MarkList?>(nil)

    /// Whether this output takes markers: a recording, or a replay buffer (for its saves).
    public var takesMarks: Bool {
        if case .file = destination { return true }
        return false
    }

    /// Asks for a marker at the session's media time `media` (ns) titled `title`: the output's
    /// thread places it in the file being written at that time (any thread; a few allocations,
    /// never on the data path).
    public func mark(atMedia media: Int64, title: String) {
        var old = pendingMarks.load(ordering: .acquiring)
        while true {
            let new = PendingMarks((old?.marks ?? []) + [PendingMark(media: media, title: title)])
            let (done, original) = pendingMarks.compareExchange(expected: old, desired: new, ordering: .acquiringAndReleasing)
            if done { break }
            old = original
        }
    }

    /// The markers of the file this recording writes now (the current segment's), in its own time.
    public var marks: [RecordingMark] { placedMarks.load(ordering: .acquiring)?.marks ?? [] }

    /// Where a replay output's saves are noted for its command (a recording's manifest is in its
    /// configuration).
    private static func replayManifest(_ destination: OutputDestination) -> RecordingManifest? {
        if case .file(let template) = destination { return RecordingManifest(template: template) }
        return nil
    }

    /// A file this output wrote is complete: counted for the control plane, then the user's command.
    func fileFinished(_ path: String) {
        lastFinishedFile.store(OutputStatus.Text(path), ordering: .releasing)
        filesFinished.wrappingIncrement(ordering: .releasing)
        fileFinishedHook?.fileFinished(path)
    }

    /// How many files this output has finished, and the last one's path. (Read between two files
    /// finishing within one look, only the later path is seen; the count says one was missed.)
    public var finishedFiles: (count: Int, last: String?) {
        let count = filesFinished.load(ordering: .acquiring)
        return (count, lastFinishedFile.load(ordering: .acquiring)?.value)
    }

    /// How the output thread's waits for packets ended: woken by the encoder's hand-off, or by a timeout.
    public var wakeupStatistics: WakeupStatistics { feed.dataWakeup.statistics }

    // MARK: Session thread

    /// Starts the output's thread with `worker`.
    func start(_ worker: any OutputWorker) {
        self.worker = worker
        // "bc-out-live", or the file's name for a recording named by its path.
        let name = configuration.name.split(separator: "/").last.map(String.init) ?? configuration.name
        let exited = self.exited
        thread = OSThread(name: "bc-out-\(name)") {
            worker.run()
            exited.store(true, ordering: .releasing)
        }
    }

    /// The output's thread has ended (it finished or failed): `join()` returns at once.
    var hasExited: Bool { exited.load(ordering: .acquiring) }

    /// Whether packets of `streamIndex` go to this output. Session thread only.
    func carries(_ streamIndex: Int) -> Bool { streamIndex >= 64 || carriedStreams & (1 << UInt64(streamIndex)) != 0 }

    /// Hands a packet to the output's thread. A live output never waits: when its queue is full the
    /// packet is dropped (and the output restarts on a keyframe). A file output never drops: it
    /// waits for room, unless it has failed.
    func offer(_ packet: EncodedPacket) {
        if feed.closed.load(ordering: .relaxed) { return }
        if feed.ring.push(packet) {
            feed.newestDTS.store(packet.dtsNanoseconds, ordering: .relaxed)
            feed.dataWakeup.wake()
            return
        }
        if !lossless {
            status.drop(.queueFull)
            feed.overflowed.store(true, ordering: .releasing)
            return
        }
        while !feed.closed.load(ordering: .acquiring) {
            feed.spaceWakeup.prepareToSleep()
            if feed.ring.push(packet) {
                feed.spaceWakeup.cancelSleep()
                feed.newestDTS.store(packet.dtsNanoseconds, ordering: .relaxed)
                feed.dataWakeup.wake()
                return
            }
            feed.spaceWakeup.sleep(timeout: .milliseconds(100))
        }
    }

    /// No more packets: the output sends what it has (a live one for at most its finish timeout)
    /// and closes. Returns at once; `join()` waits.
    func end() {
        if case .live = destination {
            finishBy.set(.now() + .nanoseconds(Int64(configuration.live.finishTimeout * 1e9)))
        }
        feed.ended.store(true, ordering: .releasing)
        feed.dataWakeup.wake()
    }

    /// Waits for the output's thread to finish.
    func join() {
        thread?.join()
        thread = nil
        worker = nil
    }

    // MARK: Output thread

    func failed(_ message: String) {
        status.setError(message)
        status.set(.failed)
        failedOutputs.wrappingIncrement(ordering: .relaxed)
        feed.close()
        logger.error("\(message)")
    }

    /// The error to report after the broadcast, if this output did not do its job.
    var failure: BroadcastError? {
        let s = statistics()
        switch s.state {
        case .failed:
            return BroadcastError(.outputFailed, s.lastError ?? "\(target) failed")
        default:
            if destination.isLive, !status.everDelivered.load(ordering: .acquiring) {
                return BroadcastError(
                    .outputFailed, "stream \(target) never went live\(s.lastError.map { ": \($0)" } ?? "")")
            }
            return nil
        }
    }
}

/// What runs on an output's thread.
protocol OutputWorker: AnyObject, Sendable {
    func run()
}
