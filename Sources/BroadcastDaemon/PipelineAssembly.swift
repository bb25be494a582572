import BroadcastCapture
import BroadcastMedia
public import BroadcastKit
public import BroadcastOutputs
public import Logging

/// Sources → encode → outputs, built the one way `record`, `stream` and the daemon all use: the
/// capture sources (with a logger), the encoder's size (`SourceSettings.outputSize`: --size when
/// given, else a screen's own size, else 1280x720), its colour and settings, and the memory plan.
///
/// *Why one type*: the three used to assemble this each on their own and drifted (the daemon and
/// `stream` encoded a screen at 1280x720 where `record` took the screen's size; `stream` made its
/// sources without a logger). The CLI's `SamePipelineTests` holds them
/// together.
public struct PipelineAssembly {
    /// The capture sources, one per buffer type (video may be a composite of layers).
    public let sources: [(type: SampleBufferType, source: any CaptureSource)]
    /// What the built-in handler is made with: encoder settings sized within the budget.
    public let configuration: EncodingConfiguration
    public let plan: MemoryPlan

    /// Opens the sources `settings` name and plans the encode into `outputs`.
    /// - Parameters:
    ///   - liveTuning: rate control for a stream (cbr unless asked otherwise); nil: when one of
    ///     `outputs` is live. The daemon passes true: a reload may add a stream to a running encode.
    ///   - replayLimitsSet: the replay outputs whose memory limit was given (kept as is by the plan).
    ///   - encodes: the outputs (by name) that ask for an encode of their own.
    ///   - encodeSize: the broadcast's own encode's size when it is smaller than the picture (the
    ///     stream's `--size` under a larger `--record-size`); nil: the picture's.
    public init(
        sources settings: SourceSettings, encoder: EncoderSettings, outputs: [OutputConfiguration],
        encodes: [String: OutputEncode] = [:], encodeSize: VideoSize? = nil, liveTuning: Bool? = nil, budget: Int64,
        replayLimitsSet: Set<String>, logger: Logger
    ) throws {
        let sources = try settings.makeSources(logger: logger)
        (configuration, plan) = try encoder.configuration(
            for: sources, size: settings.outputSize(for: sources), encodeSize: encodeSize, frameRate: settings.frameRate, outputs: outputs,
            encodes: encodes,
            liveTuning: liveTuning ?? outputs.contains { $0.destination.isLive }, budget: budget,
            replayLimitsSet: replayLimitsSet)
        self.sources = sources
    }

    /// The built-in handler for this encode.
    public func makeHandler(logger: Logger, realtime: Bool = true) -> EncodingHandler {
        EncodingHandler(configuration: configuration, logger: logger, realtime: realtime)
    }

    /// A session of these sources into `handler`.
    public func makeSession(
        handler: any BroadcastSampleHandler, options: SessionOptions = SessionOptions(), logger: Logger
    ) -> BroadcastSession {
        BroadcastSession(handler: handler, sources: sources, options: options, logger: logger)
    }

    /// Says what the plan did: a notice when x264 was cut down to fit, else `quietly`'s level.
    public func logPlan(_ logger: Logger, quietly level: Logger.Level = .debug) {
        if plan.reducesEncoder {
            logger.notice("x264 reduced to fit the memory budget: \(plan)")
        } else {
            logger.log(level: level, "memory plan: \(plan)")
        }
    }
}

extension PipelineAssembly {
    /// FFmpeg's log (av_log) into `logger` from now on, each line through `redact` (a stream's
    /// keys scrubbed): what every command that encodes does first. Here so that the executable
    /// needs no BroadcastMedia of its own (docs/DESIGN.md, "The executable's imports").
    public static func logFFmpeg(into logger: Logger, redact: @escaping @Sendable (String) -> String = { $0 }) {
        FFmpegLog.install(logger, redact: redact)
    }
}
