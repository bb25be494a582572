import ArgumentParser
import BroadcastCapture
import BroadcastKit
import BroadcastMedia
import BroadcastOutputs

/// How to encode: shared by record and stream.
struct EncoderOptions: ParsableArguments {
    @Option(name: .customLong("video-bitrate"), help: ArgumentHelp("Video bitrate: 3M, 2500k.", valueName: "rate"))
    var videoBitrate: String = "3M"

    @Option(name: .customLong("audio-bitrate"), help: ArgumentHelp("Audio bitrate: 128k.", valueName: "rate"))
    var audioBitrate: String = "128k"

    @Option(help: ArgumentHelp("Video encoder: libx264, or h264_nvenc (NVIDIA; falls back to libx264 when it cannot open).", valueName: "name"))
    var encoder: String = "libx264"

    @Option(help: ArgumentHelp("x264 preset, ultrafast ... veryslow.", valueName: "name"))
    var preset: String = "veryfast"

    @Option(help: ArgumentHelp("x264 tune: zerolatency (default, no B-frames or lookahead), film, animation, ... or none.", valueName: "name"))
    var tune: String = "zerolatency"

    @Option(name: .customLong("rate-control"), help: ArgumentHelp("cbr, vbr or crf (default: vbr to a file, cbr to a stream).", valueName: "mode"))
    var rateControl: String?

    @Option(help: ArgumentHelp("Quality for --rate-control crf, 0-51, lower is better.", valueName: "n"))
    var crf: Int = 23

    @Option(name: .customLong("keyframe-interval"), help: ArgumentHelp("Time between keyframes: 2s.", valueName: "duration"))
    var keyframeInterval: String = "2s"

    @Option(
        name: .customLong("frame-rate-mode"),
        help: ArgumentHelp(
            "cfr: a frame every tick (default). vfr (files only): a frame when the screen changed, a keyframe at least every --keyframe-interval.",
            valueName: "mode"))
    var frameRateMode: String = "cfr"

    @Option(help: ArgumentHelp("H.264 profile: baseline, main or high (default: the encoder's choice).", valueName: "name"))
    var profile: String?

    @Option(help: ArgumentHelp("Encoder threads, 0 = automatic.", valueName: "n"))
    var threads: Int = 0

    static let tunes = ["zerolatency", "film", "animation", "grain", "stillimage", "fastdecode", "psnr", "ssim", "none"]

    func videoSettings(width: Int, height: Int, frameRate: (numerator: Int, denominator: Int), live: Bool) throws
        -> VideoEncoderSettings
    {
        let control: RateControl
        switch rateControl ?? (live ? "cbr" : "vbr") {
        case "cbr": control = .cbr
        case "vbr": control = .vbr
        case "crf":
            guard (0...51).contains(crf) else { throw ValueError("invalid --crf '\(crf)': accepted is 0 to 51") }
            control = .crf(crf)
        case let other: throw ValueError("invalid --rate-control '\(other)': accepted are cbr, vbr and crf")
        }
        guard VideoEncoderSettings.knownPresets.contains(preset) else {
            throw ValueError("unknown --preset '\(preset)': accepted are \(VideoEncoderSettings.knownPresets.joined(separator: ", "))")
        }
        guard Self.tunes.contains(tune) else {
            throw ValueError("unknown --tune '\(tune)': accepted are \(Self.tunes.joined(separator: ", "))")
        }
        if let profile, !["baseline", "main", "high"].contains(profile) {
            throw ValueError("unknown --profile '\(profile)': accepted are baseline, main and high")
        }
        guard threads >= 0, threads <= 64 else { throw ValueError("invalid --threads '\(threads)': accepted is 0 to 64") }
        // h264_vaapi is not offered: it needs frames uploaded to VAAPI surfaces, which we do not do.
        let known = ["libx264", "h264_nvenc"]
        guard known.contains(encoder) else {
            throw ValueError("unknown --encoder '\(encoder)': accepted are \(known.joined(separator: ", "))")
        }
        let keyframe = try Values.duration(keyframeInterval, option: "--keyframe-interval")
        // The GOP (interval × rate frames) is a 32-bit number in libavcodec; x264 itself caps it lower.
        guard keyframe.seconds <= 600 else {
            throw ValueError("invalid --keyframe-interval '\(keyframeInterval)': must be at most 10m")
        }
        let settings = VideoEncoderSettings(
            encoder: encoder,
            width: width,
            height: height,
            frameRate: FrameRate(numerator: frameRate.numerator, denominator: frameRate.denominator),
            bitrate: try Values.bitrate(videoBitrate, option: "--video-bitrate"),
            rateControl: control,
            preset: preset,
            tune: tune == "none" ? nil : tune,
            profile: profile,
            keyframeIntervalSeconds: keyframe.seconds,
            threads: threads
        )
        if encoder == "libx264", let problem = settings.problem() { throw ValueError(problem) }
        return settings
    }

    /// The frame rate mode; vfr is refused when `live` (a stream among the outputs).
    func rateMode(live: Bool) throws -> FrameRateMode {
        try Values.frameRateMode(frameRateMode, live: live)
    }

    func audioSettings() throws -> AudioEncoderSettings {
        AudioEncoderSettings(bitrate: try Values.bitrate(audioBitrate, option: "--audio-bitrate"))
    }

    /// The encode of `sources` into `outputs` (record, stream and the daemon's start): video at
    /// `size` and `frameRate` with rate control for a stream when `liveTuning`, audio when a source
    /// gives it, the frame-rate mode (vfr refused with a live output), the sources' own colour;
    /// validated, then sized within `budget` (which also sizes the sources' pools).
    func configuration(
        for sources: [(type: SampleBufferType, source: any CaptureSource)],
        size: (width: Int, height: Int), frameRate: (numerator: Int, denominator: Int),
        outputs: [OutputConfiguration], liveTuning: Bool, budget: Int64, replayLimitsSet: Set<String>
    ) throws -> (EncodingConfiguration, MemoryPlan) {
        let hasVideo = sources.contains { $0.type == .video }
        let hasAudio = sources.contains { $0.type.isAudio }
        var configuration = EncodingConfiguration(
            video: hasVideo ? try videoSettings(width: size.width, height: size.height, frameRate: frameRate, live: liveTuning) : nil,
            audio: hasAudio ? try audioSettings() : nil,
            recordings: [],
            outputs: outputs
        )
        configuration.frameRateMode = try rateMode(live: outputs.contains { $0.destination.isLive })
        configuration.video?.colour = SourceOptions.videoColour(sources)
        try configuration.validate()
        return try MemoryBudgeting.plan(configuration, budget: budget, sources: sources, replayLimitsSet: replayLimitsSet)
    }
}
