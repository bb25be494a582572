public import BroadcastKit
public import BroadcastMedia

/// What a broadcast's capture keeps in memory of its own, for the memory plan.
public struct CaptureMemory: Sendable, Hashable {
    /// Bytes of one frame in a pool the source sizes as it is told (the test pattern's frames, the
    /// copies a V4L2 source makes when the driver runs short); 0 when the source has no such pool.
    public var poolFrameBytes: Int
    /// Memory the source holds whatever the budget (X11 shared-memory segments); its pixels are
    /// counted, though the X server shares them.
    public var fixedBytes: Int
    /// Frames arrive in another format or size than the encoder's and are converted: the
    /// converter keeps a frame (and a second one for region updates).
    public var converts: Bool

    public init(poolFrameBytes: Int = 0, fixedBytes: Int = 0, converts: Bool = false) {
        self.poolFrameBytes = poolFrameBytes
        self.fixedBytes = fixedBytes
        self.converts = converts
    }
}

/// A memory budget turned into sizes: how many frames the capture pool holds, how many packets
/// each output's queue holds, how much a replay buffer keeps, and how many frames x264 holds
/// (its threads and lookahead) — or the figures showing that the broadcast cannot fit.
///
/// The estimate is a model calibrated by measurement (docs/DESIGN.md, "Memory budget"): a fixed
/// cost for the process, x264's frames (each about `x264BytesPerPixel` per padded pixel), the
/// capture pool, the converter's frames, the packets the queues may hold at the stream's peak
/// bitrate, and the replay buffers. It errs high: the budget is what the process's private dirty
/// memory must stay under, and `broadcast status` reports that figure to check it against.
public struct MemoryPlan: Sendable, Hashable, CustomStringConvertible {
    /// Bytes of the budget.
    public let budget: Int64
    /// What the chosen sizes are estimated to cost, by part.
    public private(set) var estimate: Parts
    /// What the smallest workable sizes cost: more than `budget` and the plan is refused.
    public private(set) var minimum: Parts
    /// Frames in the capture pool: its bytes (for `TestPatternSource.poolBytes` and the V4L2 copies).
    public private(set) var capturePoolBytes: Int
    /// Packets each file output's queue holds; each live output's.
    public private(set) var fileQueueCapacity: Int
    public private(set) var liveQueueCapacity: Int
    /// x264: frame threads (0 = x264's choice, kept when it fits) and rc-lookahead (nil: the preset's).
    public private(set) var encoderThreads: Int
    public private(set) var lookahead: Int?
    /// Whether x264 gets fewer frame threads or a shorter lookahead than asked, to fit.
    public var reducesEncoder: Bool { lookahead != nil }
    /// Bytes for each replay output whose limit was not set.
    public private(set) var replayMaxBytes: Int64

    /// Costs by part, in bytes.
    public struct Parts: Sendable, Hashable, CustomStringConvertible {
        public var base: Int64 = 0
        public var encoder: Int64 = 0
        public var capture: Int64 = 0
        public var queues: Int64 = 0
        public var replay: Int64 = 0
        public var total: Int64 { base + encoder + capture + queues + replay }
        public var description: String {
            "encoder \(MemoryPlan.mebibytes(encoder)), capture \(MemoryPlan.mebibytes(capture)), "
                + "queues \(MemoryPlan.mebibytes(queues)), replay \(MemoryPlan.mebibytes(replay)), base \(MemoryPlan.mebibytes(base))"
        }
    }

