public import BroadcastKit
internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CSwResample
internal import CSwScale
public import Logging

/// Encodes video sample buffers to H.264 packets.
///
/// Time base: 1/90000 (MPEG's clock). Frames arrive at whatever times the source captured them, so
/// the encoder is told the nominal frame rate (`framerate`, for rate control and the GOP length)
/// but each frame keeps its own timestamp: 90 kHz represents 24, 25, 30, 60 and 30000/1001 fps
/// exactly and is what MPEG-TS uses natively.
///
/// Not thread-safe: one thread (the session's) calls it.
public final class VideoEncoder {
    public static let timeBase = Rational(1, 90_000)

    /// The settings in effect: `encoder` is "libx264" when a hardware encoder could not open.
    public let settings: VideoEncoderSettings
    /// The stream to add to a muxer.
    public let stream: StreamDescription
    public let streamIndex: Int
    private let logger: Logger
    private let context: CodecContext
    private let inputFrame: Frame
    private let nominalFrameDuration: Int64
    private var scaler: Scaler?
    /// What the stream is tagged as, and so what converted frames are made into.
    private let colour: ColourDescription
    /// Made for the first MJPEG frame.
    private var decoder: MJPEGDecoder?
    private var lastPTS: Int64?
    private var keyframeRequested = false
    private var flushed = false
    /// Input planes are passed to the encoder by reference, not copied (libx264 only): see `borrowPlanes`.
    private var referencesInput: Bool
    /// Benchmark instrumentation: nil unless BROADCAST_LATENCY_FILE is set.
    private let latencyProbe: LatencyProbe?
    /// Frames dropped because their timestamp was not at least 1 ms after the previous frame's.
    public private(set) var droppedFrames = 0
    /// Frames handed to the encoder.
    public private(set) var framesEncoded = 0
    /// Frames that repeated the previous picture (``SampleBuffer/isRepeat``) and were not converted.
    public private(set) var repeatsNotConverted = 0
    /// Pixels converted to the encoder's format so far (whole frames and changed regions).
    public var convertedPixels: Int { scaler?.convertedPixels ?? 0 }
    /// Compressed (MJPEG) frames dropped because they could not be decoded: webcams send truncated
    /// JPEGs now and then, which costs that frame and nothing more.
    public private(set) var undecodableFrames = 0

    /// Opens the encoder.
    ///
    /// - Parameter globalHeader: the muxers the packets go to want codec headers out of band
    ///   (AVFMT_GLOBALHEADER: MP4, MOV, MKV, FLV); sets AV_CODEC_FLAG_GLOBAL_HEADER.
    /// - Parameter streamIndex: the index the packets carry (the stream's order in every output).
    ///
    /// A hardware encoder (h264_nvenc) that cannot open is replaced by libx264 with a warning.
    /// Encoders that need frames on hardware surfaces (VAAPI, QSV) are not supported: frames are
    /// handed over in memory as yuv420p.
    public init(
        settings: VideoEncoderSettings,
        globalHeader: Bool,
        streamIndex: Int = 0,
        logger: Logger
    ) throws(FFmpegError) {
        let created = MonotonicClock().now()
        if let problem = settings.problem() {
            throw FFmpegError.invalidArgument(problem, "opening video encoder \(settings.encoder)")
        }
        var effective = settings
        let context: CodecContext
        do {
            context = try Self.open(settings, globalHeader: globalHeader, logger: logger)
        } catch  where settings.encoder != "libx264" {
            logger.warning(
                "video encoder \(settings.encoder) is not usable here, falling back to libx264",
                metadata: ["error": "\(error)"]
            )
            effective.encoder = "libx264"
            if !VideoEncoderSettings.knownPresets.contains(effective.preset) { effective.preset = "veryfast" }
            context = try Self.open(effective, globalHeader: globalHeader, logger: logger)
        }
        let rate = Rational(Int32(effective.frameRate.numerator), Int32(effective.frameRate.denominator))
        let timeBase = context.pointer.pointee.time_base
        self.stream = StreamDescription(
            parameters: try CodecParameters(context: context.pointer),
            timeBase: Rational(timeBase),
            frameRate: rate
        )
        self.nominalFrameDuration = av_rescale_q(1, av_inv_q(rate.av), timeBase)
        self.settings = effective
        self.context = context
        self.logger = logger
        self.streamIndex = streamIndex
        self.inputFrame = try Frame()
        self.colour = ColourDescription.forEncoder(source: effective.colour, height: effective.height)
        self.referencesInput = effective.encoder == "libx264"
        self.latencyProbe = LatencyProbe(origin: created, timeBase: Rational(timeBase))
        logger.debug(
            "opened video encoder",
            metadata: [
                "encoder": "\(effective.encoder)", "size": "\(effective.width)x\(effective.height)",
                "fps": "\(effective.frameRate)", "gop": "\(effective.gopSize)",
            ]
        )
    }

