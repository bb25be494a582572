import Foundation
import Testing

/// The encoded stream's geometry and colour as ffprobe reads them.
struct EncodedVideo: Equatable, CustomStringConvertible {
    var width: Int
    var height: Int
    var pixelFormat: String
    var profile: String
    var frameRate: String
    var colourSpace: String
    var colourPrimaries: String
    var colourTransfer: String
    var colourRange: String

    var description: String {
        "\(width)x\(height) \(pixelFormat) \(profile) \(frameRate) fps, \(colourSpace)/\(colourPrimaries)/\(colourTransfer) \(colourRange)"
    }
}

func encodedVideo(_ path: String) throws -> EncodedVideo {
    let r = try run("/usr/bin/ffprobe", ["-v", "error", "-select_streams", "v:0", "-show_streams", "-of", "json", path])
    guard r.status == 0, let json = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any],
        let stream = (json["streams"] as? [[String: Any]])?.first
    else { throw ProbeError(message: "ffprobe \(path) failed: \(r.stderr)") }
    func text(_ key: String) -> String { stream[key] as? String ?? "?" }
    return EncodedVideo(
        width: stream["width"] as? Int ?? 0, height: stream["height"] as? Int ?? 0, pixelFormat: text("pix_fmt"),
        profile: text("profile"), frameRate: text("r_frame_rate"), colourSpace: text("color_space"),
        colourPrimaries: text("color_primaries"), colourTransfer: text("color_transfer"), colourRange: text("color_range"))
}

/// issue 25 item 1: `record`, `stream` and the daemon build their pipeline one way
/// (`PipelineAssembly`), so the same source and flags give the same encode. Before, `stream` and
/// the daemon encoded a screen at --size's 1280x720 where `record` took the screen's own size.
@Suite(.serialized) struct SamePipelineTests {
    @Test func recordStreamAndDaemonEncodeAScreenAlike() throws {
        let screen = try XvfbScreen(width: 640, height: 360)
        defer { screen.stop() }
        try screen.window("red", 0, 0, 320, 180, title: "red-block")
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let source = "x11:\(screen.name)?cursor=off"
        let common = ["--video", source, "--audio-mic", "none", "--fps", "25", "--duration", "2s", "--quiet"]

        let recorded = try broadcast(["record", dir.path("record.mp4")] + common)
        #expect(recorded.status == 0, "record: \(recorded.stderr)")

        let server = try RTMPServer()
        defer { server.cleanup() }
        let streamed = try broadcast(
            ["stream", "rtmp://127.0.0.1:\(server.port)/live/same", "--record", dir.path("stream.mp4")] + common)
        #expect(streamed.status == 0, "stream: \(streamed.stderr)")
        server.stop()

        let (daemon, socket) = try launchDaemon(
            dir, sections: "[video]\nsource = \"\(source)\"\nfps = 25\n[audio]\nmic = \"none\"", outputs: recordingOutput(dir, file: "daemon.mp4"))
        let status = try waitUntilRecording(socket)
        // Two seconds of frames, judged by the daemon's own count rather than a sleep.
        for _ in 0..<300 {
            let r = try broadcast(["status", "--socket", socket, "--json"], timeout: 30)
            if let frames = Self.videoFramesEncoded(r.stdout), frames >= 50 { break }
            usleep(100_000)
        }
        daemon.signal(SIGTERM)
        let ended = daemon.wait(timeout: 60)
        #expect(ended.status == 0, "daemon: \(ended.stderr) \(status)")

        let record = try encodedVideo(dir.path("record.mp4"))
        #expect(record.width == 640 && record.height == 360, "record encodes the screen's own size: \(record)")
        let stream = try encodedVideo(dir.path("stream.mp4"))
        let live = try server.recordings.first.map(encodedVideo)
        let daemonFile = try encodedVideo(dir.path("daemon.mp4"))
        // The stream is rate-controlled for a live output (cbr) and the file for a file (vbr); the
        // picture's geometry, format, profile, rate and colour are the same everywhere.
        #expect(stream == record, "stream \(stream) vs record \(record)")
        #expect(daemonFile == record, "daemon \(daemonFile) vs record \(record)")
        if let live {
            #expect(live.width == record.width && live.height == record.height, "what nginx received: \(live)")
        } else {
            Issue.record("nginx recorded nothing")
        }
    }

    static func videoFramesEncoded(_ json: String) -> Int? {
        guard let range = json.range(of: "\"video_frames_encoded\":") else { return nil }
        return Int(json[range.upperBound...].prefix { $0.isNumber })
    }
}
