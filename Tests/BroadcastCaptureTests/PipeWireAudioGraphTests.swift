import BroadcastCapture
import Testing

/// Resolving what a PipeWire audio source captures and which links it makes, on graphs written by
/// hand (no server): the rules the source follows when the default changes or nodes come and go.
@Suite("PipeWire audio graph")
struct PipeWireAudioGraphTests {
    typealias Graph = PipeWireAudioGraph

    /// test_sink (FL FR, monitors), headphones (FL FR), test_mic (MONO), two streams of "alpha"
    /// (stereo, mono), one of "beta", and our stream (node 90, input FL FR).
    static func graph() -> Graph {
        var g = Graph()
        g.nodes[31] = .init(id: 31, serial: "31", name: "test_sink", mediaClass: "Audio/Sink")
        g.nodes[32] = .init(id: 32, serial: "132", name: "headphones", mediaClass: "Audio/Sink")
        g.nodes[34] = .init(id: 34, serial: "34", name: "test_mic", mediaClass: "Audio/Source")
        g.nodes[50] = .init(id: 50, serial: "150", name: "pw-play", mediaClass: "Stream/Output/Audio", applicationName: "alpha")
        g.nodes[51] = .init(id: 51, serial: "151", name: "pw-play", mediaClass: "Stream/Output/Audio", applicationName: "Alpha Player", processBinary: "alpha")
        g.nodes[52] = .init(id: 52, serial: "152", name: "pw-play", mediaClass: "Stream/Output/Audio", applicationName: "beta")
        g.nodes[90] = .init(id: 90, serial: "190", name: "broadcast-audio-app", mediaClass: "Stream/Input/Audio", applicationName: "broadcast")
        for (id, node, out, channel, monitor) in [
            (41 as UInt32, 31 as UInt32, false, "FL", false), (42, 31, true, "FL", true), (43, 31, false, "FR", false), (44, 31, true, "FR", true),
            (45, 32, true, "FL", true), (46, 32, true, "FR", true), (47, 34, true, "MONO", false),
            (60, 50, true, "FL", false), (61, 50, true, "FR", false), (62, 51, true, "MONO", false), (63, 52, true, "FL", false),
            (91, 90, false, "FL", false), (92, 90, false, "FR", false),
        ] {
            g.ports[id] = .init(id: id, nodeID: node, isOutput: out, channel: channel, isMonitor: monitor)
        }
        g.defaultSinkName = "test_sink"
        g.defaultSourceName = "test_mic"
        return g
    }

    @Test func desktopIsTheDefaultSinksMonitorAndFollowsIt() {
        var g = Self.graph()
        #expect(g.resolve(.defaultSink, excluding: 90).map(\.name) == ["test_sink"])
        #expect(g.links(capturing: g.resolve(.defaultSink), into: 90) == [
            .init(outputNode: 31, outputPort: 42, inputNode: 90, inputPort: 91), .init(outputNode: 31, outputPort: 44, inputNode: 90, inputPort: 92),
        ])
        g.defaultSinkName = "headphones"
        #expect(g.links(capturing: g.resolve(.defaultSink), into: 90).map(\.outputNode) == [32, 32])
        g.remove(id: 32)
        #expect(g.resolve(.defaultSink).isEmpty, "the default names a node that is gone: nothing to link")
    }

    @Test func aMonoMicrophoneFeedsBothChannels() {
        let g = Self.graph()
        #expect(g.links(capturing: g.resolve(.defaultSource), into: 90) == [
            .init(outputNode: 34, outputPort: 47, inputNode: 90, inputPort: 91), .init(outputNode: 34, outputPort: 47, inputNode: 90, inputPort: 92),
        ])
    }

    @Test func nodesByNameOrSerial() {
        let g = Self.graph()
        #expect(g.resolve(.node("headphones")).map(\.id) == [32])
        #expect(g.resolve(.node("132")).map(\.id) == [32])
        #expect(g.resolve(.node("nosuch")).isEmpty)
        #expect(g.resolve(.node("broadcast-audio-app"), excluding: 90).isEmpty, "never our own stream")
    }

    @Test func anApplicationIsEveryStreamOfItsNameOrBinary() {
        let g = Self.graph()
        let alpha = g.resolve(.application("alpha"), excluding: 90)
        #expect(alpha.map(\.id) == [50, 51])
        let links = g.links(capturing: alpha, into: 90)
        #expect(links.count == 4, "stereo stream: 2 links, mono stream: 2 links; \(links)")
        #expect(!links.contains { $0.outputNode == 52 }, "beta is not linked")
        #expect(g.resolve(.application("gamma")).isEmpty)
    }

    @Test func defaultMetadataValues() {
        #expect(Graph.metadataName(#"{"name":"test_sink"}"#) == "test_sink")
        #expect(Graph.metadataName(#"{ "name" : "alsa_output.pci-0000_00_1b.0.analog-stereo" }"#) == "alsa_output.pci-0000_00_1b.0.analog-stereo")
        #expect(Graph.metadataName(#"{"name":"a\"b"}"#) == "a\"b")
        #expect(Graph.metadataName(#"{"nam":"x"}"#) == nil)
        #expect(Graph.metadataName("") == nil)
        #expect(Graph.metadataName(nil) == nil)
    }
}
