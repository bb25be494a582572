import BroadcastCapture
import BroadcastKit
import Testing

/// V4L2's colour fields (struct v4l2_pix_format) → what the encoder tags, with the kernel's
/// defaults resolved as videodev2.h's V4L2_MAP_*_DEFAULT macros say.
@Suite struct V4L2ColourTests {
    // Kernel enum values (uapi).
    static let smpte170m: UInt32 = 1, rec709: UInt32 = 3, jpeg: UInt32 = 7, srgb: UInt32 = 8, bt2020: UInt32 = 10
    static let enc601: UInt32 = 1, enc709: UInt32 = 2, xv709: UInt32 = 4, sycc: UInt32 = 5
    static let full: UInt32 = 1, limited: UInt32 = 2
    static let xfer709: UInt32 = 1, xferSRGB: UInt32 = 2, xferPQ: UInt32 = 7

    static func describe(
        _ colorspace: UInt32, _ encoding: UInt32 = 0, _ quantization: UInt32 = 0, _ transfer: UInt32 = 0,
        format: PixelFormat = .yuyv422, width: Int = 1920, height: Int = 1080
    ) -> VideoColour? {
        V4L2Colour.describe(
            pixelFormat: format, colorspace: colorspace, ycbcrEncoding: encoding, quantization: quantization,
            transfer: transfer, width: width, height: height)
    }

    @Test func explicitFieldsAreTakenAsTheyAre() {
        #expect(Self.describe(Self.rec709, Self.enc709, Self.limited, Self.xfer709) == .bt709)
        #expect(Self.describe(Self.smpte170m, Self.enc601, Self.limited, Self.xfer709) == .bt601)
        // An HD camera that says BT.601 keeps BT.601: the point of passing it through.
        #expect(Self.describe(Self.srgb, Self.enc601, Self.limited, Self.xferSRGB)
            == VideoColour(matrix: .smpte170m, primaries: .bt709, transfer: .iec61966_2_1, fullRange: false))
        #expect(Self.describe(Self.rec709, Self.enc709, Self.full, Self.xfer709)?.fullRange == true)
        #expect(Self.describe(Self.bt2020, 0, 0, Self.xferPQ)
            == VideoColour(matrix: .bt2020NonConstant, primaries: .bt2020, transfer: .smpte2084, fullRange: false))
        #expect(Self.describe(Self.rec709, Self.xv709)?.matrix == .bt709)
    }

    /// Each "default" follows the colorspace (V4L2_MAP_YCBCR_ENC_DEFAULT, _XFER_FUNC_DEFAULT,
    /// _QUANTIZATION_DEFAULT).
    @Test func defaultsFollowTheColorspace() {
        #expect(Self.describe(Self.rec709) == .bt709)
        #expect(Self.describe(Self.smpte170m) == .bt601)
        // sRGB (most webcams' YUV): BT.601 matrix, sRGB transfer, limited range for YUV.
        #expect(Self.describe(Self.srgb) == VideoColour(matrix: .smpte170m, primaries: .bt709, transfer: .iec61966_2_1, fullRange: false))
        // JPEG: full range by default even for YUV.
        #expect(Self.describe(Self.jpeg) == .jpeg)
        #expect(Self.describe(Self.bt2020)?.matrix == .bt2020NonConstant)
        #expect(Self.describe(Self.srgb, Self.sycc)?.fullRange == true)
    }

    /// A driver that leaves the colorspace at default: SD video is SMPTE 170M, HD Rec. 709, other
    /// sizes sRGB (V4L2_MAP_COLORSPACE_DEFAULT).
    @Test func aDefaultColorspaceFollowsTheSize() {
        #expect(Self.describe(0, width: 720, height: 576) == .bt601)
        #expect(Self.describe(0, width: 720, height: 480) == .bt601)
        #expect(Self.describe(0, width: 1280, height: 720) == .bt709)
        #expect(Self.describe(0, width: 640, height: 360)
            == VideoColour(matrix: .smpte170m, primaries: .bt709, transfer: .iec61966_2_1, fullRange: false))
    }

    /// MJPEG decodes to the JPEG's YUV: full-range BT.601 whatever colorspace the driver reports
    /// (uvcvideo says sRGB), unless it says an encoding or range itself.
    @Test func mjpegIsFullRangeBT601() {
        let mjpeg = Self.describe(Self.srgb, format: .mjpeg, width: 1280, height: 720)
        #expect(mjpeg?.matrix == .smpte170m && mjpeg?.fullRange == true, "\(String(describing: mjpeg))")
        #expect(Self.describe(Self.jpeg, format: .mjpeg) == .jpeg)
        #expect(Self.describe(Self.srgb, Self.enc709, Self.limited, format: .mjpeg)?.matrix == .bt709)
        #expect(Self.describe(Self.srgb, Self.enc709, Self.limited, format: .mjpeg)?.fullRange == false)
    }

    /// RGB is converted by the encoder, which tags what it made: no description passes through.
    @Test func rgbFormatsHaveNone() {
        for format in [PixelFormat.rgb24, .bgr24, .bgra, .bgr0] {
            #expect(Self.describe(Self.srgb, format: format) == nil)
        }
        #expect(Self.describe(Self.srgb, format: .nv12) != nil)
    }
}
