import Atomics
import BroadcastKit
@testable import BroadcastComposition
@testable import BroadcastMedia
import Foundation
import Logging
import Testing

/// The compositor redraws what changed and nothing else (issue 26 item 3), and what it draws is
/// the same as a whole redraw.
@Suite("Composition costs what changed")
struct CompositorTests {
    static let width = 320
    static let height = 192

    /// A BGR0 picture of one colour, as a captured buffer (the memory lives as long as `pixels`).
    final class Picture {
        var pixels: [UInt32]
        let width: Int
        let height: Int
        init(width: Int, height: Int, colour: UInt32) {
            self.width = width
            self.height = height
            pixels = Array(repeating: colour, count: width * height)
        }
        func fill(_ region: PixelRegion, _ colour: UInt32) {
            for y in region.y..<(region.y + region.height) {
                for x in region.x..<(region.x + region.width) { pixels[y * width + x] = colour }
            }
        }
        func captured(changed: [PixelRegion]?) -> CapturedBuffer {
            pixels.withUnsafeBytes { bytes in
                CapturedBuffer(
                    format: .video(VideoFormat(pixelFormat: .bgr0, width: width, height: height)), captureTime: 0,
                    duration: MediaTime(value: 1, timescale: 30),
                    planes: [Plane(base: bytes.baseAddress!, count: bytes.count, bytesPerRow: width * 4)],
                    changedRegions: changed)
            }
        }
    }

    static func placement(x: Int, y: Int, width: Int, height: Int) -> LayerPlacement {
        var placement = LayerPlacement()
        placement.x = .pixels(x)
        placement.y = .pixels(y)
        placement.width = .pixels(width)
        placement.height = .pixels(height)
        return placement
    }

    /// The composite's luma plane, rows without padding.
    static func luma(_ compositor: Compositor) -> [UInt8] {
        let luma = UnsafeMutableRawPointer.allocate(byteCount: width * height * 3 / 2, alignment: 64)
        defer { luma.deallocate() }
        let planes = [
            Plane(base: luma, count: width * height, bytesPerRow: width),
            Plane(base: luma + width * height, count: width * height / 4, bytesPerRow: width / 2),
            Plane(base: luma + width * height * 5 / 4, count: width * height / 4, bytesPerRow: width / 2),
        ]
        compositor.copyComposite(into: planes)
        return Array(UnsafeBufferPointer(start: luma.assumingMemoryBound(to: UInt8.self), count: width * height))
    }

    @Test func aStaticScreenUnderAMovingLayerRedrawsOnlyTheLayersBox() throws {
        let screen = Picture(width: Self.width, height: Self.height, colour: 0x0000_00ff)  // blue
        let layer = Picture(width: 64, height: 48, colour: 0x00ff_0000)  // red
        let box = Self.placement(x: 200, y: 100, width: 64, height: 48)
        let compositor = try Compositor(width: Self.width, height: Self.height, colour: .bt601, placements: [box])
        try screen.pixels.withUnsafeBytes { _ in
            try compositor.updateBase(screen.captured(changed: nil))
        }
        try compositor.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
        #expect(try compositor.compose() == nil, "the first composite is drawn whole")
        let whole = compositor.composedPixels
        #expect(whole >= Self.width * Self.height)

        // The screen repeats, the layer has a new picture: only its box is drawn again.
        for frame in 1...10 {
            try compositor.updateBase(screen.captured(changed: []))
            layer.fill(PixelRegion(x: 0, y: 0, width: 64, height: 48), frame % 2 == 0 ? 0x00ff_0000 : 0x0000_ff00)
            try compositor.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
            let before = compositor.composedPixels
            let redrawn = try compositor.compose()
            #expect(redrawn == [PixelRegion(x: 200, y: 100, width: 64, height: 48)], "frame \(frame): \(String(describing: redrawn))")
            // The base under the box, and the layer over it: twice the box, never the frame.
            #expect(compositor.composedPixels - before == 2 * 64 * 48, "frame \(frame)")
        }
        // Nothing new at all (no layer picture, or one that says it repeats): nothing converted or drawn.
        let conversions = compositor.layerConversions
        try compositor.updateBase(screen.captured(changed: []))
        try compositor.updateLayer(0, with: nil, show: .picture)
        let before = compositor.composedPixels
        #expect(try compositor.compose() == [], "a static frame is the last composite again")
        try compositor.updateBase(screen.captured(changed: []))
        try compositor.updateLayer(0, with: layer.captured(changed: []), show: .picture)
        #expect(try compositor.compose() == [], "a repeated layer picture changes nothing")
        #expect(compositor.composedPixels == before)
        #expect(compositor.layerConversions == conversions)

        // What the partial redraws made is what a whole redraw makes.
        let partial = Self.luma(compositor)
        let fresh = try Compositor(width: Self.width, height: Self.height, colour: .bt601, placements: [box])
        try fresh.updateBase(screen.captured(changed: nil))
        try fresh.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
        _ = try fresh.compose()
        #expect(partial == Self.luma(fresh))
        // Inside the box the layer, outside it the screen.
        #expect(partial[120 * Self.width + 230] == Self.luma(fresh)[120 * Self.width + 230])
        #expect(partial[120 * Self.width + 230] != partial[10 * Self.width + 10])
    }

