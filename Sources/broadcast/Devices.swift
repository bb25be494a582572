import ArgumentParser
import BroadcastCapture
import BroadcastService

/// `broadcast devices`: what can be captured here.
struct Devices: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List V4L2 video capture devices, ALSA capture devices, reachable X11 screens, PipeWire video nodes and the ScreenCast portal.",
        discussion: """
            For each V4L2 capture node: its stable links (/dev/v4l/by-id, by-path), card, \
            driver, bus, inputs, and the pixel formats, frame sizes and frame rates of its \
            current input. For ALSA: every capture PCM, by name (hw:CARD=Loopback,DEV=1) and \
            number (hw:0,1).

            Use them as:
              broadcast record out.mp4 --video /dev/video0 --audio-mic hw:1,0
            """
    )

    @Flag(help: "Print JSON instead of text.")
    var json = false

    func run() throws {
        let video = DeviceDiscovery.videoCaptureDevices(details: true)
        let audio = DeviceDiscovery.audioCaptureDevices()
        let screens = X11ScreenSource.reachableScreens()
        let pipeWireVideo = PipeWireVideoListing.discover()
        let pipeWireAudio = PipeWireAudioListing.current()
        print(
            json
                ? Self.json(video: video, audio: audio, screens: screens, extra: pipeWireVideo.json + [("pipewireAudio", pipeWireAudio.json)])
                : Self.text(video: video, audio: audio, screens: screens) + pipeWireVideo.text + pipeWireAudio.text,
            terminator: "")
    }

    static func text(video: [DeviceDiscovery.VideoDevice], audio: [DeviceDiscovery.AudioCaptureDevice], screens: [X11ScreenInfo] = []) -> String {
        var out = "V4L2 video capture devices:\n"
        if video.isEmpty { out += "  (none)\n" }
        for device in video {
            out += "  \(device.path)  \(device.card)  (driver \(device.driver), \(device.bus))\n"
            for link in device.links { out += "    \(link)\n" }
            for input in device.inputs {
                var line = "    input \(input.index): \(input.name) (\(input.type)"
                if input.dvTimings { line += ", DV timings" + (input.timings.map { " \($0)" } ?? "") }
                line += input.current ? ", current)" : ")"
                out += line + "\n"
            }
            for format in device.formats {
                let usable = format.usable ? "" : "  [not usable by broadcast]"
                out += "      \(format.fourcc.padding(4))  \(format.description)\(usable)\n"
                let sizes = format.sizes.map { size in
                    size.frameRates.isEmpty ? size.size : "\(size.size) @ \(size.frameRates.joined(separator: "/")) fps"
                }
                if !sizes.isEmpty { out += "            \(sizes.joined(separator: ", "))\n" }
            }
        }
        out += "ALSA capture devices:\n"
        if audio.isEmpty { out += "  (none)\n" }
        for pcm in audio {
            out += "  \(pcm.pcm)  (\(pcm.numericPCM))  \(pcm.name)  [card \(pcm.card): \(pcm.cardName)], \(pcm.subdevices) subdevice\(pcm.subdevices == 1 ? "" : "s")\n"
        }
        out += "X11 screens (--video x11:DISPLAY):\n"
        if screens.isEmpty { out += "  (none reachable)\n" }
        for screen in screens { out += "  \(screen)\n" }
        return out
    }

    static func json(
        video: [DeviceDiscovery.VideoDevice], audio: [DeviceDiscovery.AudioCaptureDevice], screens: [X11ScreenInfo] = [],
        extra: [(String, JSON)] = []
    ) -> String {
        let videoJSON = video.map { device in
            JSON.object([
                ("path", .string(device.path)),
                ("links", .array(device.links.map(JSON.string))),
                ("card", .string(device.card)),
                ("driver", .string(device.driver)),
                ("bus", .string(device.bus)),
                ("inputs", .array(device.inputs.map { input in
                    var fields: [(String, JSON)] = [
                        ("index", .number(input.index)), ("name", .string(input.name)), ("type", .string(input.type)),
                        ("current", .bool(input.current)), ("dvTimings", .bool(input.dvTimings)),
                    ]
                    if let timings = input.timings { fields.append(("timings", .string(timings))) }
                    return .object(fields)
                })),
                ("formats", .array(device.formats.map { format in
                    .object([
                        ("fourcc", .string(format.fourcc)), ("description", .string(format.description)),
                        ("compressed", .bool(format.compressed)), ("usable", .bool(format.usable)),
                        ("sizes", .array(format.sizes.map { size in
                            .object([("size", .string(size.size)), ("frameRates", .array(size.frameRates.map(JSON.string)))])
                        })),
                    ])
                })),
            ])
        }
        let audioJSON = audio.map { pcm in
            JSON.object([
                ("pcm", .string(pcm.pcm)), ("numeric", .string(pcm.numericPCM)), ("card", .number(pcm.card)),
                ("cardID", .string(pcm.cardID)), ("cardName", .string(pcm.cardName)), ("device", .number(pcm.device)),
                ("name", .string(pcm.name)), ("subdevices", .number(pcm.subdevices)),
            ])
        }
        let screensJSON = screens.map { screen in
            JSON.object([
                ("display", .string(screen.display)), ("width", .number(screen.width)), ("height", .number(screen.height)),
                ("depth", .number(screen.depth)),
            ])
        }
        return JSON.object([("video", .array(videoJSON)), ("audio", .array(audioJSON)), ("x11", .array(screensJSON))] + extra).text + "\n"
    }
}

/// The devices listing prints through the control API's JSON type (object keys keep their order).
typealias JSON = JSONValue

extension JSONValue {
    static func number(_ n: Int) -> JSONValue { .number(Double(n)) }
    var text: String { serialized() }
}

extension String {
    fileprivate func padding(_ width: Int) -> String {
        count >= width ? self : self + String(repeating: " ", count: width - count)
    }
}
