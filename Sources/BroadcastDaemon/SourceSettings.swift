public import BroadcastCapture
public import BroadcastKit
import BroadcastComposition
public import BroadcastMedia
public import Logging

/// Where media comes from, typed: what `broadcast record`'s --video, --audio-mic, --size, ... and
/// the daemon config's [video] and [audio] tables say, each parsed by its `Options` spec.
public struct SourceSettings: Sendable, Hashable {
    public var video: VideoSourceSpec = Options.video.defaultValue
    public var audioMic: AudioSourceSpec = Options.audioMic.defaultValue
    public var audioApp: AudioSourceSpec = Options.audioApp.defaultValue
    /// An ALSA source's period (--audio-period), in nanoseconds.
    public var audioPeriodNanoseconds: Int64 = Options.audioPeriod.defaultValue
    /// nil: 1280x720, or the captured X11 area's or PipeWire stream's size (`outputSize`).
    public var size: VideoSize?
    public var frameRate: FrameRate = Options.fps.defaultValue
    /// A V4L2 device's input (nil: its current one).
    public var videoInput: Int?
    /// A V4L2 device's pixel format (nil: the first one it offers that fits).
    public var videoFormat: FourCC?
    /// Test sources at clock speed (false: as fast as the pipeline takes them).
    public var realtime = true
    /// Pictures drawn over the video source, in order (further `--video`s, `[video] layers`).
    public var layers: [VideoLayerSpec] = []
    /// Named layouts of layers (the daemon's `[scenes]`); the first is shown at the start.
    public var scenes: [SceneSpec] = []

    public init() {}

    /// The size asked for, else 1280x720.
    public var videoSize: VideoSize { size ?? VideoSize(width: 1280, height: 720) }

    /// The encoder's size: the size asked for when given, else an X11 source's current size
    /// (rounded down to even numbers), else a PipeWire stream's, else 1280x720.
    public func outputSize(for sources: [(type: SampleBufferType, source: any CaptureSource)]) -> VideoSize {
        if let composite = sources.lazy.compactMap({ $0.source as? LayeredVideoSource }).first {
            return VideoSize(width: composite.width, height: composite.height)
        }
        if size == nil, let x11 = sources.first(where: { $0.source is X11ScreenSource })?.source as? X11ScreenSource,
            let native = try? x11.currentSize()
        {
            return VideoSize(width: max(16, native.width & ~1), height: max(16, native.height & ~1))
        }
        if size == nil, let cast = sources.lazy.compactMap({ $0.source as? PipeWireVideoSource }).first,
            let native = cast.announcedSize
        {
            return VideoSize(width: max(16, native.width & ~1), height: max(16, native.height & ~1))
        }
        return videoSize
    }

    /// The capture source one video spec names (nil for `none`), asked for `size` where it takes one.
    func videoSource(
        _ spec: VideoSourceSpec, size: VideoSize, rate: (numerator: Int, denominator: Int), logger: Logger?
    ) throws -> (any CaptureSource)? {
        switch spec {
        case .test(let bt601, let stallAfter):
            return TestPatternSource(
                width: size.width, height: size.height, frameRate: rate, realtime: realtime, stallAfter: stallAfter, bt601: bt601)
        case .testLost(let from, let until):
            let pattern = TestPatternSource(width: size.width, height: size.height, frameRate: rate, realtime: realtime)
            pattern.lostDuring = (from.nanoseconds ?? 0)..<(until.nanoseconds ?? 0)
            return pattern
        case .none:
            return nil
        case .x11(let spec):
            return X11ScreenSource(spec: spec, frameRate: rate, logger: logger ?? Logger(label: "broadcast.x11"))
        case .pipeWire:
            var single = self
            single.video = spec
            return try single.pipeWireVideoSource(rate: rate)
        case .v4l2(let path):
            return try v4l2Source(path: path, width: size.width, height: size.height, rate: rate)
        }
    }

