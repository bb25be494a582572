package import BroadcastKit
package import CAVCodec
package import CAVFormat
package import CAVUtil
package import CSwResample
package import CSwScale

/// Decodes the JPEG frames a V4L2 device captures as MJPEG (libavcodec's "mjpeg" decoder).
///
/// Every JPEG is a picture on its own, so one packet in gives one frame out at once. A damaged
/// JPEG (webcams send truncated ones) gives nothing: the caller drops that frame and counts it.
///
/// Not thread-safe: the encoder's thread uses it. Nothing is allocated per frame once the packet
/// buffer has grown to the largest JPEG seen (the decoder's frames come from its own pool).
package final class MJPEGDecoder {
    private let context: CodecContext
    private let packet: Packet
    private let frame: Frame
    /// The JPEG bytes the packet references, with the zeroed padding libavcodec's bit readers need
    /// after the data (a capture buffer has no such guarantee).
    private var payload: UnsafeMutablePointer<AVBufferRef>?

    package init() throws(FFmpegError) {
        let what = "opening the MJPEG decoder"
        guard let codec = avcodec_find_decoder(AV_CODEC_ID_MJPEG) else {
            throw FFmpegError(code: CBroadcastShimBridge.decoderNotFound, operation: what)
        }
        let context = try CodecContext(codec: codec)
        let c = context.pointer
        // One thread: frame threading would hold frames back, and a JPEG is cheap to decode.
        c.pointee.thread_count = 1
        // A truncated scan fails instead of giving a picture whose lower part is grey.
        c.pointee.err_recognition |= AV_EF_EXPLODE
        // The decoder's complaints about a bad JPEG become debug lines: the caller reports drops itself.
        c.pointee.log_level_offset = AV_LOG_DEBUG - AV_LOG_ERROR
        try check(avcodec_open2(c, codec, nil), what)
        self.context = context
        self.packet = try Packet()
        self.frame = try Frame()
        self.payload = nil
    }

    deinit { av_buffer_unref(&payload) }

    /// Decodes one JPEG. Returns the decoded picture (full-range YUV, usually yuvj422p or yuvj420p),
    /// valid until the next call; throws when the JPEG cannot be decoded.
    package func decode(_ jpeg: Plane) throws(FFmpegError) -> UnsafePointer<AVFrame> {
        let what = "decoding a \(jpeg.count)-byte MJPEG frame"
        guard jpeg.count > 0, jpeg.count <= Int(Int32.max) - Int(AV_INPUT_BUFFER_PADDING_SIZE) else {
            throw FFmpegError(code: CBroadcastShimBridge.invalidData, reason: "no JPEG data", operation: what)
        }
        let padded = jpeg.count + Int(AV_INPUT_BUFFER_PADDING_SIZE)
        // Grows only; writable again because the decoder let go of the last packet when it returned its frame.
        if payload == nil || payload!.pointee.size < padded || av_buffer_is_writable(payload) == 0 {
            av_buffer_unref(&payload)
            payload = av_buffer_alloc(max(padded, 64 << 10))
            guard payload != nil else { throw .outOfMemory(what) }
        }
        let data = payload!.pointee.data!
        data.update(from: jpeg.base.assumingMemoryBound(to: UInt8.self), count: jpeg.count)
        (data + jpeg.count).update(repeating: 0, count: Int(AV_INPUT_BUFFER_PADDING_SIZE))

        let p = packet.pointer
        av_packet_unref(p)
        p.pointee.buf = av_buffer_ref(payload)
        guard p.pointee.buf != nil else { throw .outOfMemory(what) }
        p.pointee.data = data
        p.pointee.size = Int32(jpeg.count)
        p.pointee.flags = AV_PKT_FLAG_KEY
        defer { av_packet_unref(p) }

        let c = context.pointer
        var sent = avcodec_send_packet(c, p)
        if sent == FFmpegError.again {
            // A frame left from before (not possible with one thread, but the contract allows it).
            av_frame_unref(frame.pointer)
            while avcodec_receive_frame(c, frame.pointer) >= 0 { av_frame_unref(frame.pointer) }
            sent = avcodec_send_packet(c, p)
        }
        do {
            try check(sent, what)
            try check(avcodec_receive_frame(c, frame.pointer), what)
        } catch {
            // Start the next JPEG from a clean state, whatever this one left behind.
            avcodec_flush_buffers(c)
            throw error
        }
        return UnsafePointer(frame.pointer)
    }
}
