internal import BroadcastKit
internal import BroadcastMedia
internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CSwResample
internal import CSwScale

/// Makes one yuv420p picture out of a base and layers drawn over it, redrawing only what changed.
///
/// Each picture is converted once, when it comes: the base into a full-size yuv420p picture (only
/// its changed regions, for a screen: `Scaler.scale(_:changed:)`), each layer from its own format
/// and colour into the output's and scaled to its box. The composite (`canvas`) is then redrawn
/// only where something changed: the base's changed regions and the boxes of layers with a new
/// picture (or that appeared or went), each such region copied from the base picture and the layers
/// over it drawn into it. Nothing changed: nothing is drawn (`compose` answers `[]`).
///
/// One thread only: made by `LayeredVideoSource.start` (so its errors are the start's) and handed
/// to the composite's thread, which alone uses it from then on.
final class Compositor: @unchecked Sendable {
    enum Shown: Equatable {
        case hidden
        case picture
        case slate

        /// As an atomic's value, and back (anything else is hidden).
        var code: Int {
            switch self {
            case .hidden: 0
            case .picture: 1
            case .slate: 2
            }
        }

        init(code: Int) { self = code == 1 ? .picture : code == 2 ? .slate : .hidden }

        /// As the status says it.
        var name: String {
            switch self {
            case .hidden: "hidden"
            case .picture: "picture"
            case .slate: "slate"
            }
        }
    }

    /// Used by the composite's thread only (handed to it at the start, as the compositor is).
    final class Layer: @unchecked Sendable {
        let placement: LayerPlacement
        /// Where the layer goes; it may reach past the frame's right and bottom edges (what is
        /// past them is cut when drawn); nil when nothing of it is inside the frame.
        let box: PixelRegion?
        var decoder: MJPEGDecoder?
        /// Into RGB with the source's own matrix, when it differs from the output's (libswscale
        /// converts YUV to YUV without a matrix change).
        var toRGB: Scaler?
        var toOutput: Scaler?
        /// The converted picture, `drawn`'s size (the `toOutput` scaler's frame).
        var picture: UnsafeMutablePointer<AVFrame>?
        var drawn: PixelRegion?
        var shown = Shown.hidden

        init(placement: LayerPlacement, box: PixelRegion?) {
            self.placement = placement
            self.box = box
        }

        var area: PixelRegion? {
            switch shown {
            case .hidden: nil
            case .picture: drawn
            case .slate: box
            }
        }
    }

    let width: Int
    let height: Int
    let colour: ColourDescription
    private let canvas: Frame
    private var baseScaler: Scaler?
    private var baseDecoder: MJPEGDecoder?
    private(set) var layers: [Layer]
    /// The next `compose` redraws everything.
    private var everything = true
    /// What changed since the last `redraw` (frame coordinates, on the chroma grid), and what the
    /// last `redraw` drew: lists of their own, traded at each redraw, never shared or copied.
    private var dirty = RegionList(capacity: 64)
    private var redrawn = RegionList(capacity: 64)
    /// A layer's picture as planes and strides for libswscale, rewritten in place at each conversion.
    private var sourcePlanes: [UnsafePointer<UInt8>?] = [nil, nil, nil, nil]
    private var sourceStrides: [Int32] = [0, 0, 0, 0]
    /// Pixels drawn into the composite since the start (tests and benchmarks).
    private(set) var composedPixels = 0
    /// Layer pictures converted since the start.
    private(set) var layerConversions = 0

    convenience init(width: Int, height: Int, colour: ColourDescription, placements: [LayerPlacement]) throws(FFmpegError) {
        try self.init(
            width: width, height: height, colour: colour,
            layers: placements.map { Layer(placement: $0, box: $0.box(frameWidth: width, frameHeight: height)) })
    }

    init(width: Int, height: Int, colour: ColourDescription, layers: [Layer]) throws(FFmpegError) {
        self.width = width
        self.height = height
        self.colour = colour
        canvas = try Frame()
        canvas.pointer.pointee.format = AV_PIX_FMT_YUV420P.rawValue
        canvas.pointer.pointee.width = Int32(width)
        canvas.pointer.pointee.height = Int32(height)
        try check(av_frame_get_buffer(canvas.pointer, 0), "allocating a \(width)x\(height) composite")
        self.layers = layers
    }