    // Calibration (measured on Debian 12, FFmpeg 5.1, x264 164; see docs/DESIGN.md).
    /// The process without video: Swift runtime, libav* data pages, the audio encoder, muxers, thread stacks.
    public static let baseBytes: Int64 = 20 << 20
    /// x264 per frame it holds, per pixel of the picture padded by 64 on each dimension (luma
    /// and its half-pel planes, chroma, the quarter-size lookahead planes, per-macroblock data):
    /// 11 MiB a frame at 1080p measured; 5.5 leaves a margin (smaller pictures cost more per pixel).
    static let x264BytesPerPixel = 5.5
    /// Frames each x264 frame thread beyond the first adds (its frame, its place in the sync
    /// lookahead, the lookahead thread's): measured 41 MiB a thread at 1080p.
    static let x264FramesPerThread = 4
    /// What a lookahead frame beyond the B-frames costs, in frames: measured 6.2 MiB at 1080p.
    static let x264LookaheadFrame = 0.6
    /// Frames x264 holds beyond references, B-frames, lookahead and frame threads.
    static let x264ExtraFrames = 3
    /// Audio packets per second (AAC: 1024 samples at 48 kHz).
    static let audioPacketsPerSecond = 47.0
    /// A queue never holds less than this much media: a keyframe interval's worth must fit for
    /// a live output to restart on a keyframe after a drop, and a disk may pause for a moment.
    static let minimumQueueSeconds = 2.0
    /// What queues are given today without a budget: about a minute of media.
    static let defaultFileQueue = 8192
    static let defaultLiveQueue = 4096
    /// The capture pool: at least this many frames, at most a second of them, within 16 MiB unless the budget says less.
    static let minimumPoolFrames = 4
    static let defaultPoolBytes = 16 << 20

    /// The default: the default encoding (veryfast, zerolatency) of a 1440p screen, the largest
    /// common desktop, is estimated at 128.5 MiB at its smallest sizes, and 1080p60 measures 77 MiB
    /// of private dirty memory (process 16, x264 45, capture pool 15); 160 MiB fits the first with
    /// room for its queues, and gives the second's stream + recording about 40 s of media each at
    /// 4.6 Mbit/s before a stalled output makes the encoder wait or drop.
    public static let defaultBudget: Int64 = 160 << 20

    public var description: String {
        "budget \(Self.mebibytes(budget)): \(estimate) (total \(Self.mebibytes(estimate.total))); "
            + "x264 threads \(encoderThreads == 0 ? "auto" : "\(encoderThreads)"), lookahead \(lookahead.map { "\($0)" } ?? "preset")"
    }

    static func mebibytes(_ bytes: Int64) -> String {
        // Whole MiB and the rest apart: bytes * 10 overflowed from about 800000T (exit 132).
        let tenths = (bytes >> 20) * 10 + ((bytes & 0xFFFFF) * 10 + (1 << 19)) >> 20
        return tenths % 10 == 0 ? "\(tenths / 10) MiB" : "\(tenths / 10).\(tenths % 10) MiB"
    }

    /// x264 frames held per preset: references and B-frames (from x264's preset table), and the
    /// preset's rc-lookahead.
    static func presetFrames(_ preset: String) -> (references: Int, bFrames: Int, lookahead: Int) {
        switch preset {
        case "ultrafast": (1, 0, 0)
        case "superfast": (1, 3, 0)
        case "veryfast": (1, 3, 10)
        case "faster": (2, 3, 20)
        case "fast": (2, 3, 30)
        case "medium": (3, 3, 40)
        case "slow": (5, 3, 50)
        case "slower": (8, 3, 60)
        default: (16, 8, 60)
        }
    }

    /// Bytes x264 holds at `width`x`height` with these frame counts.
    static func x264Bytes(width: Int, height: Int, frames: Int) -> Int64 {
        Int64(Double((width + 64) * (height + 64)) * x264BytesPerPixel) * Int64(frames)
    }