    private static func open(
        _ settings: VideoEncoderSettings,
        globalHeader: Bool,
        logger: Logger
    ) throws(FFmpegError) -> CodecContext {
        let what = "opening video encoder \(settings.encoder)"
        guard let codec = avcodec_find_encoder_by_name(settings.encoder) else {
            throw FFmpegError(code: CBroadcastShimBridge.encoderNotFound, operation: what)
        }
        let context = try CodecContext(codec: codec)
        let c = context.pointer
        c.pointee.width = Int32(settings.width)
        c.pointee.height = Int32(settings.height)
        c.pointee.pix_fmt = AV_PIX_FMT_YUV420P
        c.pointee.time_base = timeBase.av
        c.pointee.framerate = AVRational(
            num: Int32(settings.frameRate.numerator),
            den: Int32(settings.frameRate.denominator)
        )
        c.pointee.sample_aspect_ratio = AVRational(num: 1, den: 1)
        // Said before avcodec_open2 so x264 writes the VUI; the muxers copy them into colr/Colour.
        let colour = ColourDescription.forEncoder(source: settings.colour, height: settings.height)
        c.pointee.colorspace = colour.matrix
        c.pointee.color_primaries = colour.primaries
        c.pointee.color_trc = colour.transfer
        c.pointee.color_range = colour.fullRange ? AVCOL_RANGE_JPEG : AVCOL_RANGE_MPEG
        c.pointee.gop_size = Int32(settings.gopSize)
        c.pointee.thread_count = Int32(settings.threads)
        if globalHeader { c.pointee.flags |= Int32(AV_CODEC_FLAG_GLOBAL_HEADER) }

        var options: [String: String] = [:]
        let bitrate = Int64(settings.bitrate)
        switch settings.rateControl {
        case .cbr:
            c.pointee.bit_rate = bitrate
            c.pointee.rc_min_rate = bitrate
            c.pointee.rc_max_rate = bitrate
            c.pointee.rc_buffer_size = Int32(clamping: bitrate)
            if settings.encoder == "libx264", settings.adaptiveFor == nil { options["nal-hrd"] = "cbr" }
        case .vbr:
            c.pointee.bit_rate = bitrate
            c.pointee.rc_max_rate = bitrate * 3 / 2
            c.pointee.rc_buffer_size = Int32(clamping: bitrate * 2)
        case .crf(let quality):
            if settings.encoder == "libx264" { options["crf"] = "\(quality)" } else { options["cq"] = "\(quality)" }
            if bitrate > 0 {
                c.pointee.rc_max_rate = bitrate
                c.pointee.rc_buffer_size = Int32(clamping: bitrate * 2)
            }
        }
        if settings.encoder == "libx264" {
            options["preset"] = settings.preset
            if let tune = settings.tune { options["tune"] = tune }
            // A forced keyframe is an IDR, where a new viewer can start decoding.
            options["forced-idr"] = "1"
            if let lookahead = settings.lookahead { options["rc-lookahead"] = "\(lookahead)" }
        }
        if let profile = settings.profile { options["profile"] = profile }

        var dictionary = OptionDictionary(options)
        try check(avcodec_open2(c, codec, &dictionary.pointer), what)
        let unused = dictionary.keys
        if !unused.isEmpty {
            logger.warning("video encoder \(settings.encoder) ignored options: \(unused.joined(separator: ", "))")
        }
        return context
    }

    /// Makes the next frame a keyframe (an IDR with libx264): a new viewer or segment starts there.
    public func forceKeyframe() { keyframeRequested = true }

    /// The bitrate from the next frame on (an adaptive output's encode): FFmpeg's libx264 wrapper
    /// reconfigures x264 when the context's bitrate, maximum rate or buffer changed between two
    /// frames, without a keyframe. CBR and VBR keep their shapes (a one-second buffer; 1.5x peaks
    /// and a two-second buffer).
    public func setBitrate(_ bitsPerSecond: Int) {
        let c = context.pointer
        let bitrate = Int64(bitsPerSecond)
        switch settings.rateControl {
        case .cbr:
            c.pointee.bit_rate = bitrate
            c.pointee.rc_max_rate = bitrate
            c.pointee.rc_buffer_size = Int32(clamping: bitrate)
        case .vbr:
            c.pointee.bit_rate = bitrate
            c.pointee.rc_max_rate = bitrate * 3 / 2
            c.pointee.rc_buffer_size = Int32(clamping: bitrate * 2)
        case .crf:
            c.pointee.rc_max_rate = bitrate
            c.pointee.rc_buffer_size = Int32(clamping: bitrate * 2)
        }
    }