    @Test func aChangedScreenRegionRedrawsThatRegionWithTheLayerOverIt() throws {
        let screen = Picture(width: Self.width, height: Self.height, colour: 0x0000_00ff)
        let layer = Picture(width: 64, height: 48, colour: 0x00ff_0000)
        let box = Self.placement(x: 200, y: 100, width: 64, height: 48)
        let compositor = try Compositor(width: Self.width, height: Self.height, colour: .bt601, placements: [box])
        try compositor.updateBase(screen.captured(changed: nil))
        try compositor.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
        _ = try compositor.compose()
        // The screen changes under the layer's corner; the layer does not.
        let changed = PixelRegion(x: 180, y: 80, width: 40, height: 40)
        screen.fill(changed, 0x0000_ff00)
        try compositor.updateBase(screen.captured(changed: [changed]))
        try compositor.updateLayer(0, with: nil, show: .picture)
        let before = compositor.composedPixels
        let redrawn = try #require(try compositor.compose())
        #expect(redrawn.count == 1)
        #expect(compositor.composedPixels - before < Self.width * Self.height / 4, "only around the change")
        let fresh = try Compositor(width: Self.width, height: Self.height, colour: .bt601, placements: [box])
        try fresh.updateBase(screen.captured(changed: nil))
        try fresh.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
        _ = try fresh.compose()
        #expect(Self.luma(compositor) == Self.luma(fresh), "the layer stays over the changed screen")
    }

    /// Y, U, V of the composite at a pixel.
    static func yuv(_ compositor: Compositor, x: Int, y: Int) -> [Int] {
        let bytes = UnsafeMutableRawPointer.allocate(byteCount: width * height * 3 / 2, alignment: 64)
        defer { bytes.deallocate() }
        let planes = [
            Plane(base: bytes, count: width * height, bytesPerRow: width),
            Plane(base: bytes + width * height, count: width * height / 4, bytesPerRow: width / 2),
            Plane(base: bytes + width * height * 5 / 4, count: width * height / 4, bytesPerRow: width / 2),
        ]
        compositor.copyComposite(into: planes)
        let b = bytes.assumingMemoryBound(to: UInt8.self)
        return [Int(b[y * width + x]), Int(b[width * height + (y / 2) * (width / 2) + x / 2]),
                Int(b[width * height * 5 / 4 + (y / 2) * (width / 2) + x / 2])]
    }

