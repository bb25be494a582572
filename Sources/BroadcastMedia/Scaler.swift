internal import BroadcastKit
internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CSwResample
internal import CSwScale

extension PixelFormat {
    /// The matching AVPixelFormat; nil for compressed formats (mjpeg).
    var avPixelFormat: AVPixelFormat? {
        switch self {
        case .yuv420p: AV_PIX_FMT_YUV420P
        case .nv12: AV_PIX_FMT_NV12
        case .yuyv422: AV_PIX_FMT_YUYV422
        case .uyvy422: AV_PIX_FMT_UYVY422
        case .rgb24: AV_PIX_FMT_RGB24
        case .bgr24: AV_PIX_FMT_BGR24
        case .bgra: AV_PIX_FMT_BGRA
        case .bgr0: AV_PIX_FMT_BGR0
        case .gray8: AV_PIX_FMT_GRAY8
        case .mjpeg: nil
        }
    }
}

/// Converts video frames of one format and size to another (libswscale), into frames it owns.
///
/// Made for one input (format, size, range): a frame of another needs another scaler.
final class Scaler {
    /// What a scaler converts from.
    struct Source: Equatable, CustomStringConvertible {
        var format: AVPixelFormat
        var width: Int32
        var height: Int32
        /// Full-range ("JPEG") YUV, 0–255, as decoded MJPEG is; otherwise video range (16–235).
        var fullRange: Bool

        init(format: AVPixelFormat, width: Int32, height: Int32, fullRange: Bool) {
            // The yuvj* formats are yuv* at full range; libswscale wants the range said, not implied.
            (self.format, self.fullRange) = Self.withoutJPEGFormat(format, fullRange: fullRange)
            self.width = width
            self.height = height
        }

        /// A sample buffer's format (never compressed: decode first).
        init?(_ video: VideoFormat) {
            guard let format = video.pixelFormat.avPixelFormat else { return nil }
            self.init(format: format, width: Int32(video.width), height: Int32(video.height), fullRange: false)
        }

        /// What a decoder produced.
        init(decoded frame: UnsafePointer<AVFrame>) {
            self.init(
                format: AVPixelFormat(rawValue: frame.pointee.format),
                width: frame.pointee.width,
                height: frame.pointee.height,
                fullRange: frame.pointee.color_range == AVCOL_RANGE_JPEG
            )
        }

        private static func withoutJPEGFormat(_ format: AVPixelFormat, fullRange: Bool) -> (AVPixelFormat, Bool) {
            switch format {
            case AV_PIX_FMT_YUVJ420P: (AV_PIX_FMT_YUV420P, true)
            case AV_PIX_FMT_YUVJ422P: (AV_PIX_FMT_YUV422P, true)
            case AV_PIX_FMT_YUVJ444P: (AV_PIX_FMT_YUV444P, true)
            case AV_PIX_FMT_YUVJ440P: (AV_PIX_FMT_YUV440P, true)
            case AV_PIX_FMT_YUVJ411P: (AV_PIX_FMT_YUV411P, true)
            default: (format, fullRange)
            }
        }

        var description: String {
            let name = av_get_pix_fmt_name(format).map { String(cString: $0) } ?? "pixel format \(format.rawValue)"
            return "\(name)\(fullRange ? " (full range)" : "") \(width)x\(height)"
        }
    }

    let source: Source
    let outputFormat: AVPixelFormat
    let outputWidth: Int32
    let outputHeight: Int32
    private let context: ScaleContext
    private let frame: Frame

    convenience init(
        input: VideoFormat, outputFormat: AVPixelFormat, width: Int32, height: Int32,
        colour: ColourDescription? = nil
    ) throws(FFmpegError) {
        guard let source = Source(input) else {
            throw FFmpegError(
                code: FFmpegError.posix(38 /* ENOSYS */),
                reason: "\(input.pixelFormat.rawValue) frames are compressed: they are decoded, not scaled",
                operation: "scaling \(input)"
            )
        }
        try self.init(source: source, outputFormat: outputFormat, width: width, height: height, colour: colour)
    }

