import BroadcastCapture
import BroadcastKit
public import BroadcastComposition
import BroadcastMedia
import BroadcastService
import Logging

/// A video source drawn over the base: a further `--video` / an element of `[video] layers`.
public struct VideoLayerSpec: Sendable, Hashable {
    public var source: VideoSourceSpec
    public var placement: LayerPlacement
    /// As written, for messages.
    public var text: String
}

extension Options {
    /// A layer: a video source with placement keys in its query (`/dev/video0?x=75%,y=75%,width=25%`).
    public static let videoLayer = OptionSpec<VideoLayerSpec>("--video", "video.layers") { text in
        try videoLayer(text)
    }

    /// The base picture (the first --video, `[video] source`): it fills the frame, so placement
    /// keys are refused with a word on where they belong.
    static func baseVideoSource(_ text: String) throws -> VideoSourceSpec {
        if let mark = text.firstIndex(of: "?"),
            let key = text[text.index(after: mark)...].split(separator: ",").map({ String($0.prefix { $0 != "=" }) })
                .first(where: placementKeys.contains)
        {
            throw ValueError(
                "invalid --video '\(text)': \(key) places a layer, and the first --video is the base (it fills the frame): give the layer as a further --video")
        }
        return try videoSource(text)
    }

    /// The keys a layer's query takes beside its source's own.
    static let placementKeys = ["x", "y", "width", "height", "fit", "crop", "on_loss", "opacity"]

    static func videoLayer(_ text: String) throws -> VideoLayerSpec {
        var sourceText = text
        var placement = LayerPlacement()
        if let mark = text.firstIndex(of: "?") {
            var kept: [Substring] = []
            var given: Set<String> = []
            let sourcePart = text[..<mark]
            for pair in text[text.index(after: mark)...].split(separator: ",", omittingEmptySubsequences: false) {
                let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let key = String(parts[0])
                guard placementKeys.contains(key) else {
                    // A key of neither the layer nor its source is named, not taken for a source.
                    if !sourceTakesQueryKeys(sourcePart) {
                        throw ValueError(
                            "invalid --video '\(text)': unknown key '\(key)': a layer's keys are \(placementKeys.joined(separator: ", ")), and \(sourcePart) takes none of its own")
                    }
                    kept.append(pair)
                    continue
                }
                guard given.insert(key).inserted else {
                    throw ValueError("invalid --video '\(text)': \(key) is given twice")
                }
                let value = parts.count == 2 ? String(parts[1]) : ""
                func invalid(_ expected: String) -> ValueError {
                    ValueError("invalid --video '\(text)': \(key)=\(value): expected \(expected)")
                }
                switch key {
                case "x", "y", "width", "height":
                    guard let length = placementLength(value, allowsZero: key == "x" || key == "y") else {
                        throw invalid(key == "x" || key == "y"
                            ? "pixels (0 to 16384) or a percentage of the output frame (0% to 100%), e.g. 75%"
                            : "pixels (2 to 16384) or a percentage of the output frame (more than 0% to 100%), e.g. 25%")
                    }
                    switch key {
                    case "x": placement.x = length
                    case "y": placement.y = length
                    case "width": placement.width = length
                    default: placement.height = length
                    }
                case "fit":
                    guard value == "fill" || value == "contain" else { throw invalid("fill (stretch to the box) or contain (keep the aspect ratio, the default)") }
                    placement.fill = value == "fill"
                case "crop":
                    guard let crop = cropRegion(value) else { throw invalid("WIDTHxHEIGHT+X+Y in the source's pixels, e.g. 640x360+0+0") }
                    placement.crop = crop
                case "opacity":
                    guard let opacity = opacity(value) else {
                        throw invalid("a percentage (more than 0% to 100%) or a fraction (more than 0 to 1), e.g. 25% or 0.25")
                    }
                    placement.opacity = opacity
                default:
                    guard let onLoss = LayerPlacement.OnLoss(rawValue: value) else { throw invalid("hide or slate") }
                    placement.onLoss = onLoss
                }
            }
            sourceText = String(text[..<mark]) + (kept.isEmpty ? "" : "?" + kept.joined(separator: ","))
        }
        let source = try videoSource(sourceText)
        if source == .none { throw ValueError("invalid --video '\(text)': a layer needs a source, not 'none'") }
        return VideoLayerSpec(source: source, placement: placement, text: text)
    }

    /// Whether a source takes query keys of its own (X11's cursor, window...; the portal's cursor),
    /// left in its text for its own parser, which names a key it does not know.
    static func sourceTakesQueryKeys(_ source: Substring) -> Bool {
        source.hasPrefix("x11:") || source == "portal" || source.hasPrefix("portal:")
    }

    /// `120` (pixels) or `25%` / `12.5%` (of the output frame).
    static func placementLength(_ text: String, allowsZero: Bool) -> LayerPlacement.Length? {
        if text.hasSuffix("%") {
            guard let percent = Double(text.dropLast()), percent.isFinite, percent <= 100, allowsZero ? percent >= 0 : percent > 0 else {
                return nil
            }
            return .percent(percent)
        }
        guard text.allSatisfy(\.isASCII), let pixels = Int(text), pixels <= 16384, pixels >= (allowsZero ? 0 : 2) else { return nil }
        return .pixels(pixels)
    }

    /// `25%` or `0.25`: more than 0, at most 1 (opaque).
    static func opacity(_ text: String) -> Double? {
        let percent = text.hasSuffix("%")
        guard let number = Double(percent ? String(text.dropLast()) : text), number.isFinite else { return nil }
        let opacity = percent ? number / 100 : number
        return opacity > 0 && opacity <= 1 ? opacity : nil
    }

