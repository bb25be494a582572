import Atomics
public import BroadcastKit
public import BroadcastMedia
public import Logging

/// The built-in handler: encodes video to H.264 once per quality the outputs ask (the broadcast's
/// own, and one encode per distinct `OutputConfiguration.video`, shared), the audio to AAC (the
/// mix of microphone and application audio, a track per source, or both: `AudioTrackMode`; Opus
/// too for WHIP), and hands each output the packets of its encodes (recordings, live streams).
///
/// It is a `BroadcastSampleHandler` like any user's: the session calls it serially, so its state
/// needs no locks; only `counters` and `outputs` are read from other threads. Each output runs on
/// a thread of its own behind a bounded lock-free queue: per packet, the session's thread only
/// pushes a reference into each queue.
public final class EncodingHandler: BroadcastSampleHandler {
    public let configuration: EncodingConfiguration
    /// Read from any thread: `counters.snapshot()`.
    public let counters = EncodingCounters()
    /// Sees each output track's mixed audio (track index, samples) on the session thread before it
    /// is encoded (the control page's meters: `LevelMeters.offer(track:_:)`); set before the start.
    public var audioTrackTap: ((Int, PlanarAudio) -> Void)?
    /// Each audio track's index among the output's audio tracks (the order of `AudioTrackLayout`).
    private var mixTrackIndex: Int?
    private var sourceTrackIndex: [SampleBufferType: Int] = [:]
    private let logger: Logger
    /// Why the outputs could not be made at init (the start throws it).
    private var unmade: BroadcastError?

    private var videoEncoder: VideoEncoder?
    /// Encodes of their own for outputs whose `video` settings differ from the broadcast's (one
    /// per distinct settings, shared by the outputs that ask the same): each encodes every frame
    /// from the captured picture, scaled once for it. Session thread; the status reads `encodes`.
    private var extraEncodes: [ExtraVideoEncode] = []
    /// The stream index the next encoder made gets (video, audio tracks, then any made later).
    private var nextStreamIndex = 0
    /// Each video encode and the outputs it feeds, for the status (any thread).
    public let videoEncodes = VideoEncodeList()
    private var audioEncoder: AudioEncoder?
    /// Opus for WHIP outputs, beside the AAC the others get: made when the first WHIP output is.
    private var opusEncoder: AudioEncoder?
    private var mixer: AudioMixer?
    /// `separate`/`both`: each source's own track.
    private var sourceTracks: [SourceTrack] = []
    /// Tracks encoded again at an output's own audio bitrate (session thread).
    private var extraAudio: [ExtraAudioEncode] = []
    private let trackTitles = ManagedAtomic(TrackTitles([]))

    /// The audio tracks' titles in stream order ("Mix", "Microphone", "Desktop audio"): what the
    /// tap's track indices name. Any thread.
    public var audioTrackTitles: [String] { trackTitles.load(ordering: .acquiring).titles }

    /// `audioTrackTitles` as a closure another thread may keep.
    public var audioTrackTitlesReader: @Sendable () -> [String] {
        { [trackTitles] in trackTitles.load(ordering: .acquiring).titles }
    }
    /// The audio tracks encoded, in stream order after the video (set at the start).
    private var audioLayout: AudioTrackLayout?
    /// The sources' volumes and mutes: set from any thread, applied from each source's next buffer.
    public let audioControl: AudioSourceControl
    /// The sources' sync offsets: set from any thread, applied from each source's next buffer.
    public let offsetControl: SourceOffsetControl
    /// An offset other than 0 was applied to audio: the audio's end is then set by where the
    /// sources' captures ended (`audioEnd`), not by where the offsets moved their last samples.
    private var audioOffsetApplied = false
    /// End of the audio delivered (output samples, before offsets).
    private var audioEnd: Int64 = 0
    /// Video frames left out because their offset put them before the start or not after the
    /// frame before them (an offset made smaller while running).
    public private(set) var framesDroppedByOffset = 0
    private var resamplers: [SampleBufferType: Resampler] = [:]
    /// `micDenoise`: the microphone's noise suppression, made at the start (state allocated once).
    private var micDenoiser: NoiseSuppressor?
    /// Every output, in configuration order, from init on (their threads start with the broadcast),
    /// and the way to change them while the broadcast runs: read and asked from any thread.
    public let outputControl: OutputControl
    /// The current outputs (a snapshot; the set changes only through `outputControl.reconfigure`).
    public var outputs: [Output] { outputControl.outputs }
    /// Outputs taken out while running: ended at once, joined when the broadcast finishes.
    private var retired: [Output] = []
    /// What new outputs are opened with: set at broadcastStarted.
    private var streams: [StreamDescription] = []
    /// Whether the encoders were made with their headers apart (set at broadcastStarted).
    private var globalHeader = false
    /// The broadcast's own video encode's figures (set at broadcastStarted).
    private var defaultEncodeStatus: VideoEncodeStatus?
    /// Set by an output that needs a keyframe; taken before each video frame on the session's thread.
    private let keyframeRequest = ManagedAtomic<Bool>(false)
    private var bitrateWindowStart: Double?
    private var bitrateWindowBytes = 0
    private var finished = false
    /// Media time (ns) of the last video frame encoded.
    private var lastVideoTime: Int64?
    /// A resume came since the last video frame: the next one may fall closer than a frame period
    /// to it (the pause took out a stretch that is not a whole number of frames).
    private var resumedSinceVideo = false
    /// Video frames dropped after a resume for being too close to the frame before the pause.
    public private(set) var framesDroppedAfterResume = 0
    /// vfr: repeated pictures not sent, and the time of the last one not sent after the last sent frame.
    public private(set) var repeatsNotSent = 0
    private var unsentRepeatTime: Int64?
    /// Media time (ns) of the last keyframe sent or forced.
    private var lastKeyframeTime: Int64?
    /// Where media time stands, for replay saves asked from other threads; see `MediaClock`.
    public let mediaClock: MediaClock
    /// End of the last buffer delivered (media ns): where media time stands still when paused.
    private var deliveredEnd: Int64 = 0
    /// Errors met after the start that did not stop the broadcast (a recording that failed, a
    /// finalize that did not work), in order.
    public private(set) var failures: [BroadcastError] = []

