import Foundation
import Testing

/// issue 26 items 1-3: further `--video`s are layers drawn over the base, placed by their query
/// keys; judged by decoding frames of the recording to RGB.
@Suite(.serialized) struct LayerTests {
    static let red = [255, 0, 0]
    // The pattern's 75 % bars.
    static let grey75 = [191, 191, 191]
    static let yellow = [191, 191, 0]
    static let blue = [0, 0, 191]
    /// The slate of a lost layer (Y 40: a dark grey).
    static let slate = [28, 28, 28]

    /// A 1280x720 screen, red all over (BT.709 output: the BT.601 pattern is converted into it).
    func redScreen() throws -> XvfbScreen {
        let screen = try XvfbScreen(width: 1280, height: 720)
        try screen.window("red", 0, 0, 1280, 720, title: "red-all")
        return screen
    }

    /// The issue's example: the pattern in the bottom-right quarter of an X11 screen. The box is
    /// x 960..1280, y 540..720; the 320x180 pattern's bars are 40 px wide (white, yellow, cyan,
    /// green, magenta, red, blue, black), its moving block in rows 120-142 of it.
    @Test func aTestPatternLayerSitsInItsBoxOverTheScreen() throws {
        let screen = try redScreen()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("talk.mp4")
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off", "--video", "test?x=75%,y=75%,width=25%,height=25%",
            "--audio-mic", "none", "--fps", "30", "--duration", "3s", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let video = try #require(try probe(file).video)
        #expect(video.width == 1280 && video.height == 720, "the base sets the frame: \(video.width ?? 0)x\(video.height ?? 0)")
        // Every frame, but those the session counted dropped (a loaded host's late source).
        #expect((video.frames ?? 0) + countedVideoDrops(r.stderr) == 90, "\(video.frames ?? 0) frames for 3 s at 30 fps: \(r.stderr)")
        let points = [
            (1020, 630), (1220, 630),  // yellow and blue bars, inside
            (964, 630), (956, 630),  // the left edge: white bar 4 px inside, the screen 4 px outside
            (1220, 544), (1220, 536),  // the top edge: blue 4 px inside, red 4 px outside
            (100, 100), (900, 600), (1020, 500),  // the screen elsewhere
        ]
        for time in [0.5, 1.5, 2.5] {
            let p = try rgbPixels(file, at: time, width: 1280, height: 720, points: points)
            #expect(near(p[0], Self.yellow) && near(p[1], Self.blue), "inside the box at \(time) s: \(p)")
            #expect(near(p[2], Self.grey75) && near(p[3], Self.red), "left edge at \(time) s: \(p)")
            #expect(near(p[4], Self.blue) && near(p[5], Self.red), "top edge at \(time) s: \(p)")
            #expect(near(p[6], Self.red) && near(p[7], Self.red) && near(p[8], Self.red), "outside at \(time) s: \(p)")
        }
        try expectDecodesCleanly(file)
    }

    /// issue 37 item 9: `opacity=50%`: inside the box the pattern and the red screen under it, half
    /// each (yellow over red: (223, 96, 0); blue over red: (128, 0, 96)); outside it the screen.
    @Test func aLayerAtHalfOpacityShowsTheScreenThroughIt() throws {
        let screen = try redScreen()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("half.mp4")
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off",
            "--video", "test?x=75%,y=75%,width=25%,height=25%,opacity=50%",
            "--audio-mic", "none", "--fps", "30", "--duration", "2s", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let points = [(1020, 630), (1220, 630), (100, 100), (900, 600)]
        for time in [0.5, 1.5] {
            let p = try rgbPixels(file, at: time, width: 1280, height: 720, points: points)
            #expect(near(p[0], [223, 96, 0]) && near(p[1], [128, 0, 96]), "inside the box at \(time) s: \(p)")
            #expect(near(p[2], Self.red) && near(p[3], Self.red), "outside at \(time) s: \(p)")
        }
        try expectDecodesCleanly(file)
    }

