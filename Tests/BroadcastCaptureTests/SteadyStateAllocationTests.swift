import BroadcastCapture
import BroadcastKit
import AllocationCounting
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The design's promise that capture allocates nothing per buffer once running: the test pattern
/// and tone through the session into a handler that does nothing, counted by `AllocationCounter`
/// (malloc-interposer).
///
/// Counted in an exit test: the body runs in a process of its own, so no other test's threads
/// allocate in the window. Only the capture path's threads are counted there: the sources' own
/// ("bc-" names) and the session's (the thread that calls the handler); the test runner's are not.
/// The counting starts after a warm-up (pools, queues, first-time setup) and covers `window` buffers.
@Suite struct SteadyStateAllocationTests {
    /// Counts the buffers it is given; opens the counting window after `warmUp` of them and closes
    /// it `window` later. Allocates nothing itself in between.
    final class NullHandler: BroadcastSampleHandler, @unchecked Sendable {
        let warmUp: Int
        let window: Int
        private var buffers = 0
        private(set) var counted = false

        init(warmUp: Int, window: Int) {
            self.warmUp = warmUp
            self.window = window
        }

        func broadcastStarted(setupInfo: SetupInfo) throws {}
        func broadcastFinished() {}

        func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
            buffers += 1
            if buffers == warmUp {
                AllocationCounter.startCounting(on: pthread_self())
            } else if buffers == warmUp + window {
                AllocationCounter.stopCounting()
                counted = true
            }
        }
    }

    /// Runs the session until `warmUp + window` buffers were delivered; returns the allocations
    /// the capture path's threads made in the window, or -1 when the window was not reached.
    static func allocations(warmUp: Int, window: Int) throws -> Int {
        AllocationCounter.prepare(countingCaptureThreads: true)
        defer { AllocationCounter.finish() }
        let handler = NullHandler(warmUp: warmUp, window: window)
        // 30 fps and 10 ms periods: 130 buffers a second of media, produced as fast as the session takes them.
        let seconds = (warmUp + window) / 130 + 2
        let session = BroadcastSession(
            handler: handler,
            sources: [
                (.video, TestPatternSource(width: 320, height: 180, frameRate: (30, 1), realtime: false)),
                (.audioMic, ToneSource(realtime: false)),
            ],
            options: SessionOptions(duration: MediaTime(value: Int64(seconds), timescale: 1))
        )
        _ = try session.run()
        guard handler.counted else { return -1 }
        let counts = AllocationCounter.counts
        return counts.own + counts.ffmpeg
    }

    @Test func testSourcesThroughTheSessionAllocateNothingPerBuffer() async {
        await #expect(processExitsWith: .success, "allocations in 1000 buffers after the warm-up (exit status: the count, capped at 100)") {
            let count = try SteadyStateAllocationTests.allocations(warmUp: 300, window: 1000)
            exit(count < 0 ? 101 : Int32(min(count, 100)))
        }
    }
}