    /// `realtime`: the sources run at clock speed (what a replay save's "now" is measured on).
    public init(configuration: EncodingConfiguration, logger: Logger, realtime: Bool = true) {
        self.configuration = configuration
        self.logger = logger
        let keyframeRequest = self.keyframeRequest
        let failed = counters.failedOutputs
        let mediaClock = MediaClock(realtime: realtime)
        self.mediaClock = mediaClock
        audioControl = AudioSourceControl(configuration.audioLevels)
        offsetControl = SourceOffsetControl(configuration.sourceOffsets)
        var outputs: [Output] = []
        do {
            for output in configuration.allOutputs {
                outputs.append(
                    try Output(configuration: output, keyframeRequest: keyframeRequest, failedOutputs: failed, logger: logger, mediaClock: mediaClock))
            }
        } catch {
            // Out of descriptors: the start fails with this (`broadcastStarted` throws it).
            unmade = error
            outputs = []
        }
        outputControl = OutputControl(outputs)
    }

    /// The replay outputs.
    public var replayOutputs: [Output] { outputs.filter(\.isReplay) }

    /// The output named `name`.
    public func output(named name: String) -> Output? { outputs.first { $0.name == name } }

    public func statistics() -> EncodingStatistics { counters.snapshot() }

    /// Makes the next video frame a keyframe. Session thread only; from elsewhere, `requestKeyframe()`.
    public func forceKeyframe() {
        videoEncoder?.forceKeyframe()
        for encode in extraEncodes { encode.encoder.forceKeyframe() }
    }


    /// Asks for a keyframe from any thread: the next video frame the session hands over becomes one.
    public func requestKeyframe() { keyframeRequest.store(true, ordering: .releasing) }

    public func broadcastStarted(setupInfo: SetupInfo) throws {
        if let unmade { throw unmade }
        try configuration.validate()
        let globalHeader = configuration.allOutputs.contains { Self.needsGlobalHeader($0.destination) }
        self.globalHeader = globalHeader
        var streams: [StreamDescription] = []
        do {
            if let video = configuration.video {
                let encoder = try VideoEncoder(
                    settings: video, globalHeader: globalHeader, streamIndex: streams.count, logger: logger)
                streams.append(encoder.stream)
                videoEncoder = encoder
            }
            if let audio = configuration.audio {
                let layout = AudioTrackLayout(configuration)
                audioLayout = layout
                trackTitles.store(TrackTitles(layout.titles), ordering: .releasing)
                for (index, track) in layout.tracks.enumerated() {
                    switch track {
                    case .mix: mixTrackIndex = index
                    case .source(let type): sourceTrackIndex[type] = index
                    }
                    let encoder = try AudioEncoder(
                        settings: audio, globalHeader: globalHeader, streamIndex: streams.count, logger: logger)
                    var stream = encoder.stream
                    stream.title = track.title(alone: layout.tracks.count == 1)
                    streams.append(stream)
                    switch track {
                    case .mix:
                        audioEncoder = encoder
                        mixer = AudioMixer(channelCount: audio.channels, sampleRate: audio.sampleRate)
                    case .source(let type):
                        sourceTracks.append(SourceTrack(type: type, encoder: encoder))
                    }
                }
                if configuration.micDenoise {
                    let denoiser: NoiseSuppressor
                    do {
                        denoiser = try NoiseSuppressor(sampleRate: audio.sampleRate, channelCount: audio.channels)
                    } catch {
                        throw BroadcastError(.invalidArgument, "--mic-denoise: \(error)")
                    }
                    micDenoiser = denoiser
                    logger.info(
                        "audio: microphone noise suppression on (WebRTC, \(denoiser.frameSize)-sample frames, its \(denoiser.algorithmicDelay)-sample delay taken off the timestamps)")
                }
            }
        } catch {
            throw BroadcastError(.outputFailed, "\(error)")
        }
        for i in streams.indices { streams[i].streamIndex = i }
        self.streams = streams
        nextStreamIndex = streams.count
        if let video = configuration.video {
            defaultEncodeStatus = VideoEncodeStatus(settings: video)
            for output in outputs { try ensureEncode(for: output.configuration) }
        }
        for output in outputs { try ensureAudioEncodes(for: output.configuration) }
        // Files are opened here, so a recording that cannot be created fails the start; live
        // outputs connect on their own threads (a server that is down must not stop the recording).
        var workers: [any OutputWorker] = []
        do {
            for output in outputs { workers.append(try makeWorker(for: output)) }
        } catch {
            for worker in workers { (worker as? RecordingWorker)?.discard() }
            throw error
        }
        for (output, worker) in zip(outputs, workers) { output.start(worker) }
        videoEncoder?.markMediaTimeZero()
        for encode in extraEncodes { encode.encoder.markMediaTimeZero() }
        publishEncodes(outputs)
        mediaClock.started()
    }

