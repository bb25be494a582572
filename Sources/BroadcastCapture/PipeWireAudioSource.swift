import Atomics
public import BroadcastKit
internal import CPipeWire
internal import CPipeWireShim
public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Audio through PipeWire: the desktop's sound (the default sink's monitor), the default
/// microphone, any audio node (`pipewire:NODE`), or the playback streams of one application
/// (`app:NAME`). One `pw_stream` per source, on a loop the source's own thread runs (no
/// pw_thread_loop, no lock); buffers reach the session through its ring like ALSA's.
///
/// Linking: the stream does not autoconnect; the source links the captured node's output ports to
/// its own input ports itself, from the registry and the "default" metadata it watches. So the
/// default sink or source is followed when it changes (the old links go, new ones come), a node
/// that goes away leaves the stream unlinked (silence is sent, `health` says `deviceLost`) and is
/// linked again when a node of that name comes back, and an application's streams are all linked
/// to the same ports, where PipeWire sums them: one `.audioApp` track, mixed sample-aligned by the
/// graph. *Why not WirePlumber's autoconnect with `target.object`*: a target that vanishes makes
/// WirePlumber move the stream to the default device (other audio than asked for) or, with
/// `node.dont-reconnect`, destroy it; and per-application capture needs links by hand anyway.
///
/// Timestamps: every graph cycle PipeWire reports its time (`pw_stream_get_time_n`: CLOCK_MONOTONIC
/// `now` of the cycle and the delay from the device); the buffer's first sample is stamped
/// `now − delay`, through the same `AudioTimeline` as ALSA (stamps count samples, at the rate
/// measured against the monotonic clock; `driftPPM`), so the encoder's resampler fits the samples to
/// the stamps the same way.
public final class PipeWireAudioSource: CaptureSource, @unchecked Sendable {
    public let target: PipeWireAudioTarget
    public let isRealtime = true
    public var name: String { target.description }
    /// What the stream asks PipeWire for (its converter gives it whatever the node has): float, 48 kHz, stereo.
    public let format = AudioFormat(sampleFormat: .f32, sampleRate: 48_000, channels: 2)
    /// The quantum asked for (node.latency); PipeWire may run the graph at another one.
    public let periodFrames: Int

    private let logger: Logger
    private var thread: OSThread?
    private let running = ManagedAtomic<Bool>(false)
    let periodsCaptured = ManagedAtomic<Int>(0)
    let droppedPeriods = ManagedAtomic<Int>(0)
    let silentPeriods = ManagedAtomic<Int>(0)
    let deviceLosses = ManagedAtomic<Int>(0)
    let linkChanges = ManagedAtomic<Int>(0)
    let linkedNodes = ManagedAtomic<Int>(0)
    private let lost = ManagedAtomic<Bool>(false)
    let driftMicroPPM = ManagedAtomic<Int>(Int.min)
    /// Capture delay PipeWire reported last (device → stream), in microseconds.
    let delayMicroseconds = ManagedAtomic<Int>(0)

    public struct Statistics: Sendable, Hashable {
        public var periodsCaptured: Int
        /// Buffers dropped because the session still held every pooled buffer.
        public var droppedPeriods: Int
        /// Silent periods sent while nothing was linked or nothing played.
        public var silentPeriods: Int
        public var deviceLosses: Int
        /// Times the set of linked nodes changed (default switched, a stream came or went).
        public var linkChanges: Int
        /// Nodes linked now (an application's streams; 1 for a device).
        public var linkedNodes: Int
        /// The graph's clock against CLOCK_MONOTONIC (positive: fast); nil until measured.
        public var driftPPM: Double?
        /// PipeWire's reported delay from the device to the stream, in seconds.
        public var delaySeconds: Double
    }

    public var statistics: Statistics {
        let drift = driftMicroPPM.load(ordering: .relaxed)
        return Statistics(
            periodsCaptured: periodsCaptured.load(ordering: .relaxed), droppedPeriods: droppedPeriods.load(ordering: .relaxed),
            silentPeriods: silentPeriods.load(ordering: .relaxed), deviceLosses: deviceLosses.load(ordering: .relaxed),
            linkChanges: linkChanges.load(ordering: .relaxed), linkedNodes: linkedNodes.load(ordering: .relaxed),
            driftPPM: drift == Int.min ? nil : Double(drift) / 1e6,
            delaySeconds: Double(delayMicroseconds.load(ordering: .relaxed)) / 1e6
        )
    }

