/// How a picture's values are to be read: the matrix that made its YUV from RGB, its range, and the
/// primaries and transfer of that RGB. The cases' raw values are the ITU-T H.273 code points, the
/// numbers the H.264 VUI, MP4's `colr` box and Matroska's Colour elements carry (and FFmpeg's
/// AVCOL_* values).
///
/// A source that delivers YUV says what its YUV is (a V4L2 device from its format's colorspace
/// fields, an MJPEG camera's JPEG pictures are full-range BT.601), and an encoder that takes that
/// YUV as it is tags its stream with it. RGB sources leave it out: the encoder converts them and
/// tags what it made.
public struct VideoColour: Sendable, Hashable, CustomStringConvertible {
    public enum Matrix: UInt8, Sendable, Hashable {
        case bt709 = 1
        case unspecified = 2
        case bt470bg = 5
        /// BT.601 as SMPTE 170M (the same coefficients as bt470bg).
        case smpte170m = 6
        case smpte240m = 7
        case bt2020NonConstant = 9
        case bt2020Constant = 10
    }

    public enum Primaries: UInt8, Sendable, Hashable {
        /// Also sRGB's.
        case bt709 = 1
        case unspecified = 2
        case bt470m = 4
        /// BT.601 625 lines (PAL).
        case bt470bg = 5
        /// BT.601 525 lines (NTSC).
        case smpte170m = 6
        case smpte240m = 7
        case bt2020 = 9
        /// DCI-P3.
        case smpte431 = 11
    }

    public enum Transfer: UInt8, Sendable, Hashable {
        case bt709 = 1
        case unspecified = 2
        /// The same curve as BT.709's.
        case smpte170m = 6
        case smpte240m = 7
        case linear = 8
        /// sRGB.
        case iec61966_2_1 = 13
        /// PQ.
        case smpte2084 = 16
    }

    public var matrix: Matrix
    public var primaries: Primaries
    public var transfer: Transfer
    /// Full range (0–255, "JPEG", "pc"); otherwise limited (16–235, "TV").
    public var fullRange: Bool

    public init(matrix: Matrix, primaries: Primaries, transfer: Transfer, fullRange: Bool) {
        self.matrix = matrix
        self.primaries = primaries
        self.transfer = transfer
        self.fullRange = fullRange
    }

    /// HD video: BT.709, limited range.
    public static let bt709 = VideoColour(matrix: .bt709, primaries: .bt709, transfer: .bt709, fullRange: false)
    /// SD video (SMPTE 170M): BT.601, limited range.
    public static let bt601 = VideoColour(matrix: .smpte170m, primaries: .smpte170m, transfer: .smpte170m, fullRange: false)
    /// JPEG (and so MJPEG): BT.601 matrix at full range over sRGB primaries and transfer.
    public static let jpeg = VideoColour(matrix: .smpte170m, primaries: .bt709, transfer: .iec61966_2_1, fullRange: true)

    public var description: String {
        "matrix \(matrix) primaries \(primaries) transfer \(transfer) \(fullRange ? "full" : "limited") range"
    }
}
