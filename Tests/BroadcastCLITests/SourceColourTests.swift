import Foundation
import Testing

/// A YUV source keeps its own colour description: the test pattern painted in BT.601 at 720p (an
/// SD camera's YUV at an HD size) is passed to x264 without a matrix change and tagged BT.601, so
/// its 75% bars decode to their colours with the file's tags. Before, it was tagged BT.709 for its
/// size, and green decoded as (0,159,0).
@Suite(.serialized) struct SourceColourTests {
    /// Yellow, green, magenta and blue of the 75% bars (8 bars across), above the moving block and
    /// below the clock.
    static let bars: [(x: Int, rgb: [Int])] = [(240, [191, 191, 0]), (560, [0, 191, 0]), (720, [191, 0, 191]), (1040, [0, 0, 191])]

    @Test(arguments: [("bt601", "smpte170m"), ("bt709", "bt709")])
    func testPatternKeepsItsMatrix(matrix: String, tag: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("bars.mp4")
        let r = try broadcast([
            "record", file, "--video", "test:colour=\(matrix)", "--size", "1280x720", "--audio-mic", "none", "--duration", "2s",
            "--quiet",
        ])
        #expect(r.status == 0, "record failed: \(r.stderr)")
        let colour = ColourTests()
        let tags = try colour.colourTags(file)
        #expect(tags == ["color_space": tag, "color_primaries": tag, "color_transfer": tag, "color_range": "tv"], "\(tags)")
        let pixels = try colour.decodedPixels(file, tags: tags, at: 0.5, points: Self.bars.map { ($0.x, 288) })
        for (bar, got) in zip(Self.bars, pixels) {
            #expect(zip(bar.rgb, got).allSatisfy { abs($0 - $1) <= 4 }, "\(matrix) bar \(bar.rgb) decoded as \(got)")
        }
    }
}
