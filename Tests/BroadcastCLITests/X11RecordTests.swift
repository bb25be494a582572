import Foundation
import Testing

/// An Xvfb display with solid-colour windows (xlogo from x11-apps), for recording it with the CLI.
/// Started and stopped by PID (SIGKILL: children of a test thread inherit its blocked SIGTERM).
final class XvfbScreen: @unchecked Sendable {
    let number: Int
    private let server: Child
    private var clients: [Child] = []
    var name: String { ":\(number)" }

    init(width: Int, height: Int) throws {
        for tool in ["/usr/bin/Xvfb", "/usr/bin/xlogo"] where !FileManager.default.isExecutableFile(atPath: tool) {
            throw ProbeError(message: "\(tool) is missing: install xvfb and x11-apps (make deps does)")
        }
        var n = 300 + Int(getpid() % 100) * 4
        while FileManager.default.fileExists(atPath: "/tmp/.X\(n)-lock") || FileManager.default.fileExists(atPath: "/tmp/.X11-unix/X\(n)") {
            n += 1
        }
        number = n
        server = try Child("/usr/bin/Xvfb", [":\(n)", "-screen", "0", "\(width)x\(height)x24", "-nolisten", "tcp", "-noreset"])
        for _ in 0..<250 where !FileManager.default.fileExists(atPath: "/tmp/.X11-unix/X\(n)") { usleep(20_000) }
        usleep(100_000)
    }

    /// A borderless window of one colour at x,y.
    @discardableResult
    func window(_ colour: String, _ x: Int, _ y: Int, _ width: Int, _ height: Int, title: String) throws -> Child {
        let child = try Child(
            "/usr/bin/env",
            ["DISPLAY=\(name)", "/usr/bin/xlogo", "-bw", "0", "-bg", colour, "-fg", colour,
             "-geometry", "\(width)x\(height)+\(x)+\(y)", "-title", title, "-name", title])
        clients.append(child)
        usleep(500_000)
        return child
    }

    func stop() {
        for client in clients {
            client.signal(SIGKILL)
            _ = client.wait(timeout: 5)
        }
        server.signal(SIGKILL)
        _ = server.wait(timeout: 5)
        try? FileManager.default.removeItem(atPath: "/tmp/.X\(number)-lock")
        try? FileManager.default.removeItem(atPath: "/tmp/.X11-unix/X\(number)")
    }
}