    public var droppedCount: Int { droppedPeriods.load(ordering: .relaxed) }

    public var health: CaptureHealth {
        CaptureHealth(state: lost.load(ordering: .relaxed) ? .deviceLost : .capturing, deviceLosses: deviceLosses.load(ordering: .relaxed))
    }

    /// Checks at once that a PipeWire server answers and that `target` is there (an application
    /// need not be playing yet), so a bad name is an error before anything starts.
    public init(target: PipeWireAudioTarget, periodFrames: Int = 1024, logger: Logger) throws(BroadcastError) {
        self.target = target
        self.periodFrames = max(32, min(periodFrames, 8192))
        self.logger = logger
        let graph: PipeWireAudioGraph
        do {
            graph = try PipeWireAudioGraph.snapshot()
        } catch {
            throw BroadcastError(.invalidArgument, "cannot capture \(target) through PipeWire: \(error.text)")
        }
        if case .application = target { return }
        guard graph.resolve(target).isEmpty else { return }
        let nodes = graph.audioNodes.filter { !$0.isPlaybackStream }.map { "\($0.name) (serial \($0.serial), \($0.mediaClass))" }
        let list = nodes.isEmpty ? "no PipeWire audio devices" : "PipeWire audio nodes: " + nodes.joined(separator: ", ")
        switch target {
        case .defaultSink: throw BroadcastError(.invalidArgument, "cannot capture \(target): PipeWire has no default sink (\(list))")
        case .defaultSource: throw BroadcastError(.invalidArgument, "cannot capture the \(target): PipeWire has no default source (\(list))")
        default: throw BroadcastError(.invalidArgument, "cannot capture \(target): no PipeWire audio node of that name or serial (\(list))")
        }
    }

    public func start(into sink: SourceSink) throws {
        guard thread == nil else { throw BroadcastError(.sourceFailed, "\(name): the source was already started") }
        // The connection is made on the source's own thread, which owns it for its whole life (see
        // `PipeWireConnection`); a server that vanished since init is an error here, as before.
        let opened = StartResult()
        running.store(true, ordering: .releasing)
        let started = OSThread(name: "bc-pw-audio") { [self] in
            let delivery = Delivery(source: self, sink: sink)
            let stream: PipeWireAudioStream
            do {
                stream = try PipeWireAudioStream(target: target, format: format, periodFrames: periodFrames, delivery: delivery)
            } catch {
                opened.finish("cannot capture \(target) through PipeWire: \(error)")
                return
            }
            opened.finish(nil)
            run(stream, delivery)
        }
        if let failure = opened.wait() {
            running.store(false, ordering: .releasing)
            started.join()
            throw BroadcastError(.sourceFailed, failure)
        }
        logger.info("\(name): capturing through PipeWire as \(format), quantum \(periodFrames) frames asked")
        thread = started
    }