    /// Whether the container `destination` is written in wants the codecs' headers apart (extradata).
    private static func needsGlobalHeader(_ destination: OutputDestination) -> Bool {
        switch destination {
        case .file(let path): (try? Recording.container(for: path).needsGlobalHeader) ?? false
        case .live(let url): !url.scheme.isWHIP && Muxer.formatNeedsGlobalHeader(formatName: url.scheme.formatName) ?? false
        }
    }

    public func broadcastPaused() { mediaClock.paused(at: deliveredEnd) }

    /// `separate` encodes no mix unless an output carries one audio track only (FLV): when such
    /// an output joins a running broadcast (a reload), the mix's encode starts now, after the
    /// source tracks, so it gets the mix as one configured at the start does, not the first
    /// source's track. Session thread.
    private func addMixTrack(for destination: OutputDestination) throws(BroadcastError) {
        guard var layout = audioLayout, !layout.hasMix, let audio = configuration.audio,
            let format = AudioTrackLayout.formatName(of: destination), AudioTrackLayout.carriesOneAudioTrack(formatName: format)
        else { return }
        let globalHeader = self.globalHeader || Self.needsGlobalHeader(destination)
        let encoder = try media { () throws(FFmpegError) in
            try AudioEncoder(settings: audio, globalHeader: globalHeader, streamIndex: nextStreamIndex, logger: logger)
        }
        var stream = encoder.stream
        stream.title = AudioTrackLayout.Track.mix.title(alone: false)
        stream.streamIndex = nextStreamIndex
        nextStreamIndex += 1
        streams.append(stream)
        mixTrackIndex = layout.addMix()
        audioLayout = layout
        trackTitles.store(TrackTitles(layout.titles), ordering: .releasing)
        audioEncoder = encoder
        mixer = AudioMixer(channelCount: audio.channels, sampleRate: audio.sampleRate)
        logger.notice("audio: the mix is encoded from now on, for an output that carries one audio track")
    }

    /// The worker that feeds `output` its packets: a file is created now (so a path that cannot
    /// be written fails here), a live stream connects on its own thread.
    private func makeWorker(for output: Output, joining: Bool = false) throws(BroadcastError) -> any OutputWorker {
        if joining {
            try addMixTrack(for: output.destination)
            try ensureEncode(for: output.configuration)
            try ensureAudioEncodes(for: output.configuration)
        }
        let streams = carriedStreams(of: output)
        output.carriedStreams = streams.reduce(0) { $0 | 1 << UInt64($1.streamIndex!) }
        switch output.destination {
        case .file(let template) where output.configuration.replay != nil:
            return try ReplayWorker(
                output: output, settings: output.configuration.replay!, pathTemplate: template, streams: streams,
                hook: output.fileFinishedHook, logger: logger)
        case .file(let path):
            let recording = try Recording(
                path: path, streams: streams, overwrite: output.configuration.overwrite, logger: logger)
            output.configuration.manifest?.recordCreated(recording, owner: output.name)
            return RecordingWorker(
                output: output, recording: recording, hasVideo: videoEncoder != nil, streams: streams,
                segments: output.configuration.segments, manifest: output.configuration.manifest,
                joinsRunningBroadcast: joining, logger: logger)
        case .live(let url) where url.scheme.isWHIP:
            if let problem = configuration.webRTCProblem(output.configuration) { throw BroadcastError(.outputFailed, problem) }
            var whipStreams = streams.filter { $0.parameters.mediaType == .video }
            if let opus = try opusStream() { whipStreams.append(opus) }
            return WHIPWorker(output: output, url: url, streams: whipStreams, engine: configuration.webRTC!, logger: logger)
        case .live(let url):
            // What it sends: its own encode's bitrates where it has one, else the broadcast's.
            let audioTracks = streams.filter { $0.parameters.mediaType == .audio }.count
            let video = videoEncoder == nil ? 0 : (output.configuration.video ?? configuration.video)?.bitrate ?? 0
            let audio = output.configuration.audioBitrate ?? configuration.audio?.bitrate ?? 0
            let totalBitrate = video + audio * audioTracks
            return LiveStreamWorker(output: output, url: url, streams: streams, totalBitrate: totalBitrate, logger: logger)
        }
    }

    /// The Opus stream WHIP outputs get, its encoder made the first time one is asked for (nil
    /// without audio). Session thread.
    private func opusStream() throws(BroadcastError) -> StreamDescription? {
        if let opusEncoder { return opusEncoder.stream }
        guard let audio = configuration.audio else { return nil }
        let settings = AudioEncoderSettings(encoder: "libopus", sampleRate: 48_000, channels: audio.channels, bitrate: audio.bitrate)
        let encoder = try media { () throws(FFmpegError) in
            try AudioEncoder(settings: settings, globalHeader: false, streamIndex: nextStreamIndex, logger: logger)
        }
        nextStreamIndex += 1
        opusEncoder = encoder
        return encoder.stream
    }

