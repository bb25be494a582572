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

    public init() {}

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
        size: VideoSize, frameRate: FrameRate,
        outputs: [OutputConfiguration], liveTuning: Bool, budget: Int64, replayLimitsSet: Set<String>
    ) throws -> (EncodingConfiguration, MemoryPlan) {
        let hasVideo = sources.contains { $0.type == .video }
        let hasAudio = sources.contains { $0.type.isAudio }
        var configuration = EncodingConfiguration(
            video: hasVideo ? try videoSettings(size: size, frameRate: frameRate, live: liveTuning) : nil,
            audio: hasAudio ? audioSettings() : nil,
            recordings: [],
            outputs: outputs
        )
        configuration.frameRateMode = try rateMode(live: outputs.contains { $0.destination.isLive })
        configuration.audioTracks = audioTracks
        configuration.audioSources = sources.map(\.type).filter(\.isAudio)
        configuration.audioLevels = [.audioMic: micLevel, .audioApp: appLevel]
        configuration.video?.colour = SourceSettings.videoColour(sources)
        configuration.webRTC = GStreamerWebRTC()
        try configuration.validate()
        return try MemoryBudgeting.plan(configuration, budget: budget, sources: sources, replayLimitsSet: replayLimitsSet)
    }
}
