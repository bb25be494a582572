public import BroadcastCapture
public import BroadcastKit
public import BroadcastMedia
public import BroadcastOutputs
import BroadcastService

/// How one option is named on the command line (`--size`) and in the daemon's config (`video.size`).
public struct OptionName: Sendable, Hashable, CustomStringConvertible {
    public let flag: String
    public let key: String
    /// What replaces "invalid --flag " when the config reports it: "invalid value " (the key is
    /// already in front of the message) or nothing ("limits.memory: '12M': expected ...").
    let configInvalid: String

    init(flag: String, key: String, configInvalid: String = "invalid value ") {
        self.flag = flag
        self.key = key
        self.configInvalid = configInvalid
    }

    public var description: String { flag }

    /// A message written about the flag, as said about the config key: the option's own flag only,
    /// so nothing else in the text (a value, a device path) is touched.
    func configMessage(_ message: String) -> String {
        var text = message.replacing("invalid \(flag) ", with: configInvalid, maxReplacements: 1)
        text = Self.replacingWholeFlag(flag, with: key, in: text)
        return text
    }

    static func replacingWholeFlag(_ flag: String, with key: String, in text: String) -> String {
        var out = ""
        var rest = Substring(text)
        while let range = rest.firstRange(of: flag) {
            let next = range.upperBound < rest.endIndex ? rest[range.upperBound] : " "
            out += rest[..<range.lowerBound]
            out += next.isLetter || next == "-" ? flag : key
            rest = rest[range.upperBound...]
        }
        return out + rest
    }
}

/// A value that is wrong for one option: the command line prints `description` (which names the
/// flag); the config names the key and the line it was set on.
public struct OptionError: Error, CustomStringConvertible {
    public let option: OptionName
    /// The message in the command line's words.
    public let description: String
    /// Other options the message names (a check across options), respelled for the config too.
    public var others: [OptionName] = []

    public init(_ option: OptionName, _ description: String, others: [OptionName] = []) {
        self.option = option
        self.description = description
        self.others = others
    }

    /// The message in the config's words.
    public var configMessage: String {
        others.reduce(option.configMessage(description)) { $1.configMessage($0) }
    }
}

/// One option of the command line and the daemon's config: its names, its default, and the one
/// parser (syntax and limits) both go through, so the two cannot drift apart.
public struct OptionSpec<Value: Sendable>: Sendable {
    public let name: OptionName
    /// The default as the command line shows it (nil: none, the option is optional).
    public let defaultText: String?
    private let parser: @Sendable (String) throws -> Value

    init(_ flag: String, _ key: String, default defaultText: String? = nil, configInvalid: String = "invalid value ",
         parse: @escaping @Sendable (String) throws -> Value) {
        self.name = OptionName(flag: flag, key: key, configInvalid: configInvalid)
        self.defaultText = defaultText
        self.parser = parse
    }

    /// The value `text` stands for, or an `OptionError` naming this option.
    public func parse(_ text: String) throws(OptionError) -> Value {
        do {
            return try parser(text)
        } catch let error as OptionError {
            throw error
        } catch let error as ValueError {
            throw OptionError(name, error.description)
        } catch let error as BroadcastError {
            throw OptionError(name, error.message)
        } catch {
            throw OptionError(name, "\(error)")
        }
    }

    /// The default's value (a default that does not parse is a bug here, not bad input).
    var defaultValue: Value {
        // swift-format-ignore
        try! parse(defaultText!)
    }
}

/// A video source, as `--video` / `video.source` names it.
public enum VideoSourceSpec: Sendable, Hashable {
    /// The built-in pattern; `bt601` paints it in that matrix; `stallAfter` hangs it (watchdog tests).
    case test(bt601: Bool?, stallAfter: MediaTime?)
    /// The built-in pattern acting as a device lost from `from` to `until` (media time; layer tests).
    case testLost(from: MediaTime, until: MediaTime)
    case x11(X11CaptureSpec)
    /// The ScreenCast portal or a PipeWire node (`portal`, `portal:window`, `pipewire:NODE`).
    case pipeWire(PipeWireVideoSpec)
    /// A V4L2 device node or a /dev/v4l/by-id link.
    case v4l2(path: String)
    case none
}

/// An audio source, as `--audio-mic` / `--audio-app` name it.
public enum AudioSourceSpec: Sendable, Hashable {
    /// The built-in tone, in periods of `period` (nil: 10 ms).
    case test(period: MediaTime?)
    case pipeWire(PipeWireAudioTarget)
    /// An ALSA capture PCM ('hw:1,0', 'default' without PipeWire).
    case alsa(String)
    /// 'default' on --audio-mic: PipeWire's default source when PipeWire answers, else ALSA's.
    case systemDefault
    case none
}