    /// Draws `layers` from the next `compose` on (another scene): everything is redrawn.
    func show(_ layers: [Layer]) {
        self.layers = layers
        everything = true
    }

    // MARK: Pictures in

    /// Converts a new base picture (only its changed regions when it says and can).
    func updateBase(_ buffer: CapturedBuffer) throws(FFmpegError) {
        guard case .video(let format) = buffer.format else { return }
        if format.pixelFormat == .mjpeg {
            if baseDecoder == nil { baseDecoder = try MJPEGDecoder() }
            let decoded = try baseDecoder!.decode(buffer.planes[0])
            let source = Scaler.Source(decoded: decoded)
            if baseScaler?.source != source {
                baseScaler = try Scaler(
                    source: source, outputFormat: AV_PIX_FMT_YUV420P, width: Int32(width), height: Int32(height), colour: colour)
            }
            _ = try baseScaler!.scale(decoded)
            everything = true
            return
        }
        if baseScaler == nil || baseScaler!.source != Scaler.Source(format) {
            baseScaler = try Scaler(
                input: format, outputFormat: AV_PIX_FMT_YUV420P, width: Int32(width), height: Int32(height), colour: colour)
        }
        let scaler = baseScaler!
        let sample = SampleBuffer(
            format: buffer.format, presentationTime: .zero, duration: buffer.duration, planes: buffer.planes,
            changedRegions: buffer.changedRegions)
        if let changed = buffer.changedRegions, scaler.holdsPicture {
            if changed.isEmpty { return }
            if scaler.convertsRegions {
                _ = try scaler.scale(sample, changed: changed)
                // What the scaler may have rewritten: each region grown by its filters' reach.
                for region in changed {
                    let grown = PixelRegion(x: region.x - 8, y: region.y - 8, width: region.width + 16, height: region.height + 16)
                    if let region = grown.onChromaGrid(width: width, height: height) { markChanged(region) }
                }
                return
            }
        }
        _ = try scaler.scale(sample)
        everything = true
    }

    /// The layer `index` at this frame: `buffer` its new picture (nil: none came, the last one
    /// repeats), `show` what it is to show.
    func updateLayer(_ index: Int, with buffer: CapturedBuffer?, show: Shown) throws(FFmpegError) {
        let layer = layers[index]
        let before = layer.area
        var changed = false
        // A repeat (the source says nothing changed) is not a new picture: nothing to convert.
        let repeats = buffer?.changedRegions?.isEmpty == true && layer.picture != nil
        if let buffer, !repeats, show == .picture, let box = layer.box {
            try convert(buffer, for: layer, box: box)
            changed = true
        }
        let shown: Shown = show == .picture && layer.picture == nil ? .hidden : show
        if shown != layer.shown {
            layer.shown = shown
            changed = true
        }
        guard changed else { return }
        // Only what is inside the frame is drawn again.
        if let before = before?.clipped(width: width, height: height) { markChanged(before) }
        if let after = layer.area, after != before, let inside = after.clipped(width: width, height: height) { markChanged(inside) }
    }

    /// `region` is drawn again at the next `redraw`; everything is, once more regions changed than
    /// the list holds.
    private func markChanged(_ region: PixelRegion) {
        if !dirty.append(region) { everything = true }
    }