    /// `WxH+X+Y`.
    static func cropRegion(_ text: String) -> PixelRegion? {
        let parts = text.split(separator: "+", omittingEmptySubsequences: false)
        guard parts.count == 3, let x = Int(parts[1]), let y = Int(parts[2]), x >= 0, y >= 0 else { return nil }
        let size = parts[0].split(separator: "x", omittingEmptySubsequences: false)
        guard size.count == 2, let w = Int(size[0]), let h = Int(size[1]), (1...16384).contains(w), (1...16384).contains(h),
            x <= 16384, y <= 16384
        else { return nil }
        return PixelRegion(x: x, y: y, width: w, height: h)
    }
}

/// A named layout of layers over the base (the daemon's `[scenes]`).
public struct SceneSpec: Sendable, Hashable {
    public var name: String
    public var layers: [VideoLayerSpec]
}

extension SourceSettings {
    /// The scenes the composite shows: `[scenes]` when given (the first at the start), else
    /// `layers` as one scene, "default".
    var sceneSpecs: [SceneSpec] { scenes.isEmpty ? [SceneSpec(name: "default", layers: layers)] : scenes }

    /// Opens every source the scenes draw (once each, however many scenes show it) over `base`
    /// into one composite source of `frame`'s size.
    func composite(
        base: any CaptureSource, frame: VideoSize, rate: (numerator: Int, denominator: Int), logger: Logger?,
        openingPortal: Bool, blame: (OptionName, any Error) -> any Error
    ) throws -> LayeredVideoSource {
        var inputs: [any CaptureSource] = []
        // A source shown in several scenes is opened once (a camera cannot be opened twice); two
        // layers of one scene are two sources.
        var opened: [VideoSourceSpec: [Int]] = [:]
        var scenes: [LayeredVideoSource.Scene] = []
        var blamed = Options.videoLayer.name
        do {
            for scene in sceneSpecs {
                if !self.scenes.isEmpty { blamed = OptionName(flag: "[scenes] \(scene.name)", key: "scenes.\(scene.name)") }
                var layers: [LayeredVideoSource.Layer] = []
                for layer in scene.layers {
                    if case .pipeWire = layer.source, !openingPortal { continue }
                    let used = Set(layers.map(\.input))
                    if let input = opened[layer.source, default: []].first(where: { !used.contains($0) }) {
                        layers.append(LayeredVideoSource.Layer(input: input, placement: layer.placement))
                    } else {
                        // The built-in pattern is painted at its (first) box's size: nothing to scale.
                        let box = layer.placement.box(frameWidth: frame.width, frameHeight: frame.height)
                        let size = VideoSize(width: max(16, box?.width ?? 16), height: max(16, box?.height ?? 16))
                        guard let source = try videoSource(layer.source, size: size, rate: rate, logger: logger) else { continue }
                        opened[layer.source, default: []].append(inputs.count)
                        layers.append(LayeredVideoSource.Layer(input: inputs.count, placement: layer.placement))
                        inputs.append(source)
                    }
                }
                scenes.append(LayeredVideoSource.Scene(name: scene.name, layers: layers))
            }
        } catch {
            throw blame(blamed, error)
        }
        return LayeredVideoSource(
            base: base, inputs: inputs, scenes: scenes, width: frame.width, height: frame.height,
            colour: Self.videoColour([(.video, base)]), logger: logger ?? Logger(label: "broadcast.layers"))
    }
}

extension DaemonConfiguration {
    /// `[video] layers = ["/dev/video0?x=75%,y=75%,width=25%,height=25%", ...]`: each a layer as a
    /// further `--video` writes it, drawn over `source` in order.
    mutating func readLayers(_ entry: TOMLDocument.Entry, key: String, environment: [String: String]) throws {
        guard case .array(let values) = entry.value else {
            throw error(entry.line, key, "expected an array of sources with placement keys, e.g. [\"test?x=75%,y=75%,width=25%,height=25%\"], got \(entry.value.typeName)")
        }
        var layers: [VideoLayerSpec] = []
        for value in values {
            guard case .string = value else {
                throw error(entry.line, key, "expected an array of strings, got an element that is \(value.typeName)")
            }
            let text = try string(TOMLDocument.Entry(value: value, line: entry.line), key: key, environment: environment)
            do {
                layers.append(try Options.videoLayer.parse(text))
            } catch {
                throw self.error(entry.line, key, error.configMessage)
            }
        }
        sources.layers = layers
    }
}

extension DaemonConfiguration {
    /// `[scenes]`: `NAME = ["source?placement", ...]`, each a layout of layers over `[video] source`
    /// written as `layers` is; the broadcast starts in the first.
    mutating func readScene(_ name: String, _ entry: TOMLDocument.Entry, key: String, environment: [String: String]) throws {
        guard !name.isEmpty, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else {
            throw error(entry.line, key, "expected a scene name of letters, digits, '-' and '_'")
        }
        let before = sources.layers
        sources.layers = []
        try readLayers(entry, key: key, environment: environment)
        sources.scenes.append(SceneSpec(name: name, layers: sources.layers))
        sources.layers = before
    }
}

extension DaemonConfiguration {
    /// Scenes replace `[video] layers` (each scene says its own); they need a base to draw over.
    func checkScenes() throws {
        guard !sources.scenes.isEmpty else { return }
        if !sources.layers.isEmpty {
            throw error(
                lines["video.layers"] ?? 0, "video.layers",
                "[video] layers and [scenes] are both set: with scenes each scene lists its layers (the broadcast starts in the first)")
        }
        if sources.video == .none {
            throw error(lines["video.source"] ?? 0, "video.source", "[scenes] draw over [video] source, which is 'none'")
        }
    }
}
