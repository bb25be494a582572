import BroadcastCapture
import BroadcastKit
import Foundation
import Logging
import Testing

/// What a session delivered from an X11 source: sizes, times, and the colours at chosen points.
final class FrameProbe: BroadcastSampleHandler {
    struct Frame {
        var width: Int
        var height: Int
        var time: Int64
        var base: UnsafeRawPointer
        /// (red, green, blue) at each probe point, in frame coordinates.
        var colours: [[UInt8]]
    }

    let points: [(x: Int, y: Int)]
    var frames: [Frame] = []
    var formats: Set<PixelFormat> = []

    init(points: [(x: Int, y: Int)]) { self.points = points }

    func broadcastStarted(setupInfo: SetupInfo) throws {}
    func broadcastFinished() {}

    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        guard let video = buffer.videoFormat else { return }
        formats.insert(video.pixelFormat)
        let plane = buffer.planes[0]
        let colours = points.map { point -> [UInt8] in
            guard point.x < video.width, point.y < video.height else { return [] }
            let offset = point.y * plane.bytesPerRow + point.x * 4
            // .bgr0: B G R X in memory.
            return [plane.bytes[offset + 2], plane.bytes[offset + 1], plane.bytes[offset]]
        }
        frames.append(
            Frame(
                width: video.width, height: video.height, time: buffer.presentationTime.nanoseconds ?? -1,
                base: plane.base, colours: colours))
    }
}

let red: [UInt8] = [255, 0, 0]
let blue: [UInt8] = [0, 0, 255]
let black: [UInt8] = [0, 0, 0]

func record(
    _ spec: String,
    seconds: Int64 = 1,
    fps: Int = 30,
    points: [(x: Int, y: Int)],
    during: (@Sendable () -> Void)? = nil
) throws -> (probe: FrameProbe, source: X11ScreenSource, result: Result<SessionSummary, any Error>) {
    let probe = FrameProbe(points: points)
    let source = X11ScreenSource(
        spec: try X11CaptureSpec(parsing: spec), frameRate: (fps, 1), logger: Logger(label: "test.x11"))
    let session = BroadcastSession(
        handler: probe, sources: [(.video, source)],
        options: SessionOptions(duration: MediaTime(nanoseconds: seconds * 1_000_000_000)))
    var helper: Thread?
    if let during {
        helper = Thread { during() }
        helper?.start()
    }
    let result = Result { try session.run() }
    _ = helper
    return (probe, source, result)
}

/// Xvfb 320x240: red 160x120 in the top left, blue 160x120 in the bottom right, black elsewhere.
@Suite(.serialized) struct X11ScreenSourceTests {
    static let quadrants: [(x: Int, y: Int)] = [(40, 30), (240, 180), (240, 30), (40, 180)]

    func twoColourDisplay(_ extra: [String] = []) throws -> VirtualDisplay {
        let display = try VirtualDisplay(width: 320, height: 240, arguments: extra)
        try display.solidWindow("red", x: 0, y: 0, width: 160, height: 120, title: "red-block")
        try display.solidWindow("blue", x: 160, y: 120, width: 160, height: 120, title: "blue-block")
        return display
    }

    @Test func wholeScreenHasTheColoursInTheirPlacesAtTheRequestedRate() throws {
        let display = try twoColourDisplay()
        defer { display.stop() }
        let (probe, source, result) = try record("x11:\(display.name)?cursor=off", seconds: 1, points: Self.quadrants)
        _ = try result.get()
        #expect(probe.formats == [.bgr0])
        #expect(probe.frames.count == 30, "\(probe.frames.count) frames in 1 s at 30 fps")
        let times = probe.frames.map(\.time)
        #expect(times == (0..<Int64(probe.frames.count)).map { $0 * 1_000_000_000 / 30 }, "frame times \(times)")
        for frame in probe.frames {
            #expect(frame.width == 320 && frame.height == 240)
            #expect(frame.colours == [red, blue, black, black], "colours \(frame.colours)")
        }
        // Nothing moved: one image from the server, the rest are repeats of it (the same memory).
        #expect(source.capturedCount <= 2, "captured \(source.capturedCount)")
        #expect(Set(probe.frames.map(\.base)).count == source.capturedCount)
    }