    /// A webcam's MJPEG (full-range BT.601 JPEG, decoded by libavcodec) drawn into a BT.709
    /// composite: converted through RGB into the output's matrix and range, so its red is BT.709's
    /// red (Y 63, U 102, V 240), not BT.601's values relabelled (Y 81, U 90).
    @Test func anMJPEGLayerIsConvertedIntoTheOutputsColour() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let jpeg = try MJPEGTests.jpeg(MJPEGTests.redBlue(width: 128, height: 72), pixelFormat: "yuvj422p", in: directory)
        let screen = Picture(width: Self.width, height: Self.height, colour: 0x0080_8080)
        let compositor = try Compositor(
            width: Self.width, height: Self.height, colour: .bt709, placements: [Self.placement(x: 0, y: 0, width: 128, height: 72)])
        try compositor.updateBase(screen.captured(changed: nil))
        try jpeg.withUnsafeBytes { raw in
            let buffer = CapturedBuffer(
                format: .video(VideoFormat(pixelFormat: .mjpeg, width: 128, height: 72, colour: .jpeg)), captureTime: 0,
                duration: MediaTime(value: 1, timescale: 30), planes: [Plane(base: raw.baseAddress!, count: raw.count, bytesPerRow: raw.count)])
            try compositor.updateLayer(0, with: buffer, show: .picture)
        }
        _ = try compositor.compose()
        let red = Self.yuv(compositor, x: 30, y: 36)
        let blue = Self.yuv(compositor, x: 100, y: 36)
        #expect(abs(red[0] - 63) <= 4 && abs(red[1] - 102) <= 5 && abs(red[2] - 240) <= 5, "red in BT.709: \(red)")
        // Blue in BT.709 limited range: Y 32, U 240, V 118.
        #expect(abs(blue[0] - 32) <= 4 && abs(blue[1] - 240) <= 5 && abs(blue[2] - 118) <= 5, "blue in BT.709: \(blue)")
        #expect(compositor.layerConversions == 1)
    }

    @Test func aLostLayerHidesOrShowsItsSlateAndTheScreenComesBackUnderIt() throws {
        let screen = Picture(width: Self.width, height: Self.height, colour: 0x0000_00ff)
        let layer = Picture(width: 64, height: 48, colour: 0x00ff_0000)
        var slate = Self.placement(x: 0, y: 0, width: 64, height: 48)
        slate.onLoss = .slate
        let compositor = try Compositor(
            width: Self.width, height: Self.height, colour: .bt601,
            placements: [Self.placement(x: 200, y: 100, width: 64, height: 48), slate])
        try compositor.updateBase(screen.captured(changed: nil))
        try compositor.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
        try compositor.updateLayer(1, with: layer.captured(changed: nil), show: .picture)
        _ = try compositor.compose()
        let shown = Self.luma(compositor)
        try compositor.updateBase(screen.captured(changed: []))
        try compositor.updateLayer(0, with: nil, show: .hidden)
        try compositor.updateLayer(1, with: nil, show: .slate)
        #expect(try compositor.compose()?.count == 2)
        let lost = Self.luma(compositor)
        #expect(lost[120 * Self.width + 230] == lost[10 * Self.width + 300], "hidden: the screen shows")
        #expect(lost[20 * Self.width + 20] == 40, "the slate")
        try compositor.updateBase(screen.captured(changed: []))
        try compositor.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
        try compositor.updateLayer(1, with: layer.captured(changed: nil), show: .picture)
        _ = try compositor.compose()
        #expect(Self.luma(compositor) == shown, "back")
    }

    /// A frame's luma plane (rows without padding: the pool's frames have none).
    static func luma(_ frame: CompositeFrame) -> [UInt8] {
        Array(UnsafeRawBufferPointer(start: frame.planes[0].base, count: width * height))
    }

    /// issue 35 item 6: a composite the pool had no frame for is not lost: the next frame handed on
    /// holds it (and says everything changed), even when nothing changed since.
    @Test func aCompositeDroppedForWantOfAFrameIsInTheNextOne() throws {
        let screen = Picture(width: Self.width, height: Self.height, colour: 0x0000_00ff)
        let layer = Picture(width: 64, height: 48, colour: 0x00ff_0000)
        let compositor = try Compositor(
            width: Self.width, height: Self.height, colour: .bt601, placements: [Self.placement(x: 200, y: 100, width: 64, height: 48)])
        let output = CompositeOutput(compositor: compositor, pool: CompositeFramePool(count: 2, width: Self.width, height: Self.height))
        defer { output.stop() }
        func frame(layerColour: UInt32?) throws -> Compositor.Redraw {
            try compositor.updateBase(screen.captured(changed: []))
            if let layerColour {
                layer.fill(PixelRegion(x: 0, y: 0, width: 64, height: 48), layerColour)
                try compositor.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
            } else {
                try compositor.updateLayer(0, with: nil, show: .picture)
            }
            return try compositor.redraw()
        }
        // Red, then green: two frames, both held by the receiver (as a slow encoder holds them).
        try compositor.updateBase(screen.captured(changed: nil))
        try compositor.updateLayer(0, with: layer.captured(changed: nil), show: .picture)
        let first = try #require(output.next(after: try compositor.redraw(), wait: false, shouldStop: { false }))
        let second = try #require(output.next(after: try frame(layerColour: 0x0000_ff00), wait: false, shouldStop: { false }))
        // Red again: no frame free, dropped.
        #expect(output.next(after: try frame(layerColour: 0x00ff_0000), wait: false, shouldStop: { false }) == nil)
        let red = Self.luma(compositor)
        first.frame.release()
        second.frame.release()
        // Nothing new after that: the frame handed on is the red composite, whole.
        let after = try #require(output.next(after: try frame(layerColour: nil), wait: false, shouldStop: { false }))
        defer { after.frame.release() }
        let differing = zip(Self.luma(after.frame), red).filter { $0 != $1 }.count
        #expect(differing == 0, "the dropped composite's change is in the next frame: \(differing) luma bytes differ")
        #expect(after.changed == nil, "and it says everything changed: \(String(describing: after.changed))")
    }

    /// A yuv420p picture (rows without padding) as a captured buffer of three planes.
    static func yuv420p(_ bytes: UnsafeRawBufferPointer, width: Int, height: Int, changed: [PixelRegion]? = nil) -> CapturedBuffer {
        let luma = width * height
        return CapturedBuffer(
            format: .video(VideoFormat(pixelFormat: .yuv420p, width: width, height: height)), captureTime: 0,
            duration: MediaTime(value: 1, timescale: 30),
            planes: [
                Plane(base: bytes.baseAddress!, count: luma, bytesPerRow: width),
                Plane(base: bytes.baseAddress! + luma, count: luma / 4, bytesPerRow: width / 2),
                Plane(base: bytes.baseAddress! + luma * 5 / 4, count: luma / 4, bytesPerRow: width / 2),
            ],
            changedRegions: changed)
    }

    /// One frame of an ffmpeg source filter as raw yuv420p.
    static func rawFrame(_ filter: String, in directory: TemporaryDirectory, _ name: String) throws -> [UInt8] {
        let path = directory.file(name)
        let result = try run([
            "ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", filter, "-frames:v", "1", "-pix_fmt", "yuv420p",
            "-f", "rawvideo", path,
        ])
        guard result.status == 0 else { throw ProbeError(message: "ffmpeg could not make \(name): \(result.standardError)") }
        return [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    /// The two tests' pictures, raw yuv420p (a testsrc2 base of the test's size, a 64x48 testsrc
    /// layer), and ffmpeg's composite of them through `filter` (inputs [0] the base, [1] the layer).
    static func composedByFfmpeg(
        _ filter: String, in directory: TemporaryDirectory
    ) throws -> (base: [UInt8], layer: [UInt8], overlay: [UInt8]) {
        let base = try rawFrame("testsrc2=size=\(width)x\(height):rate=1", in: directory, "base.raw")
        let layer = try rawFrame("testsrc=size=64x48:rate=1", in: directory, "layer.raw")
        let result = try run([
            "ffmpeg", "-nostdin", "-v", "error", "-y",
            "-f", "rawvideo", "-pix_fmt", "yuv420p", "-s", "\(width)x\(height)", "-i", directory.file("base.raw"),
            "-f", "rawvideo", "-pix_fmt", "yuv420p", "-s", "64x48", "-i", directory.file("layer.raw"),
            "-filter_complex", filter, "-frames:v", "1", "-pix_fmt", "yuv420p", "-f", "rawvideo", directory.file("overlay.raw"),
        ])
        guard result.status == 0 else { throw ProbeError(message: "ffmpeg \(filter): \(result.standardError)") }
        return (base, layer, [UInt8](try Data(contentsOf: URL(fileURLWithPath: directory.file("overlay.raw")))))
    }

    /// issue 35 item 8: a box partly outside the frame is cut at the frame's edge, as ffmpeg's
    /// overlay does, not squeezed into the part inside it. Base and layer are yuv420p (no
    /// conversion on either side), so the composite must be ffmpeg's overlay byte for byte.
    @Test(arguments: [(288, 160), (300, 20), (10, 170), (318, 190)])
    func aBoxPartlyOutsideTheFrameIsCutAsFfmpegsOverlayCutsIt(x: Int, y: Int) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (base, layer, overlay) = try Self.composedByFfmpeg("[0][1]overlay=\(x):\(y):format=yuv420", in: directory)

        var placement = Self.placement(x: x, y: y, width: 64, height: 48)
        placement.fill = true
        let (compositor, composite, differing) = try Self.compose(base, layer, placement, against: overlay)
        #expect(differing == 0, "box at \(x),\(y): \(differing) of \(overlay.count) bytes differ from ffmpeg's overlay")

        // The layer's next picture redraws its visible part only, and stays the same.
        try base.withUnsafeBytes { try compositor.updateBase(Self.yuv420p($0, width: Self.width, height: Self.height, changed: [])) }
        try layer.withUnsafeBytes { try compositor.updateLayer(0, with: Self.yuv420p($0, width: 64, height: 48), show: .picture) }
        let redrawn = try #require(try compositor.compose())
        #expect(redrawn.allSatisfy { $0.x >= 0 && $0.y >= 0 && $0.x + $0.width <= Self.width && $0.y + $0.height <= Self.height }, "\(redrawn)")
        #expect(Self.planes(compositor) == composite)
    }

    /// issue 37 item 9: a layer at `opacity` is blended over what is under it as ffmpeg's overlay
    /// blends a picture whose alpha is that constant (yuva420p, `lut=...:a=ALPHA`; `val` for the
    /// others, whose default clips them to the video range): byte for byte, on
    /// every plane; and redrawing its box again (the base repeats, the layer has a new picture)
    /// blends over the base again, not over the last blend.
    @Test(arguments: [0.25, 0.5, 0.9])
    func aLayerAtAnOpacityIsBlendedAsFfmpegsOverlayBlendsItsAlpha(opacity: Double) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var placement = Self.placement(x: 100, y: 60, width: 64, height: 48)
        placement.fill = true
        placement.opacity = opacity
        let (base, layer, overlay) = try Self.composedByFfmpeg(
            "[1]format=yuva420p,lut=y=val:u=val:v=val:a=\(placement.alpha)[l];[0][l]overlay=100:60:format=yuv420", in: directory)

        let (compositor, composite, differing) = try Self.compose(base, layer, placement, against: overlay)
        #expect(differing == 0, "opacity \(opacity): \(differing) of \(overlay.count) bytes differ from ffmpeg's overlay")
        // Neither the base nor the layer alone: the box holds a blend of the two.
        let inBox = 80 * Self.width + 120
        #expect(composite[inBox] != base[inBox] && composite[inBox] != layer[20 * 64 + 20])

        // The same layer picture again, over a repeated base: the box is redrawn, and is the same.
        for _ in 0..<3 {
            try base.withUnsafeBytes { try compositor.updateBase(Self.yuv420p($0, width: Self.width, height: Self.height, changed: [])) }
            try layer.withUnsafeBytes { try compositor.updateLayer(0, with: Self.yuv420p($0, width: 64, height: 48), show: .picture) }
            #expect(try compositor.compose() == [PixelRegion(x: 100, y: 60, width: 64, height: 48)])
            #expect(Self.planes(compositor) == composite, "a redraw blends over the base, not over the last blend")
        }
    }

    /// `layer` (64x48) placed by `placement` over `base` through a new Compositor: it, the
    /// composite's planes, and how many of their bytes differ from `overlay` (ffmpeg's).
    static func compose(
        _ base: [UInt8], _ layer: [UInt8], _ placement: LayerPlacement, against overlay: [UInt8]
    ) throws -> (Compositor, [UInt8], Int) {
        let compositor = try Compositor(width: width, height: height, colour: .bt601, placements: [placement])
        try base.withUnsafeBytes { try compositor.updateBase(yuv420p($0, width: width, height: height)) }
        try layer.withUnsafeBytes { try compositor.updateLayer(0, with: yuv420p($0, width: 64, height: 48), show: .picture) }
        _ = try compositor.compose()
        let composite = planes(compositor)
        #expect(composite.count == overlay.count)
        return (compositor, composite, zip(composite, overlay).filter { $0 != $1 }.count)
    }

    /// The composite's three planes, rows without padding.
    static func planes(_ compositor: Compositor) -> [UInt8] {
        let bytes = UnsafeMutableRawPointer.allocate(byteCount: width * height * 3 / 2, alignment: 64)
        defer { bytes.deallocate() }
        compositor.copyComposite(into: [
            Plane(base: bytes, count: width * height, bytesPerRow: width),
            Plane(base: bytes + width * height, count: width * height / 4, bytesPerRow: width / 2),
            Plane(base: bytes + width * height * 5 / 4, count: width * height / 4, bytesPerRow: width / 2),
        ])
        return Array(UnsafeBufferPointer(start: bytes.assumingMemoryBound(to: UInt8.self), count: width * height * 3 / 2))
    }
}

