package import BroadcastKit
package import CAVCodec
package import CAVFormat
package import CAVUtil
package import CSwResample
package import CSwScale

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
package final class Scaler {
    /// What a scaler converts from.
    package struct Source: Equatable, CustomStringConvertible {
        package var format: AVPixelFormat
        package var width: Int32
        package var height: Int32
        /// Full-range ("JPEG") YUV, 0–255, as decoded MJPEG is; otherwise video range (16–235).
        package var fullRange: Bool

        package init(format: AVPixelFormat, width: Int32, height: Int32, fullRange: Bool) {
            // The yuvj* formats are yuv* at full range; libswscale wants the range said, not implied.
            (self.format, self.fullRange) = Self.withoutJPEGFormat(format, fullRange: fullRange)
            self.width = width
            self.height = height
        }

        /// A sample buffer's format (never compressed: decode first).
        package init?(_ video: VideoFormat) {
            guard let format = video.pixelFormat.avPixelFormat else { return nil }
            // RGB is full range by nature (libswscale ignores the flag for it); YUV says its own.
            self.init(
                format: format, width: Int32(video.width), height: Int32(video.height),
                fullRange: video.colour?.fullRange ?? false)
        }

        /// What a decoder produced.
        package init(decoded frame: UnsafePointer<AVFrame>) {
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

        package var description: String {
            let name = av_get_pix_fmt_name(format).map { String(cString: $0) } ?? "pixel format \(format.rawValue)"
            return "\(name)\(fullRange ? " (full range)" : "") \(width)x\(height)"
        }
    }

    package let source: Source
    package let outputFormat: AVPixelFormat
    package let outputWidth: Int32
    package let outputHeight: Int32
    private let context: ScaleContext
    private let colour: ColourDescription
    private let frame: Frame
    /// Whether `frame` holds the conversion of the previous input, so regions can be updated.
    package private(set) var holdsPicture = false
    /// Region conversions: contexts by size (a few sizes recur: a clock, a video, a pointer), and
    /// a full-size frame they write into before the inside is copied out.
    private var regionContexts: [RegionSize: RegionContext] = [:]
    private var scratch: ScratchFrame?
    private static let regionContextLimit = 24
    /// The frame's planes and strides for sws_scale, kept so a conversion makes no arrays.
    private var destinationPlanes: [UnsafeMutablePointer<UInt8>?] = [nil, nil, nil, nil]
    private var destinationStrides: [Int32] = [0, 0, 0, 0]
    /// Pixels converted since the scaler was made (benchmarks and tests).
    private(set) var convertedPixels = 0

    package convenience init(
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

    /// The output has `colour`'s range (default: video range, what H.264 encoders are usually
    /// given; a full-range source is compressed into it). An RGB source becomes YUV with `colour`'s
    /// matrix (default: the rule for the output height, BT.709 from 720 lines); a YUV source keeps
    /// its matrix, so the encoder is told the source's (`VideoEncoderSettings.colour`).
    package init(
        source: Source, outputFormat: AVPixelFormat, width: Int32, height: Int32,
        colour: ColourDescription? = nil
    ) throws(FFmpegError) {
        let colour = colour ?? .forOutput(height: Int(height))
        self.context = try Self.makeContext(
            source: source, outputFormat: outputFormat, width: width, height: height, colour: colour)
        self.colour = colour
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

    private static func makeContext(
        source: Source, outputFormat: AVPixelFormat, width: Int32, height: Int32, colour: ColourDescription
    ) throws(FFmpegError) -> ScaleContext {
        let what = "scaling \(source) to \(String(cString: av_get_pix_fmt_name(outputFormat))) \(width)x\(height)"
        // Ranges are options set before sws_init_context, so the path libswscale chooses at init
        // (for yuv420p to yuv420p a plain plane copy, unless the ranges differ) already knows them.
        guard let sws = sws_alloc_context() else { throw .outOfMemory(what) }
        let context = ScaleContext(sws)
        let options: [(String, Int64)] = [
            ("srcw", Int64(source.width)), ("srch", Int64(source.height)), ("src_format", Int64(source.format.rawValue)),
            ("dstw", Int64(width)), ("dsth", Int64(height)), ("dst_format", Int64(outputFormat.rawValue)),
            ("sws_flags", Int64(SWS_BILINEAR)),
            ("src_range", source.fullRange ? 1 : 0), ("dst_range", colour.fullRange ? 1 : 0),
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
        guard sws_setColorspaceDetails(sws, table, source.fullRange ? 1 : 0, table, colour.fullRange ? 1 : 0, 0, 1 << 16, 1 << 16) >= 0 else {
            throw FFmpegError.invalidArgument("libswscale cannot convert with the \(colour) matrix", what)
        }
        return context
    }

    /// Whether region updates are possible: same size in and out, even sizes, and a packed RGB
    /// source (one plane, one pixel per 3 or 4 bytes).
    package var convertsRegions: Bool {
        source.width == outputWidth && source.height == outputHeight && source.width % 2 == 0
            && source.height % 2 == 0 && outputFormat == AV_PIX_FMT_YUV420P && !source.fullRange
            && [AV_PIX_FMT_BGR0, AV_PIX_FMT_BGRA, AV_PIX_FMT_RGB24, AV_PIX_FMT_BGR24, AV_PIX_FMT_RGB0, AV_PIX_FMT_RGBA]
                .contains(source.format)
    }

    /// The next input is not the successor of the last one converted (a frame was skipped): the
    /// next `scale(_:changed:)` converts everything.
    func forgetPicture() { holdsPicture = false }

    /// Converts `buffer` knowing what changed since the previous buffer given to this scaler:
    /// `changed` nil converts everything, empty nothing (the frame is returned as it is), otherwise
    /// only the regions, padded to the 4:2:0 chroma grid, and the result is pixel for pixel what a
    /// full conversion gives (see `convertRegion`).
    package func scale(_ buffer: borrowing SampleBuffer, changed: [PixelRegion]?) throws(FFmpegError) -> UnsafeMutablePointer<AVFrame> {
        guard holdsPicture, let changed, convertsRegions else { return try scale(buffer) }
        if changed.isEmpty { return frame.pointer }
        let width = Int(source.width)
        let height = Int(source.height)
        // Grow by the reach of the chroma filters (a changed row also changes the chroma row
        // next to its pair: libswscale's 2:1 vertical chroma filter has four taps), snap to the
        // chroma grid and clip; a big total is cheaper converted whole.
        let reach = Self.filterReach
        var regions: [PixelRegion] = []
        var area = 0
        for region in changed {
            guard let clipped = region.clipped(width: width, height: height) else { continue }
            let x0 = max(0, clipped.x - reach) & ~1
            let y0 = max(0, clipped.y - reach) & ~1
            let x1 = min(width, (clipped.x + clipped.width + reach + 1) & ~1)
            let y1 = min(height, (clipped.y + clipped.height + reach + 1) & ~1)
            regions.append(PixelRegion(x: x0, y: y0, width: x1 - x0, height: y1 - y0))
            area += (x1 - x0) * (y1 - y0)
        }
        if area * 2 > width * height { return try scale(buffer) }
        try check(av_frame_make_writable(frame.pointer), "making a video frame writable")
        guard let plane = buffer.planes.first else { return try scale(buffer) }
        for region in regions {
            try convertRegion(region, from: plane)
        }
        return frame.pointer
    }

    /// Context around a region, in pixels: libswscale's 2:1 vertical chroma filter reads rows
    /// beyond a chroma pair and its horizontal chroma filter columns beyond one, and its dither
    /// pattern repeats every 8 chroma pixels; converting a block aligned to 16 pixels with this
    /// margin, and keeping only the inside, gives exactly what the whole-frame conversion gives.
    private static let regionMargin = 8
    private static let filterReach = 4
    private static let regionAlignment = 16

    private struct RegionSize: Hashable {
        var width: Int32
        var height: Int32
    }

    private final class ScratchFrame {
        let frame: Frame
        init(_ frame: consuming Frame) { self.frame = frame }
    }

    private final class RegionContext {
        let context: ScaleContext
        init(_ context: consuming ScaleContext) { self.context = context }
    }

    /// Converts one even-aligned region of the packed source plane into the kept frame.
    private func convertRegion(_ region: PixelRegion, from plane: Plane) throws(FFmpegError) {
        let width = Int(source.width)
        let height = Int(source.height)
        let align = Self.regionAlignment
        let margin = Self.regionMargin
        let bx0 = max(0, region.x - margin) / align * align
        let by0 = max(0, region.y - margin) / align * align
        // Sizes rounded up to the alignment (then clipped) so that few distinct sizes occur.
        let bx1 = min(width, bx0 + (region.x + region.width + margin - bx0 + align - 1) / align * align)
        let by1 = min(height, by0 + (region.y + region.height + margin - by0 + align - 1) / align * align)
        let size = RegionSize(width: Int32(bx1 - bx0), height: Int32(by1 - by0))
        let regionContext: RegionContext
        if let known = regionContexts[size] {
            regionContext = known
        } else {
            if regionContexts.count >= Self.regionContextLimit { regionContexts.removeAll(keepingCapacity: true) }
            var blockSource = source
            blockSource.width = size.width
            blockSource.height = size.height
            regionContext = RegionContext(
                try Self.makeContext(
                    source: blockSource, outputFormat: outputFormat, width: size.width, height: size.height,
                    colour: colour))
            regionContexts[size] = regionContext
        }
        let scratch: ScratchFrame
        if let known = self.scratch {
            scratch = known
        } else {
            let frame = try Frame()
            frame.pointer.pointee.format = outputFormat.rawValue
            frame.pointer.pointee.width = source.width
            frame.pointer.pointee.height = source.height
            try check(av_frame_get_buffer(frame.pointer, 0), "allocating a \(width)x\(height) frame")
            scratch = ScratchFrame(frame)
            self.scratch = scratch
        }
        let bytesPerPixel = source.format == AV_PIX_FMT_RGB24 || source.format == AV_PIX_FMT_BGR24 ? 3 : 4
        var sourcePlanes: [UnsafePointer<UInt8>?] = [
            plane.base.assumingMemoryBound(to: UInt8.self) + by0 * plane.bytesPerRow + bx0 * bytesPerPixel, nil, nil, nil,
        ]
        var sourceStrides: [Int32] = [Int32(plane.bytesPerRow), 0, 0, 0]
        var scratchPlanes: [UnsafeMutablePointer<UInt8>?] = (0..<4).map { scratch.frame.plane($0) }
        var scratchStrides: [Int32] = (0..<4).map { scratch.frame.bytesPerRow($0) }
        let rows = sws_scale(
            regionContext.context.pointer, &sourcePlanes, &sourceStrides, 0, size.height, &scratchPlanes, &scratchStrides)
        try check(rows, "converting a \(size.width)x\(size.height) region of a \(source) frame")
        convertedPixels += Int(size.width) * Int(size.height)
        // Copy the inside: luma, then both chroma planes at half the coordinates.
        for index in 0..<3 {
            let shift = index == 0 ? 0 : 1
            let from = scratchPlanes[index]!
            let fromStride = Int(scratchStrides[index])
            let to = frame.plane(index)!
            let toStride = Int(frame.bytesPerRow(index))
            let x = region.x >> shift
            let columns = region.width >> shift
            for y in (region.y >> shift)..<((region.y + region.height) >> shift) {
                (to + y * toStride + x).update(from: from + (y - (by0 >> shift)) * fromStride + (x - (bx0 >> shift)), count: columns)
            }
        }
    }

    /// The kept picture, to encode again.
    package func keptPicture() throws(FFmpegError) -> UnsafeMutablePointer<AVFrame> { frame.pointer }

    /// Tests: a scaler to yuv420p of the same size, as the encoder makes for a screen.
    convenience init(toYUV420P input: VideoFormat) throws(FFmpegError) {
        try self.init(input: input, outputFormat: AV_PIX_FMT_YUV420P, width: Int32(input.width), height: Int32(input.height))
    }

    /// Tests: `scale(_:changed:)` without the frame pointer.
    func update(_ buffer: borrowing SampleBuffer, changed: [PixelRegion]?) throws(FFmpegError) {
        _ = try scale(buffer, changed: changed)
    }

    /// Tests: the kept picture's planes, rows without padding.
    func pictureBytes() -> [[UInt8]] {
        (0..<3).map { index in
            let shift = index == 0 ? 0 : 1
            let columns = Int(outputWidth) >> shift
            let rows = Int(outputHeight) >> shift
            let stride = Int(frame.bytesPerRow(index))
            let base = frame.plane(index)!
            var bytes: [UInt8] = []
            bytes.reserveCapacity(columns * rows)
            for y in 0..<rows { bytes.append(contentsOf: UnsafeBufferPointer(start: base + y * stride, count: columns)) }
            return bytes
        }
    }

    /// Converts `buffer` and returns the scaler's frame, valid until the next call. When an
    /// encoder still holds a reference to the frame, a new buffer is allocated first.
    package func scale(_ buffer: borrowing SampleBuffer) throws(FFmpegError) -> UnsafeMutablePointer<AVFrame> {
        var sourcePlanes: [UnsafePointer<UInt8>?] = [nil, nil, nil, nil]
        var sourceStrides: [Int32] = [0, 0, 0, 0]
        for (index, plane) in buffer.planes.prefix(4).enumerated() {
            sourcePlanes[index] = plane.base.assumingMemoryBound(to: UInt8.self)
            sourceStrides[index] = Int32(plane.bytesPerRow)
        }
        return try scale(planes: &sourcePlanes, strides: &sourceStrides)
    }

    /// Converts a decoded frame (of `source`'s format and size); same result as `scale(_:)`.
    package func scale(_ decoded: UnsafePointer<AVFrame>) throws(FFmpegError) -> UnsafeMutablePointer<AVFrame> {
        var sourcePlanes: [UnsafePointer<UInt8>?] = [nil, nil, nil, nil]
        var sourceStrides: [Int32] = [0, 0, 0, 0]
        Frame.planes(of: decoded, into: &sourcePlanes, strides: &sourceStrides)
        return try scale(planes: &sourcePlanes, strides: &sourceStrides)
    }

    /// Converts planes of `source`'s format and size (a cropped view of a bigger picture: the
    /// compositor's layers).
    package func scale(
        planes sourcePlanes: inout [UnsafePointer<UInt8>?],
        strides sourceStrides: inout [Int32]
    ) throws(FFmpegError) -> UnsafeMutablePointer<AVFrame> {
        try check(av_frame_make_writable(frame.pointer), "making a video frame writable")
        // Rewritten in place (the frame's buffers may have moved): no arrays made per picture.
        for index in 0..<4 {
            destinationPlanes[index] = frame.plane(index)
            destinationStrides[index] = frame.bytesPerRow(index)
        }
        let rows = sws_scale(
            context.pointer, &sourcePlanes, &sourceStrides, 0, source.height,
            &destinationPlanes, &destinationStrides
        )
        try check(rows, "scaling a \(source) frame")
        convertedPixels += Int(source.width) * Int(source.height)
        holdsPicture = true
        return frame.pointer
    }
}
