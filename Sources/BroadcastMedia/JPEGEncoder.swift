public import BroadcastKit
internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CSwResample
internal import CSwScale

/// Turns a video frame into a JPEG picture of a given width (the control API's preview): libswscale
/// to full-range 4:2:0 of that size, then libavcodec's "mjpeg" encoder. MJPEG frames (a webcam's)
/// are decoded first. One thread calls it; the scaler and encoder are kept while the frame's format
/// and the width stay the same.
public final class JPEGEncoder {
    private var scaler: Scaler?
    private var codec: OpenCodec?
    private var decoder: MJPEGDecoder?
    private let packet: Packet
    /// JPEG quality as libavcodec's qscale (2 best .. 31 worst).
    private let quality: Int32
    private var nextPTS: Int64 = 0

    public init(quality: Int32 = 5) throws(FFmpegError) {
        self.packet = try Packet()
        self.quality = quality
    }

    /// `buffer`'s picture `width` pixels wide (even, at most the frame's), its height in proportion.
    public func encode(_ buffer: borrowing SampleBuffer, width requested: Int) throws(FFmpegError) -> [UInt8] {
        guard let format = buffer.videoFormat else { throw .invalidArgument("not a video frame", "encoding a preview") }
        if format.pixelFormat == .mjpeg {
            guard let jpeg = buffer.planes.first else { throw .invalidArgument("an MJPEG frame without data", "encoding a preview") }
            if decoder == nil { decoder = try MJPEGDecoder() }
            let decoded = try decoder!.decode(jpeg)
            let source = Scaler.Source(decoded: decoded)
            let frame = try scalerFor(source, requested)
            return try encode(frame.scale(decoded))
        }
        guard let source = Scaler.Source(format) else { throw .invalidArgument("\(format) cannot be scaled", "encoding a preview") }
        return try encode(scalerFor(source, requested).scale(buffer))
    }

    private func scalerFor(_ source: Scaler.Source, _ requested: Int) throws(FFmpegError) -> Scaler {
        let width = Int32(max(16, min(requested, Int(source.width))) & ~1)
        let height = Int32(max(2, Int(Double(source.height) * Double(width) / Double(source.width)) & ~1))
        if let scaler, scaler.source == source, scaler.outputWidth == width, scaler.outputHeight == height { return scaler }
        // JPEG (JFIF) is full-range BT.601 whatever the source was.
        var colour = ColourDescription.bt601
        colour.fullRange = true
        let made = try Scaler(source: source, outputFormat: AV_PIX_FMT_YUV420P, width: width, height: height, colour: colour)
        scaler = made
        codec = nil
        return made
    }

    private func encode(_ frame: UnsafeMutablePointer<AVFrame>) throws(FFmpegError) -> [UInt8] {
        let what = "encoding a \(frame.pointee.width)x\(frame.pointee.height) preview JPEG"
        if codec == nil {
            guard let found = avcodec_find_encoder(AV_CODEC_ID_MJPEG) else {
                throw .invalidArgument("libavcodec has no MJPEG encoder", what)
            }
            let context = try CodecContext(codec: found)
            let c = context.pointer
            c.pointee.width = frame.pointee.width
            c.pointee.height = frame.pointee.height
            c.pointee.pix_fmt = AV_PIX_FMT_YUV420P
            c.pointee.color_range = AVCOL_RANGE_JPEG
            c.pointee.time_base = AVRational(num: 1, den: 25)
            c.pointee.thread_count = 1
            c.pointee.flags |= AV_CODEC_FLAG_QSCALE
            c.pointee.global_quality = quality * FF_QP2LAMBDA
            try check(avcodec_open2(c, found, nil), what)
            codec = OpenCodec(context)
        }
        let c = codec!.context.pointer
        frame.pointee.color_range = AVCOL_RANGE_JPEG
        frame.pointee.quality = c.pointee.global_quality
        // Increasing: the encoder refuses a picture whose pts is not after the last one's.
        frame.pointee.pts = nextPTS
        nextPTS += 1
        try check(avcodec_send_frame(c, frame), what)
        av_packet_unref(packet.pointer)
        defer { av_packet_unref(packet.pointer) }
        try check(avcodec_receive_packet(c, packet.pointer), what)
        return Array(UnsafeBufferPointer(start: packet.pointer.pointee.data, count: Int(packet.pointer.pointee.size)))
    }
}

/// An open codec context kept between calls.
private final class OpenCodec {
    let context: CodecContext
    init(_ context: consuming CodecContext) { self.context = context }
}
