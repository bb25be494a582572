public import BroadcastKit
internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CSwResample
internal import CSwScale

/// A frame rate as a fraction of whole numbers (30/1, 30000/1001).
public struct FrameRate: Sendable, Hashable, CustomStringConvertible {
    public var numerator: Int
    public var denominator: Int

    public init(numerator: Int, denominator: Int = 1) {
        self.numerator = numerator
        self.denominator = denominator
    }

    public init(_ framesPerSecond: Int) { self.init(numerator: framesPerSecond, denominator: 1) }

    public var framesPerSecond: Double { Double(numerator) / Double(denominator) }
    public var description: String { denominator == 1 ? "\(numerator)" : "\(numerator)/\(denominator)" }
}

/// How the encoder spends bits.
public enum RateControl: Sendable, Hashable {
    /// Constant bitrate, for live streaming: maxrate = bitrate, a one-second VBV buffer and
    /// x264's nal-hrd=cbr.
    case cbr
    /// Average bitrate with peaks up to 1.5×, a two-second VBV buffer.
    case vbr
    /// Constant quality (x264 CRF, lower is better, 18–28 is usual); `bitrate`, when non-zero,
    /// caps it as maxrate.
    case crf(Int)
}

/// What to encode video as. Validate names with `knownPresets` and `encoderExists(_:)` before
/// starting anything.
public struct VideoEncoderSettings: Sendable, Hashable {
    /// An FFmpeg encoder name: "libx264" (default) or "h264_nvenc" (takes yuv420p frames from
    /// memory like libx264). VAAPI encoders need hardware surfaces and are not supported.
    public var encoder: String
    /// Output size in pixels (even numbers for 4:2:0); input frames of another size are scaled.
    public var width: Int
    public var height: Int
    public var frameRate: FrameRate
    /// Bits per second.
    public var bitrate: Int
    public var rateControl: RateControl
    /// x264 speed preset; one of `knownPresets`.
    public var preset: String
    /// x264 tune ("zerolatency": no B-frames nor lookahead, what live output wants); nil for none.
    public var tune: String?
    /// H.264 profile ("baseline", "main", "high"); nil lets the encoder choose.
    public var profile: String?
    /// Seconds between keyframes: GOP size = this × frame rate.
    public var keyframeIntervalSeconds: Double
    /// Encoder threads; 0 lets the encoder choose.
    public var threads: Int
    /// x264's rc-lookahead (frames it looks ahead for rate control and frame types, each a frame
    /// held in memory); nil: the preset's. Set by the memory budget.
    public var lookahead: Int? = nil
    /// What the source's YUV is, when the encoder takes it without a matrix change (a YUV or
    /// MJPEG camera, the test pattern): the stream is tagged with it. nil: the source is RGB and
    /// the encoder converts it to BT.709 from 720 lines, BT.601 below, limited range, and says so.
    public var colour: VideoColour? = nil
    /// The adaptive live output (by name) this encode is for: never shared, and its bitrate moves
    /// while it runs (`VideoEncoder.setBitrate`), so CBR goes without x264's NAL HRD, under which
    /// x264 refuses a change of its VBV. nil: an encode like any other.
    public var adaptiveFor: String? = nil

    public init(
        encoder: String = "libx264",
        width: Int,
        height: Int,
        frameRate: FrameRate = FrameRate(30),
        bitrate: Int = 2_500_000,
        rateControl: RateControl = .cbr,
        preset: String = "veryfast",
        tune: String? = "zerolatency",
        profile: String? = nil,
        keyframeIntervalSeconds: Double = 2,
        threads: Int = 0
    ) {
        self.encoder = encoder
        self.width = width
        self.height = height
        self.frameRate = frameRate
        self.bitrate = bitrate
        self.rateControl = rateControl
        self.preset = preset
        self.tune = tune
        self.profile = profile
        self.keyframeIntervalSeconds = keyframeIntervalSeconds
        self.threads = threads
    }

    /// x264's preset names, fastest first.
    public static let knownPresets: [String] = [
        "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo",
    ]

    /// Whether this libavcodec has an encoder called `name` (avcodec_find_encoder_by_name). An
    /// existing hardware encoder may still fail to open when its device is missing.
    public static func encoderExists(_ name: String) -> Bool {
        guard let codec = avcodec_find_encoder_by_name(name) else { return false }
        return codec.pointee.type == AVMEDIA_TYPE_VIDEO
    }

    /// Whether `other` asks for the same encode: equal but for how it is run (threads, lookahead),
    /// which the memory plan sets. Outputs that ask the same encode share it.
    public func sameEncode(as other: VideoEncoderSettings?) -> Bool {
        guard var other else { return false }
        other.threads = threads
        other.lookahead = lookahead
        return other == self
    }

    /// Frames between keyframes, at least 1.
    public var gopSize: Int {
        max(1, Int((keyframeIntervalSeconds * frameRate.framesPerSecond).rounded()))
    }

    /// Why these settings cannot work, or nil.
    public func problem() -> String? {
        if width <= 0 || height <= 0 { return "video size \(width)x\(height) must be positive" }
        if width % 2 != 0 || height % 2 != 0 { return "video size \(width)x\(height) must be even for 4:2:0" }
        if frameRate.numerator <= 0 || frameRate.denominator <= 0 { return "frame rate \(frameRate) must be positive" }
        if bitrate < 0 { return "bitrate \(bitrate) must not be negative" }
        switch rateControl {
        case .cbr, .vbr:
            if bitrate <= 0 { return "bitrate \(bitrate) must be positive for \(rateControl == .cbr ? "CBR" : "VBR")" }
        case .crf(let quality):
            if !(0...51).contains(quality) { return "CRF \(quality) must be within 0...51" }
        }
        if keyframeIntervalSeconds <= 0 { return "keyframe interval \(keyframeIntervalSeconds) s must be positive" }
        if threads < 0 { return "threads \(threads) must not be negative" }
        if encoder == "libx264", !Self.knownPresets.contains(preset) {
            return "unknown preset \(preset) (known: \(Self.knownPresets.joined(separator: ", ")))"
        }
        if !Self.encoderExists(encoder) { return "no video encoder named \(encoder) in this FFmpeg" }
        return nil
    }
}