    /// Encodes one video frame; returns the packets the encoder has ready (maybe none yet).
    ///
    /// A frame in the encoder's format (yuv420p) and size goes in without a copy; anything else is
    /// converted first, and MJPEG is decoded before that. A frame whose timestamp is not after the
    /// previous one is dropped, and so is a JPEG that does not decode (counted in `undecodableFrames`).
    public func encode(_ buffer: borrowing SampleBuffer) throws(FFmpegError) -> [EncodedPacket] {
        let what = "encoding a video frame with \(settings.encoder)"
        guard let format = buffer.videoFormat else {
            throw FFmpegError.invalidArgument("the buffer holds audio", what)
        }
        guard !flushed else { throw FFmpegError.invalidArgument("the encoder was flushed", what) }
        guard buffer.presentationTime.isNumeric else {
            throw FFmpegError.invalidArgument("the frame has no timestamp", what)
        }
        guard buffer.planes.count >= format.pixelFormat.planeCount else {
            throw FFmpegError.invalidArgument(
                "\(format) needs \(format.pixelFormat.planeCount) planes, got \(buffer.planes.count)",
                what
            )
        }
        let pts = buffer.presentationTime.rescaled(to: Self.timeBase.denominator).value
        latencyProbe?.entering(pts: pts)
        // Matroska and FLV count in milliseconds: a frame less than 1 ms after the previous one would
        // share its timestamp there (a device delivering two buffers back to back), so it goes.
        if let last = lastPTS, pts < last + Int64(Self.timeBase.denominator) / 1000 {
            droppedFrames += 1
            skippedFrame()
            logger.debug(
                "dropping a video frame less than 1 ms after the previous one", metadata: ["pts": "\(pts)"])
            return []
        }

        let c = context.pointer
        let frame: UnsafeMutablePointer<AVFrame>
        if format.pixelFormat == .mjpeg {
            guard let decoded = try decodeJPEG(buffer.planes[0]) else { return [] }
            let source = Scaler.Source(decoded: decoded)
            if scaler?.source != source {
                scaler = try Scaler(
                    source: source, outputFormat: c.pointee.pix_fmt, width: c.pointee.width, height: c.pointee.height,
                    colour: colour)
            }
            frame = try scaler!.scale(decoded)
        } else if format.pixelFormat == .yuv420p, format.width == Int(c.pointee.width), format.height == Int(c.pointee.height),
            c.pointee.pix_fmt == AV_PIX_FMT_YUV420P
        {
            // Point the frame at the buffer's planes: avcodec_send_frame copies a frame that is not
            // refcounted before returning, so nothing outlives this call.
            frame = inputFrame.pointer
            av_frame_unref(frame)
            frame.pointee.format = AV_PIX_FMT_YUV420P.rawValue
            frame.pointee.width = c.pointee.width
            frame.pointee.height = c.pointee.height
            for (index, plane) in buffer.planes.prefix(3).enumerated() {
                inputFrame.setPlane(
                    index,
                    UnsafeMutablePointer(mutating: plane.base.assumingMemoryBound(to: UInt8.self)),
                    bytesPerRow: Int32(plane.bytesPerRow)
                )
            }
            if referencesInput { borrowPlanes(buffer) }
        } else {
            if scaler == nil || scaler!.source != Scaler.Source(format) {
                scaler = try Scaler(
                    input: format, outputFormat: c.pointee.pix_fmt, width: c.pointee.width, height: c.pointee.height,
                    colour: colour)
            }
            if buffer.isRepeat, scaler!.convertsRegions, scaler!.holdsPicture { repeatsNotConverted += 1 }
            frame = try scaler!.scale(buffer, changed: buffer.changedRegions)
        }
        lastPTS = pts
        frame.pointee.pts = pts
        frame.pointee.pict_type = AVPictureType(rawValue: keyframeRequested ? 1 : 0)  // AV_PICTURE_TYPE_I : AV_PICTURE_TYPE_NONE
        keyframeRequested = false
        defer {
            if frame == inputFrame.pointer {
                if frame.pointee.buf.0 != nil { returnPlanes() }
                for index in 0..<3 { inputFrame.setPlane(index, nil, bytesPerRow: 0) }
            }
        }
        framesEncoded += 1
        latencyProbe?.sending(pts: pts)
        let packets = try send(frame, what)
        latencyProbe?.handOver(packets)
        return packets
    }

