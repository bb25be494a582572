import Atomics
import BroadcastKit
import Synchronization
import Testing

/// The changed-regions contract through the session: passed on as the source said, and `nil`
/// (everything changed) for the first buffer after one that was dropped.
@Suite struct ChangedRegionsTests {
    final class RegionsHandler: BroadcastSampleHandler, @unchecked Sendable {
        let seen = Mutex<[(pts: Int64, regions: [PixelRegion]?)]>([])
        func broadcastStarted(setupInfo: SetupInfo) throws {}
        func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
            let entry = (buffer.presentationTime.nanoseconds!, buffer.changedRegions)
            seen.withLock { $0.append(entry) }
        }
        func broadcastPaused() {}
        func broadcastResumed() {}
        func broadcastFinished() {}
    }

    @Test func regionsArePassedOnAndADroppedFrameMakesTheNextOneWhole() throws {
        let handler = RegionsHandler()
        let source = ManualSource()
        let session = BroadcastSession(
            handler: handler, sources: [(.video, source)],
            options: SessionOptions(reorderWindowNanoseconds: 0, clock: MockClock()))
        let runner = SessionRunner(session)
        #expect(waitUntil { source.sink != nil })
        let format = MediaFormat.video(VideoFormat(pixelFormat: .bgr0, width: 64, height: 32))
        let frame: Int64 = 33_333_333
        let window = PixelRegion(x: 3, y: 5, width: 7, height: 9)
        let pushes: [(Int64, [PixelRegion]?)] = [
            (0, nil), (frame, [window]), (2 * frame, []),
            (2 * frame, [window]),  // the same capture time again: dropped as out of order
            (3 * frame, []),  // a repeat of the dropped one: the handler must hear "everything"
            (4 * frame, [window]),
        ]
        for (time, regions) in pushes {
            source.push(format: format, at: time, durationNanoseconds: frame, changedRegions: regions)
        }
        #expect(waitUntil { handler.seen.withLock { $0.count } == 5 })
        try session.finish()
        _ = try runner.result().get()
        let seen = handler.seen.withLock { $0 }
        #expect(seen.map(\.pts) == [0, frame, 2 * frame, 3 * frame, 4 * frame])
        #expect(seen.map(\.regions) == [nil, [window], [], nil, [window]])
    }

    @Test func clippingAndRepeats() {
        let region = PixelRegion(x: -3, y: 30, width: 10, height: 10)
        #expect(region.clipped(width: 64, height: 32) == PixelRegion(x: 0, y: 30, width: 7, height: 2))
        #expect(PixelRegion(x: 64, y: 0, width: 5, height: 5).clipped(width: 64, height: 32) == nil)
    }
}