/// A composite in a real session: a layer whose source fails while the base goes on.
@Suite("Layered source in a session")
struct LayeredSessionTests {
    /// What the test's sources and handler tell each other (atomics: they run on three threads).
    final class Steps: Sendable {
        /// The layer handed over its first frame.
        let layerStarted = ManagedAtomic(false)
        /// The layer failed (after `sink.fail` returned).
        let layerFailed = ManagedAtomic(false)
        /// Frames the handler saw with the layer in them.
        let layerSeen = ManagedAtomic(0)
    }

    /// A BGR0 source of one colour, as fast as it is taken. The base (`fails` false) waits for the
    /// layer's first frame before its own, and for the layer's failure before its frame 40; the layer
    /// fails once the handler saw it 3 times. So the layer is shown, then fails, then the base goes
    /// on, in that order, whatever the threads' timing.
    final class SolidSource: CaptureSource, @unchecked Sendable {
        let name: String
        let isRealtime = false
        let frames: Int
        let width: Int
        let height: Int
        let fails: Bool
        let steps: Steps
        private var thread: OSThread?
        private let pixels: UnsafeMutableRawPointer
        init(name: String, width: Int, height: Int, colour: UInt32, frames: Int, fails: Bool, steps: Steps) {
            (self.name, self.width, self.height, self.frames, self.fails, self.steps) = (name, width, height, frames, fails, steps)
            pixels = .allocate(byteCount: width * height * 4, alignment: 64)
            pixels.bindMemory(to: UInt32.self, capacity: width * height).update(repeating: colour, count: width * height)
        }
        deinit { pixels.deallocate() }
        func start(into sink: SourceSink) throws {
            let (frames, width, height, fails, steps) = (self.frames, self.width, self.height, self.fails, self.steps)
            let plane = Plane(base: pixels, count: width * height * 4, bytesPerRow: width * 4)
            @Sendable func wait(_ condition: () -> Bool) { while !condition() && !sink.isStopping { usleep(500) } }
            thread = OSThread(name: "bc-test-solid") {
                if !fails { wait { steps.layerStarted.load(ordering: .acquiring) } }
                for index in 0..<frames {
                    if !fails && index == 40 { wait { steps.layerFailed.load(ordering: .acquiring) } }
                    let buffer = CapturedBuffer(
                        format: .video(VideoFormat(pixelFormat: .bgr0, width: width, height: height)),
                        captureTime: sink.startTime + Int64(index) * 33_333_333, duration: MediaTime(value: 1, timescale: 30),
                        planes: [plane])
                    if !sink.push(buffer) { return }
                    if fails { steps.layerStarted.store(true, ordering: .releasing) }
                }
                guard fails else { return sink.endOfStream() }
                wait { steps.layerSeen.load(ordering: .acquiring) >= 3 }
                sink.fail(BroadcastError(.sourceFailed, "the test layer is gone"))
                steps.layerFailed.store(true, ordering: .releasing)
            }
        }
        func stop() {
            thread?.join()
            thread = nil
        }
    }

