import BroadcastCapture
import BroadcastKit
import BroadcastService
import Logging

/// PipeWire audio for `--audio-app desktop|app:NAME|pipewire:NODE` and `--audio-mic default|pipewire:NODE`.
extension SourceSettings {
    /// The PipeWire target an --audio-mic/--audio-app value names, nil when it names something else
    /// (an ALSA PCM, 'test', 'none'). `default` is decided when the source opens
    /// (`AudioSourceSpec.systemDefault`): PipeWire's default source when a PipeWire server answers on
    /// this session's socket, ALSA's `default` PCM otherwise: on a desktop the PipeWire stream
    /// follows the default when the person switches it and measures the graph's clock; a capture
    /// box without PipeWire keeps ALSA.
    static func pipeWireAudioTarget(_ value: String, option: String) throws -> PipeWireAudioTarget? {
        switch value {
        case "desktop":
            return .defaultSink
        case let spec where spec.hasPrefix("pipewire:"):
            let node = String(spec.dropFirst("pipewire:".count))
            guard !node.isEmpty else {
                throw ValueError("invalid \(option) '\(value)': expected pipewire:NODE, a node name or serial (see 'broadcast devices')")
            }
            return .node(node)
        case let spec where spec.hasPrefix("app:"):
            let app = String(spec.dropFirst("app:".count))
            guard !app.isEmpty else {
                throw ValueError("invalid \(option) '\(value)': expected app:NAME, an application.name or application.process.binary")
            }
            return .application(app)
        default:
            return nil
        }
    }

    func pipeWireAudioSource(_ target: PipeWireAudioTarget, periodNanoseconds: Int64) throws -> any CaptureSource {
        let frames = max(32, Int((Double(periodNanoseconds) * 48_000 / 1e9).rounded()))
        return try PipeWireAudioSource(target: target, periodFrames: frames, logger: Logger(label: "broadcast.capture"))
    }
}
