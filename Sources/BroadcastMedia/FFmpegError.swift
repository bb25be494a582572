internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CFFmpegShim
internal import CSwResample
internal import CSwScale

/// A failed libav* call: FFmpeg's AVERROR code, its `av_strerror` text, and what we were doing.
///
/// Every error BroadcastMedia throws is an `FFmpegError`; conditions FFmpeg itself never reports
/// (an unsupported pixel format, a buffer of the wrong media type) carry the AVERROR code that
/// fits best (`AVERROR(EINVAL)`, `AVERROR(ENOSYS)`).
public struct FFmpegError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The negative AVERROR code, e.g. `AVERROR(ENOENT)` or `AVERROR_ENCODER_NOT_FOUND`.
    public let code: Int32
    /// `av_strerror(code)`.
    public let reason: String
    /// What we were doing, naming the thing: "opening encoder libx264", "opening output /tmp/a.mp4".
    public let operation: String

    public init(code: Int32, operation: String) {
        self.code = code
        self.reason = FFmpegError.text(of: code)
        self.operation = operation
    }

    /// An error FFmpeg did not report but that we describe in its terms: `reason` is ours.
    public init(code: Int32, reason: String, operation: String) {
        self.code = code
        self.reason = reason
        self.operation = operation
    }

    public var description: String { "\(operation): \(reason) (AVERROR \(code))" }

    /// `av_strerror` of any AVERROR code.
    public static func text(of code: Int32) -> String {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 128) { buffer in
            CBroadcast_av_err2str(code, buffer.baseAddress, buffer.count)
            return String(cString: buffer.baseAddress!)
        }
    }

    /// AVERROR(EAGAIN): the send/receive contract's "go to the other side".
    public static var again: Int32 { CBroadcast_AVERROR_EAGAIN() }
    /// AVERROR_EOF
    public static var endOfFile: Int32 { CBroadcast_AVERROR_EOF() }
    /// AVERROR_EXIT: a blocking call ended by the interrupt callback (a deadline passed).
    public static var interrupted: Int32 { CBroadcast_AVERROR_EXIT() }
    /// AVERROR(errno) for a POSIX errno.
    public static func posix(_ errno: Int32) -> Int32 { CBroadcast_AVERROR(errno) }

    package static func invalidArgument(_ reason: String, _ operation: String) -> FFmpegError {
        FFmpegError(code: posix(22 /* EINVAL */), reason: reason, operation: operation)
    }

    static func outOfMemory(_ operation: String) -> FFmpegError {
        FFmpegError(code: posix(12 /* ENOMEM */), operation: operation)
    }
}

/// Throws an `FFmpegError` when `result` is negative; returns it otherwise.
@discardableResult
package func check(_ result: Int32, _ operation: @autoclosure () -> String) throws(FFmpegError) -> Int32 {
    if result < 0 { throw FFmpegError(code: result, operation: operation()) }
    return result
}

/// AVERROR constants Swift cannot import, read once from the C shim.
enum CBroadcastShimBridge {
    static var encoderNotFound: Int32 { CBroadcast_AVERROR_ENCODER_NOT_FOUND() }
    static var muxerNotFound: Int32 { CBroadcast_AVERROR_MUXER_NOT_FOUND() }
    static var decoderNotFound: Int32 { CBroadcast_AVERROR_DECODER_NOT_FOUND() }
    static var invalidData: Int32 { CBroadcast_AVERROR_INVALIDDATA() }
    static var noTimestamp: Int64 { CBroadcast_AV_NOPTS_VALUE() }
}
