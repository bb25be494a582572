import BroadcastCapture
import BroadcastKit
import Logging

/// V4L2 and ALSA sources for `--video /dev/videoN`, `--audio-mic hw:X,Y`, `--audio-app ...`.
extension SourceOptions {
    /// `--video` names a V4L2 device when it is a path under /dev (a node or a /dev/v4l/by-id link).
    static func isV4L2Path(_ value: String) -> Bool { value.hasPrefix("/dev/") }

    /// Opens and configures the V4L2 device at once: a bad node, input, size or format fails here,
    /// with exit code 2 and one line naming the device and what it supports.
    func v4l2Source(path: String, width: Int, height: Int, rate: (numerator: Int, denominator: Int)) throws -> any CaptureSource {
        var format: FourCC?
        if let text = videoFormat {
            guard let fourcc = V4L2PixelFormats.parse(text) else {
                throw ValueError("invalid --video-format '\(text)': expected a V4L2 FourCC such as YUYV, UYVY, NV12, YU12, RGB3, BGR3, XR24, GREY or MJPG")
            }
            format = fourcc
        }
        if let input = videoInput, input < 0 {
            throw ValueError("invalid --video-input '\(input)': expected an input number from 0 (see 'broadcast devices')")
        }
        return try V4L2Source(
            path: path,
            options: V4L2Options(width: width, height: height, frameRate: rate, input: videoInput, pixelFormat: format),
            logger: Logger(label: "broadcast.capture")
        )
    }

    /// The audio periods a source may be asked for (--audio-period, the test tone's test:period=).
    static let audioPeriodRange: ClosedRange<Int64> = 2_000_000...200_000_000

    /// --audio-period in nanoseconds, checked whether or not an ALSA source uses it.
    func alsaPeriod() throws -> Int64 {
        let period = try Values.duration(audioPeriod, option: "--audio-period").nanoseconds ?? 0
        guard Self.audioPeriodRange.contains(period) else {
            throw ValueError("invalid --audio-period '\(audioPeriod)': must be from 2ms to 200ms")
        }
        return period
    }

    /// Opens the ALSA capture PCM `name` ('hw:1,0', 'plughw:CARD=Loopback,DEV=1', 'default') with
    /// periods of about `periodNanoseconds`.
    func alsaSource(name: String, option: String, periodNanoseconds: Int64) throws -> any CaptureSource {
        guard !name.isEmpty, !name.contains(where: \.isWhitespace) else {
            throw ValueError("invalid \(option) '\(name)': expected 'test', 'none' or an ALSA capture device such as hw:1,0, plughw:CARD=Loopback,DEV=1 or default")
        }
        var options = ALSAOptions()
        options.periodFrames = max(16, Int((Double(periodNanoseconds) * Double(options.sampleRate) / 1e9).rounded()))
        return try ALSASource(pcmName: name, options: options, logger: Logger(label: "broadcast.capture"))
    }
}