    @Test func regionShowsOnlyTheRegion() throws {
        let display = try twoColourDisplay()
        defer { display.stop() }
        let (probe, _, result) = try record(
            "x11:\(display.name)+160,120/160x120?cursor=off", points: [(0, 0), (159, 119), (80, 60)])
        _ = try result.get()
        #expect(probe.frames.count == 30)
        for frame in probe.frames {
            #expect(frame.width == 160 && frame.height == 120)
            #expect(frame.colours == [blue, blue, blue], "colours \(frame.colours)")
        }
    }

    @Test(arguments: ["title=red-block", "title=red-"])
    func windowByTitleShowsTheWindowOnly(selector: String) throws {
        let display = try twoColourDisplay()
        defer { display.stop() }
        let (probe, source, result) = try record(
            "x11:\(display.name)?cursor=off,\(selector)", points: [(0, 0), (159, 119)])
        _ = try result.get()
        #expect(source.name.contains("red-"))
        #expect(probe.frames.count == 30)
        for frame in probe.frames {
            #expect(frame.width == 160 && frame.height == 120)
            #expect(frame.colours == [red, red], "colours \(frame.colours)")
        }
    }

    @Test func changingScreenIsCapturedEveryFrame() throws {
        let display = try VirtualDisplay(width: 320, height: 240)
        defer { display.stop() }
        // ico redraws its window continuously.
        try display.client("/usr/bin/ico", ["-geometry", "320x240+0+0"])
        usleep(500_000)
        let (probe, source, result) = try record("x11:\(display.name)?cursor=off", seconds: 2, points: [])
        _ = try result.get()
        #expect(probe.frames.count == 60)
        #expect(source.capturedCount >= 50, "captured \(source.capturedCount) of \(probe.frames.count)")
    }

