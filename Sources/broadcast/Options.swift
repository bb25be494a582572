import ArgumentParser
import BroadcastDaemon
import BroadcastKit
import BroadcastOutputs
import Logging

// The command line's options: ArgumentParser's declarations and help. What each value means, its
// syntax, limits and default are the library's `Options` specs, shared with the daemon's config:
// `settings()` turns the flags into the same typed `SourceSettings`/`EncoderSettings` the config makes.

/// Where media comes from: shared by every command that captures.
struct SourceOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("Video source: 'test' (built-in pattern; 'test:colour=bt601' or 'bt709' paints it in that matrix whatever its size), 'x11:DISPLAY[+X,Y/WxH][?window=ID|title=TEXT,cursor=off,window-gone=keep]' (an X11 screen, region or window), 'portal[:window][?cursor=embedded|metadata|hidden]' (a Wayland desktop through the ScreenCast portal), 'pipewire:NODE' (a PipeWire video node by name or serial) or 'none'. Repeatable: the first is the base (it sets the frame, unless --size), each further one a layer drawn over it in order, placed by keys in its query: x, y, width, height (pixels, or percent of the output frame: x=75%,width=25%; default: from 0,0 to the frame's right and bottom edges), fit=fill (stretch; default: keep the aspect ratio inside the box), crop=WxH+X+Y (part of the source), on_loss=hide|slate (what shows while its device is lost; default hide), opacity=25% (how much of the layer shows over what is under it, also 0.25; default 100%: opaque), e.g. '/dev/video0?x=75%,y=75%,width=25%,height=25%'.", valueName: "source"))
    var video: [String] = []

    @Option(name: .customLong("audio-mic"), help: ArgumentHelp("Microphone audio (.audioMic): 'test' (built-in tone, in 10 ms periods; 'test:period=21ms' for another period), 'default' (PipeWire's default source when PipeWire runs, else ALSA's default), 'pipewire:NODE' (a PipeWire node by name or serial), an ALSA capture device (hw:1,0, plughw:CARD=Loopback,DEV=1) or 'none'.", valueName: "source"))
    var audioMic: String = Options.audioMic.defaultText!

    @Option(name: .customLong("audio-app"), help: ArgumentHelp("Application audio (.audioApp): 'test', 'desktop' (PipeWire: what the default sink plays, followed when it changes), 'app:NAME' (PipeWire: the streams of one application, by application.name or binary), 'pipewire:NODE', an ALSA capture device (a loopback, e.g. hw:Loopback,1,0) or 'none'.", valueName: "source"))
    var audioApp: String = Options.audioApp.defaultText!

    @Option(name: .customLong("audio-period"), help: ArgumentHelp("With an ALSA --audio-mic/--audio-app: how much audio the device hands over at a time (its period), 2ms to 200ms. Shorter: lower latency (a video frame waits for the audio period it falls in), more wake-ups and a greater risk of overruns on a busy machine. The device may round it.", valueName: "duration"))
    var audioPeriod: String = Options.audioPeriod.defaultText!

    @Option(help: ArgumentHelp("Video size, WIDTHxHEIGHT (even numbers). Default: a screen's own size (an X11 screen, region or window, a portal or PipeWire cast: record, stream and the daemon alike), else 1280x720.", valueName: "WxH"))
    var size: String?

    @Option(help: ArgumentHelp("Frames per second: 30, 29.97 or 30000/1001.", valueName: "rate"))
    var fps: String = Options.fps.defaultText!

    @Option(name: .customLong("video-input"), help: ArgumentHelp("With --video /dev/videoN (or a /dev/v4l/by-id link): the input to capture, by number (e.g. vivid's HDMI input is 3; 'broadcast devices' lists them). Default: the device's current input.", valueName: "n"))
    var videoInput: String?

    @Option(name: .customLong("video-format"), help: ArgumentHelp("With --video /dev/videoN: the pixel format to capture, a V4L2 FourCC: YUYV, UYVY, NV12, YU12, RGB3, BGR3, XR24, GREY, or MJPG (compressed, decoded before encoding). Default: the first of these the device offers at the size and rate asked for, MJPG only when no uncompressed format gives them.", valueName: "fourcc"))
    var videoFormat: String?

    @Flag(name: .customLong("no-realtime"), help: "Test sources run as fast as the pipeline takes them, not at clock speed (needs --duration).")
    var noRealtime = false

    @Option(name: .customLong("setup"), help: ArgumentHelp("A KEY=VALUE for the handler's setup info; repeatable.", valueName: "key=value"))
    var setup: [String] = []

    /// The typed settings, each flag through its spec (the config's keys go through the same ones).
    func settings() throws(OptionError) -> SourceSettings {
        var settings = SourceSettings()
        settings.video = try Options.video.parse(video.first ?? Options.video.defaultText!)
        settings.layers = try video.dropFirst().map { text throws(OptionError) in try Options.videoLayer.parse(text) }
        settings.audioMic = try Options.audioMic.parse(audioMic)
        settings.audioApp = try Options.audioApp.parse(audioApp)
        settings.audioPeriodNanoseconds = try Options.audioPeriod.parse(audioPeriod)
        settings.size = try size.map { text throws(OptionError) in try Options.size.parse(text) }
        settings.frameRate = try Options.fps.parse(fps)
        settings.videoInput = try videoInput.map { text throws(OptionError) in try Options.videoInput.parse(text) }
        settings.videoFormat = try videoFormat.map { text throws(OptionError) in try Options.videoFormat.parse(text) }
        settings.realtime = !noRealtime
        return settings
    }

    func setupInfo() throws -> SetupInfo {
        var info = SetupInfo()
        for pair in setup {
            let (k, v) = try Values.setupPair(pair)
            info[k] = v
        }
        return info
    }
}

