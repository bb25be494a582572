public import BroadcastKit

/// Where a layer goes in the output frame: its box (`x`, `y`, `width`, `height`, in pixels or in
/// percent of the output frame), whether its picture fills the box or keeps its aspect inside it,
/// the part of the source it takes (`crop`), and what shows while its device is lost.
public struct LayerPlacement: Sendable, Hashable {
    public enum Length: Sendable, Hashable, CustomStringConvertible {
        case pixels(Int)
        /// Percent of the output frame's width (x, width) or height (y, height).
        case percent(Double)

        func resolved(in total: Int) -> Int {
            switch self {
            case .pixels(let n): n
            case .percent(let p): Int((Double(total) * p / 100).rounded())
            }
        }

        public var description: String {
            switch self {
            case .pixels(let n): "\(n)"
            case .percent(let p): p == p.rounded() ? "\(Int(p))%" : "\(p)%"
            }
        }
    }

    /// What a layer whose device is lost shows.
    public enum OnLoss: String, Sendable, Hashable {
        /// Nothing: what is under it shows through, until the device is back.
        case hide
        /// A flat dark box where the layer was.
        case slate
    }

    public var x: Length = .pixels(0)
    public var y: Length = .pixels(0)
    /// nil: to the right edge of the frame.
    public var width: Length?
    /// nil: to the bottom edge of the frame.
    public var height: Length?
    /// Stretch the picture to the box; otherwise it keeps its aspect ratio, centred in the box.
    public var fill = false
    /// The part of the source's picture to take, in its pixels; nil: all of it.
    public var crop: PixelRegion?
    public var onLoss: OnLoss = .hide
    /// How much of the layer's picture shows over what is under it, from more than 0 to 1 (opaque,
    /// the default): `opacity=25%`. Blended in the output's YUV as ffmpeg's `overlay` blends a
    /// picture with a constant alpha (`alpha`, 0-255, with its rounding), so the two agree byte for byte.
    public var opacity: Double = 1

    /// `opacity` as an 8-bit alpha (255: opaque), as ffmpeg's overlay takes it from a yuva picture.
    public var alpha: Int { Int((min(1, max(0, opacity)) * 255).rounded()) }

    public init() {}

    /// The box in an output frame `frameWidth` x `frameHeight`, on the 4:2:0 grid (even origin
    /// and size). It may reach past the frame's right and bottom edges: the picture is placed in
    /// the whole box and what is past the edges is cut when drawn (as ffmpeg's overlay and OBS do),
    /// never squeezed into the part inside. Nil when nothing of it is inside the frame.
    public func box(frameWidth: Int, frameHeight: Int) -> PixelRegion? {
        let left = x.resolved(in: frameWidth)
        let top = y.resolved(in: frameHeight)
        let w = width?.resolved(in: frameWidth) ?? (frameWidth - left)
        let h = height?.resolved(in: frameHeight) ?? (frameHeight - top)
        guard w > 0, h > 0 else { return nil }
        // Grown outwards to even edges, not cut.
        let (gridLeft, gridTop) = (max(0, left) & ~1, max(0, top) & ~1)
        let box = PixelRegion(
            x: gridLeft, y: gridTop, width: ((left + w + 1) & ~1) - gridLeft, height: ((top + h + 1) & ~1) - gridTop)
        return box.clipped(width: frameWidth, height: frameHeight) == nil ? nil : box
    }

    /// Where a picture `sourceWidth` x `sourceHeight` (after the crop) is drawn inside `box`: the
    /// box itself with `fill`, else the largest rectangle of the picture's aspect, centred.
    public func drawn(in box: PixelRegion, sourceWidth: Int, sourceHeight: Int) -> PixelRegion {
        guard !fill, sourceWidth > 0, sourceHeight > 0 else { return box }
        // Compare aspects without rounding: w/h against box.w/box.h.
        var w = box.width
        var h = box.height
        if sourceWidth * box.height > box.width * sourceHeight {
            h = box.width * sourceHeight / sourceWidth
        } else {
            w = box.height * sourceWidth / sourceHeight
        }
        w = max(2, w & ~1)
        h = max(2, h & ~1)
        let left = (box.x + (box.width - w) / 2) & ~1
        let top = (box.y + (box.height - h) / 2) & ~1
        return PixelRegion(x: left, y: top, width: w, height: h)
    }

    /// The placement as query keys (for messages and the status document).
    public var queryText: String {
        var keys = ["x=\(x)", "y=\(y)"]
        if let width { keys.append("width=\(width)") }
        if let height { keys.append("height=\(height)") }
        if fill { keys.append("fit=fill") }
        if let crop { keys.append("crop=\(crop.width)x\(crop.height)+\(crop.x)+\(crop.y)") }
        if onLoss != .hide { keys.append("on_loss=\(onLoss.rawValue)") }
        if opacity < 1 {
            let percent = opacity * 100
            keys.append(percent == percent.rounded() ? "opacity=\(Int(percent))%" : "opacity=\(percent)%")
        }
        return keys.joined(separator: ",")
    }
}

extension PixelRegion {
    /// Grown outwards to even coordinates and sizes (4:2:0 chroma pairs), then cut to the frame.
    func onChromaGrid(width frameWidth: Int, height frameHeight: Int) -> PixelRegion? {
        let left = max(0, x) & ~1
        let top = max(0, y) & ~1
        let right = min(frameWidth, (x + width + 1) & ~1)
        let bottom = min(frameHeight, (y + height + 1) & ~1)
        guard right > left, bottom > top else { return nil }
        return PixelRegion(x: left, y: top, width: right - left, height: bottom - top)
    }

    /// The overlap of two regions; nil when they do not meet.
    func intersection(_ other: PixelRegion) -> PixelRegion? {
        let left = max(x, other.x)
        let top = max(y, other.y)
        let right = min(x + width, other.x + other.width)
        let bottom = min(y + height, other.y + other.height)
        guard right > left, bottom > top else { return nil }
        return PixelRegion(x: left, y: top, width: right - left, height: bottom - top)
    }
}