    public func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        thread = nil
    }

    /// The first connection's outcome, from the source's thread to `start`.
    private final class StartResult: @unchecked Sendable {
        private let done = ManagedAtomic<Bool>(false)
        private var failure: String?

        func finish(_ failure: String?) {
            self.failure = failure
            done.store(true, ordering: .releasing)
        }

        /// Waits (a connection takes milliseconds) and returns the failure, nil when connected.
        func wait() -> String? {
            while !done.load(ordering: .acquiring) { usleep(1_000) }
            return failure
        }
    }

    private func run(_ first: PipeWireAudioStream, _ delivery: Delivery) {
        var stream: PipeWireAudioStream? = first
        var nextReconnect: Int64 = 0
        while running.load(ordering: .acquiring) && !delivery.sink.isStopping {
            if let live = stream {
                live.iterate(timeoutMilliseconds: 10)
                if let failure = live.failure {
                    logger.warning("\(name): PipeWire connection lost (\(failure)); sending silence and reconnecting")
                    stream = nil
                    setLost(true)
                    nextReconnect = MonotonicClockReading.now() + 1_000_000_000
                } else {
                    setLost(live.targetMissing)
                    linkedNodes.store(live.linkedNodeCount, ordering: .relaxed)
                }
            } else {
                usleep(10_000)
                if MonotonicClockReading.now() >= nextReconnect {
                    nextReconnect = MonotonicClockReading.now() + 1_000_000_000
                    if let again = try? PipeWireAudioStream(target: target, format: format, periodFrames: periodFrames, delivery: delivery) {
                        logger.notice("\(name): PipeWire connection back")
                        stream = again
                    }
                }
            }
            delivery.fillSilence()
        }
        stream = nil
        let stats = statistics
        logger.info("\(name): \(stats.periodsCaptured) buffers, \(stats.silentPeriods) silent periods, \(stats.droppedPeriods) dropped (session behind), \(stats.linkChanges) link changes, delay \(Int(stats.delaySeconds * 1000)) ms, drift \(stats.driftPPM.map { "\(($0 * 10).rounded() / 10) ppm" } ?? "not measured")")
    }

    private func setLost(_ missing: Bool) {
        let was = lost.exchange(missing, ordering: .relaxed)
        if missing && !was {
            deviceLosses.wrappingIncrement(ordering: .relaxed)
            logger.warning("\(name): the node is gone; sending silence until it is back")
        } else if !missing && was {
            logger.notice("\(name): back")
        }
    }

    func logLinks(_ nodes: [PipeWireAudioGraph.Node]) {
        linkChanges.wrappingIncrement(ordering: .relaxed)
        logger.info("\(name): linked to \(nodes.isEmpty ? "nothing" : nodes.map { "\($0.name) (serial \($0.serial))" }.joined(separator: ", "))")
    }

    /// Turns what the stream receives into session buffers: pooled copies, stamped on the timeline;
    /// silence while nothing arrives. Used on the source's thread only.
    final class Delivery {
        unowned let source: PipeWireAudioSource
        let sink: SourceSink
        let pool: BufferPool
        let maxFrames = 8192
        var timeline: AudioTimeline
        let mediaFormat: MediaFormat
        /// Session-clock time where the last delivered buffer ended.
        var lastEnd: Int64
        /// Monotonic time real audio last arrived.
        var lastArrival: Int64
        let isMonotonic: Bool

        init(source: PipeWireAudioSource, sink: SourceSink) {
            self.source = source
            self.sink = sink
            let bytes = maxFrames * source.format.bytesPerFrame
            pool = BufferPool(count: 64, byteCount: bytes, planeLayout: [(0, bytes, bytes)])
            // PipeWire's cycle times are exact (the graph's own clock, on CLOCK_MONOTONIC: stamps on the
            // fitted line are within a microsecond of them), so anything a few ms off is a cycle the
            // graph lost under load, not drift: re-anchor at 4 ms (ALSA's htstamps need 30 ms).
            timeline = AudioTimeline(sampleRate: source.format.sampleRate, toleranceNanoseconds: 4_000_000)
            mediaFormat = .audio(source.format)
            lastEnd = sink.clock.now()
            lastArrival = MonotonicClockReading.now()
            isMonotonic = sink.clock is MonotonicClock
        }

        /// One buffer of `frames` interleaved frames at `data`, whose first sample the graph
        /// places at `observed` on the monotonic clock (nil: not known, use arrival).
        func deliver(_ data: UnsafeRawPointer, frames: Int, observed: Int64?) {
            let frames = min(frames, maxFrames)
            guard frames > 0 else { return }
            let rate = source.format.sampleRate
            let duration = Int64(frames) * 1_000_000_000 / Int64(rate)
            let now = sink.clock.now()
            var time = now - duration
            if isMonotonic, let observed, abs(observed - now) < 1_000_000_000 { time = observed }
            let captureTime = timeline.place(frames: frames, observedTime: time)
            if let drift = timeline.driftPPM { source.driftMicroPPM.store(Int(drift * 1e6), ordering: .relaxed) }
            lastEnd = captureTime + duration
            lastArrival = MonotonicClockReading.now()
            guard let buffer = pool.acquire(wait: false, shouldStop: { false }) else {
                source.droppedPeriods.wrappingIncrement(ordering: .relaxed)
                sink.noteLoss()
                return
            }
            let bytes = frames * source.format.bytesPerFrame
            buffer.memory.copyMemory(from: data, byteCount: bytes)
            source.periodsCaptured.wrappingIncrement(ordering: .relaxed)
            sink.offer(
                CapturedBuffer(
                    format: mediaFormat, captureTime: captureTime, duration: MediaTime(value: Int64(frames), timescale: Int32(rate)),
                    planes: [Plane(base: UnsafeRawPointer(buffer.memory), count: bytes, bytesPerRow: bytes)], frameCount: frames, backing: buffer
                )
            )
        }

        /// While nothing arrives (nothing linked, the node gone, an application not playing):
        /// silence at the nominal rate, up to a little before now, so the track stays continuous
        /// and a video frame never waits for audio that is not coming.
        func fillSilence() {
            let gap: Int64 = 200_000_000
            guard MonotonicClockReading.now() - lastArrival > gap else { return }
            let now = sink.clock.now()
            let rate = source.format.sampleRate
            let frames = source.periodFrames
            let period = Int64(frames) * 1_000_000_000 / Int64(rate)
            if now - lastEnd > 2_000_000_000 { lastEnd = now - period }  // asleep for long: do not send seconds at once
            timeline.restart()
            while lastEnd + period <= now - 40_000_000, let buffer = pool.acquire(wait: false, shouldStop: { false }) {
                let bytes = frames * source.format.bytesPerFrame
                buffer.memory.initializeMemory(as: UInt8.self, repeating: 0, count: bytes)
                sink.offer(
                    CapturedBuffer(
                        format: mediaFormat, captureTime: lastEnd, duration: MediaTime(value: Int64(frames), timescale: Int32(rate)),
                        planes: [Plane(base: UnsafeRawPointer(buffer.memory), count: bytes, bytesPerRow: bytes)], frameCount: frames, backing: buffer
                    )
                )
                source.silentPeriods.wrappingIncrement(ordering: .relaxed)
                lastEnd += period
            }
        }
    }
}