/// The x264/encoder rate control as asked for (nil in `EncoderSettings`: cbr to a stream, vbr to a file).
public enum RateControlChoice: String, Sendable { case cbr, vbr, crf }

/// Every option the command line and the config share, by name.
public enum Options {
    // MARK: Sources ([video], [audio])

    public static let video = OptionSpec<VideoSourceSpec>("--video", "video.source", default: "test") { text in
        try baseVideoSource(text)
    }
    public static let audioMic = OptionSpec<AudioSourceSpec>("--audio-mic", "audio.mic", default: "test") { text in
        try audioSource(text, option: "--audio-mic")
    }
    public static let audioApp = OptionSpec<AudioSourceSpec>("--audio-app", "audio.app", default: "none") { text in
        try audioSource(text, option: "--audio-app")
    }
    /// The audio periods a source may be asked for (--audio-period, the test tone's test:period=).
    public static let audioPeriodRange: ClosedRange<Int64> = 2_000_000...200_000_000
    public static let audioPeriod = OptionSpec<Int64>("--audio-period", "audio.period", default: "21ms") { text in
        let period = try Values.duration(text, option: "--audio-period").nanoseconds ?? 0
        guard audioPeriodRange.contains(period) else {
            throw ValueError("invalid --audio-period '\(text)': must be from 2ms to 200ms")
        }
        return period
    }
    public static let size = OptionSpec<VideoSize>("--size", "video.size") { text in
        let (width, height) = try Values.size(text)
        return VideoSize(width: width, height: height)
    }
    public static let fps = OptionSpec<FrameRate>("--fps", "video.fps", default: "30") { text in
        let rate = try Values.frameRate(text)
        return FrameRate(numerator: rate.numerator, denominator: rate.denominator)
    }
    public static let videoInput = OptionSpec<Int>("--video-input", "video.input") { text in
        guard let input = Int(text), input >= 0 else {
            throw ValueError("invalid --video-input '\(text)': expected an input number from 0 (see 'broadcast devices')")
        }
        return input
    }
    public static let videoFormat = OptionSpec<FourCC>("--video-format", "video.format") { text in
        guard let fourcc = V4L2PixelFormats.parse(text) else {
            throw ValueError("invalid --video-format '\(text)': expected a V4L2 FourCC such as YUYV, UYVY, NV12, YU12, RGB3, BGR3, XR24, GREY or MJPG")
        }
        return fourcc
    }

    // MARK: Encoding ([encoder])