    /// Records the luma at one point of every video frame.
    final class LumaProbe: BroadcastSampleHandler {
        var lumas: [UInt8] = []
        let x: Int, y: Int
        let steps: Steps
        init(x: Int, y: Int, steps: Steps) { (self.x, self.y, self.steps) = (x, y, steps) }
        func broadcastStarted(setupInfo: SetupInfo) throws {}
        func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
            guard type == .video else { return }
            let (x, y) = (self.x, self.y)
            let luma = buffer.withPlane(0) { bytes, bytesPerRow in bytes.unsafeLoad(fromByteOffset: y * bytesPerRow + x, as: UInt8.self) }
            lumas.append(luma)
            if abs(Int(luma) - 145) <= 3 { steps.layerSeen.wrappingIncrement(ordering: .releasing) }
        }
        func broadcastFinished() {}
    }

    @Test func aLayerThatFailsIsHiddenAndTheBaseGoesOn() throws {
        // A red screen of 60 frames; a green layer that gives 5 frames and fails.
        let steps = Steps()
        let base = SolidSource(name: "screen", width: 160, height: 96, colour: 0x00ff_0000, frames: 60, fails: false, steps: steps)
        let layer = SolidSource(name: "camera", width: 32, height: 32, colour: 0x0000_ff00, frames: 5, fails: true, steps: steps)
        var placement = LayerPlacement()
        (placement.x, placement.y, placement.width, placement.height) = (.pixels(100), .pixels(40), .pixels(32), .pixels(32))
        let composite = LayeredVideoSource(
            base: base, inputs: [layer], scenes: [.init(name: "default", layers: [.init(input: 0, placement: placement)])],
            width: 160, height: 96, colour: nil, logger: Logger(label: "test"))
        let probe = LumaProbe(x: 116, y: 56, steps: steps)
        let session = BroadcastSession(handler: probe, sources: [(.video, composite)])
        let summary = try session.run(setupInfo: [:])
        #expect(summary.reason == .sourcesEnded, "\(summary.reason)")
        #expect(probe.lumas.count == 60, "every base frame: \(probe.lumas.count)")
        // Green (BT.601 limited: Y 145) while the layer shows; the red screen (Y 81) once it failed.
        #expect(probe.lumas.prefix(3).allSatisfy { abs(Int($0) - 145) <= 3 }, "the layer was shown: \(probe.lumas)")
        #expect(probe.lumas.suffix(20).allSatisfy { abs(Int($0) - 81) <= 3 }, "hidden after it failed: \(probe.lumas.suffix(20))")
    }
}

