import BroadcastCapture
import BroadcastService

/// The PipeWire audio part of `broadcast devices`: audio nodes (sinks, sources, playing
/// applications' streams) and the default sink and source.
struct PipeWireAudioListing {
    var graph: PipeWireAudioGraph?
    /// Why there is no graph (no PipeWire server on this session's socket).
    var unavailable: String?

    static func current() -> PipeWireAudioListing {
        do {
            return PipeWireAudioListing(graph: try PipeWireAudioGraph.snapshot(timeoutNanoseconds: 2_000_000_000))
        } catch {
            return PipeWireAudioListing(unavailable: error.text)
        }
    }

    private var devices: [PipeWireAudioGraph.Node] { graph?.audioNodes.filter { !$0.mediaClass.hasPrefix("Stream/") } ?? [] }
    private var applications: [PipeWireAudioGraph.Node] { graph?.audioNodes.filter(\.isPlaybackStream) ?? [] }

    var text: String {
        var out = "PipeWire audio (--audio-app desktop|app:NAME|pipewire:NODE, --audio-mic default|pipewire:NODE):\n"
        guard let graph else { return out + "  (not available: \(unavailable ?? "no server"))\n" }
        out += "  default sink: \(graph.defaultSinkName ?? "(none)")  (--audio-app desktop captures its monitor)\n"
        out += "  default source: \(graph.defaultSourceName ?? "(none)")  (--audio-mic default)\n"
        if devices.isEmpty { out += "  (no audio nodes)\n" }
        for node in devices {
            out += "  pipewire:\(node.name)  serial \(node.serial)  \(node.mediaClass)  \(node.description)\n"
        }
        if !applications.isEmpty { out += "  playing now (--audio-app app:NAME):\n" }
        for node in applications {
            let app = node.applicationName ?? node.processBinary ?? node.name
            out += "    app:\(app)  serial \(node.serial)  \(node.description)\(node.processBinary.map { "  (binary \($0))" } ?? "")\n"
        }
        return out
    }

    var json: JSON {
        guard let graph else { return .object([("available", .bool(false)), ("error", .string(unavailable ?? "no server"))]) }
        func node(_ node: PipeWireAudioGraph.Node) -> JSON {
            var fields: [(String, JSON)] = [
                ("id", .number(Int(node.id))), ("serial", .string(node.serial)), ("name", .string(node.name)),
                ("description", .string(node.description)), ("mediaClass", .string(node.mediaClass)),
            ]
            if let app = node.applicationName { fields.append(("applicationName", .string(app))) }
            if let binary = node.processBinary { fields.append(("processBinary", .string(binary))) }
            return .object(fields)
        }
        return .object([
            ("available", .bool(true)),
            ("defaultSink", graph.defaultSinkName.map(JSON.string) ?? .null),
            ("defaultSource", graph.defaultSourceName.map(JSON.string) ?? .null),
            ("nodes", .array(devices.map(node))),
            ("streams", .array(applications.map(node))),
        ])
    }
}
