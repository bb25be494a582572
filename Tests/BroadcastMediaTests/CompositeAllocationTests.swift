import AllocationCounting
import Atomics
import BroadcastKit
@testable import BroadcastComposition
@testable import BroadcastMedia
import Logging
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The design's "steady state allocates nothing" for the composite (issue 35 item 7): a static
/// screen under a layer with a new picture every frame (converted, cropped, scaled into its box,
/// redrawn in its box, handed on with its changed region) through the session into a handler that
/// does nothing, counted by `AllocationCounter` on the composite's thread ("bc-compose"), the
/// sources' ("bc-" names) and the session's, after a warm-up, in an exit test (a process of its own).
@Suite struct CompositeAllocationTests {
    /// A BGR0 source as fast as it is taken: `pictures` pictures in turn, made once, so each buffer
    /// lends memory that exists already. `changed` is what each buffer after the first says changed
    /// (nil: a new picture, [] a repeat).
    final class LentSource: CaptureSource, @unchecked Sendable {
        let name: String
        let isRealtime = false
        let width: Int
        let height: Int
        let changed: [PixelRegion]?
        /// Buffers handed over so far.
        let pushed = ManagedAtomic(0)
        private var thread: OSThread?
        private let memory: [UnsafeMutableRawPointer]
        private let planes: [[Plane]]

        init(name: String, width: Int, height: Int, colours: [UInt32], changed: [PixelRegion]?) {
            (self.name, self.width, self.height, self.changed) = (name, width, height, changed)
            memory = colours.map { colour in
                let pixels = UnsafeMutableRawPointer.allocate(byteCount: width * height * 4, alignment: 64)
                pixels.bindMemory(to: UInt32.self, capacity: width * height).update(repeating: colour, count: width * height)
                return pixels
            }
            planes = memory.map { [Plane(base: $0, count: width * height * 4, bytesPerRow: width * 4)] }
        }

        deinit { for pixels in memory { pixels.deallocate() } }

        func start(into sink: SourceSink) throws {
            let (width, height, planes, changed, pushed) = (self.width, self.height, self.planes, self.changed, self.pushed)
            let format = MediaFormat.video(VideoFormat(pixelFormat: .bgr0, width: width, height: height))
            thread = OSThread(name: "bc-test-lent") {
                var index = 0
                while !sink.isStopping {
                    let buffer = CapturedBuffer(
                        format: format, captureTime: sink.startTime + Int64(index) * 33_333_333,
                        duration: MediaTime(value: 1, timescale: 30), planes: planes[index % planes.count],
                        changedRegions: index == 0 ? nil : changed)
                    if !sink.push(buffer) { return }
                    pushed.wrappingIncrement(ordering: .relaxed)
                    index += 1
                }
            }
        }

        func stop() {
            thread?.join()
            thread = nil
        }
    }

    /// Opens the counting window after `warmUp` video frames once the layer has handed over
    /// `warmUp` pictures too (its thread may start late on a busy host: its first picture makes
    /// its converter), and closes it `window` frames later; allocates nothing itself in between.
    final class NullHandler: BroadcastSampleHandler, @unchecked Sendable {
        let warmUp: Int
        let window: Int
        let layer: LentSource
        private var frames = 0
        private var openedAt: Int?
        private(set) var counted = false
        init(warmUp: Int, window: Int, layer: LentSource) { (self.warmUp, self.window, self.layer) = (warmUp, window, layer) }
        func broadcastStarted(setupInfo: SetupInfo) throws {}
        func broadcastFinished() {}
        func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
            frames += 1
            if let openedAt {
                if frames == openedAt + window {
                    AllocationCounter.stopCounting()
                    counted = true
                }
            } else if frames >= warmUp && layer.pushed.load(ordering: .relaxed) >= warmUp {
                openedAt = frames
                AllocationCounter.startCounting(on: pthread_self())
            }
        }
    }

    /// The allocations in `window` composite frames after `warmUp`, or -1 when the window was not reached.
    static func allocations(warmUp: Int, window: Int) throws -> Int {
        AllocationCounter.prepare(countingCaptureThreads: true)
        defer { AllocationCounter.finish() }
        // A wake-up's first sleep instantiates type metadata (once per process, not per frame):
        // done here, so that a source's first wait inside the window does not count it.
        let wakeup = try Wakeup()
        wakeup.prepareToSleep()
        wakeup.sleep(timeout: .zero)
        // A static screen (every buffer after the first says nothing changed) and a camera-like
        // layer with a new picture at every frame, cropped and scaled into its box.
        let screen = LentSource(name: "screen", width: 320, height: 192, colours: [0x0000_00ff], changed: [])
        let camera = LentSource(name: "camera", width: 160, height: 120, colours: [0x00ff_0000, 0x0000_ff00], changed: nil)
        var placement = LayerPlacement()
        (placement.x, placement.y, placement.width, placement.height) = (.pixels(200), .pixels(100), .pixels(96), .pixels(72))
        placement.crop = PixelRegion(x: 40, y: 30, width: 80, height: 60)
        let composite = LayeredVideoSource(
            base: screen, inputs: [camera], scenes: [.init(name: "default", layers: [.init(input: 0, placement: placement)])],
            width: 320, height: 192, colour: nil, logger: Logger(label: "test"))
        let handler = NullHandler(warmUp: warmUp, window: window, layer: camera)
        // Long enough for a late layer; the window is over long before on an idle host.
        let session = BroadcastSession(
            handler: handler, sources: [(.video, composite)],
            options: SessionOptions(duration: MediaTime(value: Int64(warmUp + window + 3000), timescale: 30)))
        _ = try session.run()
        guard handler.counted else { return -1 }
        let counts = AllocationCounter.counts
        return counts.own + counts.ffmpeg
    }

    @Test func aLayerOverAStaticScreenAllocatesNothingPerFrame() async {
        await #expect(processExitsWith: .success, "allocations in 300 composite frames after the warm-up (exit status: the count, capped at 100)") {
            let count = try CompositeAllocationTests.allocations(warmUp: 60, window: 300)
            exit(count < 0 ? 101 : Int32(min(count, 100)))
        }
    }
}
