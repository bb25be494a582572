public import BroadcastKit

/// The colour description of a V4L2 capture format, from the four fields of `struct
/// v4l2_pix_format` (colorspace, ycbcr_enc, quantization, xfer_func), with every "default" value
/// resolved the way videodev2.h says (V4L2_MAP_*_DEFAULT): the encoding and transfer follow the
/// colorspace, the range follows whether the pixels are RGB, and a driver that leaves the colorspace
/// itself at default gets SMPTE 170M for SD video, Rec. 709 for HD and sRGB otherwise
/// (V4L2_MAP_COLORSPACE_DEFAULT).
///
/// The enum values are the kernel's (uapi, stable).
public enum V4L2Colour {
    // enum v4l2_colorspace
    static let colorspaceDefault: UInt32 = 0, smpte170m: UInt32 = 1, smpte240m: UInt32 = 2, rec709: UInt32 = 3,
        bt878: UInt32 = 4, system470M: UInt32 = 5, system470BG: UInt32 = 6, jpeg: UInt32 = 7, srgb: UInt32 = 8,
        oprgb: UInt32 = 9, bt2020: UInt32 = 10, raw: UInt32 = 11, dciP3: UInt32 = 12
    // enum v4l2_ycbcr_encoding
    static let encodingDefault: UInt32 = 0, enc601: UInt32 = 1, enc709: UInt32 = 2, xv601: UInt32 = 3, xv709: UInt32 = 4,
        sycc: UInt32 = 5, encBT2020: UInt32 = 6, encBT2020Constant: UInt32 = 7, encSMPTE240M: UInt32 = 8
    // enum v4l2_quantization
    static let quantizationDefault: UInt32 = 0, fullRange: UInt32 = 1, limitedRange: UInt32 = 2
    // enum v4l2_xfer_func
    static let transferDefault: UInt32 = 0, xfer709: UInt32 = 1, xferSRGB: UInt32 = 2, xferOPRGB: UInt32 = 3,
        xferSMPTE240M: UInt32 = 4, xferNone: UInt32 = 5, xferDCIP3: UInt32 = 6, xferSMPTE2084: UInt32 = 7

    /// The description of a format with these fields, `width`x`height`; `rgb`: the pixels are RGB
    /// (their range is then full by default, and the matrix is what a YUV version would use).
    public static func describe(
        colorspace: UInt32, ycbcrEncoding: UInt32, quantization: UInt32, transfer: UInt32, rgb: Bool,
        width: Int, height: Int
    ) -> VideoColour {
        var colorspace = colorspace
        if colorspace == colorspaceDefault {
            // V4L2_MAP_COLORSPACE_DEFAULT(is_sdtv, is_hdtv): SD video is 480 or 576 lines (NTSC, PAL).
            let sd = (height == 480 || height == 486 || height == 576) && width <= 720
            colorspace = sd ? smpte170m : height >= 720 ? rec709 : srgb
        }
        // V4L2_MAP_YCBCR_ENC_DEFAULT
        var encoding = ycbcrEncoding
        if encoding == encodingDefault {
            switch colorspace {
            case rec709, dciP3: encoding = enc709
            case bt2020: encoding = encBT2020
            case smpte240m: encoding = encSMPTE240M
            default: encoding = enc601
            }
        }
        // V4L2_MAP_XFER_FUNC_DEFAULT
        var xfer = transfer
        if xfer == transferDefault {
            switch colorspace {
            case oprgb: xfer = xferOPRGB
            case smpte240m: xfer = xferSMPTE240M
            case dciP3: xfer = xferDCIP3
            case raw: xfer = xferNone
            case srgb, jpeg: xfer = xferSRGB
            default: xfer = xfer709
            }
        }
        // V4L2_MAP_QUANTIZATION_DEFAULT; the deprecated sYCC encoding is full-range BT.601 by definition.
        let full: Bool
        switch quantization {
        case fullRange: full = true
        case limitedRange: full = false
        default: full = rgb || colorspace == jpeg || encoding == sycc
        }
        let matrix: VideoColour.Matrix
        switch encoding {
        case enc709, xv709: matrix = .bt709
        case encBT2020: matrix = .bt2020NonConstant
        case encBT2020Constant: matrix = .bt2020Constant
        case encSMPTE240M: matrix = .smpte240m
        default: matrix = .smpte170m  // 601, xvYCC 601, sYCC
        }
        let primaries: VideoColour.Primaries
        switch colorspace {
        case smpte170m, bt878: primaries = .smpte170m
        case smpte240m: primaries = .smpte240m
        case rec709, jpeg, srgb: primaries = .bt709
        case system470M: primaries = .bt470m
        case system470BG: primaries = .bt470bg
        case bt2020: primaries = .bt2020
        case dciP3: primaries = .smpte431
        default: primaries = .unspecified  // opRGB has no H.273 code point; raw has no primaries
        }
        let curve: VideoColour.Transfer
        switch xfer {
        // SMPTE 170M's curve is Rec. 709's: said the way SD video says it.
        case xfer709: curve = primaries == .smpte170m ? .smpte170m : .bt709
        case xferSRGB: curve = .iec61966_2_1
        case xferSMPTE240M: curve = .smpte240m
        case xferNone: curve = .linear
        case xferSMPTE2084: curve = .smpte2084
        default: curve = .unspecified  // opRGB's and DCI-P3's gammas have no H.273 code point
        }
        return VideoColour(matrix: matrix, primaries: primaries, transfer: curve, fullRange: full)
    }

    /// What a captured format's pixels are, as the encoder needs it: nil for RGB (the encoder
    /// converts it and tags what it made); for MJPEG, JPEG's full-range BT.601 unless the driver
    /// says another encoding or range (the pictures decode to YUV with the JPEG's own matrix).
    public static func describe(
        pixelFormat: PixelFormat, colorspace: UInt32, ycbcrEncoding: UInt32, quantization: UInt32, transfer: UInt32,
        width: Int, height: Int
    ) -> VideoColour? {
        switch pixelFormat {
        case .rgb24, .bgr24, .bgra, .bgr0: return nil
        default: break
        }
        var colour = describe(
            colorspace: colorspace, ycbcrEncoding: ycbcrEncoding, quantization: quantization, transfer: transfer, rgb: false,
            width: width, height: height)
        if pixelFormat == .mjpeg {
            if ycbcrEncoding == encodingDefault { colour.matrix = .smpte170m }
            colour.fullRange = quantization != limitedRange
        }
        return colour
    }
}