    /// Converts a layer's picture into the output's format and colour at its drawn size.
    private func convert(_ buffer: CapturedBuffer, for layer: Layer, box: PixelRegion) throws(FFmpegError) {
        guard case .video(let format) = buffer.format else { return }
        for index in 0..<4 {
            sourcePlanes[index] = nil
            sourceStrides[index] = 0
        }
        var source: Scaler.Source
        var sourceColour = format.colour
        if format.pixelFormat == .mjpeg {
            if layer.decoder == nil { layer.decoder = try MJPEGDecoder() }
            let decoded = try layer.decoder!.decode(buffer.planes[0])
            source = Scaler.Source(decoded: decoded)
            Frame.planes(of: decoded, into: &sourcePlanes, strides: &sourceStrides)
            sourceColour = sourceColour ?? .jpeg
        } else {
            guard let known = Scaler.Source(format) else { return }
            source = known
            for index in 0..<min(4, buffer.planes.count) {
                sourcePlanes[index] = buffer.planes[index].base.assumingMemoryBound(to: UInt8.self)
                sourceStrides[index] = Int32(buffer.planes[index].bytesPerRow)
            }
        }
        if let crop = layer.placement.crop, !Self.crop(&sourcePlanes, strides: sourceStrides, source: &source, to: crop) {
            throw FFmpegError.invalidArgument(
                "crop \(crop) has nothing inside the source's \(source.width)x\(source.height) picture", "cropping a layer")
        }
        let drawn = layer.placement.drawn(in: box, sourceWidth: Int(source.width), sourceHeight: Int(source.height))
        let (w, h) = (Int32(drawn.width), Int32(drawn.height))
        let isRGB = av_pix_fmt_desc_get(source.format).map { $0.pointee.flags & UInt64(AV_PIX_FMT_FLAG_RGB) != 0 } ?? false
        if !isRGB, let sourceColour, ColourDescription(sourceColour).matrix != colour.matrix {
            // Through RGB: out of the source's matrix, into the output's.
            if layer.toRGB?.source != source || layer.toRGB?.outputWidth != w || layer.toRGB?.outputHeight != h {
                layer.toRGB = try Scaler(
                    source: source, outputFormat: AV_PIX_FMT_BGR0, width: w, height: h, colour: ColourDescription(sourceColour))
            }
            let rgb = try layer.toRGB!.scale(planes: &sourcePlanes, strides: &sourceStrides)
            let rgbSource = Scaler.Source(format: AV_PIX_FMT_BGR0, width: w, height: h, fullRange: false)
            if layer.toOutput?.source != rgbSource {
                layer.toOutput = try Scaler(source: rgbSource, outputFormat: AV_PIX_FMT_YUV420P, width: w, height: h, colour: colour)
            }
            layer.picture = try layer.toOutput!.scale(UnsafePointer(rgb))
        } else {
            layer.toRGB = nil
            if layer.toOutput?.source != source || layer.toOutput?.outputWidth != w || layer.toOutput?.outputHeight != h {
                layer.toOutput = try Scaler(source: source, outputFormat: AV_PIX_FMT_YUV420P, width: w, height: h, colour: colour)
            }
            layer.picture = try layer.toOutput!.scale(planes: &sourcePlanes, strides: &sourceStrides)
        }
        layer.drawn = drawn
        layerConversions += 1
    }

    /// Points `planes` at `crop` (on the chroma grid, cut to the picture) and makes `source` its
    /// size; false (nothing changed) when nothing of `crop` is inside the picture.
    ///
    /// A plane's offset for `x` pixels is `av_image_get_linesize(format, x, plane)`: the bytes `x`
    /// pixels take, which for packed 4:2:2 (YUYV, UYVY: four bytes per two pixels) is 2x, not the
    /// largest component step (4) times x.
    @discardableResult
    static func crop(_ planes: inout [UnsafePointer<UInt8>?], strides: [Int32], source: inout Scaler.Source, to crop: PixelRegion) -> Bool {
        let (width, height) = (Int(source.width), Int(source.height))
        guard width >= 2, height >= 2, let region = crop.clipped(width: width, height: height),
            let descriptor = av_pix_fmt_desc_get(source.format)
        else { return false }
        // Grown to even edges (chroma pairs), then cut to the picture on even edges, at least 2x2.
        let right = min((region.x + region.width + 1) & ~1, width & ~1)
        let bottom = min((region.y + region.height + 1) & ~1, height & ~1)
        let x = min(region.x & ~1, right - 2)
        let y = min(region.y & ~1, bottom - 2)
        let isRGB = descriptor.pointee.flags & UInt64(AV_PIX_FMT_FLAG_RGB) != 0
        for index in 0..<4 where planes[index] != nil {
            let chroma = !isRGB && (index == 1 || index == 2)
            let rows = chroma ? y >> Int(descriptor.pointee.log2_chroma_h) : y
            let columnBytes = Int(av_image_get_linesize(source.format, Int32(x), Int32(index)))
            guard columnBytes >= 0 else { return false }
            planes[index] = planes[index]! + rows * Int(strides[index]) + columnBytes
        }
        source.width = Int32(right - x)
        source.height = Int32(bottom - y)
        return true
    }