    /// The output is video range (what H.264 encoders are given); a full-range source is
    /// compressed into it. An RGB source becomes YUV with `colour`'s matrix (default: the rule for
    /// the output height, BT.709 from 720 lines); a YUV source keeps its matrix.
    init(
        source: Source, outputFormat: AVPixelFormat, width: Int32, height: Int32,
        colour: ColourDescription? = nil
    ) throws(FFmpegError) {
        let colour = colour ?? .forOutput(height: Int(height))
        let what = "scaling \(source) to \(String(cString: av_get_pix_fmt_name(outputFormat))) \(width)x\(height)"
        // Ranges are options set before sws_init_context, so the path libswscale chooses at init
        // (for yuv420p to yuv420p a plain plane copy, unless the ranges differ) already knows them.
        guard let sws = sws_alloc_context() else { throw .outOfMemory(what) }
        let context = ScaleContext(sws)
        let options: [(String, Int64)] = [
            ("srcw", Int64(source.width)), ("srch", Int64(source.height)), ("src_format", Int64(source.format.rawValue)),
            ("dstw", Int64(width)), ("dsth", Int64(height)), ("dst_format", Int64(outputFormat.rawValue)),
            ("sws_flags", Int64(SWS_BILINEAR)),
            ("src_range", source.fullRange ? 1 : 0), ("dst_range", 0),
        ]
        for (name, value) in options {
            try check(av_opt_set_int(UnsafeMutableRawPointer(sws), name, value, 0), "\(what): setting \(name)")
        }
        guard sws_init_context(sws, nil, nil) >= 0 else {
            throw FFmpegError.invalidArgument("libswscale cannot do this conversion", what)
        }
        // libswscale's default matrix is BT.601; the RGB→YUV one is the destination table. The
        // source table only matters for a YUV source, which keeps its own matrix: give it the same.
        let table = sws_getCoefficients(colour.swsColourspace)
        guard sws_setColorspaceDetails(sws, table, source.fullRange ? 1 : 0, table, 0, 0, 1 << 16, 1 << 16) >= 0 else {
            throw FFmpegError.invalidArgument("libswscale cannot convert with the \(colour) matrix", what)
        }
        self.context = context
        self.source = source
        self.outputFormat = outputFormat
        self.outputWidth = width
        self.outputHeight = height
        self.frame = try Frame()
        frame.pointer.pointee.format = outputFormat.rawValue
        frame.pointer.pointee.width = width
        frame.pointer.pointee.height = height
        try check(av_frame_get_buffer(frame.pointer, 0), "allocating a \(width)x\(height) frame")
    }

    /// Converts `buffer` and returns the scaler's frame, valid until the next call. When an
    /// encoder still holds a reference to the frame, a new buffer is allocated first.
    func scale(_ buffer: borrowing SampleBuffer) throws(FFmpegError) -> UnsafeMutablePointer<AVFrame> {
        var sourcePlanes: [UnsafePointer<UInt8>?] = [nil, nil, nil, nil]
        var sourceStrides: [Int32] = [0, 0, 0, 0]
        for (index, plane) in buffer.planes.prefix(4).enumerated() {
            sourcePlanes[index] = plane.base.assumingMemoryBound(to: UInt8.self)
            sourceStrides[index] = Int32(plane.bytesPerRow)
        }
        return try scale(planes: &sourcePlanes, strides: &sourceStrides)
    }

    /// Converts a decoded frame (of `source`'s format and size); same result as `scale(_:)`.
    func scale(_ decoded: UnsafePointer<AVFrame>) throws(FFmpegError) -> UnsafeMutablePointer<AVFrame> {
        var sourcePlanes: [UnsafePointer<UInt8>?] = withUnsafeBytes(of: decoded.pointee.data) { data in
            let pointers = data.bindMemory(to: UnsafeMutablePointer<UInt8>?.self)
            return (0..<4).map { UnsafePointer(pointers[$0]) }
        }
        var sourceStrides: [Int32] = withUnsafeBytes(of: decoded.pointee.linesize) { sizes in
            (0..<4).map { sizes.load(fromByteOffset: $0 * 4, as: Int32.self) }
        }
        return try scale(planes: &sourcePlanes, strides: &sourceStrides)
    }

    private func scale(
        planes sourcePlanes: inout [UnsafePointer<UInt8>?],
        strides sourceStrides: inout [Int32]
    ) throws(FFmpegError) -> UnsafeMutablePointer<AVFrame> {
        try check(av_frame_make_writable(frame.pointer), "making a video frame writable")
        var destinationPlanes: [UnsafeMutablePointer<UInt8>?] = (0..<4).map { frame.plane($0) }
        var destinationStrides: [Int32] = (0..<4).map { frame.bytesPerRow($0) }
        let rows = sws_scale(
            context.pointer, &sourcePlanes, &sourceStrides, 0, source.height,
            &destinationPlanes, &destinationStrides
        )
        try check(rows, "scaling a \(source) frame")
        return frame.pointer
    }
}