    /// Plans `configuration` within `budget` bytes.
    ///
    /// - Parameters:
    ///   - capture: what the video source keeps (nil: no video source).
    ///   - cores: the processors x264 would start frame threads for (`threads 0`).
    ///   - replayLimitsSet: names of replay outputs whose byte limit was given: kept as given.
    /// - Throws: a one-line error with what it needs vs the budget when even the smallest sizes do not fit.
    public init(
        budget: Int64, configuration: EncodingConfiguration, capture: CaptureMemory?, cores: Int,
        replayLimitsSet: Set<String> = []
    ) throws(BroadcastError) {
        self.budget = budget
        let video = configuration.video
        let outputs = configuration.allOutputs
        let media = MediaRates(configuration)
        let replay = ReplayNeeds(outputs, limitsSet: replayLimitsSet, media: media)
        let encoder = X264Needs(video, cores: cores)
        // Outputs' encodes of their own: each in full (its threads and lookahead as asked) and the
        // frames its converter keeps; what does not fit is refused with the figures.
        let extras = Self.extraEncodes(configuration)
        let extraEncoders = extras.reduce(Int64(0)) { $0 + X264Needs($1, cores: cores).full }
        let extraConverters = extras.reduce(Int64(0)) { $0 + Int64($1.width * $1.height * 3) }
        let pool = CaptureNeeds(capture, video: video, fps: media.fps)
        let queueCount = outputs.filter { $0.replay == nil }.count
        let queueMinimum = Int64(queueCount * media.minimumQueuePackets) * media.queueBytesPerPacket

        minimum = Parts(
            base: Self.baseBytes, encoder: encoder.minimum + extraEncoders, capture: pool.fixed + pool.minimum + extraConverters,
            queues: queueMinimum,
            replay: replay.fixed + replay.eachMinimum * Int64(replay.unset))
        capturePoolBytes = Int(pool.minimum)
        fileQueueCapacity = media.minimumQueuePackets
        liveQueueCapacity = media.minimumQueuePackets
        encoderThreads = video?.threads ?? 0
        lookahead = nil
        replayMaxBytes = replay.eachMinimum
        estimate = minimum
        if minimum.total > budget {
            var what = video.map { "\($0.width)x\($0.height) at \($0.frameRate) fps" } ?? "this audio-only broadcast"
            if !extras.isEmpty { what += " with \(extras.map { "\($0.width)x\($0.height)" }.joined(separator: ", ")) beside" }
            throw BroadcastError(
                .invalidArgument,
                "memory budget \(Self.mebibytes(budget)) is too small for \(what): it needs at least \(Self.mebibytes(minimum.total)) (\(minimum))"
            )
        }

        // Spend what is left, in order of what it buys: x264 as asked (threads, lookahead), the
        // capture pool (a late encoder thread drops fewer frames), the queues (a slow disk or
        // network waits longer before anything is lost), then the replay buffers.
        var spare = budget - minimum.total
        if video != nil { spend(&spare, on: encoder, alreadyCounted: extraEncoders) }
        spend(&spare, on: pool, frameBytes: capture?.poolFrameBytes ?? 1)
        if queueCount > 0 && media.queueBytesPerPacket > 0 { spend(&spare, onQueuesOf: outputs, count: queueCount, media: media) }
        if replay.unset > 0 {
            // Never below what the buffer's length needs (which the minimum counted), at most the default.
            let each = max(replayMaxBytes, min(ReplaySettings.defaultMaxBytes, replayMaxBytes + spare / Int64(replay.unset)))
            estimate.replay += (each - replayMaxBytes) * Int64(replay.unset)
            replayMaxBytes = each
        }
    }

    /// The distinct encodes of their own that outputs ask for (not the broadcast's).
    static func extraEncodes(_ configuration: EncodingConfiguration) -> [VideoEncoderSettings] {
        var extras: [VideoEncoderSettings] = []
        for output in configuration.allOutputs {
            guard let own = output.video, !own.sameEncode(as: configuration.video), !extras.contains(where: { $0.sameEncode(as: own) })
            else { continue }
            extras.append(own)
        }
        return extras
    }

    /// The media's peak rates, which size the queues and the replay buffers.
    private struct MediaRates {
        let fps: Double
        let bytesPerSecond: Double
        let keyframeSeconds: Double
        /// The smallest queue: two seconds or a keyframe interval, whichever is longer.
        let minimumQueuePackets: Int
        /// A queued packet: its payload at the peak rate, an AVPacket and its buffer.
        let queueBytesPerPacket: Int64

        init(_ configuration: EncodingConfiguration) {
            let video = configuration.video
            fps = video?.frameRate.framesPerSecond ?? 0
            let audioTracks = Double(configuration.audioTrackCount)
            var bitsPerSecond = Double(configuration.audio?.bitrate ?? 0) * audioTracks
            // An output's queue holds one video stream: the most demanding encode's, to be safe.
            let peaks = ([video] + MemoryPlan.extraEncodes(configuration)).compactMap { video -> Double? in
                guard let video else { return nil }
                return switch video.rateControl {
                case .cbr: Double(video.bitrate)
                case .vbr: Double(video.bitrate) * 1.5
                case .crf: video.bitrate > 0 ? Double(video.bitrate) : Double(video.width * video.height) * video.frameRate.framesPerSecond * 0.15
                }
            }
            bitsPerSecond += peaks.max() ?? 0
            bytesPerSecond = bitsPerSecond / 8
            let packetsPerSecond = fps + (configuration.audio == nil ? 0 : MemoryPlan.audioPacketsPerSecond * audioTracks)
            let packetBytes = packetsPerSecond > 0 ? bytesPerSecond / packetsPerSecond : 0
            keyframeSeconds = video?.keyframeIntervalSeconds ?? 1
            minimumQueuePackets = Int((max(MemoryPlan.minimumQueueSeconds, keyframeSeconds) * packetsPerSecond).rounded(.up)) + 1
            queueBytesPerPacket = Int64(packetBytes.rounded(.up)) + 256
        }
    }