    // MARK: The composite

    /// What a `redraw` drew.
    enum Redraw: Equatable {
        /// The whole frame.
        case everything
        /// Nothing changed: the last composite stands.
        case nothing
        /// `redrawnRegions`.
        case regions
    }

    /// Redraws what changed since the last call; allocates nothing.
    func redraw() throws(FFmpegError) -> Redraw {
        guard let base = try baseScaler?.keptPicture() else { return .nothing }
        if everything {
            draw(PixelRegion(x: 0, y: 0, width: width, height: height), base: base)
            everything = false
            dirty.removeAll()
            return .everything
        }
        if dirty.isEmpty { return .nothing }
        swap(&dirty, &redrawn)
        dirty.removeAll()
        for region in redrawn.regions { draw(region, base: base) }
        return .regions
    }

    /// The regions the last `redraw` drew when it answered `.regions` (valid until the next one).
    var redrawnRegions: UnsafeBufferPointer<PixelRegion> { redrawn.regions }

    /// `redraw` as regions (tests): nil when everything was redrawn, empty when nothing changed.
    func compose() throws(FFmpegError) -> [PixelRegion]? {
        switch try redraw() {
        case .everything: nil
        case .nothing: []
        case .regions: Array(redrawnRegions)
        }
    }

    /// The base, then every layer over it, inside `region`.
    private func draw(_ region: PixelRegion, base: UnsafeMutablePointer<AVFrame>) {
        Self.copy(region, from: base, origin: (0, 0), into: canvas.pointer)
        composedPixels += region.width * region.height
        for layer in layers {
            guard let area = layer.area, let inside = area.intersection(region) else { continue }
            switch layer.shown {
            case .picture:
                guard let picture = layer.picture else { break }
                let alpha = layer.placement.alpha
                if alpha >= 255 {
                    Self.copy(inside, from: picture, origin: (area.x, area.y), into: canvas.pointer)
                } else {
                    Self.blend(inside, from: picture, origin: (area.x, area.y), into: canvas.pointer, alpha: alpha)
                }
            case .slate:
                Self.fill(inside, in: canvas.pointer, luma: 40, chroma: 128)
            case .hidden:
                break
            }
            composedPixels += inside.width * inside.height
        }
    }

    /// Calls `row` for each row of `region` (frame coordinates, even) in the three planes of a
    /// yuv420p picture placed at `origin` and of `to`: the row's first pixel in each, and its width.
    @inline(__always)
    static func forEachRow(
        _ region: PixelRegion, from: UnsafeMutablePointer<AVFrame>, origin: (x: Int, y: Int), into to: UnsafeMutablePointer<AVFrame>,
        _ row: (_ source: UnsafeMutablePointer<UInt8>, _ destination: UnsafeMutablePointer<UInt8>, _ columns: Int) -> Void
    ) {
        for index in 0..<3 {
            let shift = index == 0 ? 0 : 1
            let fromStride = Int(Frame.bytesPerRow(index, of: from))
            let toStride = Int(Frame.bytesPerRow(index, of: to))
            guard let source = Frame.plane(index, of: from), let destination = Frame.plane(index, of: to) else { continue }
            let columns = region.width >> shift
            let x = region.x >> shift
            let ox = origin.x >> shift
            let oy = origin.y >> shift
            for y in (region.y >> shift)..<((region.y + region.height) >> shift) {
                row(source + (y - oy) * fromStride + (x - ox), destination + y * toStride + x, columns)
            }
        }
    }

