import BroadcastKit
@testable import BroadcastMedia
import Testing

/// Converting only the changed regions of a screen into the picture kept from the previous frame
/// must give, pixel for pixel, what converting every frame whole gives.
@Suite("Damage-aware conversion")
struct DamageConversionTests {
    /// A BGR0 screen with noise content (so that any chroma filter reaching outside a region shows).
    struct Screen {
        let width: Int
        let height: Int
        var pixels: [UInt32]
        var seed: UInt64

        init(width: Int, height: Int, seed: UInt64) {
            self.width = width
            self.height = height
            self.seed = seed
            pixels = Array(repeating: 0, count: width * height)
            paint(PixelRegion(x: 0, y: 0, width: width, height: height))
        }

        mutating func next() -> UInt32 {
            seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return UInt32(truncatingIfNeeded: seed >> 33)
        }

        /// Fills `region` with new noise; returns the region as a source would report it.
        @discardableResult
        mutating func paint(_ region: PixelRegion) -> PixelRegion {
            let clipped = region.clipped(width: width, height: height)!
            for y in clipped.y..<(clipped.y + clipped.height) {
                for x in clipped.x..<(clipped.x + clipped.width) { pixels[y * width + x] = next() & 0x00ff_ffff }
            }
            return clipped
        }

        /// Fills `region` with one colour.
        mutating func fill(_ region: PixelRegion, _ colour: UInt32) {
            let clipped = region.clipped(width: width, height: height)!
            for y in clipped.y..<(clipped.y + clipped.height) {
                for x in clipped.x..<(clipped.x + clipped.width) { pixels[y * width + x] = colour }
            }
        }

        func withBuffer<R>(index: Int, changed: [PixelRegion]?, _ body: (borrowing SampleBuffer) throws -> R) rethrows -> R {
            try pixels.withUnsafeBytes { bytes in
                let buffer = SampleBuffer(
                    format: .video(VideoFormat(pixelFormat: .bgr0, width: width, height: height)),
                    presentationTime: MediaTime(value: Int64(index), timescale: 30),
                    duration: MediaTime(value: 1, timescale: 30),
                    planes: [Plane(base: bytes.baseAddress!, count: bytes.count, bytesPerRow: width * 4)],
                    changedRegions: changed
                )
                return try body(buffer)
            }
        }
    }

    /// Feeds the same frames to a scaler told what changed and one that converts every frame,
    /// and compares the pictures after every frame.
    struct Comparison {
        let damaged: Scaler
        let whole: Scaler
        var frames = 0
        /// Frames the damage-aware scaler converted in part (less than the whole picture), and whole:
        /// a scaler that ignored the damage would still match pixel for pixel, but count no partials.
        var partialConversions = 0
        var wholeConversions = 0

        init(width: Int, height: Int) throws {
            let format = VideoFormat(pixelFormat: .bgr0, width: width, height: height)
            damaged = try Scaler(toYUV420P: format)
            whole = try Scaler(toYUV420P: format)
        }

        mutating func feed(_ screen: Screen, changed: [PixelRegion]?, sourceLocation: SourceLocation = #_sourceLocation) throws {
            let convertedBefore = damaged.convertedPixels
            try screen.withBuffer(index: frames, changed: changed) { buffer in
                try damaged.update(buffer, changed: buffer.changedRegions)
                try whole.update(buffer, changed: nil)
            }
            frames += 1
            if damaged.convertedPixels - convertedBefore < screen.width * screen.height {
                partialConversions += 1
            } else {
                wholeConversions += 1
            }
            let got = damaged.pictureBytes()
            let want = whole.pictureBytes()
            for plane in 0..<3 where got[plane] != want[plane] {
                let columns = plane == 0 ? screen.width : screen.width / 2
                let first = zip(got[plane], want[plane]).enumerated().first { $0.element.0 != $0.element.1 }!.offset
                Issue.record(
                    "frame \(frames - 1): plane \(plane) differs first at x \(first % columns) y \(first / columns) (\(got[plane][first]) vs \(want[plane][first])); changed \(changed.map { "\($0)" } ?? "nil")",
                    sourceLocation: sourceLocation)
                return
            }
        }
    }

    @Test("a small window changing: the whole picture stays exact over many frames, converting far less")
    func smallWindowChanges() throws {
        var screen = Screen(width: 640, height: 360, seed: 1)
        var comparison = try Comparison(width: 640, height: 360)
        try comparison.feed(screen, changed: nil)
        for frame in 0..<60 {
            if frame % 5 == 4 {
                try comparison.feed(screen, changed: [])  // a repeat
                continue
            }
            let changed = screen.paint(PixelRegion(x: 301, y: 157, width: 47, height: 33))
            try comparison.feed(screen, changed: [changed])
        }
        #expect(comparison.damaged.convertedPixels * 10 < comparison.whole.convertedPixels)
        #expect(comparison.wholeConversions == 1 && comparison.partialConversions == 60, "\(comparison.partialConversions) partial, \(comparison.wholeConversions) whole")
    }