    public static let videoBitrate = OptionSpec<Int>("--video-bitrate", "encoder.video_bitrate", default: "3M") { text in
        try Values.bitrate(text, option: "--video-bitrate")
    }
    /// An adaptive live output's lowest video bitrate (default: a quarter of its bitrate).
    public static let minVideoBitrate = OptionSpec<Int>("--min-video-bitrate", "output.min_video_bitrate") { text in
        try Values.bitrate(text, option: "--min-video-bitrate")
    }
    /// A live output whose video bitrate follows its network.
    public static let adaptive = OptionSpec<Bool>("--adaptive", "output.adaptive", default: "false") { text in
        try flag(text, option: "--adaptive")
    }
    /// The lowest bitrate any bitrate option takes (`Values.bitrate`).
    public static let bitrateRange = 8_000...500_000_000
    public static let audioBitrate = OptionSpec<Int>("--audio-bitrate", "encoder.audio_bitrate", default: "128k") { text in
        try Values.bitrate(text, option: "--audio-bitrate")
    }
    // h264_vaapi is not offered: it needs frames uploaded to VAAPI surfaces, which we do not do.
    public static let encoders = ["libx264", "h264_nvenc"]
    public static let encoder = OptionSpec<String>("--encoder", "encoder.encoder", default: "libx264") { text in
        guard encoders.contains(text) else {
            throw ValueError("unknown --encoder '\(text)': accepted are \(encoders.joined(separator: ", "))")
        }
        return text
    }
    public static let preset = OptionSpec<String>("--preset", "encoder.preset", default: "veryfast") { text in
        guard VideoEncoderSettings.knownPresets.contains(text) else {
            throw ValueError("unknown --preset '\(text)': accepted are \(VideoEncoderSettings.knownPresets.joined(separator: ", "))")
        }
        return text
    }
    public static let tunes = ["zerolatency", "film", "animation", "grain", "stillimage", "fastdecode", "psnr", "ssim", "none"]
    /// nil: "none" (no tune).
    public static let tune = OptionSpec<String?>("--tune", "encoder.tune", default: "zerolatency") { text in
        guard tunes.contains(text) else {
            throw ValueError("unknown --tune '\(text)': accepted are \(tunes.joined(separator: ", "))")
        }
        return text == "none" ? nil : text
    }
    public static let rateControl = OptionSpec<RateControlChoice>("--rate-control", "encoder.rate_control") { text in
        guard let choice = RateControlChoice(rawValue: text) else {
            throw ValueError("invalid --rate-control '\(text)': accepted are cbr, vbr and crf")
        }
        return choice
    }
    public static let crf = OptionSpec<Int>("--crf", "encoder.crf", default: "23") { text in
        guard let n = Int(text), (0...51).contains(n) else { throw ValueError("invalid --crf '\(text)': accepted is 0 to 51") }
        return n
    }
    public static let keyframeInterval = OptionSpec<MediaTime>("--keyframe-interval", "encoder.keyframe_interval", default: "2s") { text in
        let interval = try Values.duration(text, option: "--keyframe-interval")
        // The GOP (interval × rate frames) is a 32-bit number in libavcodec; x264 itself caps it lower.
        guard interval.seconds <= 600 else { throw ValueError("invalid --keyframe-interval '\(text)': must be at most 10m") }
        return interval
    }
    /// cfr or vfr; vfr with a live output is refused when the outputs are known (`EncoderSettings.configuration`).
    public static let frameRateMode = OptionSpec<FrameRateMode>("--frame-rate-mode", "encoder.frame_rate_mode", default: "cfr") { text in
        try Values.frameRateMode(text, live: false)
    }
    /// mixed, separate or both (see `AudioTrackMode`).
    public static let audioTracks = OptionSpec<AudioTrackMode>("--audio-tracks", "encoder.audio_tracks", default: "mixed") { text in
        guard let mode = AudioTrackMode(rawValue: text) else {
            throw ValueError("invalid --audio-tracks '\(text)': accepted are mixed, separate and both")
        }
        return mode
    }
    public static let micVolume = OptionSpec<Double>("--mic-volume", "audio.mic_volume", default: "0dB") { text in
        try volume(text, option: "--mic-volume")
    }
    public static let appVolume = OptionSpec<Double>("--app-volume", "audio.app_volume", default: "0dB") { text in
        try volume(text, option: "--app-volume")
    }
    public static let micMute = OptionSpec<Bool>("--mute-mic", "audio.mic_mute", default: "false") { text in
        try flag(text, option: "--mute-mic")
    }
    public static let appMute = OptionSpec<Bool>("--mute-app", "audio.app_mute", default: "false") { text in
        try flag(text, option: "--mute-app")
    }
    /// The microphone's noise suppression (`NoiseSuppressor`); refused without a microphone.
    public static let micDenoise = OptionSpec<Bool>("--mic-denoise", "audio.mic_denoise", default: "false") { text in
        try flag(text, option: "--mic-denoise")
    }
    /// Why `--app-denoise` / `app_denoise` is refused (it is not an option, but a likely guess).
    public static let appDenoiseRefusal =
        "noise suppression is for the microphone only (--mic-denoise): music and game audio must not be treated as noise"
    /// A source's sync offset (see `Values.offset`): positive delays it, -2s to +2s.
    public static let micOffset = OptionSpec<Int64>("--mic-offset", "audio.mic_offset", default: "0") { text in
        try Values.offset(text, option: "--mic-offset")
    }
    public static let appOffset = OptionSpec<Int64>("--app-offset", "audio.app_offset", default: "0") { text in
        try Values.offset(text, option: "--app-offset")
    }
    public static let videoOffset = OptionSpec<Int64>("--video-offset", "video.offset", default: "0") { text in
        try Values.offset(text, option: "--video-offset")
    }
    /// A source's volume in decibels: "-6dB", "-6", "+3dB", from -60 to +20 (0: as captured).
    public static let volumeRange: ClosedRange<Double> = -60...20
    static func volume(_ text: String, option: String) throws -> Double {
        var number = Substring(text)
        if number.lowercased().hasSuffix("db") { number = number.dropLast(2) }
        if number.hasPrefix("+") { number = number.dropFirst() }
        guard !number.isEmpty, number.allSatisfy({ $0.isNumber || $0 == "." || $0 == "-" }), let value = Double(number),
            volumeRange.contains(value)
        else {
            throw ValueError("invalid \(option) '\(text)': expected decibels from -60dB to +20dB, such as -6dB (0dB: as captured)")
        }
        return value
    }
    static func flag(_ text: String, option: String) throws -> Bool {
        switch text {
        case "true": return true
        case "false": return false
        default: throw ValueError("invalid \(option) '\(text)': expected true or false")
        }
    }
    public static let profile = OptionSpec<String>("--profile", "encoder.profile") { text in
        guard ["baseline", "main", "high"].contains(text) else {
            throw ValueError("unknown --profile '\(text)': accepted are baseline, main and high")
        }
        return text
    }
    public static let threads = OptionSpec<Int>("--threads", "encoder.threads", default: "0") { text in
        guard let n = Int(text), (0...64).contains(n) else { throw ValueError("invalid --threads '\(text)': accepted is 0 to 64") }
        return n
    }