    /// `fit` and `crop`: the pattern's yellow bar alone (crop), stretched over a wide box (fill),
    /// next to the same crop kept at its aspect ratio (a tall box: the picture is centred, the
    /// screen shows above and below it).
    @Test func cropAndFitPlaceThePartOfTheSourceAsAsked() throws {
        let screen = try redScreen()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("crop.mp4")
        // The pattern is painted at its box's size: 400x100 → bars 50 px wide; yellow is x 50..100
        // (the clock covers rows 0..18, the moving block rows 66..78).
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off",
            "--video", "test?x=0,y=0,width=400,height=100,crop=40x32+55+24,fit=fill",
            "--video", "test?x=600,y=0,width=200,height=400,crop=40x40+10+40",
            "--audio-mic", "none", "--fps", "30", "--duration", "2s", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        // The second pattern is 200x400, bars 25 px wide: x 10..50 is white (to 25) then yellow
        // (rows 40..80: below its clock); the 40x40 crop kept square in a 200x400 box is drawn
        // at 600..800 x 100..300.
        let p = try rgbPixels(file, at: 0.5, width: 1280, height: 720, points: [
            (10, 10), (390, 90), (200, 50), (410, 50),  // the fill box: yellow to its corners, red past it
            (700, 50), (700, 350), (610, 200), (790, 200),  // above/below the square: red; its sides: the crop
        ])
        #expect(near(p[0], Self.yellow) && near(p[1], Self.yellow) && near(p[2], Self.yellow), "filled crop: \(p)")
        #expect(near(p[3], Self.red), "right of the filled box: \(p)")
        #expect(near(p[4], Self.red) && near(p[5], Self.red), "above and below the contained crop: \(p)")
        #expect(near(p[6], Self.grey75) && near(p[7], Self.yellow), "the contained crop, white then yellow: \(p)")
    }

