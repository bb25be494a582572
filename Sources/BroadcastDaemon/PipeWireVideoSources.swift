import BroadcastCapture
import BroadcastKit
import Logging

/// `--video portal[...]` and `--video pipewire:NODE`.
extension SourceOptions {
    /// Asks the ScreenCast portal (or finds the node) now: a missing portal, a refusal or a cancel
    /// is one line and exit 2 before anything is written.
    func pipeWireVideoSource(spec text: String, rate: (numerator: Int, denominator: Int)) throws -> any CaptureSource {
        let spec = try PipeWireVideoSpec(parsing: text)
        do {
            return try PipeWireVideoSource(spec: spec, frameRate: rate, logger: Logger(label: "broadcast.pipewire"))
        } catch {
            throw ValueError(error.message)
        }
    }
}
