import BroadcastCapture
public import BroadcastKit
public import BroadcastMedia
public import BroadcastOutputs
import BroadcastService
import BroadcastWebRTC

/// How to encode, typed: what record's and stream's --video-bitrate, --preset, ... and the daemon
/// config's [encoder] table say, each parsed by its `Options` spec.
public struct EncoderSettings: Sendable, Hashable {
    public var videoBitrate: Int = Options.videoBitrate.defaultValue
    public var audioBitrate: Int = Options.audioBitrate.defaultValue
    public var encoder: String = Options.encoder.defaultValue
    public var preset: String = Options.preset.defaultValue
    /// nil: no tune ("none").
    public var tune: String? = Options.tune.defaultValue
    /// nil: vbr to a file, cbr to a stream.
    public var rateControl: RateControlChoice?
    public var crf: Int = Options.crf.defaultValue
    public var keyframeInterval: MediaTime = Options.keyframeInterval.defaultValue
    public var frameRateMode: FrameRateMode = Options.frameRateMode.defaultValue
    /// nil: the encoder's choice.
    public var profile: String?
    public var threads: Int = Options.threads.defaultValue
    /// One mixed audio track, one per source, or both.
    public var audioTracks: AudioTrackMode = Options.audioTracks.defaultValue
    /// The microphone's and the application audio's volume (dB) and mute at the start.
    public var micLevel = AudioLevel()
    public var appLevel = AudioLevel()
    /// The microphone's noise suppression (`--mic-denoise`, `[audio] mic_denoise`).
    public var micDenoise: Bool = Options.micDenoise.defaultValue
    /// Each source's sync offset (`--mic-offset`, `--app-offset`, `--video-offset`; `[audio]
    /// mic_offset`, `app_offset`, `[video] offset`): like the levels, changed while running.
    public var offsets = SourceOffsets()

    public init() {}

    /// `--mic-denoise` with `--audio-mic none`: there is nothing it could apply to.
    static let noMicrophoneToDenoise = OptionError(
        Options.micDenoise.name, "--mic-denoise needs a microphone: --audio-mic is 'none'", others: [Options.audioMic.name])

    /// The `[encoder]` keys whose values differ in `other`, each as "key old → new", in the
    /// config's order; the levels (`[audio]`'s volumes and mutes) are not among them.
    func changedKeys(to other: EncoderSettings) -> [String] {
        var changed: [String] = []
        func compare<T: Equatable>(_ option: OptionName, _ a: T, _ b: T, _ text: (T) -> String) {
            if a != b { changed.append("\(option.key) \(text(a)) → \(text(b))") }
        }
        compare(Options.videoBitrate.name, videoBitrate, other.videoBitrate) { "\($0)" }
        compare(Options.audioBitrate.name, audioBitrate, other.audioBitrate) { "\($0)" }
        compare(Options.encoder.name, encoder, other.encoder) { $0 }
        compare(Options.preset.name, preset, other.preset) { $0 }
        compare(Options.tune.name, tune, other.tune) { $0 ?? "none" }
        compare(Options.rateControl.name, rateControl, other.rateControl) { $0?.rawValue ?? "default" }
        compare(Options.crf.name, crf, other.crf) { "\($0)" }
        compare(Options.keyframeInterval.name, keyframeInterval, other.keyframeInterval) { "\($0.seconds) s" }
        compare(Options.frameRateMode.name, frameRateMode, other.frameRateMode) { $0.rawValue }
        compare(Options.profile.name, profile, other.profile) { $0 ?? "default" }
        compare(Options.threads.name, threads, other.threads) { "\($0)" }
        compare(Options.audioTracks.name, audioTracks, other.audioTracks) { $0.rawValue }
        compare(Options.micDenoise.name, micDenoise, other.micDenoise) { "\($0)" }
        return changed
    }

    public func videoSettings(size: VideoSize, frameRate: FrameRate, live: Bool) throws -> VideoEncoderSettings {
        let control: RateControl
        switch rateControl ?? (live ? .cbr : .vbr) {
        case .cbr: control = .cbr
        case .vbr: control = .vbr
        case .crf: control = .crf(crf)
        }
        let settings = VideoEncoderSettings(
            encoder: encoder,
            width: size.width,
            height: size.height,
            frameRate: frameRate,
            bitrate: videoBitrate,
            rateControl: control,
            preset: preset,
            tune: tune,
            profile: profile,
            keyframeIntervalSeconds: keyframeInterval.seconds,
            threads: threads
        )
        if encoder == "libx264", let problem = settings.problem() { throw ValueError(problem) }
        return settings
    }