    /// A layer whose device is lost from 1 s to 2.5 s while the screen goes on: hidden (the screen
    /// shows), or a slate, then back; every frame of the base is in the file.
    @Test func aLostLayerHidesOrShowsItsSlateAndComesBack() throws {
        let screen = try redScreen()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("lost.mp4")
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off",
            "--video", "test:lost=1s-2500ms?x=0,y=0,width=320,height=180",
            "--video", "test:lost=1s-2500ms?x=640,y=0,width=320,height=180,on_loss=slate",
            "--audio-mic", "none", "--fps", "30", "--duration", "4s", "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let video = try #require(try probe(file).video)
        #expect(
            (video.frames ?? 0) + countedVideoDrops(r.stderr) == 120,
            "the base goes on: \(video.frames ?? 0) frames for 4 s at 30 fps: \(r.stderr)")
        // Yellow bars of each pattern (x 40..80), below the clock and above the block.
        let points = [(60, 90), (700, 90), (400, 90)]
        for time in [0.5, 3.5] {
            let p = try rgbPixels(file, at: time, width: 1280, height: 720, points: points)
            #expect(near(p[0], Self.yellow) && near(p[1], Self.yellow) && near(p[2], Self.red), "layers shown at \(time) s: \(p)")
        }
        for time in [1.5, 2.0] {
            let p = try rgbPixels(file, at: time, width: 1280, height: 720, points: points)
            #expect(near(p[0], Self.red), "the hidden layer shows the screen at \(time) s: \(p)")
            #expect(near(p[1], Self.slate), "the slate at \(time) s: \(p)")
        }
        try expectDecodesCleanly(file)
    }

    /// Placement values are checked before anything starts: exit 2, one line naming the value.
    @Test(arguments: [
        ("test?x=abc", "x=abc: expected pixels"),
        ("test?width=0", "width=0: expected pixels (2 to 16384)"),
        ("test?y=150%", "y=150%: expected pixels"),
        ("test?height=-5%", "height=-5%"),
        ("test?fit=stretch", "fit=stretch: expected fill"),
        ("test?crop=big", "crop=big: expected WIDTHxHEIGHT+X+Y"),
        ("test?on_loss=maybe", "on_loss=maybe: expected hide or slate"),
        ("test?opacity=0", "opacity=0: expected a percentage (more than 0% to 100%)"),
        ("test?opacity=150%", "opacity=150%: expected a percentage"),
        ("test?opacity=half", "opacity=half: expected"),
        ("none?x=0", "a layer needs a source"),
        ("x11::0?cursor=sideways,x=0", "cursor"),
        // issue 35 item 22: a key given twice, a key of neither the layer nor its source.
        ("test?x=10,y=0,x=20", "x is given twice"),
        ("test?x=0,size=big", "unknown key 'size': a layer's keys are x, y, width, height, fit, crop, on_loss"),
        ("/dev/video0?zoom=2", "unknown key 'zoom'"),
        ("test?crop=0x2+0+0", "crop=0x2+0+0: expected WIDTHxHEIGHT+X+Y"),
    ])
    func badPlacementIsRefused(layer: String, expected: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let r = try broadcast(["record", dir.path("x.mp4"), "--video", "test", "--video", layer, "--duration", "1s"])
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
        #expect(r.stderr.contains(expected), "expected '\(expected)' in: \(r.stderr)")
        #expect(dir.contents.isEmpty, "nothing may be created: \(dir.contents)")
    }

    /// issue 35 item 22: a crop with nothing of it inside its source's picture is not drawn as if
    /// there were none: the layer shows what `on_loss` says and one line says why and what shows;
    /// a 1x1 crop at the picture's corner is a crop like any other.
    @Test func aCropOutsideItsSourceIsSaidAndATinyCropIsTaken() throws {
        let screen = try redScreen()
        defer { screen.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("crops.mp4")
        let r = try broadcast([
            "record", file, "--video", "x11:\(screen.name)?cursor=off",
            "--video", "test?x=0,y=0,width=320,height=180,crop=10x10+5000+5000,on_loss=slate",
            "--video", "test?x=640,y=0,width=320,height=180,crop=1x1+319+179",
            "--audio-mic", "none", "--fps", "30", "--duration", "2s",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let said = r.stderr.split(separator: "\n").filter { $0.contains("10x10+5000+5000") }
        #expect(said.count == 1, "one line about the crop: \(r.stderr)")
        #expect(said.first?.contains("has nothing inside the source's 320x180 picture") == true, "\(said)")
        #expect(said.first?.contains("shown as a slate from now on") == true, "what shows, as shown: \(said)")
        #expect(!r.stderr.contains("1x1+319+179"), "the tiny crop is taken: \(r.stderr)")
        let p = try rgbPixels(file, at: 1.0, width: 1280, height: 720, points: [(160, 90), (800, 90), (1100, 400)])
        #expect(near(p[0], Self.slate), "the slate where the crop found nothing: \(p)")
        #expect(!near(p[1], Self.red), "the tiny crop's picture in its box: \(p)")
        #expect(near(p[2], Self.red), "the screen elsewhere: \(p)")
    }

    @Test func placementOnTheBaseIsRefused() throws {
        let r = try broadcast(["record", "/tmp/never-written.mp4", "--video", "test?x=10", "--duration", "1s"])
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("x places a layer, and the first --video is the base"), "\(r.stderr)")
    }

    /// The daemon's `[video] layers`, refused with file:line: key.
    @Test func badLayerInTheConfigNamesFileLineAndKey() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("bad.toml")
        try """
            [video]
            source = "test"
            layers = ["test?x=10%", "test?crop=0x1"]
            [[output]]
            name = "a"
            path = "\(dir.path("a.mkv"))"
            """.write(toFile: file, atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", file], timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
        #expect(r.stderr.contains("\(file):3: video.layers: "), "file:line: key in: \(r.stderr)")
        #expect(r.stderr.contains("crop=0x1"), "the value in: \(r.stderr)")
    }

    /// A layout whose pictures cannot fit the memory budget is refused at start with the figures.
    @Test func aLayoutThatCannotFitTheBudgetIsRefused() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let one = try broadcast(["record", dir.path("one.mp4"), "--video", "test", "--size", "1920x1080", "--memory-budget", "100M", "--duration", "1s", "--no-realtime", "--quiet"])
        #expect(one.status == 0, "the base alone fits: \(one.stderr)")
        let layers = (0..<6).flatMap { _ in ["--video", "test?x=0,y=0"] }
        let r = try broadcast(["record", dir.path("x.mp4"), "--video", "test", "--size", "1920x1080", "--memory-budget", "100M", "--duration", "1s"] + layers)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("memory budget 100 MiB is too small for 1920x1080 at 30 fps: it needs at least"), "\(r.stderr)")
        #expect(r.stderr.contains("capture"), "the figures by part: \(r.stderr)")
    }
}
