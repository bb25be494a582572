import BroadcastCapture
import BroadcastKit
import Logging

/// V4L2 and ALSA sources for `--video /dev/videoN`, `--audio-mic hw:X,Y`, `--audio-app ...`.
extension SourceSettings {
    /// Opens and configures the V4L2 device at once: a bad node, input, size or format fails here,
    /// with exit code 2 and one line naming the device and what it supports.
    func v4l2Source(path: String, width: Int, height: Int, rate: (numerator: Int, denominator: Int)) throws -> any CaptureSource {
        try V4L2Source(
            path: path,
            options: V4L2Options(width: width, height: height, frameRate: rate, input: videoInput, pixelFormat: videoFormat),
            logger: Logger(label: "broadcast.capture")
        )
    }

    /// Opens the ALSA capture PCM `name` ('hw:1,0', 'plughw:CARD=Loopback,DEV=1', 'default') with
    /// periods of about `periodNanoseconds`.
    func alsaSource(name: String, periodNanoseconds: Int64) throws -> any CaptureSource {
        var options = ALSAOptions()
        options.periodFrames = max(16, Int((Double(periodNanoseconds) * Double(options.sampleRate) / 1e9).rounded()))
        return try ALSASource(pcmName: name, options: options, logger: Logger(label: "broadcast.capture"))
    }
}