    @Test("a window moved over a damaged area: old and new places are both reported")
    func windowMovesOverDamage() throws {
        var screen = Screen(width: 320, height: 240, seed: 2)
        var comparison = try Comparison(width: 320, height: 240)
        try comparison.feed(screen, changed: nil)
        var window = PixelRegion(x: 13, y: 7, width: 61, height: 45)
        var background = screen.pixels
        screen.fill(window, 0x00_20_80_ff)
        try comparison.feed(screen, changed: [window])
        for step in 0..<40 {
            // Damage under the window's path: a clock ticking behind it.
            let clock = screen.paint(PixelRegion(x: 60, y: 40, width: 37, height: 17))
            for y in clock.y..<(clock.y + clock.height) {
                for x in clock.x..<(clock.x + clock.width) { background[y * 320 + x] = screen.pixels[y * 320 + x] }
            }
            let old = window
            window.x += 3 + step % 3
            window.y += 1 + step % 2
            // Expose the old place (restore the background), draw the window at the new one.
            for y in old.y..<(old.y + old.height) {
                for x in old.x..<(old.x + old.width) { screen.pixels[y * 320 + x] = background[y * 320 + x] }
            }
            screen.fill(window, 0x00_20_80_ff)
            try comparison.feed(screen, changed: [old, window, clock])
        }
        #expect(comparison.wholeConversions == 1 && comparison.partialConversions == 41, "\(comparison.partialConversions) partial, \(comparison.wholeConversions) whole")
    }

    @Test("damage touching every edge and corner of the screen")
    func damageAtTheEdges() throws {
        let width = 200
        let height = 120
        var screen = Screen(width: width, height: height, seed: 3)
        var comparison = try Comparison(width: width, height: height)
        try comparison.feed(screen, changed: nil)
        let edges = [
            PixelRegion(x: 0, y: 0, width: 9, height: 5),
            PixelRegion(x: width - 7, y: 0, width: 7, height: 3),
            PixelRegion(x: 0, y: height - 1, width: width, height: 1),
            PixelRegion(x: width - 1, y: 0, width: 1, height: height),
            PixelRegion(x: width - 11, y: height - 9, width: 11, height: 9),
            PixelRegion(x: 0, y: 50, width: 3, height: 21),
        ]
        for region in edges {
            let changed = screen.paint(region)
            try comparison.feed(screen, changed: [changed])
        }
        // Regions reported partly outside the frame are clipped.
        let beyond = PixelRegion(x: width - 5, y: height - 5, width: 40, height: 40)
        screen.paint(beyond)
        try comparison.feed(screen, changed: [beyond, PixelRegion(x: -10, y: -10, width: 13, height: 12)])
        screen.paint(PixelRegion(x: 0, y: 0, width: 3, height: 2))
        try comparison.feed(screen, changed: [PixelRegion(x: -10, y: -10, width: 13, height: 12)])
        #expect(comparison.wholeConversions == 1 && comparison.partialConversions == 8, "\(comparison.partialConversions) partial, \(comparison.wholeConversions) whole")
    }

    @Test("odd offsets and sizes against the 4:2:0 chroma grid", arguments: [(1, 1), (1, 0), (0, 1), (3, 5), (15, 17), (17, 15)])
    func oddOffsets(dx: Int, dy: Int) throws {
        var screen = Screen(width: 256, height: 144, seed: UInt64(10 + dx * 7 + dy))
        var comparison = try Comparison(width: 256, height: 144)
        try comparison.feed(screen, changed: nil)
        for width in [1, 2, 3, 5, 16, 17] {
            for height in [1, 2, 3, 7] {
                let region = PixelRegion(x: 31 + dx + width, y: 21 + dy + height, width: width, height: height)
                screen.paint(region)
                try comparison.feed(screen, changed: [region])
            }
        }
        #expect(comparison.wholeConversions == 1 && comparison.partialConversions == 24, "\(comparison.partialConversions) partial, \(comparison.wholeConversions) whole")
    }

    @Test("a frame the scaler did not see makes the next conversion whole")
    func forgottenPicture() throws {
        var screen = Screen(width: 160, height: 120, seed: 4)
        var comparison = try Comparison(width: 160, height: 120)
        try comparison.feed(screen, changed: nil)
        screen.paint(PixelRegion(x: 10, y: 10, width: 20, height: 20))  // in a frame that is dropped
        comparison.damaged.forgetPicture()
        let changed = screen.paint(PixelRegion(x: 80, y: 60, width: 10, height: 10))
        try comparison.feed(screen, changed: [changed])
        #expect(comparison.wholeConversions == 2 && comparison.partialConversions == 0, "after forgetting, converted whole: \(comparison.partialConversions) partial, \(comparison.wholeConversions) whole")
    }
}
