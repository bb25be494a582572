public import BroadcastKit

/// A V4L2 pixel format code: four ASCII characters packed little-endian ('YUYV', 'NV12', 'MJPG').
public struct FourCC: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// "YUYV" → 'YUYV'; nil unless exactly four ASCII characters (a short code is padded with spaces: "Y10").
    public init?(_ text: String) {
        var bytes = Array(text.utf8)
        guard (1...4).contains(bytes.count), bytes.allSatisfy({ $0 >= 0x20 && $0 < 0x7f }) else { return nil }
        while bytes.count < 4 { bytes.append(0x20) }
        rawValue = UInt32(bytes[0]) | UInt32(bytes[1]) << 8 | UInt32(bytes[2]) << 16 | UInt32(bytes[3]) << 24
    }

    public var description: String {
        var text = ""
        for shift in stride(from: 0, to: 32, by: 8) {
            let byte = UInt8((rawValue >> UInt32(shift)) & 0xff)
            text.append((0x20..<0x7f).contains(byte) ? Character(Unicode.Scalar(byte)) : "?")
        }
        // The big-endian variant flag (bit 31) is shown as v4l2-ctl does.
        while text.hasSuffix(" ") { text.removeLast() }
        return text
    }

    public static let yuyv = FourCC("YUYV")!
    public static let uyvy = FourCC("UYVY")!
    public static let nv12 = FourCC("NV12")!
    /// Planar 4:2:0 (I420).
    public static let yu12 = FourCC("YU12")!
    /// V4L2_PIX_FMT_RGB24.
    public static let rgb3 = FourCC("RGB3")!
    /// V4L2_PIX_FMT_BGR24.
    public static let bgr3 = FourCC("BGR3")!
    /// V4L2_PIX_FMT_XBGR32: bytes B G R X in memory (what most drivers call 32-bit RGB).
    public static let xr24 = FourCC("XR24")!
    /// V4L2_PIX_FMT_ABGR32: bytes B G R A.
    public static let ar24 = FourCC("AR24")!
    /// V4L2_PIX_FMT_BGR32 (deprecated): bytes B G R X.
    public static let bgr4 = FourCC("BGR4")!
    public static let grey = FourCC("GREY")!
    public static let mjpg = FourCC("MJPG")!
    public static let jpeg = FourCC("JPEG")!
}

/// How V4L2 pixel formats map onto the pixel formats sample buffers carry.
public enum V4L2PixelFormats {
    /// The uncompressed formats broadcast captures, in the order it prefers them when none is asked
    /// for (cheap to convert first).
    public static let preferred: [FourCC] = [.yuyv, .nv12, .yu12, .uyvy, .xr24, .bgr4, .ar24, .rgb3, .bgr3, .grey]
    /// Compressed formats broadcast captures (the encoder decodes them first), taken only when no
    /// uncompressed format gives the size and rate asked for, or when asked for by name.
    public static let compressed: [FourCC] = [.mjpg, .jpeg]

    /// The sample-buffer pixel format for `fourcc`; nil when broadcast cannot use it.
    public static func pixelFormat(for fourcc: FourCC) -> PixelFormat? {
        switch fourcc {
        case .yuyv: .yuyv422
        case .uyvy: .uyvy422
        case .nv12: .nv12
        case .yu12: .yuv420p
        case .rgb3: .rgb24
        case .bgr3: .bgr24
        case .xr24, .bgr4: .bgr0
        case .ar24: .bgra
        case .grey: .gray8
        case .mjpg, .jpeg: .mjpeg
        default: nil
        }
    }

    /// True when frames of `fourcc` go to the encoder as captured (an uncompressed format).
    public static func isUncompressed(_ fourcc: FourCC) -> Bool {
        guard let format = pixelFormat(for: fourcc) else { return false }
        return format != .mjpeg
    }

    /// True when broadcast can capture `fourcc`: uncompressed, or MJPEG (decoded by the encoder).
    public static func isUsable(_ fourcc: FourCC) -> Bool { pixelFormat(for: fourcc) != nil }

    /// The format to capture: `wanted` when given; otherwise the first preferred uncompressed
    /// format that `offers` the asked size and rate, else a compressed one that does (a webcam
    /// giving 1080p30 only as MJPEG), else the first uncompressed format offering the size at
    /// another rate, else a compressed one; failing all that, the first usable format, whose
    /// size error the caller reports. Nil when the device offers nothing usable.
    public static func choose(
        offered: [FourCC],
        wanted: FourCC?,
        offers: (FourCC) -> V4L2FormatMatch
    ) -> FourCC? {
        if let wanted { return wanted }
        let raw = preferred.filter(offered.contains)
        let packed = compressed.filter(offered.contains)
        let matches = Dictionary(uniqueKeysWithValues: (raw + packed).map { ($0, offers($0)) })
        return raw.first { matches[$0] == .sizeAndRate } ?? packed.first { matches[$0] == .sizeAndRate }
            ?? raw.first { matches[$0] == .size } ?? packed.first { matches[$0] == .size }
            ?? raw.first ?? packed.first
    }

    /// Names accepted for `--video-format`: the FourCC itself or a common name.
    public static func parse(_ text: String) -> FourCC? {
        switch text.uppercased() {
        case "YUYV", "YUY2", "YUYV422": return .yuyv
        case "UYVY", "UYVY422": return .uyvy
        case "NV12": return .nv12
        case "YU12", "I420", "YUV420", "YUV420P": return .yu12
        case "RGB3", "RGB24": return .rgb3
        case "BGR3", "BGR24": return .bgr3
        case "XR24", "XRGB32", "BGRX", "BGR0", "XBGR32": return .xr24
        case "AR24", "BGRA", "ABGR32": return .ar24
        case "BGR4", "BGR32": return .bgr4
        case "GREY", "GRAY", "GRAY8", "Y8": return .grey
        case "MJPG", "MJPEG": return .mjpg
        case "JPEG": return .jpeg
        default: return FourCC(text)
        }
    }

