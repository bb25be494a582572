import Foundation
import Testing

/// Screen recordings that convert only what changed (X11 DAMAGE) and, in vfr, send only changed
/// frames: checked by decoding what was recorded while windows appeared, overlapped and went away.
@Suite(.serialized) struct X11DamageTests {
    static let red = [255, 0, 0]
    static let blue = [0, 0, 255]
    static let green = [0, 255, 0]
    static let yellow = [255, 255, 0]
    static let black = [0, 0, 0]

    /// Packet times and keyframe flags of the video stream, in decoding order.
    func videoPackets(_ path: String) throws -> [(time: Double, key: Bool)] {
        let r = try run(
            "/usr/bin/ffprobe", ["-v", "error", "-select_streams", "v:0", "-show_entries", "packet=pts_time,flags", "-of", "csv=p=0", path])
        guard r.status == 0 else { throw ProbeError(message: "ffprobe \(path): \(r.stderr)") }
        return r.stdout.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: ",")
            guard fields.count >= 2, let time = Double(fields[0]) else { return nil }
            return (time, fields[1].contains("K"))
        }
    }

    @Test("small windows appearing at odd places, overlapping and going away are recorded as the screen showed them")
    func smallWindowsChanging() throws {
        let screen = try XvfbScreen(width: 640, height: 360)
        defer { screen.stop() }
        try screen.window("red", 0, 0, 320, 180, title: "red-block")
        try screen.window("blue", 320, 180, 320, 180, title: "blue-block")
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("damage.mkv")
        let recorder = try Child(
            broadcastBinary,
            ["record", file, "--video", "x11:\(screen.name)?cursor=off", "--audio-mic", "none", "--duration", "6s", "--quiet"])
        usleep(1_500_000)
        // Odd offsets and sizes against the chroma grid; the second over the first; one touching the screen's edge.
        let green = try screen.window("green", 101, 61, 63, 47, title: "green")
        try screen.window("yellow", 131, 85, 57, 41, title: "yellow")
        try screen.window("green", 597, 0, 43, 31, title: "corner")
        usleep(700_000)
        green.signal(SIGKILL)  // its place is exposed again: red, under the yellow one yellow
        _ = green.wait(timeout: 5)
        let r = recorder.wait(timeout: 60)
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let probe = try probe(file)
        let duration = try #require(probe.formatDuration)
        // The final state, at the last frames: every changed and unchanged place.
        let points: [((Int, Int), [Int])] = [
            ((107, 67), Self.red),  // where the green window was, not under the yellow one
            ((157, 100), Self.yellow),  // yellow over where green was
            ((183, 120), Self.yellow),
            ((137, 121), Self.yellow),
            ((170, 70), Self.red),  // green's old top right corner
            ((630, 6), Self.green),  // the corner window
            ((634, 36), Self.black),  // just below it
            ((40, 40), Self.red), ((480, 270), Self.blue), ((480, 45), Self.black), ((80, 270), Self.black),
        ]
        let pixels = try rgbPixels(file, at: duration - 0.2, width: 640, height: 360, points: points.map(\.0))
        for (index, (point, colour)) in points.enumerated() {
            #expect(near(pixels[index], colour), "at \(point): \(pixels[index]), expected \(colour)")
        }
        try expectDecodesCleanly(file)
    }

    @Test("vfr: 10 s of a static screen with one change at 5 s: few frames, times on the capture grid, 10 s long, keyframes every interval",
        arguments: ["mp4", "mkv"])
    func variableFrameRate(container: String) throws {
        let screen = try XvfbScreen(width: 320, height: 180)
        defer { screen.stop() }
        try screen.window("red", 0, 0, 320, 180, title: "red")
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("vfr.\(container)")
        let started = Date()
        let recorder = try Child(
            broadcastBinary,
            ["record", file, "--video", "x11:\(screen.name)?cursor=off", "--audio-mic", "none", "--duration", "10s",
             "--fps", "30", "--keyframe-interval", "2s", "--frame-rate-mode", "vfr", "--quiet"])
        usleep(UInt32(max(0, 5 - Date().timeIntervalSince(started)) * 1_000_000))
        try screen.window("blue", 100, 50, 120, 80, title: "blue")
        let r = recorder.wait(timeout: 60)
        #expect(r.status == 0, "record failed: \(r.stderr)")

        let packets = try videoPackets(file)
        let times = packets.map(\.time).sorted()
        // cfr would have 300; keyframes every 2 s, the change, the end.
        #expect(packets.count >= 6 && packets.count <= 30, "\(packets.count) frames: \(times)")
        let probed = try probe(file)
        let duration = try #require(probed.formatDuration)
        #expect(abs(duration - 10) < 0.1, "plays \(duration) s")
        #expect(probed.video?.frames == packets.count, "decoded \(probed.video?.frames ?? 0) of \(packets.count)")
        // Capture times: on the 1/30 s grid, increasing.
        for time in times {
            #expect(abs(time * 30 - (time * 30).rounded()) < 0.05, "frame at \(time) s is off the 1/30 s grid")
        }
        #expect(Set(times).count == times.count, "repeated timestamps: \(times)")
        // A keyframe at least every 2 s, to the end.
        let keys = packets.filter(\.key).map(\.time).sorted()
        #expect(keys.first == 0, "keyframes \(keys)")
        for (a, b) in zip(keys, keys.dropFirst() + [duration]) {
            #expect(b - a <= 2.0 + 0.04, "keyframes \(keys): \(b - a) s between \(a) and \(b)")
        }
        // The change: blue from the first frame after it, red before, at a time that fits 5 s
        // after the command started (less its start-up).
        var changeFrame: Double?
        for time in times {
            let pixel = try rgbPixels(file, at: time, width: 320, height: 180, points: [(160, 90)])[0]
            if near(pixel, Self.blue) {
                changeFrame = changeFrame ?? time
            } else {
                #expect(changeFrame == nil && near(pixel, Self.red), "at \(time) s: \(pixel) (change at \(changeFrame ?? -1))")
            }
        }
        let change = try #require(changeFrame, "the change never shows: \(times)")
        #expect(change > 3.0 && change < 6.0, "the change at \(change) s")
        try expectDecodesCleanly(file)
    }
}
