import BroadcastCapture
import BroadcastKit
import BroadcastService
import Logging

/// `--video portal[...]` and `--video pipewire:NODE`.
extension SourceSettings {
    /// Asks the ScreenCast portal (or finds the node) now: a missing portal, a refusal or a cancel
    /// is one line and exit 2 before anything is written.
    func pipeWireVideoSource(rate: (numerator: Int, denominator: Int)) throws -> any CaptureSource {
        guard case .pipeWire(let spec) = video else { preconditionFailure("not a PipeWire video source: \(video)") }
        do {
            return try PipeWireVideoSource(spec: spec, frameRate: rate, logger: Logger(label: "broadcast.pipewire"))
        } catch {
            throw ValueError(error.message)
        }
    }
}