    /// Planes of one frame as the driver lays it out in a single-planar buffer: the first plane's
    /// stride is `bytesPerLine`; chroma planes of planar formats follow at the strides V4L2 defines.
    public static func planeLayout(
        _ format: PixelFormat,
        width: Int,
        height: Int,
        bytesPerLine: Int,
        sizeImage: Int
    ) -> [(offset: Int, count: Int, bytesPerRow: Int)] {
        switch format {
        case .yuv420p:
            let lumaSize = bytesPerLine * height
            let chromaStride = bytesPerLine / 2
            let chromaSize = chromaStride * ((height + 1) / 2)
            return [(0, lumaSize, bytesPerLine), (lumaSize, chromaSize, chromaStride), (lumaSize + chromaSize, chromaSize, chromaStride)]
        case .nv12:
            let lumaSize = bytesPerLine * height
            return [(0, lumaSize, bytesPerLine), (lumaSize, bytesPerLine * ((height + 1) / 2), bytesPerLine)]
        case .mjpeg:
            return [(0, sizeImage, sizeImage)]
        default:
            return [(0, bytesPerLine * height, bytesPerLine)]
        }
    }
}

/// How well a format a device offers fits what was asked for.
public enum V4L2FormatMatch: Sendable, Hashable {
    /// The size is not offered.
    case none
    /// The size is offered, not at the rate asked for.
    case size
    case sizeAndRate

    /// How `sizes` and `rates` (those offered at the asked size) fit `width`x`height` at
    /// `framesPerSecond`. A list the driver does not enumerate (empty) fits anything; a rate fits
    /// within 1%.
    public static func of(
        sizes: [V4L2FrameSize],
        rates: V4L2FrameRates,
        width: Int,
        height: Int,
        framesPerSecond: Double
    ) -> V4L2FormatMatch {
        guard sizes.isEmpty || sizes.contains(where: { $0.contains(width: width, height: height) }) else { return .none }
        return rates.contains(framesPerSecond) ? .sizeAndRate : .size
    }
}

/// The frame rates a device offers for one format and size (VIDIOC_ENUM_FRAMEINTERVALS).
public enum V4L2FrameRates: Sendable, Hashable {
    /// The driver does not enumerate intervals.
    case unknown
    case discrete([V4L2Fraction])
    /// Any interval from `shortest` to `longest` (stepwise or continuous).
    case range(shortest: V4L2Fraction, longest: V4L2Fraction)

    /// True when `framesPerSecond` is offered, within 1%.
    public func contains(_ framesPerSecond: Double) -> Bool {
        func near(_ rate: Double) -> Bool { abs(rate - framesPerSecond) <= framesPerSecond * 0.01 }
        switch self {
        case .unknown:
            return true
        case .discrete(let intervals):
            return intervals.contains { near($0.framesPerSecond) }
        case .range(let shortest, let longest):
            let fastest = shortest.framesPerSecond
            let slowest = longest.framesPerSecond
            return (min(fastest, slowest)...max(fastest, slowest)).contains(framesPerSecond) || near(fastest) || near(slowest)
        }
    }

    /// The intervals as a list (a range as its two ends).
    public var intervals: [V4L2Fraction] {
        switch self {
        case .unknown: []
        case .discrete(let intervals): intervals
        case .range(let shortest, let longest): [shortest, longest]
        }
    }
}

/// A frame size a device offers for a format.
public enum V4L2FrameSize: Sendable, Hashable, CustomStringConvertible {
    case discrete(width: Int, height: Int)
    case stepwise(minWidth: Int, maxWidth: Int, stepWidth: Int, minHeight: Int, maxHeight: Int, stepHeight: Int)

    public func contains(width: Int, height: Int) -> Bool {
        switch self {
        case .discrete(let w, let h):
            return w == width && h == height
        case .stepwise(let minW, let maxW, let stepW, let minH, let maxH, let stepH):
            return (minW...maxW).contains(width) && (minH...maxH).contains(height)
                && (width - minW) % max(stepW, 1) == 0 && (height - minH) % max(stepH, 1) == 0
        }
    }

    public var description: String {
        switch self {
        case .discrete(let w, let h): "\(w)x\(h)"
        case .stepwise(let minW, let maxW, let stepW, let minH, let maxH, let stepH):
            "\(minW)x\(minH) to \(maxW)x\(maxH) in steps of \(stepW)x\(stepH)"
        }
    }
}

/// A frame interval (seconds per frame) as the device reports it, e.g. 1/25.
public struct V4L2Fraction: Sendable, Hashable, CustomStringConvertible {
    public var numerator: Int
    public var denominator: Int

    public init(_ numerator: Int, _ denominator: Int) {
        self.numerator = numerator
        self.denominator = denominator
    }

    /// Frames per second for an interval.
    public var framesPerSecond: Double { numerator == 0 ? 0 : Double(denominator) / Double(numerator) }

    /// "25", "12.5", "29.97".
    public var rateText: String {
        let fps = framesPerSecond
        if fps == fps.rounded() { return String(Int(fps)) }
        return String((fps * 100).rounded() / 100)
    }

    public var description: String { "\(numerator)/\(denominator)" }
}