    /// The video encode of an output that asks for one of its own (`size`, `video_bitrate`, ...):
    /// these settings at `encode.size` (nil: the picture's), at most the picture's size; rate
    /// control cbr for a stream and vbr for a file unless set; the broadcast's colour.
    /// Gives `output` the encode `encode` asks for (`resolve`), and when it is adaptive, makes that
    /// encode its own (never shared) with its range: `min_video_bitrate`, else a quarter of its bitrate.
    static func apply(
        _ encode: OutputEncode, to output: inout OutputConfiguration, picture: VideoSize, frameRate: FrameRate, colour: VideoColour?
    ) throws {
        output.audioBitrate = encode.audioBitrate
        guard encode.asksVideo else { return }
        var video = try resolve(encode, picture: picture, frameRate: frameRate, live: output.destination.isLive, colour: colour)
        output.video = video
        guard encode.adaptive else { return }
        if let problem = OutputEncode.adaptiveProblem(output.destination) { throw OptionError(Options.adaptive.name, problem) }
        let minimum = encode.minimumBitrate ?? max(Options.bitrateRange.lowerBound, video.bitrate / 4)
        if minimum > video.bitrate {
            throw OptionError(
                Options.minVideoBitrate.name,
                "invalid --min-video-bitrate \(minimum / 1000)k: above the output's video bitrate (\(video.bitrate / 1000)k)",
                others: [Options.videoBitrate.name])
        }
        video.adaptiveFor = output.name
        output.video = video
        output.adaptiveMinimum = minimum
    }

    static func resolve(
        _ encode: OutputEncode, picture: VideoSize, frameRate: FrameRate, live: Bool, colour: VideoColour?
    ) throws -> VideoEncoderSettings {
        let size = encode.size ?? picture
        if size.width > picture.width || size.height > picture.height {
            throw OptionError(
                Options.size.name,
                "invalid size \(size.width)x\(size.height): larger than the picture (\(picture.width)x\(picture.height)); an output's encode scales the picture down, never up")
        }
        var settings = try encode.encoder.videoSettings(size: size, frameRate: frameRate, live: live)
        settings.colour = colour
        return settings
    }

    /// The frame rate mode; vfr is refused when `live` (a stream among the outputs).
    public func rateMode(live: Bool) throws -> FrameRateMode {
        if frameRateMode == .vfr, live {
            throw OptionError(
                Options.frameRateMode.name,
                "--frame-rate-mode vfr is for files only: a live output needs a constant frame rate (cfr)")
        }
        return frameRateMode
    }

    public func audioSettings() -> AudioEncoderSettings {
        AudioEncoderSettings(bitrate: audioBitrate)
    }

    /// The encode of `sources` into `outputs` (record, stream and the daemon's start): video at
    /// `size` and `frameRate` with rate control for a stream when `liveTuning`, audio when a source
    /// gives it, the frame-rate mode (vfr refused with a live output), the sources' own colour;
    /// validated, then sized within `budget` (which also sizes the sources' pools).
    public func configuration(
        for sources: [(type: SampleBufferType, source: any CaptureSource)],
        size: VideoSize, encodeSize: VideoSize? = nil, frameRate: FrameRate,
        outputs: [OutputConfiguration], encodes: [String: OutputEncode] = [:], liveTuning: Bool, budget: Int64,
        replayLimitsSet: Set<String>
    ) throws -> (EncodingConfiguration, MemoryPlan) {
        let hasVideo = sources.contains { $0.type == .video }
        let hasAudio = sources.contains { $0.type.isAudio }
        let colour = SourceSettings.videoColour(sources)
        var outputs = outputs
        for i in outputs.indices {
            guard let encode = encodes[outputs[i].name] else { continue }
            if hasVideo {
                try Self.apply(encode, to: &outputs[i], picture: size, frameRate: frameRate, colour: colour)
            } else {
                outputs[i].audioBitrate = encode.audioBitrate
            }
        }
        var configuration = EncodingConfiguration(
            video: hasVideo ? try videoSettings(size: encodeSize ?? size, frameRate: frameRate, live: liveTuning) : nil,
            audio: hasAudio ? audioSettings() : nil,
            recordings: [],
            outputs: outputs
        )
        configuration.frameRateMode = try rateMode(live: outputs.contains { $0.destination.isLive })
        configuration.audioTracks = audioTracks
        configuration.audioSources = sources.map(\.type).filter(\.isAudio)
        configuration.audioLevels = [.audioMic: micLevel, .audioApp: appLevel]
        if micDenoise {
            guard configuration.audioSources.contains(.audioMic) else { throw Self.noMicrophoneToDenoise }
            configuration.micDenoise = true
        }
        configuration.sourceOffsets = offsets
        configuration.video?.colour = colour
        configuration.webRTC = GStreamerWebRTC()
        try configuration.validate()
        return try MemoryBudgeting.plan(configuration, budget: budget, sources: sources, replayLimitsSet: replayLimitsSet)
    }
}