/// One connection and its capture stream, linked by hand to what the target names now.
final class PipeWireAudioStream {
    let connection: PipeWireConnection
    let target: PipeWireAudioTarget
    private var stream: OpaquePointer?
    private let delivery: PipeWireAudioSource.Delivery
    private let hook = UnsafeMutablePointer<spa_hook>.allocate(capacity: 1)
    private let events = UnsafeMutablePointer<pw_stream_events>.allocate(capacity: 1)
    private var nodeID: UInt32?
    private var plannedGeneration = -1
    /// The links asked for: their proxies, and when they were asked for (one the graph still lacks
    /// after `linkPatience` failed, a port just made not yet ready, and is asked for again).
    private var links: [PipeWireAudioGraph.Link: (proxy: OpaquePointer, askedAt: Int64)] = [:]
    private static let linkPatience: Int64 = 3_000_000_000
    private var nextLinkCheck: Int64 = 0
    private var linkedNodeIDs: [UInt32] = []
    private var streamError: String?
    private let bytesPerFrame: Int
    /// Buffers dequeued in one process call (kept, so a cycle allocates nothing).
    private var queued: [(UnsafeMutablePointer<pw_buffer>, Int)] = []

    var failure: String? { connection.failure ?? streamError }
    /// The target (a device, the default) resolves to no node now.
    private(set) var targetMissing = false
    var linkedNodeCount: Int { linkedNodeIDs.count }