    /// Replay buffers: given limits count in full; every other one needs at least its seconds at
    /// peak bitrate plus a keyframe interval, and all of those get the same limit: the largest of
    /// their minimums, then up to the default.
    private struct ReplayNeeds {
        var fixed: Int64 = 0
        var unset = 0
        var eachMinimum: Int64 = 0

        init(_ outputs: [OutputConfiguration], limitsSet: Set<String>, media: MediaRates) {
            for output in outputs {
                guard let replay = output.replay else { continue }
                if limitsSet.contains(output.name) {
                    fixed += replay.maxBytes
                } else {
                    unset += 1
                    eachMinimum = max(eachMinimum, Int64((replay.seconds + media.keyframeSeconds) * media.bytesPerSecond * 1.25))
                }
            }
        }
    }

    /// x264 at its smallest (one frame thread, no lookahead beyond its B-frames) and as asked.
    private struct X264Needs {
        var minimum: Int64 = 0
        var full: Int64 = 0
        var fullThreads = 1
        var minimumThreads = 1
        var fullLookahead = 0
        var minimumLookahead = 0
        /// One frame's bytes at the encoded size.
        var frameBytes: Int64 = 0
        var references = 0
        var bFrames = 0

        init(_ video: VideoEncoderSettings?, cores: Int) {
            guard let video else { return }
            let preset = MemoryPlan.presetFrames(video.preset)
            let zeroLatency = video.tune == "zerolatency"
            // zerolatency: no B-frames, no lookahead, and threads work on slices of one frame.
            references = preset.references
            bFrames = zeroLatency ? 0 : preset.bFrames
            minimumLookahead = bFrames
            fullLookahead = zeroLatency ? 0 : max(preset.lookahead, bFrames)
            if !zeroLatency {
                fullThreads = video.threads == 0 ? max(1, cores * 3 / 2) : video.threads
                minimumThreads = video.threads == 0 ? 1 : video.threads
            }
            frameBytes = MemoryPlan.x264Bytes(width: video.width, height: video.height, frames: 1)
            minimum = Int64(Double(frameBytes) * frames(threads: minimumThreads, lookahead: minimumLookahead))
            full = Int64(Double(frameBytes) * frames(threads: fullThreads, lookahead: fullLookahead))
            if video.encoder != "libx264" {
                // A hardware encoder keeps its frames on the device; its fallback is x264.
                full = minimum
            }
        }

        /// Frames x264 holds: references, the frame being encoded and those waiting for output;
        /// each B-frame twice (the frame and its place in the lookahead, with the macroblock-tree
        /// data); the lookahead beyond the B-frames (its quarter-size planes, about 0.6 of a frame
        /// each, until a frame is encoded); each further frame thread.
        func frames(threads: Int, lookahead: Int) -> Double {
            Double(references + MemoryPlan.x264ExtraFrames + 2 * bFrames + MemoryPlan.x264FramesPerThread * (threads - 1))
                + MemoryPlan.x264LookaheadFrame * Double(lookahead - bFrames)
        }
    }

    /// Capture: the pool at its smallest and at its best (at least four frames, at most a second of
    /// them within 16 MiB), and what is held anyway (the converter's frames, the source's own).
    private struct CaptureNeeds {
        var fixed: Int64 = 0
        var minimum: Int64 = 0
        var full: Int64 = 0

        init(_ capture: CaptureMemory?, video: VideoEncoderSettings?, fps: Double) {
            guard let capture, let video else { return }
            fixed = Int64(capture.fixedBytes)
            if capture.converts { fixed += Int64(video.width * video.height * 3) }  // two yuv420p frames
            let perSecond = max(MemoryPlan.minimumPoolFrames, Int(fps.rounded(.up)))
            minimum = Int64(capture.poolFrameBytes * MemoryPlan.minimumPoolFrames)
            full = Int64(capture.poolFrameBytes)
                * Int64(max(MemoryPlan.minimumPoolFrames, min(perSecond, MemoryPlan.defaultPoolBytes / max(capture.poolFrameBytes, 1))))
        }
    }

