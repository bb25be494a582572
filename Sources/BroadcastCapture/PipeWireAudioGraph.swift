/// What a PipeWire audio source captures, as `--audio-app`/`--audio-mic` name it.
public enum PipeWireAudioTarget: Sendable, Hashable, CustomStringConvertible {
    /// `--audio-app desktop`: the monitor of the default sink ("what you hear"), followed when the default changes.
    case defaultSink
    /// `--audio-mic default` on a PipeWire system: the default source, followed when it changes.
    case defaultSource
    /// `pipewire:NODE`: one node by `node.name` or `object.serial` (a sink is captured through its monitor).
    case node(String)
    /// `app:NAME`: every playback stream whose `application.name` or `application.process.binary` is NAME.
    case application(String)

    public var description: String {
        switch self {
        case .defaultSink: "desktop (default sink's monitor)"
        case .defaultSource: "default source"
        case .node(let name): "pipewire:\(name)"
        case .application(let name): "app:\(name)"
        }
    }
}

/// The part of a PipeWire graph an audio capture cares about, as the registry and the "default"
/// metadata describe it. Pure (no libpipewire), so resolving targets and planning links is
/// unit-tested without a server.
public struct PipeWireAudioGraph: Sendable, Hashable {
    public struct Node: Sendable, Hashable {
        public var id: UInt32
        public var serial: String
        public var name: String
        public var description: String
        /// Audio/Sink, Audio/Source, Audio/Source/Virtual, Stream/Output/Audio, ...
        public var mediaClass: String
        public var applicationName: String?
        public var processBinary: String?

        public init(id: UInt32, serial: String, name: String, description: String = "", mediaClass: String, applicationName: String? = nil, processBinary: String? = nil) {
            self.id = id
            self.serial = serial
            self.name = name
            self.description = description
            self.mediaClass = mediaClass
            self.applicationName = applicationName
            self.processBinary = processBinary
        }

        public var isSink: Bool { mediaClass.hasPrefix("Audio/Sink") || mediaClass == "Audio/Duplex" }
        public var isSource: Bool { mediaClass.hasPrefix("Audio/Source") || mediaClass == "Audio/Duplex" }
        public var isPlaybackStream: Bool { mediaClass == "Stream/Output/Audio" }
        public var isAudio: Bool { mediaClass.contains("Audio") }
    }

    public struct Port: Sendable, Hashable {
        public var id: UInt32
        public var nodeID: UInt32
        public var isOutput: Bool
        /// audio.channel: FL, FR, MONO, AUX0, ...
        public var channel: String
        public var isMonitor: Bool

        public init(id: UInt32, nodeID: UInt32, isOutput: Bool, channel: String, isMonitor: Bool = false) {
            self.id = id
            self.nodeID = nodeID
            self.isOutput = isOutput
            self.channel = channel
            self.isMonitor = isMonitor
        }
    }

    /// A link to make: output port of the captured node → input port of our stream.
    public struct Link: Sendable, Hashable {
        public var outputNode: UInt32
        public var outputPort: UInt32
        public var inputNode: UInt32
        public var inputPort: UInt32

        public init(outputNode: UInt32, outputPort: UInt32, inputNode: UInt32, inputPort: UInt32) {
            self.outputNode = outputNode
            self.outputPort = outputPort
            self.inputNode = inputNode
            self.inputPort = inputPort
        }
    }

    public var nodes: [UInt32: Node] = [:]
    public var ports: [UInt32: Port] = [:]
    /// The links that exist, by their global id: output port → input port (anyone's, ours included).
    public var portLinks: [UInt32: PortPair] = [:]
    /// node.name of the default sink and source, from the "default" metadata.
    public var defaultSinkName: String?
    public var defaultSourceName: String?

    public init() {}

    /// Removes a global (node or port) the registry says is gone.
    public mutating func remove(id: UInt32) {
        nodes[id] = nil
        ports[id] = nil
        portLinks[id] = nil
    }

    /// An output port linked to an input port.
    public struct PortPair: Sendable, Hashable {
        public var output: UInt32
        public var input: UInt32
        public init(output: UInt32, input: UInt32) { (self.output, self.input) = (output, input) }
    }