    init(target: PipeWireAudioTarget, format: AudioFormat, periodFrames: Int, delivery: PipeWireAudioSource.Delivery) throws(PipeWireError) {
        self.target = target
        self.delivery = delivery
        bytesPerFrame = format.bytesPerFrame
        queued.reserveCapacity(16)
        connection = try PipeWireConnection()
        hook.initialize(to: spa_hook())
        events.initialize(to: pw_stream_events())

        guard let props = CBroadcastPW_properties(nil, nil, 0) else { throw PipeWireError("cannot allocate stream properties") }
        let role: String
        switch target {
        case .defaultSource: role = "mic"
        case .node: role = "node"
        default: role = "app"
        }
        for (key, value) in [
            ("media.type", "Audio"), ("media.category", "Capture"), ("media.role", "Production"),
            ("node.name", "broadcast-audio-\(role)"), ("node.description", "broadcast: \(target)"),
            ("node.autoconnect", "false"), ("node.latency", "\(periodFrames)/\(format.sampleRate)"),
            ("application.name", "broadcast"),
        ] {
            pw_properties_set(props, key, value)
        }
        guard let stream = pw_stream_new(connection.core, "broadcast \(target)", props) else {
            throw PipeWireError("cannot create a PipeWire stream: \(String(cString: strerror(errno)))")
        }
        self.stream = stream

        events.pointee.version = UInt32(PW_VERSION_STREAM_EVENTS)
        events.pointee.state_changed = { data, _, state, error in
            guard let data else { return }
            let me = Unmanaged<PipeWireAudioStream>.fromOpaque(data).takeUnretainedValue()
            me.stateChanged(state, error: error.map { String(cString: $0) })
        }
        events.pointee.param_changed = { data, id, param in
            guard let data, id == SPA_PARAM_Format.rawValue, param != nil else { return }
            Unmanaged<PipeWireAudioStream>.fromOpaque(data).takeUnretainedValue().formatChanged()
        }
        events.pointee.process = { data in
            guard let data else { return }
            Unmanaged<PipeWireAudioStream>.fromOpaque(data).takeUnretainedValue().process()
        }
        pw_stream_add_listener(stream, hook, events, Unmanaged.passUnretained(self).toOpaque())

        let podBuffer = UnsafeMutablePointer<UInt8>.allocate(capacity: 1024)
        defer { podBuffer.deallocate() }
        guard let pod = CBroadcastPWAudio_format(podBuffer, 1024, UInt32(format.sampleRate), UInt32(format.channels)) else {
            throw PipeWireError("cannot build the audio format")
        }
        var params: [UnsafePointer<spa_pod>?] = [pod]
        let flags = pw_stream_flags(rawValue: PW_STREAM_FLAG_MAP_BUFFERS.rawValue)
        let rc = params.withUnsafeMutableBufferPointer {
            pw_stream_connect(stream, SPA_DIRECTION_INPUT, UInt32.max, flags, $0.baseAddress, 1)
        }
        if rc < 0 { throw PipeWireError("cannot connect the capture stream: \(PipeWire.describe(rc))") }
    }

    deinit {
        for made in links.values { pw_proxy_destroy(made.proxy) }
        if let stream { pw_stream_destroy(stream) }
        hook.deallocate()
        events.deallocate()
    }

    func iterate(timeoutMilliseconds: Int32) {
        connection.iterate(timeoutMilliseconds: timeoutMilliseconds)
        relink()
    }

    private func stateChanged(_ state: pw_stream_state, error: String?) {
        if state == PW_STREAM_STATE_ERROR { streamError = error ?? "stream error" }
        if let stream, state == PW_STREAM_STATE_PAUSED || state == PW_STREAM_STATE_STREAMING {
            let id = pw_stream_get_node_id(stream)
            if id != UInt32.max, id != nodeID {
                nodeID = id
                plannedGeneration = -1
            }
        }
    }

    /// Once the format is fixed: ask for many buffers (64 cycles, 0.7 s at a 512-frame quantum),
    /// so the thread may run late under load without PipeWire dropping cycles it had no buffer for.
    private func formatChanged() {
        guard let stream else { return }
        let podBuffer = UnsafeMutablePointer<UInt8>.allocate(capacity: 1024)
        defer { podBuffer.deallocate() }
        guard let pod = CBroadcastPWAudio_buffers(podBuffer, 1024, 64, Int32(8192 * bytesPerFrame), Int32(bytesPerFrame)) else { return }
        var params: [UnsafePointer<spa_pod>?] = [pod]
        _ = params.withUnsafeMutableBufferPointer { pw_stream_update_params(stream, $0.baseAddress, 1) }
    }