    /// Encodes the last converted picture again at `time` (vfr: the end of a still stretch). Nothing
    /// when there is no kept picture (the last frame went in without conversion) or `time` is not
    /// after the last frame.
    public func repeatLastPicture(at time: MediaTime) throws(FFmpegError) -> [EncodedPacket] {
        guard !flushed, let scaler, scaler.holdsPicture, scaler.convertsRegions, time.isNumeric else { return [] }
        let pts = time.rescaled(to: Self.timeBase.denominator).value
        if let last = lastPTS, pts < last + Int64(Self.timeBase.denominator) / 1000 { return [] }
        let frame = try scaler.keptPicture()
        lastPTS = pts
        frame.pointee.pts = pts
        frame.pointee.pict_type = AVPictureType(rawValue: 0)
        framesEncoded += 1
        repeatsNotConverted += 1
        return try send(frame, "encoding a repeated video frame with \(settings.encoder)")
    }

    /// The caller drops a frame instead of encoding it: the next one's changed regions are relative
    /// to the dropped one, so it is converted whole.
    public func skippedFrame() { scaler?.forgetPicture() }

    /// Decodes one captured JPEG; nil when it does not decode (dropped and counted, never an error:
    /// one bad frame must not end a broadcast). The first drop is a warning, later ones debug lines.
    private func decodeJPEG(_ jpeg: Plane) throws(FFmpegError) -> UnsafePointer<AVFrame>? {
        if decoder == nil { decoder = try MJPEGDecoder() }
        do {
            return try decoder!.decode(jpeg)
        } catch {
            undecodableFrames += 1
            let message: Logger.Message = "dropping an MJPEG frame that does not decode (damaged or truncated JPEG)"
            let metadata: Logger.Metadata = ["error": "\(error)", "dropped": "\(undecodableFrames)"]
            if undecodableFrames == 1 {
                logger.warning("\(message); further ones are logged at debug level", metadata: metadata)
            } else {
                logger.debug(message, metadata: metadata)
            }
            return nil
        }
    }

    /// Benchmarks (BROADCAST_LATENCY_FILE): media time zero is now. The session reads its start
    /// time right after `broadcastStarted` returns, so the handler calls this last thing there.
    public func markMediaTimeZero() { latencyProbe?.origin = MonotonicClock().now() }

    /// Wraps the buffer's planes in AVBufferRefs that free nothing, so avcodec_send_frame takes a
    /// reference instead of allocating a frame and copying every plane into it (3 MB at 1080p, each
    /// frame; libx264 copies the picture into its own again anyway).
    ///
    /// Rule 2 holds because of how libavcodec runs an encoder like libx264 (no frame threads, no
    /// hardware queue): when no packet is pending, which `send` ensures by draining to EAGAIN,
    /// avcodec_send_frame hands the frame to the encoder and unreferences it before it returns.
    /// `returnPlanes` checks that nothing kept a reference; if something ever does, the encoder goes
    /// back to copying for good.
    private func borrowPlanes(_ buffer: borrowing SampleBuffer) {
        let frame = inputFrame.pointer
        withUnsafeMutableBytes(of: &frame.pointee.buf) { refs in
            let slots = refs.bindMemory(to: UnsafeMutablePointer<AVBufferRef>?.self)
            for (index, plane) in buffer.planes.prefix(3).enumerated() {
                slots[index] = av_buffer_create(
                    UnsafeMutablePointer(mutating: plane.base.assumingMemoryBound(to: UInt8.self)),
                    plane.count, { _, _ in }, nil, 0)
            }
        }
    }

    /// After a frame sent with borrowed planes: drops our references, and stops borrowing when the
    /// encoder kept one.
    private func returnPlanes() {
        if let first = inputFrame.pointer.pointee.buf.0, av_buffer_get_ref_count(first) != 1 {
            referencesInput = false
            logger.error(
                "video encoder \(settings.encoder) kept a reference to an input frame; copying frames from now on")
        }
        av_frame_unref(inputFrame.pointer)
    }

    /// Drains the encoder at the end of the stream; returns its last packets. Call once.
    public func flush() throws(FFmpegError) -> [EncodedPacket] {
        guard !flushed else { return [] }
        flushed = true
        latencyProbe?.write()
        return try send(nil, "flushing video encoder \(settings.encoder)")
    }

    /// Sends a frame (nil: end of stream) and receives what is ready.
    private func send(_ frame: UnsafeMutablePointer<AVFrame>?, _ what: String) throws(FFmpegError) -> [EncodedPacket] {
        var packets: [EncodedPacket] = []
        try context.encode(
            frame, into: &packets, mediaType: .video, streamIndex: streamIndex, timeBase: stream.timeBase,
            defaultDuration: nominalFrameDuration, what)
        return packets
    }
}