    /// The streams `output` carries: the video, and the audio tracks its container holds (an
    /// FLV output one, the mix).
    private func carriedStreams(of output: Output) -> [StreamDescription] {
        let firstAudio = videoEncoder == nil ? 0 : 1
        // The video of the encode the output asked for: its own, or the broadcast's.
        var video = Array(streams[..<firstAudio])
        if firstAudio == 1, let own = extraEncode(for: output.configuration.video) { video = [own.stream] }
        guard let layout = audioLayout else { return video + streams[firstAudio...] }
        let audio = layout.carried(by: AudioTrackLayout.formatName(of: output.destination), mode: configuration.audioTracks)
        return video + audio.map { track in
            extraAudioEncode(track: track, for: output.configuration)?.stream ?? streams[firstAudio + track]
        }
    }

    /// The encode of its own of `track` an output with `configuration` takes at its audio
    /// bitrate; nil for the broadcast's (no bitrate of its own, or the broadcast's).
    private func extraAudioEncode(track: Int, for configuration: OutputConfiguration) -> ExtraAudioEncode? {
        guard let bitrate = configuration.audioBitrate, bitrate != self.configuration.audio?.bitrate else { return nil }
        return extraAudio.first { $0.track == track && $0.bitrate == bitrate }
    }

    /// Makes the encodes of the tracks `output` carries at its own audio bitrate, those not made
    /// yet (session thread). WHIP outputs take the Opus encode, whatever they ask.
    private func ensureAudioEncodes(for output: OutputConfiguration) throws(BroadcastError) {
        guard let bitrate = output.audioBitrate, let audio = configuration.audio, bitrate != audio.bitrate,
            let layout = audioLayout
        else { return }
        if case .live(let url) = output.destination, url.scheme.isWHIP { return }
        let globalHeader = self.globalHeader || Self.needsGlobalHeader(output.destination)
        let carried = layout.carried(by: AudioTrackLayout.formatName(of: output.destination), mode: configuration.audioTracks)
        for track in carried where extraAudioEncode(track: track, for: output) == nil {
            var settings = audio
            settings.bitrate = bitrate
            let index = nextStreamIndex
            let encoder = try media { () throws(FFmpegError) in
                try AudioEncoder(settings: settings, globalHeader: globalHeader, streamIndex: index, logger: logger)
            }
            nextStreamIndex += 1
            var stream = encoder.stream
            stream.title = layout.tracks[track].title(alone: layout.tracks.count == 1)
            stream.streamIndex = index
            extraAudio.append(ExtraAudioEncode(track: track, bitrate: bitrate, encoder: encoder, stream: stream))
            logger.notice("audio: an encode of its own of track \(track + 1) at \(bitrate / 1000) kb/s")
        }
    }

    /// The encode of its own an output with `settings` takes, nil for the broadcast's (nil, or
    /// the same settings).
    private func extraEncode(for settings: VideoEncoderSettings?) -> ExtraVideoEncode? {
        guard let settings, !settings.sameEncode(as: configuration.video) else { return nil }
        return extraEncodes.first { $0.asked.sameEncode(as: settings) }
    }

    /// Makes the encode `output` takes when none has its settings yet (session thread).
    private func ensureEncode(for output: OutputConfiguration) throws(BroadcastError) {
        guard let settings = output.video, videoEncoder != nil, !settings.sameEncode(as: configuration.video),
            extraEncode(for: settings) == nil
        else { return }
        let index = nextStreamIndex
        let globalHeader = self.globalHeader
        let encoder = try media { () throws(FFmpegError) in
            try VideoEncoder(settings: settings, globalHeader: globalHeader, streamIndex: index, logger: logger)
        }
        nextStreamIndex += 1
        var stream = encoder.stream
        stream.streamIndex = index
        extraEncodes.append(ExtraVideoEncode(asked: settings, encoder: encoder, stream: stream, adaptiveMinimum: output.adaptiveMinimum))
        logger.notice("video: an encode of its own at \(settings.width)x\(settings.height), \(settings.bitrate / 1000) kb/s")
    }

    /// An adaptive output's encode follows its network: the controller sees the output's backlog
    /// and send rate (atomics), and a new target goes to the encoder before this frame. Session thread.
    private func adapt(_ encode: ExtraVideoEncode) {
        guard let owner = encode.asked.adaptiveFor, var controller = encode.controller,
            let output = outputs.first(where: { $0.name == owner })
        else { return }
        let (backlog, sent, path) = output.congestion
        let audio = configuration.audio?.bitrate ?? 0
        let now = MonotonicClock().now()
        if let target = controller.observe(now: now, backlog: backlog, sentBitsPerSecond: sent, pathBitsPerSecond: path, audioBitsPerSecond: audio) {
            encode.encoder.setBitrate(target)
            let took = path.map { ", the path took \($0 / 1000) kb/s" } ?? ""
            logger.notice("stream \(output.target): adapting: video at \(target / 1000) of \(controller.maximum / 1000) kb/s (backlog \(backlog / 1_000_000) ms\(took))")
        }
        // A WebRTC output: each new receiver report, once.
        let report = output.receiverReport
        if report.count != encode.reportsSeen {
            encode.reportsSeen = report.count
            if let target = controller.observe(now: now, fractionLost: report.fractionLost, roundTrip: report.roundTrip) {
                encode.encoder.setBitrate(target)
                let rtt = report.roundTrip.map { ", round trip \($0 / 1_000_000) ms" } ?? ""
                logger.notice(
                    "stream \(output.target): adapting: video at \(target / 1000) of \(controller.maximum / 1000) kb/s (the viewer lost \(Int((report.fractionLost * 100).rounded())) %\(rtt))")
            }
        }
        output.adapted(to: controller.target, of: controller.maximum)
        encode.controller = controller
    }