    // MARK: Limits ([limits])

    public static let memoryBudget = OptionSpec<Int64>("--memory-budget", "limits.memory", configInvalid: "") { text in
        try Values.memoryBudget(text, option: "--memory-budget")
    }

    // MARK: Source specs

    static func videoSource(_ text: String) throws -> VideoSourceSpec {
        switch text {
        case "test":
            return .test(bt601: nil, stallAfter: nil)
        case let spec where spec.hasPrefix("test:stall-after="):
            // A capture that hangs after a while, as a wedged device does (for watchdog tests); after
            // 0s it never delivers a frame (a device that opens and stays silent).
            let after = String(spec.dropFirst("test:stall-after=".count))
            return .test(bt601: nil, stallAfter: after == "0" || after == "0s" ? .zero : try Values.duration(after, option: "--video test:stall-after"))
        case let spec where spec.hasPrefix("test:lost="):
            // A device that goes away and comes back: test:lost=1s-3s (media time).
            let range = spec.dropFirst("test:lost=".count).split(separator: "-")
            guard range.count == 2 else { throw ValueError("invalid --video '\(spec)': expected test:lost=FROM-UNTIL, e.g. test:lost=1s-3s") }
            let from = try Values.duration(String(range[0]), option: "--video test:lost")
            let until = try Values.duration(String(range[1]), option: "--video test:lost")
            guard (from.nanoseconds ?? 0) < (until.nanoseconds ?? 0) else { throw ValueError("invalid --video '\(spec)': FROM must come before UNTIL") }
            return .testLost(from: from, until: until)
        case let spec where spec.hasPrefix("test:colour="):
            // The pattern in a given matrix, whatever its size (BT.601 at 720p: an SD camera's YUV
            // upscaled, which must keep its matrix and say so).
            let matrix = spec.dropFirst("test:colour=".count)
            guard matrix == "bt601" || matrix == "bt709" else {
                throw ValueError("invalid --video '\(spec)': accepted are test:colour=bt601 and test:colour=bt709")
            }
            return .test(bt601: matrix == "bt601", stallAfter: nil)
        case "none":
            return .none
        case let spec where spec.hasPrefix("x11:"):
            return .x11(try X11CaptureSpec(parsing: spec))
        case let spec where PipeWireVideoSpec.matches(spec):
            return .pipeWire(try PipeWireVideoSpec(parsing: spec))
        case let path where isV4L2Path(path):
            return .v4l2(path: path)
        default:
            throw ValueError(
                "unsupported --video '\(text)': accepted are 'test', 'x11:DISPLAY', 'portal', 'portal:window', 'pipewire:NODE' and 'none' or a V4L2 device such as /dev/video0"
            )
        }
    }

    /// `--video` names a V4L2 device when it is a path under /dev (a node or a /dev/v4l/by-id link).
    static func isV4L2Path(_ value: String) -> Bool { value.hasPrefix("/dev/") }

    static func audioSource(_ value: String, option: String) throws -> AudioSourceSpec {
        switch value {
        case "test":
            return .test(period: nil)
        case let spec where spec.hasPrefix("test:period="):
            // The tone in periods of a device's size (ALSA's default is 21 ms), to measure what an
            // audio period costs video latency (a video frame waits for the period it falls in).
            let period = try Values.duration(String(spec.dropFirst("test:period=".count)), option: "\(option) test:period")
            guard audioPeriodRange.contains(period.nanoseconds ?? 0) else {
                throw ValueError("invalid \(option) '\(spec)': the period must be from 2ms to 200ms")
            }
            return .test(period: period)
        case "none":
            return .none
        case "default" where option == "--audio-mic":
            return .systemDefault
        default:
            if let target = try SourceSettings.pipeWireAudioTarget(value, option: option) { return .pipeWire(target) }
            guard !value.isEmpty, !value.contains(where: \.isWhitespace) else {
                throw ValueError("invalid \(option) '\(value)': expected 'test', 'none' or an ALSA capture device such as hw:1,0, plughw:CARD=Loopback,DEV=1 or default")
            }
            return .alsa(value)
        }
    }
}

/// A video size in pixels (even, 16 to 8192 a side when parsed).
public struct VideoSize: Sendable, Hashable {
    public var width: Int
    public var height: Int
    public init(width: Int, height: Int) {
        self.width = width
        self.height = height
    }
}
