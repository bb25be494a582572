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
/// Made for one input format: a frame of another format or size needs another scaler.
final class Scaler {
    let input: VideoFormat
    let outputFormat: AVPixelFormat
    let outputWidth: Int32
    let outputHeight: Int32
    private let context: ScaleContext
    private let frame: Frame

    init(input: VideoFormat, outputFormat: AVPixelFormat, width: Int32, height: Int32) throws(FFmpegError) {
        let what = "scaling \(input) to \(String(cString: av_get_pix_fmt_name(outputFormat))) \(width)x\(height)"
        guard let inputFormat = input.pixelFormat.avPixelFormat else {
            throw FFmpegError(
                code: FFmpegError.posix(38 /* ENOSYS */),
                reason: "\(input.pixelFormat.rawValue) frames are compressed; decoding them is not supported",
                operation: what
            )
        }
        guard
            let sws = sws_getContext(
                Int32(input.width), Int32(input.height), inputFormat,
                width, height, outputFormat,
                SWS_BILINEAR, nil, nil, nil
            )
        else { throw FFmpegError.invalidArgument("libswscale cannot do this conversion", what) }
        self.context = ScaleContext(sws)
        self.input = input
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
        try check(av_frame_make_writable(frame.pointer), "making a video frame writable")
        var sourcePlanes: [UnsafePointer<UInt8>?] = [nil, nil, nil, nil]
        var sourceStrides: [Int32] = [0, 0, 0, 0]
        for (index, plane) in buffer.planes.prefix(4).enumerated() {
            sourcePlanes[index] = plane.base.assumingMemoryBound(to: UInt8.self)
            sourceStrides[index] = Int32(plane.bytesPerRow)
        }
        var destinationPlanes: [UnsafeMutablePointer<UInt8>?] = (0..<4).map { frame.plane($0) }
        var destinationStrides: [Int32] = (0..<4).map { frame.bytesPerRow($0) }
        let rows = sws_scale(
            context.pointer, &sourcePlanes, &sourceStrides, 0, Int32(input.height),
            &destinationPlanes, &destinationStrides
        )
        try check(rows, "scaling a \(input) frame")
        return frame.pointer
    }
}