/// RGB of the pixels at `points` in the decoded frame at `time` seconds.
func rgbPixels(_ path: String, at time: Double, width: Int, height: Int, points: [(Int, Int)]) throws -> [[Int]] {
    let raw = FileManager.default.temporaryDirectory.appendingPathComponent("frame-\(UUID().uuidString).rgb").path
    defer { try? FileManager.default.removeItem(atPath: raw) }
    let r = try run(
        "/usr/bin/ffmpeg",
        ["-nostdin", "-v", "error", "-ss", "\(time)", "-i", path, "-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "rgb24", "-y", raw])
    guard r.status == 0 else { throw ProbeError(message: "ffmpeg frame at \(time) s of \(path): \(r.stderr)") }
    let data = try Data(contentsOf: URL(fileURLWithPath: raw))
    guard data.count == width * height * 3 else { throw ProbeError(message: "frame is \(data.count) bytes, not \(width)x\(height)x3") }
    return points.map { x, y in (0..<3).map { Int(data[(y * width + x) * 3 + $0]) } }
}

/// Close to a colour after H.264 and back (limited range, 4:2:0).
func near(_ pixel: [Int], _ colour: [Int]) -> Bool { zip(pixel, colour).allSatisfy { abs($0 - $1) <= 24 } }

/// `broadcast record --video x11:...` from an Xvfb screen, checked by decoding the recording.
@Suite(.serialized) struct X11RecordTests {
    static let red = [255, 0, 0]
    static let blue = [0, 0, 255]
    static let black = [0, 0, 0]

    func display() throws -> XvfbScreen {
        let screen = try XvfbScreen(width: 640, height: 360)
        try screen.window("red", 0, 0, 320, 180, title: "red-block")
        try screen.window("blue", 320, 180, 320, 180, title: "blue-block")
        return screen
    }

    @Test func fiveSecondsOfTheScreenHaveTheColoursInPlaceAndEveryFrame() throws {
        let screen = try display()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("screen.mp4")
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off", "--audio-mic", "none", "--fps", "30", "--duration", "5s",
            "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let video = try #require(try probe(file).video)
        #expect(video.width == 640 && video.height == 360, "size \(video.width ?? 0)x\(video.height ?? 0)")
        #expect(video.frames == 150, "\(video.frames ?? 0) frames for 5 s at 30 fps")
        for time in [0.5, 2.5, 4.5] {
            let pixels = try rgbPixels(file, at: time, width: 640, height: 360, points: [(80, 45), (480, 270), (480, 45), (80, 270)])
            #expect(near(pixels[0], Self.red) && near(pixels[1], Self.blue), "at \(time) s: \(pixels)")
            #expect(near(pixels[2], Self.black) && near(pixels[3], Self.black), "at \(time) s: \(pixels)")
        }
        try expectDecodesCleanly(file)
    }

    @Test func regionAndWindowRecordingsHaveTheirSizeAndOnlyTheirContent() throws {
        let screen = try display()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        for (spec, size, colour) in [
            ("x11:\(screen.name)+320,180/320x180?cursor=off", (320, 180), Self.blue),
            ("x11:\(screen.name)?cursor=off,title=red-block", (320, 180), Self.red),
        ] {
            let file = dir.path("part.mkv")
            let r = try broadcast(["record", file, "--video", spec, "--audio-mic", "none", "--duration", "2s", "--quiet"])
            #expect(r.status == 0, "\(spec): \(r.stderr)")
            let video = try #require(try probe(file).video)
            #expect(video.width == size.0 && video.height == size.1, "\(spec): \(video.width ?? 0)x\(video.height ?? 0)")
            let corners = [(4, 4), (size.0 - 4, 4), (4, size.1 - 4), (size.0 - 4, size.1 - 4), (size.0 / 2, size.1 / 2)]
            let pixels = try rgbPixels(file, at: 1, width: size.0, height: size.1, points: corners)
            #expect(pixels.allSatisfy { near($0, colour) }, "\(spec): \(pixels)")
            try? FileManager.default.removeItem(atPath: file)
        }
    }

    @Test func aStaticScreenIsRepeatedAtTheOutputRate() throws {
        let screen = try display()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("static.mp4")
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off", "--audio-mic", "none", "--duration", "3s",
            "--log-level", "info",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        #expect(try probe(file).video?.frames == 90)
        // "X display :N: 91 frames delivered, 1 captured, 90 repeated ..."
        let line = try #require(r.stderr.split(separator: "\n").first { $0.contains("frames delivered") }, "\(r.stderr)")
        let words = line.split(separator: " ")
        func number(before word: String) -> Int? {
            guard let i = words.firstIndex(where: { $0.hasPrefix(word) }), i > 0 else { return nil }
            return Int(words[i - 1])
        }
        #expect((number(before: "frames") ?? 0) >= 90, "\(line)")
        #expect((number(before: "captured") ?? 99) <= 3, "\(line)")
    }

    @Test func killingTheCapturedWindowsClientEndsWithAClearErrorAndAPlayableFile() throws {
        let screen = try display()
        defer { screen.stop() }
        let victim = try screen.window("green", 100, 100, 200, 100, title: "victim")
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("window.mp4")
        let child = try Child(broadcastBinary, ["record", file, "--video", "x11:\(screen.name)?title=victim", "--duration", "20s", "--quiet"])
        usleep(3_000_000)
        victim.signal(SIGKILL)
        let r = child.wait(timeout: 20)
        #expect(r.status == 1, "exit \(r.status): \(r.stderr)")
        let errorLines = r.stderr.split(separator: "\n").filter { $0.hasPrefix("broadcast: error:") }
        #expect(errorLines.count == 1, "\(r.stderr)")
        #expect(errorLines.first.map { $0.contains("\"victim\"") && $0.contains(screen.name) && $0.contains("gone") } == true, "\(r.stderr)")
        let video = try #require(try probe(file).video)
        // Half a second of frames at least: start-up on a loaded machine can take over two of the three seconds.
        #expect((video.frames ?? 0) >= 15, "\(video.frames ?? 0) frames before the window went")
        try expectDecodesCleanly(file)
    }

    @Test(arguments: ["x11::0+1/10x10", "x11:nodisplay", "x11::0?cursor=sometimes"])
    func badX11TextExitsTwoWithOneLine(text: String) throws {
        let r = try broadcast(["record", "/tmp/never.mp4", "--video", text, "--duration", "1s"])
        #expect(r.status == 2)
        let lines = r.stderr.split(separator: "\n")
        #expect(lines.count == 1 && lines[0].contains("'\(text)'"), "\(r.stderr)")
    }
}