/// How to encode: shared by record and stream.
struct EncoderOptions: ParsableArguments {
    @Option(name: .customLong("video-bitrate"), help: ArgumentHelp("Video bitrate: 3M, 2500k.", valueName: "rate"))
    var videoBitrate: String = Options.videoBitrate.defaultText!

    @Option(name: .customLong("audio-bitrate"), help: ArgumentHelp("Audio bitrate: 128k.", valueName: "rate"))
    var audioBitrate: String = Options.audioBitrate.defaultText!

    @Option(help: ArgumentHelp("Video encoder: libx264, or h264_nvenc (NVIDIA; falls back to libx264 when it cannot open).", valueName: "name"))
    var encoder: String = Options.encoder.defaultText!

    @Option(help: ArgumentHelp("x264 preset, ultrafast ... veryslow.", valueName: "name"))
    var preset: String = Options.preset.defaultText!

    @Option(help: ArgumentHelp("x264 tune: zerolatency (default, no B-frames or lookahead), film, animation, ... or none.", valueName: "name"))
    var tune: String = Options.tune.defaultText!

    @Option(name: .customLong("rate-control"), help: ArgumentHelp("cbr, vbr or crf (default: vbr to a file, cbr to a stream).", valueName: "mode"))
    var rateControl: String?

    @Option(help: ArgumentHelp("Quality for --rate-control crf, 0-51, lower is better.", valueName: "n"))
    var crf: String = Options.crf.defaultText!

    @Option(name: .customLong("keyframe-interval"), help: ArgumentHelp("Time between keyframes: 2s.", valueName: "duration"))
    var keyframeInterval: String = Options.keyframeInterval.defaultText!

    @Option(
        name: .customLong("frame-rate-mode"),
        help: ArgumentHelp(
            "cfr: a frame every tick (default). vfr (files only): a frame when the screen changed, a keyframe at least every --keyframe-interval.",
            valueName: "mode"))
    var frameRateMode: String = Options.frameRateMode.defaultText!

    @Option(
        name: .customLong("audio-tracks"),
        help: ArgumentHelp(
            "mixed: one track, microphone and application audio mixed (default). separate: a track per source (\"Microphone\", \"Desktop audio\"). both: the mix, then a track per source. An FLV output (RTMP) gets the mix.",
            valueName: "mode"))
    var audioTracks: String = Options.audioTracks.defaultText!

    @Option(name: .customLong("mic-volume"), help: ArgumentHelp("The microphone's volume in dB, -60dB to +20dB (0dB: as captured).", valueName: "dB"))
    var micVolume: String = Options.micVolume.defaultText!

    @Option(name: .customLong("app-volume"), help: ArgumentHelp("The application audio's volume in dB, -60dB to +20dB.", valueName: "dB"))
    var appVolume: String = Options.appVolume.defaultText!