extension LayeredSessionTests {
    /// issue 35 item 22: a failed layer with `on_loss=slate` shows its slate, and the line that
    /// says it failed says so (it said "hidden from now on").
    @Test func aFailedLayerWithASlateSaysItShowsTheSlate() throws {
        let steps = Steps()
        let base = SolidSource(name: "screen", width: 160, height: 96, colour: 0x00ff_0000, frames: 60, fails: false, steps: steps)
        let layer = SolidSource(name: "camera", width: 32, height: 32, colour: 0x0000_ff00, frames: 5, fails: true, steps: steps)
        var placement = LayerPlacement()
        (placement.x, placement.y, placement.width, placement.height) = (.pixels(100), .pixels(40), .pixels(32), .pixels(32))
        placement.onLoss = .slate
        let recorded = RecordedLog()
        let composite = LayeredVideoSource(
            base: base, inputs: [layer], scenes: [.init(name: "default", layers: [.init(input: 0, placement: placement)])],
            width: 160, height: 96, colour: nil, logger: Logger(label: "test") { _ in RecordingLogHandler(log: recorded) })
        let probe = LumaProbe(x: 116, y: 56, steps: steps)
        let summary = try BroadcastSession(handler: probe, sources: [(.video, composite)]).run(setupInfo: [:])
        #expect(summary.reason == .sourcesEnded, "\(summary.reason)")
        #expect(probe.lumas.suffix(20).allSatisfy { $0 == 40 }, "the slate after it failed: \(probe.lumas.suffix(20))")
        let lines = recorded.records.map(\.1).filter { $0.contains("camera") }
        #expect(lines.count == 1 && lines[0].contains("failed, shown as a slate from now on"), "\(lines)")
    }
}