    /// Copies `region` (frame coordinates, even) of a yuv420p picture placed at `origin` into `to`.
    static func copy(
        _ region: PixelRegion, from: UnsafeMutablePointer<AVFrame>, origin: (x: Int, y: Int), into to: UnsafeMutablePointer<AVFrame>
    ) {
        forEachRow(region, from: from, origin: origin, into: to) { source, destination, columns in
            destination.update(from: source, count: columns)
        }
    }

    /// Blends `region` (frame coordinates, even) of a yuv420p picture placed at `origin` over what
    /// `to` holds there, with a constant `alpha` (0-255) on all three planes: ffmpeg's overlay's
    /// `FAST_DIV255(d * (255 - a) + s * a)` = `((v + 128) * 257) >> 16`, so the result is its byte
    /// for byte. In 16-bit lanes, as `(w + (w >> 8)) >> 8` with `w = v + 128` (the same value: `w`
    /// is whole, so adding `w / 256` before or after the floor gives the same floor; the largest
    /// `w`, 255 * 255 + 128, plus its `w >> 8` stays under 65536): the compiler vectorises the row
    /// loop with 16-bit multiplies, eight pixels a lane where 32-bit lanes took four. What is under
    /// the layer was just copied from the base, so a redraw blends over the base, never over an
    /// older blend.
    static func blend(
        _ region: PixelRegion, from: UnsafeMutablePointer<AVFrame>, origin: (x: Int, y: Int), into to: UnsafeMutablePointer<AVFrame>,
        alpha: Int
    ) {
        let a = UInt16(min(255, max(0, alpha)))
        let b = 255 &- a
        forEachRow(region, from: from, origin: origin, into: to) { s, d, columns in
            for i in 0..<columns {
                let w = UInt16(d[i]) &* b &+ UInt16(s[i]) &* a &+ 128
                d[i] = UInt8(truncatingIfNeeded: (w &+ (w &>> 8)) &>> 8)
            }
        }
    }

    static func fill(_ region: PixelRegion, in frame: UnsafeMutablePointer<AVFrame>, luma: UInt8, chroma: UInt8) {
        for index in 0..<3 {
            let shift = index == 0 ? 0 : 1
            let stride = Int(Frame.bytesPerRow(index, of: frame))
            guard let plane = Frame.plane(index, of: frame) else { continue }
            for y in (region.y >> shift)..<((region.y + region.height) >> shift) {
                (plane + y * stride + (region.x >> shift)).update(repeating: index == 0 ? luma : chroma, count: region.width >> shift)
            }
        }
    }

    /// Copies the composite into a yuv420p picture laid out as `planes` (the output's frames).
    func copyComposite(into planes: [Plane]) {
        for index in 0..<3 {
            let shift = index == 0 ? 0 : 1
            let stride = Int(canvas.bytesPerRow(index))
            guard let from = canvas.plane(index), index < planes.count else { continue }
            let to = UnsafeMutableRawPointer(mutating: planes[index].base).assumingMemoryBound(to: UInt8.self)
            let columns = width >> shift
            for y in 0..<(height >> shift) {
                (to + y * planes[index].bytesPerRow).update(from: from + y * stride, count: columns)
            }
        }
    }
}

/// Regions in memory of its own, made once: appending never allocates (it says when it is full).
/// One thread (the compositor's).
final class RegionList {
    private let storage: UnsafeMutablePointer<PixelRegion>
    private let capacity: Int
    private(set) var count = 0

    init(capacity: Int) {
        storage = .allocate(capacity: capacity)
        self.capacity = capacity
    }

    deinit { storage.deallocate() }

    var isEmpty: Bool { count == 0 }
    var regions: UnsafeBufferPointer<PixelRegion> { UnsafeBufferPointer(start: storage, count: count) }

    /// False (nothing kept) when full.
    func append(_ region: PixelRegion) -> Bool {
        guard count < capacity else { return false }
        (storage + count).initialize(to: region)
        count += 1
        return true
    }

    func removeAll() {
        // PixelRegion is trivial: nothing to deinitialise.
        count = 0
    }
}
