import ArgumentParser
import BroadcastCapture
import BroadcastKit
import Logging

/// Where media comes from: shared by every command that captures.
struct SourceOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("Video source: 'test' (built-in pattern; 'test:colour=bt601' or 'bt709' paints it in that matrix whatever its size), 'x11:DISPLAY[+X,Y/WxH][?window=ID|title=TEXT,cursor=off,window-gone=keep]' (an X11 screen, region or window), 'portal[:window][?cursor=embedded|metadata|hidden]' (a Wayland desktop through the ScreenCast portal), 'pipewire:NODE' (a PipeWire video node by name or serial) or 'none'.", valueName: "source"))
    var video: String = "test"

    @Option(name: .customLong("audio-mic"), help: ArgumentHelp("Microphone audio (.audioMic): 'test' (built-in tone, in 10 ms periods; 'test:period=21ms' for another period), 'default' (PipeWire's default source when PipeWire runs, else ALSA's default), 'pipewire:NODE' (a PipeWire node by name or serial), an ALSA capture device (hw:1,0, plughw:CARD=Loopback,DEV=1) or 'none'.", valueName: "source"))
    var audioMic: String = "test"

    @Option(name: .customLong("audio-app"), help: ArgumentHelp("Application audio (.audioApp): 'test', 'desktop' (PipeWire: what the default sink plays, followed when it changes), 'app:NAME' (PipeWire: the streams of one application, by application.name or binary), 'pipewire:NODE', an ALSA capture device (a loopback, e.g. hw:Loopback,1,0) or 'none'.", valueName: "source"))
    var audioApp: String = "none"

    @Option(name: .customLong("audio-period"), help: ArgumentHelp("With an ALSA --audio-mic/--audio-app: how much audio the device hands over at a time (its period), 2ms to 200ms. Shorter: lower latency (a video frame waits for the audio period it falls in), more wake-ups and a greater risk of overruns on a busy machine. The device may round it.", valueName: "duration"))
    var audioPeriod: String = "21ms"

    @Option(help: ArgumentHelp("Video size, WIDTHxHEIGHT (even numbers; default 1280x720, or the captured X11 area's size).", valueName: "WxH"))
    var size: String?

    @Option(help: ArgumentHelp("Frames per second: 30, 29.97 or 30000/1001.", valueName: "rate"))
    var fps: String = "30"

    @Option(name: .customLong("video-input"), help: ArgumentHelp("With --video /dev/videoN (or a /dev/v4l/by-id link): the input to capture, by number (e.g. vivid's HDMI input is 3; 'broadcast devices' lists them). Default: the device's current input.", valueName: "n"))
    var videoInput: Int?

    @Option(name: .customLong("video-format"), help: ArgumentHelp("With --video /dev/videoN: the pixel format to capture, a V4L2 FourCC: YUYV, UYVY, NV12, YU12, RGB3, BGR3, XR24, GREY, or MJPG (compressed, decoded before encoding). Default: the first of these the device offers at the size and rate asked for, MJPG only when no uncompressed format gives them.", valueName: "fourcc"))
    var videoFormat: String?

    @Flag(name: .customLong("no-realtime"), help: "Test sources run as fast as the pipeline takes them, not at clock speed (needs --duration).")
    var noRealtime = false

    @Option(name: .customLong("setup"), help: ArgumentHelp("A KEY=VALUE for the handler's setup info; repeatable.", valueName: "key=value"))
    var setup: [String] = []

    func videoSize() throws -> (width: Int, height: Int) { try Values.size(size ?? "1280x720") }

    /// The encoder's size: --size when given, else an X11 source's current size (rounded down to
    /// even numbers), else 1280x720.
    func outputSize(for sources: [(type: SampleBufferType, source: any CaptureSource)]) throws -> (width: Int, height: Int) {
        if size == nil, let x11 = sources.first(where: { $0.source is X11ScreenSource })?.source as? X11ScreenSource,
            let native = try? x11.currentSize()
        {
            return (max(16, native.width & ~1), max(16, native.height & ~1))
        }
        if size == nil, let cast = sources.lazy.compactMap({ $0.source as? PipeWireVideoSource }).first,
            let native = cast.announcedSize
        {
            return (max(16, native.width & ~1), max(16, native.height & ~1))
        }
        return try videoSize()
    }
    func frameRate() throws -> (numerator: Int, denominator: Int) { try Values.frameRate(fps) }

    /// What the video source's YUV is, when the encoder takes it without a matrix change (the test
    /// pattern, a YUV or MJPEG V4L2 device); nil for RGB sources, which the encoder converts.
    static func videoColour(_ sources: [(type: SampleBufferType, source: any CaptureSource)]) -> VideoColour? {
        switch sources.first(where: { $0.type == .video })?.source {
        case let test as TestPatternSource: test.colour
        case let device as V4L2Source: device.colour
        default: nil
        }
    }

    func setupInfo() throws -> SetupInfo {
        var info = SetupInfo()
        for pair in setup {
            let (k, v) = try Values.setupPair(pair)
            info[k] = v
        }
        return info
    }

    /// The capture sources these options name, one per buffer type. `openingPortal: false` checks a
    /// portal/PipeWire video spec without asking the portal (for validating a config: each ask is a
    /// Start, i.e. a prompt or a spent restore token) and leaves that source out.
    func makeSources(logger: Logger? = nil, openingPortal: Bool = true) throws -> [(type: SampleBufferType, source: any CaptureSource)] {
        let (width, height) = try videoSize()
        let rate = try frameRate()
        let period = try alsaPeriod()
        var sources: [(type: SampleBufferType, source: any CaptureSource)] = []
        /// A portal/PipeWire video spec checked but not opened (`openingPortal` false).
        var videoLeftOut = false
        switch video {
        case "test":
            sources.append((.video, TestPatternSource(width: width, height: height, frameRate: rate, realtime: !noRealtime)))
        case let spec where spec.hasPrefix("test:stall-after="):
            // A capture that hangs after a while, as a wedged device does (for watchdog tests); after
            // 0s it never delivers a frame (a device that opens and stays silent).
            let text = String(spec.dropFirst("test:stall-after=".count))
            let after = text == "0" || text == "0s" ? MediaTime.zero : try Values.duration(text, option: "--video test:stall-after")
            sources.append((.video, TestPatternSource(width: width, height: height, frameRate: rate, realtime: !noRealtime, stallAfter: after)))
        case let spec where spec.hasPrefix("test:colour="):
            // The pattern in a given matrix, whatever its size (BT.601 at 720p: an SD camera's YUV
            // upscaled, which must keep its matrix and say so).
            let matrix = spec.dropFirst("test:colour=".count)
            guard matrix == "bt601" || matrix == "bt709" else {
                throw ValueError("invalid --video '\(spec)': accepted are test:colour=bt601 and test:colour=bt709")
            }
            sources.append((.video, TestPatternSource(
                width: width, height: height, frameRate: rate, realtime: !noRealtime, bt601: matrix == "bt601")))
        case "none":
            break
        case let spec where spec.hasPrefix("x11:"):
            let x11 = try X11CaptureSpec(parsing: spec)
            sources.append((.video, X11ScreenSource(spec: x11, frameRate: rate, logger: logger ?? Logger(label: "broadcast.x11"))))
        case let spec where PipeWireVideoSpec.matches(spec) && !openingPortal:
            _ = try PipeWireVideoSpec(parsing: spec)
            videoLeftOut = true
        case let spec where PipeWireVideoSpec.matches(spec):
            sources.append((.video, try pipeWireVideoSource(spec: spec, rate: rate)))
        case let path where Self.isV4L2Path(path):
            sources.append((.video, try v4l2Source(path: path, width: width, height: height, rate: rate)))
        default:
            throw ValueError(
                "unsupported --video '\(video)': accepted are 'test', 'x11:DISPLAY', 'portal', 'portal:window', 'pipewire:NODE' and 'none' or a V4L2 device such as /dev/video0"
            )
        }
        for (type, value, option) in [(SampleBufferType.audioMic, audioMic, "--audio-mic"), (.audioApp, audioApp, "--audio-app")] {
            let pipeWire = try Self.pipeWireAudioTarget(value, option: option, serverAnswers: { PipeWireAudioGraph.serverAnswers })
            switch value {
            case "test":
                sources.append((type, ToneSource(realtime: !noRealtime)))
            case let spec where spec.hasPrefix("test:period="):
                // The tone in periods of a device's size (ALSA's default is 21 ms), to measure what an
                // audio period costs video latency (a video frame waits for the period it falls in).
                let period = try Values.duration(String(spec.dropFirst("test:period=".count)), option: "\(option) test:period").nanoseconds ?? 0
                guard Self.audioPeriodRange.contains(period) else {
                    throw ValueError("invalid \(option) '\(spec)': the period must be from 2ms to 200ms")
                }
                sources.append((type, ToneSource(periodFrames: Int(period * 48_000 / 1_000_000_000), realtime: !noRealtime)))
            case "none":
                break
            case _ where pipeWire != nil:
                sources.append((type, try pipeWireAudioSource(pipeWire!, periodNanoseconds: period)))
            default:
                sources.append((type, try alsaSource(name: value, option: option, periodNanoseconds: period)))
            }
        }
        if sources.isEmpty && !videoLeftOut {
            throw ValueError("nothing to capture: --video, --audio-mic and --audio-app are all 'none'")
        }
        return sources
    }
}

/// How long to run and how much to say.
struct RunOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Stop after this much media time: 10s, 500ms, 2m, 1h30m, 01:30 (default: until SIGINT/SIGTERM).", valueName: "duration"))
    var duration: String?

    @Flag(name: .shortAndLong, help: "Print no status line or progress.")
    var quiet = false

    @Option(name: .customLong("log-level"), help: ArgumentHelp("trace, debug, info, notice, warning, error or critical.", valueName: "level"))
    var logLevel: String = "info"

    @Flag(name: [.customLong("overwrite"), .customShort("y")], help: "Replace a recording file that exists (only once the new recording is complete). Without it an existing file is refused.")
    var overwrite = false

    func mediaDuration() throws -> MediaTime? {
        try duration.map { try Values.duration($0, option: "--duration") }
    }

    func level() throws -> Logger.Level {
        guard let level = Logger.Level(rawValue: logLevel.lowercased()) else {
            throw ValueError(
                "invalid --log-level '\(logLevel)': accepted are \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))"
            )
        }
        return level
    }
}