    /// Makes the links match what the target names now (called after every loop iteration; does
    /// nothing unless the graph changed).
    private func relink() {
        retryMissingLinks()
        guard let own = nodeID, connection.generation != plannedGeneration else { return }
        plannedGeneration = connection.generation
        let graph = connection.graph
        let nodes = graph.resolve(target, excluding: own)
        if case .application = target { targetMissing = false } else { targetMissing = nodes.isEmpty }
        let wanted = graph.links(capturing: nodes, into: own)
        for (link, made) in links where !wanted.contains(link) {
            pw_proxy_destroy(made.proxy)
            links[link] = nil
        }
        let now = MonotonicClockReading.now()
        for link in wanted where links[link] == nil {
            if let proxy = CBroadcastPWAudio_link(connection.core, link.outputNode, link.outputPort, link.inputNode, link.inputPort) {
                links[link] = (proxy, now)
            }
        }
        let linked = Set(links.keys.map(\.outputNode)).sorted()
        if linked != linkedNodeIDs {
            linkedNodeIDs = linked
            // Another node may run on another clock (another sound card): measure it afresh.
            delivery.timeline.restart()
            delivery.source.logLinks(linked.compactMap { graph.nodes[$0] })
        }
    }

    /// A link asked for that the graph still lacks after `linkPatience` (its creation failed: the
    /// server said so to the proxy, which nothing here listens to) is dropped and planned again.
    /// Checked once a second. Without it, a switch of the default sink was sometimes never followed
    /// (1 run in 9 of PipeWireAudioTests' sink switch): the new sink's ports had just been made.
    private func retryMissingLinks() {
        let now = MonotonicClockReading.now()
        guard now >= nextLinkCheck else { return }
        nextLinkCheck = now + 1_000_000_000
        let graph = connection.graph
        var dropped = false
        for (link, made) in links where now - made.askedAt >= Self.linkPatience && !graph.exists(link) {
            pw_proxy_destroy(made.proxy)
            links[link] = nil
            dropped = true
        }
        if dropped { plannedGeneration = -1 }
    }

    /// A graph cycle's buffers: drained at once (all of them, so the last one is the cycle `now`
    /// reports), copied into pooled buffers and given back to PipeWire.
    private func process() {
        guard let stream else { return }
        var time = pw_time()
        let timed = pw_stream_get_time_n(stream, &time, MemoryLayout<pw_time>.size) == 0 && time.now > 0
        var delay: Int64 = 0
        if timed, time.rate.denom > 0, time.delay > 0 {
            delay = time.delay * 1_000_000_000 * Int64(time.rate.num) / Int64(time.rate.denom)
            delivery.source.delayMicroseconds.store(Int(delay / 1000), ordering: .relaxed)
        }
        // A non-realtime stream may find several cycles queued; the last is `now`'s, earlier ones
        // are placed back by their length.
        queued.removeAll(keepingCapacity: true)
        while let buffer = pw_stream_dequeue_buffer(stream) {
            let spa = buffer.pointee.buffer.pointee
            var frames = 0
            if spa.n_datas > 0, let chunk = spa.datas[0].chunk, spa.datas[0].data != nil {
                frames = Int(chunk.pointee.size) / bytesPerFrame
            }
            queued.append((buffer, frames))
        }
        var after = queued.reduce(0) { $0 + $1.1 }
        let rate = Int64(delivery.source.format.sampleRate)
        for (buffer, frames) in queued {
            let spa = buffer.pointee.buffer.pointee
            if frames > 0, let base = spa.datas[0].data, let chunk = spa.datas[0].chunk {
                let observed: Int64? = timed ? Int64(time.now) - delay - Int64(after - queued.last!.1) * 1_000_000_000 / rate : nil
                delivery.deliver(UnsafeRawPointer(base + Int(chunk.pointee.offset % spa.datas[0].maxsize)), frames: frames, observed: observed)
            }
            after -= frames
            pw_stream_queue_buffer(stream, buffer)
        }
    }
}