    /// Publishes each encode with the outputs it feeds, and lets go of the encodes no output takes
    /// any more (a reload changed or removed them: their memory goes back). Session thread.
    private func publishEncodes(_ outputs: [Output]) {
        let taken = outputs.compactMap { extraEncode(for: $0.configuration.video) }
        extraEncodes = extraEncodes.filter { encode in taken.contains { $0 === encode } }
        extraAudio = extraAudio.filter { encode in
            outputs.contains { extraAudioEncode(track: encode.track, for: $0.configuration) === encode }
        }
        guard let defaultEncodeStatus else { return }
        var list = [defaultEncodeStatus.feeding(outputs.filter { extraEncode(for: $0.configuration.video) == nil }.map(\.name))]
        for encode in extraEncodes {
            list.append(encode.status.feeding(outputs.filter { extraEncode(for: $0.configuration.video) === encode }.map(\.name)))
        }
        videoEncodes.publish(list)
    }

    /// Applies the output set asked through `outputControl` (on the session's thread): outputs whose
    /// configuration is unchanged go on untouched, others end, new ones start on a fresh keyframe.
    /// An output whose new configuration cannot start keeps running as it was: only an output the
    /// set leaves out is ended. Returns what happened to each output.
    @discardableResult
    private func applyRequestedOutputs(_ desired: [OutputConfiguration]) -> [OutputChange] {
        let current = outputs
        var next: [Output] = []
        var changes: [OutputChange] = []
        for configuration in desired {
            if let kept = current.first(where: { $0.configuration == configuration }) {
                next.append(kept)
                changes.append(OutputChange(name: configuration.name, result: .unchanged))
                continue
            }
            let predecessor = current.first { $0.name == configuration.name }
            do {
                if self.configuration.frameRateMode == .vfr, configuration.destination.isLive {
                    throw BroadcastError(
                        .outputFailed, "the frame rate mode is vfr, for files only; a live output needs cfr")
                }
                // Never two recordings in one file, whatever the new set says: an output whose
                // replacement would write the file it writes now keeps that file.
                let others = current + next.filter { added in !current.contains { $0 === added } }
                try OutputConfiguration.checkDistinctFiles(others.map(\.configuration) + [configuration])
                let output = try Output(
                    configuration: configuration, keyframeRequest: keyframeRequest, failedOutputs: counters.failedOutputs,
                    logger: logger, mediaClock: mediaClock)
                output.start(try makeWorker(for: output, joining: true))
                next.append(output)
                changes.append(OutputChange(name: configuration.name, result: predecessor == nil ? .added : .replaced))
                logger.notice("output \(output.name) \(predecessor == nil ? "added" : "started with its new settings") (\(output.target))")
            } catch {
                let message = (error as? BroadcastError)?.message ?? "\(error)"
                if let predecessor {
                    next.append(predecessor)
                    changes.append(OutputChange(name: configuration.name, result: .kept, reason: message))
                    record(BroadcastError(
                        .outputFailed, "output \(configuration.name): its new settings cannot start (\(message)); it goes on with its old ones"))
                } else {
                    changes.append(OutputChange(name: configuration.name, result: .failed, reason: message))
                    record(BroadcastError(.outputFailed, "output \(configuration.name) not added: \(message)"))
                }
            }
        }
        for output in current where !next.contains(where: { $0 === output }) {
            output.end()
            retired.append(output)
            if !changes.contains(where: { $0.name == output.name }) {
                changes.append(OutputChange(name: output.name, result: .removed))
            }
            logger.notice("output \(output.name) \(desired.contains { $0.name == output.name } ? "ended for its replacement" : "removed") (\(output.target))")
        }
        outputControl.publish(next)
        publishEncodes(next)
        // Opus is encoded only while a WHIP output takes it.
        if !next.contains(where: \.isWebRTC) { opusEncoder = nil }
        forceKeyframe()
        return changes
    }

    /// Joins the outputs a reload removed whose threads have ended, keeping their failures: each
    /// holds descriptors (its queue's wake-up pipes) until then. Session thread.
    private func reapRetired() {
        guard retired.contains(where: \.hasExited) else { return }
        retired.removeAll { output in
            guard output.hasExited else { return false }
            output.join()
            keepFailure(of: output)
            return true
        }
    }

    private func keepFailure(of output: Output) {
        if let failure = output.failure, !failures.contains(failure) {
            failures.append(failure)
            if output.state != .failed { logger.error("\(failure)") }
        }
    }

    /// A turn asked through the session (`requestControl()`): the output set a reload asked for
    /// applies now, also while the broadcast is paused.
    public func controlRequested() {
        guard !finished else { return }
        if let request = outputControl.takeRequest() { request.answer(applyRequestedOutputs(request.desired)) }
        reapRetired()
    }