    @Test func withoutMITSHMPlainGetImageGivesTheSameImage() throws {
        let display = try twoColourDisplay(["-extension", "MIT-SHM"])
        defer { display.stop() }
        let (probe, _, result) = try record("x11:\(display.name)?cursor=off", points: Self.quadrants)
        _ = try result.get()
        #expect(probe.frames.count == 30)
        for frame in probe.frames { #expect(frame.colours == [red, blue, black, black]) }
    }

    @Test func theCursorIsDrawnInUnlessTurnedOff() throws {
        let display = try VirtualDisplay(width: 320, height: 240)
        defer { display.stop() }
        // Xvfb puts the pointer in the middle of the screen, showing the root window's cursor.
        let around = (110..<130).flatMap { y in (150..<170).map { x in (x: x, y: y) } }
        let with = try record("x11:\(display.name)", seconds: 1, points: around)
        let without = try record("x11:\(display.name)?cursor=off", seconds: 1, points: around)
        _ = try with.result.get()
        _ = try without.result.get()
        let drawn = try #require(with.probe.frames.last).colours.filter { $0 != black }.count
        let plain = try #require(without.probe.frames.last).colours.filter { $0 != black }.count
        #expect(plain == 0)
        #expect(drawn > 10, "\(drawn) cursor pixels drawn around the screen's middle")
    }

    @Test func aClosedWindowEndsTheBroadcastNamingIt() throws {
        let display = try twoColourDisplay()
        defer { display.stop() }
        let victim = try display.solidWindow("green", x: 40, y: 40, width: 100, height: 80, title: "victim")
        let started = Date()
        let (probe, _, result) = try record(
            "x11:\(display.name)?title=victim", seconds: 10, points: [(50, 40)],
            during: { usleep(1_000_000); display.kill(victim) })
        #expect(Date().timeIntervalSince(started) < 5, "the broadcast should end soon after the window is gone")
        #expect(probe.frames.count >= 20)
        switch result {
        case .success: Issue.record("the broadcast should fail when the window is gone")
        case .failure(let error):
            let message = "\(error)"
            #expect(message.contains("victim") && message.contains(display.name) && message.contains("gone"), "\(message)")
        }
    }

    @Test func windowGoneKeepRepeatsTheLastFrame() throws {
        let display = try twoColourDisplay()
        defer { display.stop() }
        let victim = try display.solidWindow("green", x: 40, y: 40, width: 100, height: 80, title: "victim")
        let (probe, _, result) = try record(
            "x11:\(display.name)?window-gone=keep,title=victim", seconds: 2, points: [(50, 40)],
            during: { usleep(500_000); display.kill(victim) })
        _ = try result.get()
        #expect(probe.frames.count == 60)
        #expect(probe.frames.allSatisfy { $0.colours == [[0, 255, 0]] })
    }

    @Test func startErrorsNameTheDisplay() throws {
        let display = try twoColourDisplay()
        defer { display.stop() }
        let outside = try record("x11:\(display.name)+200,200/200x100", points: [])
        #expect("\(outside.result)".contains("outside the screen of X display \(display.name)"), "\(outside.result)")
        let noWindow = try record("x11:\(display.name)?title=no-such-window", points: [])
        #expect("\(noWindow.result)".contains("no window titled \"no-such-window\""), "\(noWindow.result)")
        let noServer = try record("x11::\(display.number + 1000)", points: [])
        #expect("\(noServer.result)".contains("cannot open X display :\(display.number + 1000)"), "\(noServer.result)")
    }

    @Test func screensAreListed() throws {
        let display = try VirtualDisplay(width: 320, height: 240)
        defer { display.stop() }
        let screens = X11ScreenSource.screens(of: display.name)
        #expect(screens == [X11ScreenInfo(display: display.name, width: 320, height: 240, depth: 24)])
        #expect(X11ScreenSource.reachableScreens().contains { $0.display == display.name })
    }
}

@Suite struct X11CaptureSpecTests {
    @Test func parsesScreensRegionsWindowsAndOptions() throws {
        #expect(try X11CaptureSpec(parsing: "x11::0") == X11CaptureSpec(display: ":0"))
        #expect(try X11CaptureSpec(parsing: "x11:") == X11CaptureSpec(display: ""))
        #expect(
            try X11CaptureSpec(parsing: "x11::99+100,200/1280x720")
                == X11CaptureSpec(display: ":99", target: .region(X11Rectangle(x: 100, y: 200, width: 1280, height: 720))))
        #expect(
            try X11CaptureSpec(parsing: "x11::0.1/640x480").target
                == .region(X11Rectangle(x: 0, y: 0, width: 640, height: 480)))
        #expect(try X11CaptureSpec(parsing: "x11::0?window=0x1a00007").target == .window(0x1a00007))
        #expect(try X11CaptureSpec(parsing: "x11::0?window=42").target == .window(42))
        let full = try X11CaptureSpec(parsing: "x11:host:3?cursor=off,shm=off,window-gone=keep,title=a, b")
        #expect(full.display == "host:3")
        #expect(full.target == .windowTitled("a, b"))
        #expect(!full.drawsCursor && !full.usesSharedMemory && full.windowGone == .keep)
    }

    @Test(arguments: [
        "x11:0", "x11::abc", "x11::0+1/10x10", "x11::0+1,2/10", "x11::0/1x10", "x11::0?cursor=maybe",
        "x11::0?window=zz", "x11::0?frobnicate=1", "x11::0+1,1/10x10?window=0x10", "x11::0?title=", "v4l2:/dev/video0",
    ])
    func rejectsBadText(text: String) {
        #expect(throws: BroadcastError.self) { try X11CaptureSpec(parsing: text) }
        do {
            _ = try X11CaptureSpec(parsing: text)
        } catch {
            #expect(error.code == .invalidArgument)
            #expect(error.message.contains("'\(text)'"), "\(error.message)")
        }
    }
}
