internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CSwResample
internal import CSwScale

/// A rational number, FFmpeg's AVRational: time bases and frame rates.
public struct Rational: Sendable, Hashable, CustomStringConvertible {
    public var numerator: Int32
    public var denominator: Int32

    public init(_ numerator: Int32, _ denominator: Int32) {
        self.numerator = numerator
        self.denominator = denominator
    }

    public var doubleValue: Double { Double(numerator) / Double(denominator) }
    public var description: String { "\(numerator)/\(denominator)" }

    var av: AVRational { AVRational(num: numerator, den: denominator) }
    init(_ av: AVRational) { self.init(av.num, av.den) }
}

public enum MediaType: String, Sendable, Hashable {
    case video, audio
}

/// An encoder's output parameters (AVCodecParameters), what a muxer needs to add a stream.
///
/// Immutable once made, so it may be shared across threads.
public final class CodecParameters: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<AVCodecParameters>

    init(context: UnsafePointer<AVCodecContext>) throws(FFmpegError) {
        guard let p = avcodec_parameters_alloc() else { throw .outOfMemory("allocating codec parameters") }
        pointer = p
        try check(avcodec_parameters_from_context(p, context), "copying codec parameters")
    }

    deinit {
        var p: UnsafeMutablePointer<AVCodecParameters>? = pointer
        avcodec_parameters_free(&p)
    }

    public var mediaType: MediaType { pointer.pointee.codec_type == AVMEDIA_TYPE_VIDEO ? .video : .audio }
    /// FFmpeg's codec name: "h264", "aac".
    public var codecName: String { String(cString: avcodec_get_name(pointer.pointee.codec_id)) }
    public var width: Int { Int(pointer.pointee.width) }
    public var height: Int { Int(pointer.pointee.height) }
    public var sampleRate: Int { Int(pointer.pointee.sample_rate) }
    public var channels: Int { Int(pointer.pointee.ch_layout.nb_channels) }
    public var bitRate: Int64 { pointer.pointee.bit_rate }
    /// Codec-level header (SPS/PPS, AudioSpecificConfig) when the encoder wrote a global header.
    public var hasExtradata: Bool { pointer.pointee.extradata_size > 0 }
    /// The codec-level header's bytes (H.264: SPS/PPS as libx264 writes them, Annex B); empty
    /// without a global header.
    public var extradata: [UInt8] {
        guard let data = pointer.pointee.extradata, pointer.pointee.extradata_size > 0 else { return [] }
        return Array(UnsafeBufferPointer(start: data, count: Int(pointer.pointee.extradata_size)))
    }
}

/// One stream as an encoder produces it: its parameters and the time base of its packets.
public struct StreamDescription: Sendable {
    public var parameters: CodecParameters
    public var timeBase: Rational
    /// Nominal frame rate of a video stream.
    public var frameRate: Rational?
    /// The track's title in the container ("Microphone"): MP4/MOV `hdlr` name, Matroska TrackName.
    public var title: String?
    /// The `streamIndex` of the packets of this stream, when an output carries only some of the
    /// encoder's streams (nil: the order the streams are added in).
    public var streamIndex: Int?

    public init(parameters: CodecParameters, timeBase: Rational, frameRate: Rational? = nil) {
        self.parameters = parameters
        self.timeBase = timeBase
        self.frameRate = frameRate
    }
}

extension Array where Element == StreamDescription {
    /// How many packet stream indices these streams span (the largest `streamIndex` + 1): what a
    /// per-stream table indexed by `EncodedPacket.streamIndex` needs.
    public var streamIndexSpan: Int {
        var span = 0
        for (position, stream) in enumerated() { span = Swift.max(span, (stream.streamIndex ?? position) + 1) }
        return span
    }
}

/// One encoded packet: its refcounted AVPacket, timestamps in `timeBase`, the stream it belongs to.
///
/// Immutable after the encoder made it: outputs on other threads share it, each muxer taking its
/// own reference (av_packet_ref) to the same payload, never a copy.
public final class EncodedPacket: @unchecked Sendable {
    private let packet: Packet
    public let mediaType: MediaType
    /// Index of the stream in every output (the order the streams were added in).
    public let streamIndex: Int
    public let timeBase: Rational
    public let pts: Int64
    public let dts: Int64
    public let duration: Int64
    public let isKeyframe: Bool
    public let size: Int

    init(taking packet: consuming Packet, mediaType: MediaType, streamIndex: Int, timeBase: Rational) {
        let p = packet.pointer
        p.pointee.stream_index = Int32(streamIndex)
        self.mediaType = mediaType
        self.streamIndex = streamIndex
        self.timeBase = timeBase
        self.pts = p.pointee.pts
        self.dts = p.pointee.dts
        self.duration = p.pointee.duration
        self.isKeyframe = p.pointee.flags & AV_PKT_FLAG_KEY != 0
        self.size = Int(p.pointee.size)
        self.packet = packet
    }

    /// Presentation time in seconds.
    public var presentationSeconds: Double { Double(pts) * timeBase.doubleValue }
    /// Decoding time in seconds.
    public var decodingSeconds: Double { Double(dts) * timeBase.doubleValue }

    /// The payload, valid during `body`.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(start: packet.pointer.pointee.data, count: Int(packet.pointer.pointee.size)))
    }

    /// A new AVPacket referencing the same payload, for a muxer to consume.
    func reference() throws(FFmpegError) -> Packet { try packet.reference() }
}
