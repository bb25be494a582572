import BroadcastCapture
import BroadcastKit
import Testing

/// Which pixel format a V4L2 source captures, from what the device offers: uncompressed when the
/// size and rate asked for exist that way, MJPEG when only it gives them or when asked for.
@Suite struct V4L2NegotiationTests {
    /// A webcam as uvcvideo describes it: YUYV up to 1280x720, at 30 fps only up to 640x480;
    /// MJPEG at every size at 30 fps.
    struct Webcam {
        var offered: [FourCC] = [.yuyv, .mjpg]

        func sizes(_ fourcc: FourCC) -> [V4L2FrameSize] {
            let yuyv: [V4L2FrameSize] = [.discrete(width: 640, height: 480), .discrete(width: 1280, height: 720)]
            return fourcc == .yuyv ? yuyv : yuyv + [.discrete(width: 1920, height: 1080)]
        }

        func rates(_ fourcc: FourCC, width: Int) -> V4L2FrameRates {
            if fourcc == .yuyv, width > 640 { return .discrete([V4L2Fraction(1, 10), V4L2Fraction(1, 5)]) }
            return .discrete([V4L2Fraction(1, 30), V4L2Fraction(1, 15)])
        }

        func choose(width: Int, height: Int, fps: Double, wanted: FourCC? = nil) -> FourCC? {
            V4L2PixelFormats.choose(offered: offered, wanted: wanted) { fourcc in
                V4L2FormatMatch.of(
                    sizes: sizes(fourcc), rates: rates(fourcc, width: width), width: width, height: height,
                    framesPerSecond: fps)
            }
        }
    }

    @Test func mjpegIsUsableButNotPreferred() {
        #expect(V4L2PixelFormats.isUsable(.mjpg))
        #expect(V4L2PixelFormats.isUsable(.jpeg))
        #expect(V4L2PixelFormats.isUsable(.yuyv))
        #expect(!V4L2PixelFormats.isUsable(FourCC("NV21")!))
        #expect(!V4L2PixelFormats.preferred.contains(.mjpg))
        #expect(V4L2PixelFormats.compressed.allSatisfy { V4L2PixelFormats.pixelFormat(for: $0) == .mjpeg })
    }

    @Test func uncompressedWhenTheDeviceGivesTheSizeAndRateThatWay() {
        let cam = Webcam()
        #expect(cam.choose(width: 640, height: 480, fps: 30) == .yuyv)
        #expect(cam.choose(width: 1280, height: 720, fps: 10) == .yuyv)
        // Both formats offer 720p, only MJPEG at 30 fps.
        #expect(cam.choose(width: 1280, height: 720, fps: 30) == .mjpg)
        // Only MJPEG offers 1080p.
        #expect(cam.choose(width: 1920, height: 1080, fps: 30) == .mjpg)
        #expect(cam.choose(width: 1920, height: 1080, fps: 10) == .mjpg)
    }

    @Test func askedForByName() {
        let cam = Webcam()
        #expect(cam.choose(width: 640, height: 480, fps: 30, wanted: .mjpg) == .mjpg)
        #expect(cam.choose(width: 1920, height: 1080, fps: 30, wanted: .yuyv) == .yuyv, "the size error is the caller's to report")
    }

    @Test func noFormatFitsExactly() {
        let cam = Webcam()
        // 720p at 25: no format has that rate; YUYV has the size, so it is taken (the rate is warned about).
        #expect(cam.choose(width: 1280, height: 720, fps: 25) == .yuyv)
        // A size nothing offers: the first uncompressed format, whose size error names what it offers.
        #expect(cam.choose(width: 800, height: 600, fps: 30) == .yuyv)
        // Only MJPEG on offer.
        #expect(Webcam(offered: [.mjpg]).choose(width: 640, height: 480, fps: 30) == .mjpg)
        #expect(Webcam(offered: [FourCC("H264")!]).choose(width: 640, height: 480, fps: 30) == nil)
    }

    @Test func ratesMatchWithinOnePercent() {
        let discrete = V4L2FrameRates.discrete([V4L2Fraction(1001, 30000), V4L2Fraction(1, 15)])
        #expect(discrete.contains(29.97))
        #expect(discrete.contains(30))
        #expect(!discrete.contains(25))
        let range = V4L2FrameRates.range(shortest: V4L2Fraction(1, 60), longest: V4L2Fraction(1, 1))
        #expect(range.contains(25) && range.contains(60) && !range.contains(120))
        #expect(V4L2FrameRates.unknown.contains(30))
        // A driver that enumerates no sizes or rates fits anything.
        #expect(V4L2FormatMatch.of(sizes: [], rates: .unknown, width: 123, height: 45, framesPerSecond: 7) == .sizeAndRate)
        let vga: [V4L2FrameSize] = [.discrete(width: 640, height: 480)]
        #expect(V4L2FormatMatch.of(sizes: vga, rates: discrete, width: 320, height: 240, framesPerSecond: 30) == .none)
        #expect(V4L2FormatMatch.of(sizes: vga, rates: discrete, width: 640, height: 480, framesPerSecond: 25) == .size)
        #expect(V4L2FormatMatch.of(sizes: vga, rates: discrete, width: 640, height: 480, framesPerSecond: 15) == .sizeAndRate)
    }
}