    @Option(
        name: .customLong("mic-offset"), parsing: .unconditional,
        help: ArgumentHelp(
            "Move the microphone in time against the other sources, -2s to +2s: 200ms plays it 200 ms later (a late picture), -0.15s earlier. Changed while running: broadcast offset mic VALUE.",
            valueName: "offset"))
    var micOffset: String = Options.micOffset.defaultText!

    @Option(name: .customLong("app-offset"), parsing: .unconditional, help: ArgumentHelp("Move the application audio in time, -2s to +2s (like --mic-offset).", valueName: "offset"))
    var appOffset: String = Options.appOffset.defaultText!

    @Option(
        name: .customLong("video-offset"), parsing: .unconditional,
        help: ArgumentHelp(
            "Move the picture in time against the audio, -2s to +2s: 200ms shows each frame 200 ms later. Frames it puts before the start are left out.",
            valueName: "offset"))
    var videoOffset: String = Options.videoOffset.defaultText!

    @Flag(name: .customLong("mute-mic"), help: "Start with the microphone muted (silence in its track and the mix).")
    var muteMic = false

    @Flag(name: .customLong("mute-app"), help: "Start with the application audio muted.")
    var muteApp = false

    @Flag(
        name: .customLong("mic-denoise"),
        help: "Suppress the microphone's steady background noise (fan, hum, hiss) before its track and the mix (WebRTC's noise suppressor, about 0.3 % of a core; not the application audio). Daemon: [audio] mic_denoise = true.")
    var micDenoise = false

    /// Not an option: refused with why (noise suppression is for the microphone).
    @Flag(name: .customLong("app-denoise"), help: .hidden)
    var appDenoise = false

    @Option(help: ArgumentHelp("H.264 profile: baseline, main or high (default: the encoder's choice).", valueName: "name"))
    var profile: String?

    @Option(help: ArgumentHelp("Encoder threads, 0 = automatic.", valueName: "n"))
    var threads: String = Options.threads.defaultText!

    /// The typed settings, each flag through its spec (the config's [encoder] keys go through the same ones).
    func settings() throws(OptionError) -> EncoderSettings {
        var settings = EncoderSettings()
        settings.videoBitrate = try Options.videoBitrate.parse(videoBitrate)
        settings.audioBitrate = try Options.audioBitrate.parse(audioBitrate)
        settings.encoder = try Options.encoder.parse(encoder)
        settings.preset = try Options.preset.parse(preset)
        settings.tune = try Options.tune.parse(tune)
        settings.rateControl = try rateControl.map { text throws(OptionError) in try Options.rateControl.parse(text) }
        settings.crf = try Options.crf.parse(crf)
        settings.keyframeInterval = try Options.keyframeInterval.parse(keyframeInterval)
        settings.frameRateMode = try Options.frameRateMode.parse(frameRateMode)
        settings.profile = try profile.map { text throws(OptionError) in try Options.profile.parse(text) }
        settings.threads = try Options.threads.parse(threads)
        settings.audioTracks = try Options.audioTracks.parse(audioTracks)
        settings.micLevel.volumeDecibels = try Options.micVolume.parse(micVolume)
        settings.appLevel.volumeDecibels = try Options.appVolume.parse(appVolume)
        settings.micLevel.muted = muteMic
        settings.offsets.mic = try Options.micOffset.parse(micOffset)
        settings.offsets.app = try Options.appOffset.parse(appOffset)
        settings.offsets.video = try Options.videoOffset.parse(videoOffset)
        settings.appLevel.muted = muteApp
        if appDenoise { throw OptionError(Options.micDenoise.name, "--app-denoise: \(Options.appDenoiseRefusal)") }
        settings.micDenoise = micDenoise
        return settings
    }
}

/// --memory-budget for record and stream.
struct MemoryBudgetOptions: ParsableArguments {
    @Option(
        name: .customLong("memory-budget"),
        help: ArgumentHelp(
            "The most broadcast's own (private dirty) memory may reach: 160M (default), 1G. Queue, pool and replay sizes and x264's threads and lookahead are derived from it; a broadcast that cannot fit is refused.",
            valueName: "size"))
    var memoryBudget: String?

    func budget() throws(OptionError) -> Int64 {
        guard let text = memoryBudget else { return MemoryPlan.defaultBudget }
        return try Options.memoryBudget.parse(text)
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