    /// x264 as asked when it fits; else frame threads go first, down to 1 (each costs four frames;
    /// one thread encodes a picture the size a budget this tight allows in real time), then the
    /// lookahead, down to the B-frames it must see.
    private mutating func spend(_ spare: inout Int64, on encoder: X264Needs, alreadyCounted: Int64) {
        let extra = encoder.full - encoder.minimum
        if extra <= spare {
            estimate.encoder = encoder.full + alreadyCounted
            spare -= extra
            return
        }
        let affordable = Double(spare) / Double(max(encoder.frameBytes, 1))
        let lookaheadFrames = min(encoder.fullLookahead - encoder.minimumLookahead, Int(affordable / Self.x264LookaheadFrame))
        let left = affordable - Double(lookaheadFrames) * Self.x264LookaheadFrame
        let threadFrames = min(encoder.fullThreads - encoder.minimumThreads, Int(left) / Self.x264FramesPerThread)
        encoderThreads = encoder.minimumThreads + threadFrames
        let lookahead = encoder.minimumLookahead + lookaheadFrames
        self.lookahead = lookahead
        let spent = Int64(
            Double(encoder.frameBytes)
                * (encoder.frames(threads: encoderThreads, lookahead: lookahead)
                    - encoder.frames(threads: encoder.minimumThreads, lookahead: encoder.minimumLookahead)))
        estimate.encoder += spent
        spare -= spent
    }

    /// Whole frames of the capture pool, up to its best.
    private mutating func spend(_ spare: inout Int64, on pool: CaptureNeeds, frameBytes: Int) {
        guard pool.full > pool.minimum else { return }
        let extra = min(pool.full - pool.minimum, spare)
        let frame = Int64(max(frameBytes, 1))
        let frames = extra / frame
        capturePoolBytes = Int(pool.minimum + frames * frame)
        estimate.capture += frames * frame
        spare -= frames * frame
    }

    /// Half of what is left, shared by the queues, up to today's defaults.
    private mutating func spend(_ spare: inout Int64, onQueuesOf outputs: [OutputConfiguration], count: Int, media: MediaRates) {
        let perQueue = spare / 2 / Int64(count) / media.queueBytesPerPacket
        let fileQueue = min(Self.defaultFileQueue, media.minimumQueuePackets + Int(perQueue))
        let liveQueue = min(Self.defaultLiveQueue, media.minimumQueuePackets + Int(perQueue))
        fileQueueCapacity = fileQueue
        liveQueueCapacity = liveQueue
        var spent: Int64 = 0
        for output in outputs where output.replay == nil {
            spent += Int64((output.destination.isLive ? liveQueue : fileQueue) - media.minimumQueuePackets) * media.queueBytesPerPacket
        }
        estimate.queues += spent
        spare -= spent
    }

    /// `configuration` with the planned sizes: x264's threads and lookahead, queue capacities, the
    /// replay limits not given.
    public func applied(to configuration: EncodingConfiguration, replayLimitsSet: Set<String> = []) -> EncodingConfiguration {
        var configuration = configuration
        if configuration.video != nil {
            configuration.video!.threads = encoderThreads
            configuration.video!.lookahead = lookahead
        }
        // Recordings given as paths become outputs, so each gets its queue capacity.
        configuration.outputs = configuration.allOutputs.map {
            sized($0, replayLimitSet: replayLimitsSet.contains($0.name))
        }
        configuration.recordings = []
        return configuration
    }

    /// `output` with the planned queue capacity and, unless its limit was given, replay limit
    /// (also for an output added while running, which the plan did not count).
    public func sized(_ output: OutputConfiguration, replayLimitSet: Bool) -> OutputConfiguration {
        var output = output
        output.live.queueCapacity = liveQueueCapacity
        output.fileQueueCapacity = fileQueueCapacity
        if output.replay != nil, !replayLimitSet { output.replay!.maxBytes = replayMaxBytes }
        return output
    }
}
