package import BroadcastKit
package import CAVCodec
package import CAVUtil
package import CSwScale

/// How an encoder's YUV output is to be read: the matrix that made it from RGB, its range, and the
/// primaries and transfer of the RGB it came from. Written into the H.264 VUI (x264 reads the codec
/// context's fields at open) and, through the codec parameters, into the containers (MP4 `colr`,
/// MKV Colour elements; FLV carries the VUI).
///
/// The rule: BT.709 for pictures 720 lines high or more, BT.601 (SMPTE 170M) below. That is what
/// players assume for untagged video (ffmpeg, mpv, browsers), so even a player that ignores the tags
/// shows the right colours, and an SD camera's BT.601 YUV passes through without a matrix change.
package struct ColourDescription: Equatable, CustomStringConvertible {
    package var matrix: AVColorSpace
    var primaries: AVColorPrimaries
    var transfer: AVColorTransferCharacteristic
    /// Limited ("TV", 16–235) range; H.264 encoders are given video range.
    var fullRange: Bool

    static let bt709 = ColourDescription(
        matrix: AVCOL_SPC_BT709, primaries: AVCOL_PRI_BT709, transfer: AVCOL_TRC_BT709, fullRange: false)
    static let bt601 = ColourDescription(
        matrix: AVCOL_SPC_SMPTE170M, primaries: AVCOL_PRI_SMPTE170M, transfer: AVCOL_TRC_SMPTE170M, fullRange: false)

    /// The description for an encoded picture `height` lines high.
    static func forOutput(height: Int) -> ColourDescription { height >= 720 ? .bt709 : .bt601 }

    /// What the encoder is given: the source's own YUV when it says what it is (taken without a
    /// matrix change, so tagged as it is), else the rule for an RGB picture `height` lines high.
    static func forEncoder(source: VideoColour?, height: Int) -> ColourDescription {
        source.map(ColourDescription.init) ?? .forOutput(height: height)
    }

    /// The libswscale coefficient table (SWS_CS_*) of this matrix.
    var swsColourspace: Int32 {
        switch matrix {
        case AVCOL_SPC_BT709: SWS_CS_ITU709
        case AVCOL_SPC_SMPTE240M: SWS_CS_SMPTE240M
        case AVCOL_SPC_BT2020_NCL, AVCOL_SPC_BT2020_CL: SWS_CS_BT2020
        default: SWS_CS_ITU601
        }
    }

    package var description: String {
        let name = av_color_space_name(matrix).map { String(cString: $0) } ?? "matrix \(matrix.rawValue)"
        return "\(name) \(fullRange ? "full" : "limited") range"
    }
}

extension ColourDescription {
    /// A source's description in FFmpeg's terms: the H.273 code points are FFmpeg's AVCOL_* values.
    package init(_ colour: VideoColour) {
        self.init(
            matrix: AVColorSpace(rawValue: UInt32(colour.matrix.rawValue)),
            primaries: AVColorPrimaries(rawValue: UInt32(colour.primaries.rawValue)),
            transfer: AVColorTransferCharacteristic(rawValue: UInt32(colour.transfer.rawValue)),
            fullRange: colour.fullRange)
    }
}