    public func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        guard !finished else { return }
        if let request = outputControl.takeRequest() { request.answer(applyRequestedOutputs(request.desired)) }
        if !retired.isEmpty { reapRetired() }
        let end = buffer.presentationTime.nanoseconds.map { $0 + (buffer.duration.nanoseconds ?? 0) } ?? deliveredEnd
        if end > deliveredEnd { deliveredEnd = end }
        switch type {
        case .video:
            guard videoEncoder != nil else { return }
            // The source's sync offset, as set now (one atomic load). A frame it puts before the
            // start, or not after the last frame sent (the offset was made smaller), goes: the
            // timestamps only go forward.
            let offset = offsetControl.offset(of: .video)
            guard let time = buffer.presentationTime.nanoseconds.map({ $0 + offset }) else { return try encodeVideo(buffer) }
            if time < 0 || lastVideoTime.map({ time <= $0 }) ?? false {
                framesDroppedByOffset += 1
                videoEncoder?.skippedFrame()
                for encode in extraEncodes { encode.encoder.skippedFrame() }
                return
            }
            if offset == 0 {
                try encodeVideo(buffer)
            } else {
                try encodeVideo(buffer.retimed(to: MediaTime(nanoseconds: time)))
            }
        case .audioMic, .audioApp:
            try processAudio(buffer, of: type)
        }
    }

    /// A video frame, on its timeline (its offset applied).
    private func encodeVideo(_ buffer: borrowing SampleBuffer) throws {
        guard let videoEncoder else { return }
        let time = buffer.presentationTime.nanoseconds ?? 0
        if resumedSinceVideo, let last = lastVideoTime, let rate = configuration.video?.frameRate,
            rate.numerator > 0, time - last < 1_000_000_000 * Int64(rate.denominator) / Int64(rate.numerator)
        {
            // A pause cut out a stretch of capture that is not a whole number of frames: the
            // first frame after it can fall less than a frame period after the one before it.
            // Players and transcoders that count in frames (1/fps) would give both the same
            // timestamp ("non monotonically increasing dts"): this frame goes; the next one is
            // between one and two periods after the last.
            framesDroppedAfterResume += 1
            videoEncoder.skippedFrame()
            for encode in extraEncodes { encode.encoder.skippedFrame() }
            return
        }
        if configuration.frameRateMode == .vfr, let settings = configuration.video {
            let interval = Int64(settings.keyframeIntervalSeconds * 1_000_000_000)
            let keyframeDue = lastKeyframeTime.map { time - $0 >= interval } ?? true
            if buffer.isRepeat, !keyframeDue {
                // The picture did not change: no frame (its changes, none, are not lost to the
                // encoder's kept picture). The last one is sent at the end so the file is as long.
                repeatsNotSent += 1
                unsentRepeatTime = time
                return
            }
            unsentRepeatTime = nil
            if keyframeDue {
                forceKeyframe()
                lastKeyframeTime = time
            }
        }
        resumedSinceVideo = false
        lastVideoTime = time
        if keyframeRequest.load(ordering: .relaxed), keyframeRequest.exchange(false, ordering: .acquiring) {
            forceKeyframe()
        }
        try route(media { () throws(FFmpegError) in try videoEncoder.encode(buffer) })
        for encode in extraEncodes {
            if encode.controller != nil { adapt(encode) }
            try route(media { () throws(FFmpegError) in try encode.encoder.encode(buffer) }, encode: encode.status)
        }
        if buffer.videoFormat?.pixelFormat == .mjpeg {
            counters.undecodableFrames.store(videoEncoder.undecodableFrames, ordering: .relaxed)
        }
    }

    /// An audio buffer: resampled on its capture timestamps, then moved by its source's offset
    /// into the mix and its own track, whose aligners keep the track continuous across a change
    /// (silence for a gap, an overlap dropped).
    private func processAudio(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        guard let settings = configuration.audio, audioLayout != nil, let format = buffer.audioFormat else { return }
        if resamplers[type]?.input != format {
            resamplers[type] = try media { () throws(FFmpegError) in
                try Resampler(
                    input: format,
                    outputRate: settings.sampleRate,
                    outputChannels: settings.channels
                )
            }
        }
        let resampler = resamplers[type]!
        let position = buffer.presentationTime.rescaled(to: Int32(settings.sampleRate)).value
        // Converted and steered onto the timestamps (a device clock's drift is resampled away).
        // Lent from stage to stage (the resampler's storage, then the mixer's): no copies, no
        // allocation per buffer.
        var converted = try media { () throws(FFmpegError) in try resampler.resample(buffer, at: position) }
        // The source's sync offset, as set now (one atomic load), in output samples. Applied
        // after the resampler, which keeps steering on the capture timestamps: a change is a
        // jump the aligners below fill with silence or take the overlap out of.
        let lead = audioLead(of: type, sampleRate: settings.sampleRate)
        if let start = buffer.presentationTime.nanoseconds {
            let end = start + (buffer.duration.nanoseconds ?? 0)
            audioEnd = max(audioEnd, (end * Int64(settings.sampleRate) + 500_000_000) / 1_000_000_000)
        }
        if lead != 0 {
            audioOffsetApplied = true
            converted.startSample += lead
            // An early source's first samples belong before the start: they go.
            if converted.startSample < 0 {
                let before = Int(-converted.startSample)
                if before >= converted.frameCount { return }
                converted = converted.dropping(first: before)
            }
        }
        // The microphone denoised first (before its volume, its track and the mix), in the
        // suppressor's 10 ms frames: what is ready comes out at its own positions (a changed
        // offset is a jump, which flushes what it holds first).
        if type == .audioMic, let micDenoiser {
            try micDenoiser.denoise(converted) { denoised in try deliverAudio(denoised, of: type, lead: lead) }
        } else {
            try deliverAudio(converted, of: type, lead: lead)
        }
    }

    /// A source's sync offset as set now, in samples at `sampleRate` (rounded to the nearest).
    private func audioLead(of type: SampleBufferType, sampleRate: Int) -> Int64 {
        let offset = offsetControl.offset(of: type)
        return offset == 0 ? 0 : (offset * Int64(sampleRate) + (offset > 0 ? 500_000_000 : -500_000_000)) / 1_000_000_000
    }

    /// Hands a source's samples (on the timeline, at the encoder's rate, its offset `lead` in
    /// samples applied) to the mix and to the source's own track, and to their encodes at other
    /// outputs' bitrates. Session thread.
    private func deliverAudio(_ converted: PlanarAudio, of type: SampleBufferType, lead: Int64) throws {
        // The source's volume and mute, as set now (one atomic load): applied to its part of
        // the mix and to its own track alike.
        let gain = audioControl.gain(of: type)
        if let audioEncoder, let mixer {
            mixer.append(converted, from: type, gain: gain, lead: lead)
            while let mixed = mixer.mixed() {
                if let index = mixTrackIndex { audioTrackTap?(index, mixed) }
                try route(media { () throws(FFmpegError) in try audioEncoder.encode(mixed) })
                if let opusEncoder { try route(media { () throws(FFmpegError) in try opusEncoder.encode(mixed) }, opus: true) }
                for extra in extraAudio where extra.track == mixTrackIndex {
                    try route(media { () throws(FFmpegError) in try extra.encoder.encode(mixed) }, own: true)
                }
            }
        }
        for track in sourceTracks where track.type == type {
            track.aligner.append(converted, from: type, gain: gain, lead: lead)
            while let samples = track.aligner.mixed() {
                if let index = sourceTrackIndex[type] { audioTrackTap?(index, samples) }
                try route(media { () throws(FFmpegError) in try track.encoder.encode(samples) })
                for extra in extraAudio where extra.track == sourceTrackIndex[type] {
                    try route(media { () throws(FFmpegError) in try extra.encoder.encode(samples) }, own: true)
                }
            }
        }
    }

    public func broadcastResumed() {
        resumedSinceVideo = true
        mediaClock.resumed()
    }

    /// A source lost its device or got it back: logged (the outputs keep going meanwhile, with the
    /// source's "no signal" slate or silence), so a log says when a recording shows what.
    public func sourceHealthChanged(_ health: CaptureHealth, of type: SampleBufferType) {
        switch health.state {
        case .deviceLost:
            logger.warning("\(type) source health: device lost (\(health.deviceLosses) so far); the outputs get \(type == .video ? "a no-signal slate" : "silence") until it is back")
        case .capturing:
            logger.notice("\(type) source health: capturing again (losses so far: \(health.deviceLosses))")
        }
    }

    /// Runs a BroadcastMedia call, turning its error into the session's kind.
    private func media<T>(_ body: () throws(FFmpegError) -> T) throws(BroadcastError) -> T {
        do {
            return try body()
        } catch {
            throw BroadcastError(.outputFailed, "\(error)")
        }
    }

    public func broadcastFinished() {
        guard !finished else { return }
        finished = true
        for (type, resampler) in resamplers.sorted(by: { "\($0.key)" < "\($1.key)" })
        where resampler.correctionPPM != 0 || resampler.jumps > 0 {
            logger.info(
                "\(type) audio kept on its timestamps: resampled \(Int(resampler.correctionPPM.rounded())) ppm off nominal at the end, \(resampler.jumps) jumps (\(resampler.jumpsOverLosses) over buffers lost before them)"
            )
        }
        do {
            // The microphone's last samples still inside the suppressor (a frame and its delay).
            if let micDenoiser {
                let lead = audioLead(of: .audioMic, sampleRate: configuration.audio?.sampleRate ?? 48_000)
                try micDenoiser.finish { denoised in try deliverAudio(denoised, of: .audioMic, lead: lead) }
                if micDenoiser.failedFrames > 0 { logger.warning("audio: noise suppression left \(micDenoiser.failedFrames) frames as they were (the library refused them)") }
            }
            if let audioEncoder, mixer != nil {
                if let mixed = mixer!.mixed(final: true, until: audioOffsetApplied ? audioEnd : nil) {
                    try route(audioEncoder.encode(mixed))
                    if let opusEncoder { try route(opusEncoder.encode(mixed), opus: true) }
                    for extra in extraAudio where extra.track == mixTrackIndex { try route(extra.encoder.encode(mixed), own: true) }
                }
                try route(audioEncoder.flush())
                if let opusEncoder { try route(opusEncoder.flush(), opus: true) }
            }
            for track in sourceTracks {
                if let samples = track.aligner.mixed(final: true, until: audioOffsetApplied ? audioEnd : nil) {
                    try route(track.encoder.encode(samples))
                    for extra in extraAudio where extra.track == sourceTrackIndex[track.type] {
                        try route(extra.encoder.encode(samples), own: true)
                    }
                }
                try route(track.encoder.flush())
            }
            for extra in extraAudio { try route(extra.encoder.flush(), own: true) }
            if let videoEncoder {
                if let time = unsentRepeatTime {
                    try route(videoEncoder.repeatLastPicture(at: MediaTime(nanoseconds: time)))
                    for encode in extraEncodes {
                        try route(encode.encoder.repeatLastPicture(at: MediaTime(nanoseconds: time)), encode: encode.status)
                    }
                }
                try route(videoEncoder.flush())
                for encode in extraEncodes { try route(encode.encoder.flush(), encode: encode.status) }
            }
        } catch {
            record(BroadcastError(.outputFailed, "flushing the encoders: \(error)"))
        }
        if let videoEncoder {
            // Every frame the session delivered is either encoded or left out here, for a reason
            // with a count: a check of "delivered = in the file" must subtract these (a starved
            // device handing over two buffers within 1 ms of each other is one).
            logger.info(
                "video: \(counters.videoFrames.load(ordering: .relaxed)) frames encoded; left out: \(videoEncoder.droppedFrames) less than 1 ms after the previous, \(videoEncoder.undecodableFrames) undecodable, \(framesDroppedAfterResume) too close after a resume, \(repeatsNotSent) unchanged (vfr), \(framesDroppedByOffset) moved before the start or the previous frame by --video-offset"
            )
        }
        // The encoders are done: their memory (x264's frames and lookahead, tens of MB at 1080p)
        // goes back before the recordings are finalized, which builds a long file's whole index
        // in memory; the process's peak stays the recording's.
        videoEncoder = nil
        extraEncodes = []
        extraAudio = []
        audioEncoder = nil
        opusEncoder = nil
        sourceTracks = []
        resamplers = [:]
        micDenoiser = nil
        // Every output sends what it has (a live one for at most its finish timeout) and closes;
        // recordings are finalized on their own threads, together.
        for output in outputs { output.end() }
        for output in outputs + retired {
            output.join()
            keepFailure(of: output)
        }
        retired = []
        updateBytesWritten()
    }

    private func record(_ error: BroadcastError) {
        logger.error("\(error)")
        failures.append(error)
    }

    /// Counts the packets and hands each to every output. An output that fails reports it while
    /// the others go on; when every output has failed the broadcast cannot go on. Audio goes to
    /// the outputs of its codec: `opus` (the second encode of the same samples) to WHIP outputs
    /// only, counted there, AAC to the others.
    private func route(
        _ packets: [EncodedPacket], opus: Bool = false, encode: VideoEncodeStatus? = nil, own: Bool = false
    ) throws {
        guard !packets.isEmpty else { return }
        if own {
            // An output's own audio encode: to the outputs that carry its stream, not counted in
            // the broadcast's figures (its first encodes').
            for packet in packets { for output in outputs where output.carries(packet.streamIndex) { output.offer(packet) } }
            return
        }
        if opus {
            for packet in packets { for output in outputs where output.isWebRTC { output.offer(packet) } }
            return
        }
        if let encode {
            // An output's own encode: counted apart (the broadcast's figures are its first encode's).
            for packet in packets {
                encode.count(packet)
                for output in outputs where output.carries(packet.streamIndex) { output.offer(packet) }
            }
            return
        }
        for packet in packets {
            if packet.mediaType == .video { defaultEncodeStatus?.count(packet) }
            switch packet.mediaType {
            case .video: counters.videoFrames.wrappingIncrement(ordering: .relaxed)
            case .audio: counters.audioFrames.wrappingIncrement(ordering: .relaxed)
            }
            if packet.isKeyframe, packet.mediaType == .video {
                counters.keyframes.wrappingIncrement(ordering: .relaxed)
                let time = Int64((packet.presentationSeconds * 1e9).rounded())
                if time > lastKeyframeTime ?? .min { lastKeyframeTime = time }
            }
            measureBitrate(packet)
            // WHIP outputs take the video and the Opus (routed apart), no AAC track.
            for output in outputs where output.carries(packet.streamIndex) && (packet.mediaType == .video || !output.isWebRTC) {
                output.offer(packet)
            }
        }
        updateBytesWritten()
        // Every current output failed (the counter also counts outputs a reload has removed since:
        // it is only the cheap test whether to look).
        if !outputs.isEmpty, counters.failedOutputs.load(ordering: .relaxed) > 0, outputs.allSatisfy({ $0.state == .failed }) {
            let last = outputs.compactMap { $0.statistics().lastError }.last ?? "unknown error"
            throw BroadcastError(.outputFailed, "every output failed; the last error: \(last)")
        }
    }

    private func measureBitrate(_ packet: EncodedPacket) {
        let time = packet.decodingSeconds
        bitrateWindowBytes += packet.size
        guard let start = bitrateWindowStart else {
            bitrateWindowStart = time
            return
        }
        let elapsed = time - start
        if elapsed >= 1 {
            counters.bitrate.store(Int(Double(bitrateWindowBytes * 8) / elapsed), ordering: .relaxed)
            bitrateWindowStart = time
            bitrateWindowBytes = 0
        }
    }

    private func updateBytesWritten() {
        var total: Int64 = 0
        // Recordings only: a replay output's saves are files of their own (its status has them).
        for output in outputs where !output.destination.isLive && !output.isReplay {
            total += output.status.bytes.load(ordering: .relaxed)
        }
        if total > counters.bytesWritten.load(ordering: .relaxed) {
            counters.bytesWritten.store(total, ordering: .relaxed)
        }
    }
}