    /// Whether these settings capture video at all.
    public var hasVideo: Bool { video != .none }

    /// What the video source's YUV is, when the encoder takes it without a matrix change (the test
    /// pattern, a YUV or MJPEG V4L2 device); nil for RGB sources, which the encoder converts.
    static func videoColour(_ sources: [(type: SampleBufferType, source: any CaptureSource)]) -> VideoColour? {
        switch sources.first(where: { $0.type == .video })?.source {
        case let test as TestPatternSource: test.colour
        case let device as V4L2Source: device.colour
        case let composite as LayeredVideoSource: composite.colour
        default: nil
        }
    }

    /// The capture sources these settings name, one per buffer type. `openingPortal: false` leaves
    /// a portal/PipeWire video source out (for validating a config: each ask of the portal is a
    /// Start, i.e. a prompt or a spent restore token).
    public func makeSources(logger: Logger? = nil, openingPortal: Bool = true) throws -> [(type: SampleBufferType, source: any CaptureSource)] {
        try makeSources(logger: logger, openingPortal: openingPortal, blame: { _, error in error })
    }

    /// `makeSources`, each failure passed through `blame` with the option whose source failed (the
    /// daemon's config turns it into file:line: key).
    func makeSources(
        logger: Logger?, openingPortal: Bool, blame: (OptionName, any Error) -> any Error
    ) throws -> [(type: SampleBufferType, source: any CaptureSource)] {
        let rate = (numerator: frameRate.numerator, denominator: frameRate.denominator)
        var sources: [(type: SampleBufferType, source: any CaptureSource)] = []
        /// A portal/PipeWire video spec checked but not opened (`openingPortal` false).
        var videoLeftOut = false
        do {
            if case .pipeWire = video, !openingPortal {
                videoLeftOut = true
            } else if let source = try videoSource(video, size: videoSize, rate: rate, logger: logger) {
                sources.append((.video, source))
            }
        } catch {
            throw blame(Options.video.name, error)
        }
        if !layers.isEmpty || !scenes.isEmpty {
            guard let base = sources.first?.source else {
                if videoLeftOut { return sources }
                throw OptionError(Options.video.name, "--video none cannot have layers over it: the first --video is the base picture")
            }
            let layered = try composite(
                base: base, frame: outputSize(for: sources), rate: rate, logger: logger, openingPortal: openingPortal, blame: blame)
            sources[0] = (.video, layered)
        }
        for (type, spec, option) in [(SampleBufferType.audioMic, audioMic, Options.audioMic.name), (.audioApp, audioApp, Options.audioApp.name)] {
            do {
                switch spec {
                case .test(let period):
                    if let period {
                        let ns = period.nanoseconds ?? 0
                        sources.append((type, ToneSource(periodFrames: Int(ns * 48_000 / 1_000_000_000), realtime: realtime)))
                    } else {
                        sources.append((type, ToneSource(realtime: realtime)))
                    }
                case .none:
                    break
                case .pipeWire(let target):
                    sources.append((type, try pipeWireAudioSource(target, periodNanoseconds: audioPeriodNanoseconds)))
                case .systemDefault:
                    if PipeWireAudioGraph.serverAnswers {
                        sources.append((type, try pipeWireAudioSource(.defaultSource, periodNanoseconds: audioPeriodNanoseconds)))
                    } else {
                        sources.append((type, try alsaSource(name: "default", periodNanoseconds: audioPeriodNanoseconds)))
                    }
                case .alsa(let name):
                    sources.append((type, try alsaSource(name: name, periodNanoseconds: audioPeriodNanoseconds)))
                }
            } catch {
                throw blame(option, error)
            }
        }
        if sources.isEmpty && !videoLeftOut {
            throw OptionError(
                Options.video.name, "nothing to capture: --video, --audio-mic and --audio-app are all 'none'",
                others: [Options.audioMic.name, Options.audioApp.name])
        }
        return sources
    }
}
