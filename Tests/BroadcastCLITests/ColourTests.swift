import Foundation
import Testing

/// An RGB screen recorded at HD size is BT.709 limited-range YUV and says so (H.264 VUI and the
/// container), so a player decodes known colour patches back to their RGB values.
@Suite(.serialized) struct ColourTests {
    /// Five 256x360 windows side by side on a 1280x720 screen.
    static let patches: [(name: String, rgb: [Int])] = [
        ("#ff0000", [255, 0, 0]), ("#00ff00", [0, 255, 0]), ("#0000ff", [0, 0, 255]),
        ("#ffffff", [255, 255, 255]), ("#808080", [128, 128, 128]),
    ]

    /// The stream's colour tags as ffprobe names them ("unknown" when absent).
    func colourTags(_ path: String) throws -> [String: String] {
        let r = try run(
            "/usr/bin/ffprobe",
            ["-v", "error", "-select_streams", "v:0", "-show_entries",
             "stream=color_space,color_primaries,color_transfer,color_range", "-of", "default=nw=1", path])
        guard r.status == 0 else { throw ProbeError(message: "ffprobe \(path): \(r.stderr)") }
        var tags = ["color_space": "unknown", "color_primaries": "unknown", "color_transfer": "unknown", "color_range": "unknown"]
        for line in r.stdout.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1).map(String.init)
            if parts.count == 2 { tags[parts[0]] = parts[1] }
        }
        return tags
    }

    /// RGB at `points` of the frame at `time`, decoded with the matrix and range the file is tagged
    /// with; where it says nothing, what players assume for HD (BT.709, limited range).
    func decodedPixels(
        _ path: String, tags: [String: String], at time: Double, width: Int = 1280, height: Int = 720, points: [(Int, Int)]
    ) throws -> [[Int]] {
        let matrix = ["bt709": "bt709", "smpte170m": "smpte170m", "bt470bg": "bt470"][tags["color_space"] ?? ""] ?? "bt709"
        let range = tags["color_range"] == "pc" ? "pc" : "tv"
        let raw = FileManager.default.temporaryDirectory.appendingPathComponent("colour-\(UUID().uuidString).rgb").path
        defer { try? FileManager.default.removeItem(atPath: raw) }
        let r = try run(
            "/usr/bin/ffmpeg",
            ["-nostdin", "-v", "error", "-ss", "\(time)", "-i", path, "-frames:v", "1",
             "-vf", "scale=in_color_matrix=\(matrix):in_range=\(range)",
             "-f", "rawvideo", "-pix_fmt", "rgb24", "-y", raw])
        guard r.status == 0 else { throw ProbeError(message: "ffmpeg frame at \(time) s of \(path): \(r.stderr)") }
        let data = try Data(contentsOf: URL(fileURLWithPath: raw))
        guard data.count == width * height * 3 else { throw ProbeError(message: "frame is \(data.count) bytes, not \(width)x\(height)x3") }
        return points.map { x, y in (0..<3).map { Int(data[(y * width + x) * 3 + $0]) } }
    }

    /// An Xvfb screen (1280x720 unless said) with the five patches side by side, each a fifth as
    /// wide and half as high as the screen.
    func patchScreen(width: Int = 1280, height: Int = 720) throws -> XvfbScreen {
        let screen = try XvfbScreen(width: width, height: height)
        for (index, patch) in Self.patches.enumerated() {
            try screen.window(patch.name, index * width / 5, height / 4, width / 5, height / 2, title: "patch-\(index)")
        }
        return screen
    }

    /// The file says `standard` (BT.709 unless said) limited range, and each patch's centre decodes
    /// within 6 levels.
    func expectPatches(_ file: String, _ what: String, standard: String = "bt709", width: Int = 1280, height: Int = 720) throws {
        let tags = try colourTags(file)
        #expect(tags["color_space"] == standard, "\(what): \(tags)")
        #expect(tags["color_primaries"] == standard, "\(what): \(tags)")
        #expect(tags["color_transfer"] == standard, "\(what): \(tags)")
        #expect(tags["color_range"] == "tv", "\(what): \(tags)")
        let centres = Self.patches.indices.map { ($0 * width / 5 + width / 10, height / 2) }
        let pixels = try decodedPixels(file, tags: tags, at: 1, width: width, height: height, points: centres)
        for (patch, pixel) in zip(Self.patches, pixels) {
            let close = zip(pixel, patch.rgb).allSatisfy { abs($0 - $1) <= 6 }
            #expect(close, "\(what): \(patch.name) decoded as \(pixel) (tags \(tags))")
        }
    }

    @Test(arguments: ["mp4", "mkv"])
    func hdScreenPatchesDecodeToTheirColoursWithTheFilesBT709Tags(_ container: String) throws {
        let screen = try patchScreen()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("colours.\(container)")
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off", "--audio-mic", "none", "--duration", "2s", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        try expectPatches(file, container)
    }

    /// The same screen streamed over RTMP: nginx's copy (FLV, whose colour is the H.264 VUI) says
    /// BT.709 and decodes to the patches' colours.
    @Test func hdScreenPatchesStreamedOverRTMPKeepTheirColours() throws {
        let screen = try patchScreen()
        defer { screen.stop() }
        let server = try RTMPServer()
        defer { server.cleanup() }
        let r = try broadcast(
            ["stream", "rtmp://127.0.0.1:\(server.port)/live/colour", "--video", "x11:\(screen.name)?cursor=off",
             "--audio-mic", "none", "--duration", "3s", "--quiet"],
            timeout: 60)
        #expect(r.status == 0, "stream failed: \(r.stderr.suffix(3000))")
        server.stop()
        let copy = try #require(server.recordings.first, "nginx recorded nothing")
        try expectPatches(copy, "rtmp")
    }

    /// Below 720 lines the common rule holds: BT.601 (SMPTE 170M), said as such.
    @Test func sdScreenPatchesAreBT601AndSaySo() throws {
        let screen = try patchScreen(width: 640, height: 360)
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("colours.mp4")
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off", "--audio-mic", "none", "--duration", "2s", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        try expectPatches(file, "sd mp4", standard: "smpte170m", width: 640, height: 360)
    }
}