/// issue 35 item 5: a crop of a packed picture (a camera's YUYV/UYVY, a screen's BGR0, RGB24)
/// takes the columns and rows asked for, up to the picture's right and bottom edges and not past
/// them. Each is judged against ffmpeg's crop of the same frame, drawn through the same conversion:
/// the cropped layer's composite must equal, byte for byte, the composite of ffmpeg's crop drawn
/// uncropped.
@Suite("A crop takes the part asked for")
struct CompositorCropTests {
    static let sourceWidth = 320
    static let sourceHeight = 240

    static let packedFormats: [PixelFormat] = [.yuyv422, .uyvy422, .rgb24, .bgr24, .bgra, .bgr0]

    /// Bytes of one pixel of a packed format.
    static func bytesPerPixel(_ format: PixelFormat) -> Int {
        switch format {
        case .yuyv422, .uyvy422: 2
        case .rgb24, .bgr24: 3
        default: 4
        }
    }

    /// ffmpeg's testsrc frame in `format`, raw, `width` x `height`.
    static func testFrame(_ format: PixelFormat, in directory: TemporaryDirectory) throws -> [UInt8] {
        let path = directory.file("full-\(format.rawValue).raw")
        let result = try run([
            "ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=\(sourceWidth)x\(sourceHeight):rate=1",
            "-frames:v", "1", "-pix_fmt", format.rawValue, "-f", "rawvideo", path,
        ])
        guard result.status == 0 else { throw ProbeError(message: "ffmpeg could not make a \(format) frame: \(result.standardError)") }
        return [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    /// ffmpeg's `crop` of the raw frame at `path`, in the same format.
    static func ffmpegCrop(_ format: PixelFormat, _ crop: PixelRegion, in directory: TemporaryDirectory) throws -> [UInt8] {
        let path = directory.file("crop-\(format.rawValue)-\(crop.description).raw")
        let result = try run([
            "ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", format.rawValue,
            "-s", "\(sourceWidth)x\(sourceHeight)", "-i", directory.file("full-\(format.rawValue).raw"),
            "-vf", "crop=\(crop.width):\(crop.height):\(crop.x):\(crop.y)", "-pix_fmt", format.rawValue, "-f", "rawvideo", path,
        ])
        guard result.status == 0 else { throw ProbeError(message: "ffmpeg could not crop: \(result.standardError)") }
        return [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    /// The composite (all three planes, rows without padding) of a grey base with `picture`
    /// (`width` x `height` in `format`) drawn at the origin, cropped by `crop`, filling a box
    /// of the crop's size (no scaling).
    static func composite(
        _ picture: [UInt8], _ format: PixelFormat, width: Int, height: Int, crop: PixelRegion?, box: PixelRegion
    ) throws -> [UInt8] {
        let (frameWidth, frameHeight) = (96, 64)
        var placement = CompositorTests.placement(x: 0, y: 0, width: box.width, height: box.height)
        placement.fill = true
        placement.crop = crop
        let compositor = try Compositor(width: frameWidth, height: frameHeight, colour: .bt601, placements: [placement])
        let base = [UInt32](repeating: 0x0080_8080, count: frameWidth * frameHeight)
        try base.withUnsafeBytes { bytes in
            try compositor.updateBase(
                CapturedBuffer(
                    format: .video(VideoFormat(pixelFormat: .bgr0, width: frameWidth, height: frameHeight)), captureTime: 0,
                    duration: MediaTime(value: 1, timescale: 30),
                    planes: [Plane(base: bytes.baseAddress!, count: bytes.count, bytesPerRow: frameWidth * 4)]))
        }
        // The picture's own memory, exactly its size: a read past it is a read past the frame.
        let memory = UnsafeMutableRawBufferPointer.allocate(byteCount: picture.count, alignment: 64)
        defer { memory.deallocate() }
        memory.copyMemory(from: UnsafeRawBufferPointer(start: picture, count: picture.count))
        try compositor.updateLayer(
            0,
            with: CapturedBuffer(
                format: .video(VideoFormat(pixelFormat: format, width: width, height: height)), captureTime: 0,
                duration: MediaTime(value: 1, timescale: 30),
                planes: [Plane(base: memory.baseAddress!, count: memory.count, bytesPerRow: width * bytesPerPixel(format))]),
            show: .picture)
        _ = try compositor.compose()
        let out = UnsafeMutableRawPointer.allocate(byteCount: frameWidth * frameHeight * 3 / 2, alignment: 64)
        defer { out.deallocate() }
        let luma = frameWidth * frameHeight
        compositor.copyComposite(into: [
            Plane(base: out, count: luma, bytesPerRow: frameWidth),
            Plane(base: out + luma, count: luma / 4, bytesPerRow: frameWidth / 2),
            Plane(base: out + luma * 5 / 4, count: luma / 4, bytesPerRow: frameWidth / 2),
        ])
        return Array(UnsafeBufferPointer(start: out.assumingMemoryBound(to: UInt8.self), count: luma * 3 / 2))
    }

    @Test(arguments: packedFormats)
    func aCropOfAPackedPictureIsFfmpegsCrop(format: PixelFormat) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let full = try Self.testFrame(format, in: directory)
        #expect(full.count == Self.sourceWidth * Self.sourceHeight * Self.bytesPerPixel(format))
        let crops = [
            PixelRegion(x: 256, y: 192, width: 64, height: 48),  // the bottom-right corner
            PixelRegion(x: 318, y: 238, width: 2, height: 2),  // its last pixels
            PixelRegion(x: 240, y: 0, width: 80, height: 40),  // the right edge, the top
            PixelRegion(x: 0, y: 200, width: 90, height: 40),  // the bottom edge, the left
            PixelRegion(x: 200, y: 100, width: 60, height: 30),  // inside
        ]
        for crop in crops {
            let reference = try Self.ffmpegCrop(format, crop, in: directory)
            let expected = try Self.composite(
                reference, format, width: crop.width, height: crop.height, crop: nil,
                box: PixelRegion(x: 0, y: 0, width: crop.width, height: crop.height))
            let cropped = try Self.composite(
                full, format, width: Self.sourceWidth, height: Self.sourceHeight, crop: crop,
                box: PixelRegion(x: 0, y: 0, width: crop.width, height: crop.height))
            let differing = zip(cropped, expected).filter { $0 != $1 }.count
            #expect(differing == 0, "\(format) crop \(crop): \(differing) of \(expected.count) composite bytes differ from ffmpeg's crop")
        }
    }
}