/// An output's own encode as asked (`[[output]]` keys `size`, `video_bitrate`, `rate_control`,
/// `crf`, `preset`, `profile`, `keyframe_interval`; `--record-size`, ...): the broadcast's
/// `[encoder]` settings with those applied, and the size (nil: the picture's). Outputs whose
/// encodes come out the same share one.
public struct OutputEncode: Sendable, Hashable {
    public var encoder: EncoderSettings
    public var size: VideoSize?
    /// A live output whose video bitrate follows its network (`--adaptive`, `adaptive = true`),
    /// from `minimumBitrate` (nil: a quarter of its bitrate) up to its bitrate.
    public var adaptive = false
    public var minimumBitrate: Int?
    /// The output's own audio bitrate (`audio_bitrate`), nil: the broadcast's.
    public var audioBitrate: Int?
    /// Whether a video key was given (or the encode was made for its video): an output that asks
    /// only for its own audio bitrate keeps the broadcast's video encode.
    public var asksVideo: Bool

    public init(
        encoder: EncoderSettings, size: VideoSize? = nil, adaptive: Bool = false, minimumBitrate: Int? = nil, asksVideo: Bool = true
    ) {
        self.encoder = encoder
        self.size = size
        self.adaptive = adaptive
        self.minimumBitrate = minimumBitrate
        self.asksVideo = asksVideo
    }

    /// Why `destination` cannot adapt its bitrate, or nil.
    public static func adaptiveProblem(_ destination: OutputDestination) -> String? {
        switch destination {
        case .file(let path): "adaptive is for live outputs (rtmp://, rtmps://, srt://, whip+https://), not the file \(path)"
        case .live: nil
        }
    }

    /// The keys an output may set, in the config's words (`[[output]]`), each one `[encoder]`'s or
    /// `[video]`'s option: the same names, values and limits.
    public static let keys = [
        "size", "video_bitrate", "rate_control", "crf", "preset", "profile", "keyframe_interval", "adaptive", "min_video_bitrate",
        "audio_bitrate",
    ]

    /// Sets `key` (one of `keys`) from `text`, through the option's own parser.
    public mutating func set(_ key: String, _ text: String) throws(OptionError) {
        switch key {
        case "size": size = try Options.size.parse(text)
        case "video_bitrate": encoder.videoBitrate = try Options.videoBitrate.parse(text)
        case "rate_control": encoder.rateControl = try Options.rateControl.parse(text)
        case "crf": encoder.crf = try Options.crf.parse(text)
        case "preset": encoder.preset = try Options.preset.parse(text)
        case "profile": encoder.profile = try Options.profile.parse(text)
        case "keyframe_interval": encoder.keyframeInterval = try Options.keyframeInterval.parse(text)
        case "adaptive": adaptive = try Options.adaptive.parse(text)
        case "min_video_bitrate": minimumBitrate = try Options.minVideoBitrate.parse(text)
        case "audio_bitrate": audioBitrate = try Options.audioBitrate.parse(text)
        default: preconditionFailure("not an output encode key: \(key)")
        }
        if key != "audio_bitrate" { asksVideo = true }
    }
}