    /// Whether the graph has a link for `link`'s ports.
    public func exists(_ link: Link) -> Bool {
        portLinks.values.contains(PortPair(output: link.outputPort, input: link.inputPort))
    }

    public var audioNodes: [Node] { nodes.values.filter(\.isAudio).sorted { $0.id < $1.id } }

    /// The nodes `target` names now (none: it is not there), never `excluding` (our own stream).
    public func resolve(_ target: PipeWireAudioTarget, excluding own: UInt32? = nil) -> [Node] {
        let candidates = nodes.values.filter { $0.isAudio && $0.id != own }
        switch target {
        case .defaultSink:
            guard let name = defaultSinkName else { return [] }
            return candidates.filter { $0.name == name && $0.isSink }.sorted { $0.id < $1.id }.prefix(1).map { $0 }
        case .defaultSource:
            guard let name = defaultSourceName else { return [] }
            return candidates.filter { $0.name == name && ($0.isSource || $0.isSink) }.sorted { $0.id < $1.id }.prefix(1).map { $0 }
        case .node(let wanted):
            let byName = candidates.filter { $0.name == wanted || $0.serial == wanted }.sorted { $0.id < $1.id }
            return byName.prefix(1).map { $0 }
        case .application(let app):
            return candidates.filter { $0.isPlaybackStream && ($0.applicationName == app || $0.processBinary == app) }
                .sorted { $0.id < $1.id }
        }
    }

    /// The links that capture `sources` into the input ports of node `sink` (our stream): each
    /// output port of a source (a sink's monitor ports, a source's capture ports, a stream's
    /// output ports) to our port of the same channel; a MONO port (or a single one) to every one
    /// of ours; ports of channels we do not have by position. Several sources on one of our ports
    /// are summed by PipeWire (that is how an application's streams are mixed).
    public func links(capturing sources: [Node], into sink: UInt32) -> Set<Link> {
        let ours = ports.values.filter { $0.nodeID == sink && !$0.isOutput }.sorted { $0.id < $1.id }
        guard !ours.isEmpty else { return [] }
        var result = Set<Link>()
        for source in sources {
            var outputs = ports.values.filter { $0.nodeID == source.id && $0.isOutput }.sorted { $0.id < $1.id }
            // A sink's only output ports are its monitor ports; a source with monitor ports of its
            // own besides capture ports (rare) is captured from the capture ports.
            if !source.isSink, outputs.contains(where: { !$0.isMonitor }) { outputs.removeAll(where: \.isMonitor) }
            for (index, port) in outputs.enumerated() {
                let targets: [Port]
                if let same = ours.first(where: { $0.channel == port.channel }) {
                    targets = [same]
                } else if port.channel == "MONO" || outputs.count == 1 {
                    targets = ours
                } else {
                    targets = [ours[index % ours.count]]
                }
                for target in targets {
                    result.insert(Link(outputNode: source.id, outputPort: port.id, inputNode: sink, inputPort: target.id))
                }
            }
        }
        return result
    }

    /// The node name in a "default" metadata value: `{ "name": "alsa_output.pci-0000_00_1b.0.analog-stereo" }`.
    public static func metadataName(_ value: String?) -> String? {
        guard let value else { return nil }
        let characters = Array(value)
        let key = Array("\"name\"")
        guard let at = (0...max(0, characters.count - key.count)).first(where: { characters[$0..<min(characters.count, $0 + key.count)].elementsEqual(key) })
        else { return nil }
        var rest = characters[(at + key.count)...].drop { $0 == " " || $0 == "\t" }
        guard rest.first == ":" else { return nil }
        rest = rest.dropFirst().drop { $0 == " " || $0 == "\t" }
        guard rest.first == "\"" else { return nil }
        rest = rest.dropFirst()
        var name = ""
        var escaped = false
        for character in rest {
            if escaped {
                name.append(character)
                escaped = false
            } else if character == "\\" {
                escaped = true
            } else if character == "\"" {
                return name
            } else {
                name.append(character)
            }
        }
        return nil
    }
}
