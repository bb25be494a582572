import Atomics
import BroadcastKit
import Synchronization
import Testing

/// `SampleBuffer.followsLoss` through the session: set on the first buffer of a type after some
/// were lost (the queue full, the source's own drop said with `noteLoss()`), and on no other.
/// The audio path jumps such a hole instead of stretching it (the VM's drift section on a starved
/// guest: vm/README.md, "Slow hosts").
@Suite struct FollowsLossTests {
    /// Blocks in its first `processSampleBuffer` until `gate` opens, so the queue fills.
    final class GatedHandler: BroadcastSampleHandler, @unchecked Sendable {
        let seen = Mutex<[(pts: Int64, followsLoss: Bool)]>([])
        let entered = ManagedAtomic<Bool>(false)
        let gate = ManagedAtomic<Bool>(false)
        func broadcastStarted(setupInfo: SetupInfo) throws {}
        func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
            let entry = (buffer.presentationTime.nanoseconds!, buffer.followsLoss)
            seen.withLock { $0.append(entry) }
            entered.store(true, ordering: .releasing)
            _ = waitUntil { gate.load(ordering: .acquiring) }
        }
        func broadcastPaused() {}
        func broadcastResumed() {}
        func broadcastFinished() {}
    }

    private static let format = MediaFormat.audio(AudioFormat(sampleFormat: .s16, sampleRate: 48_000, channels: 2))
    private static let period: Int64 = 10_000_000

    /// Offers the period starting at `index` periods without waiting, as a realtime source does.
    @discardableResult
    private func offer(_ sink: SourceSink, _ index: Int64) -> Bool {
        let backing = Bytes(count: 480 * 4)
        return sink.offer(
            CapturedBuffer(
                format: Self.format, captureTime: index * Self.period, duration: MediaTime(nanoseconds: Self.period),
                planes: [Plane(base: backing.pointer, count: backing.count, bytesPerRow: backing.count)],
                frameCount: 480, backing: backing))
    }

    @Test func theFirstBufferAfterAQueueFullDropFollowsALoss() throws {
        let handler = GatedHandler()
        let source = ManualSource()
        let session = BroadcastSession(
            handler: handler, sources: [(.audioMic, source)],
            options: SessionOptions(queueCapacity: 4, reorderWindowNanoseconds: 0, clock: MockClock()))
        let runner = SessionRunner(session)
        #expect(waitUntil { source.sink != nil })
        let sink = source.sink!
        offer(sink, 0)
        #expect(waitUntil { handler.entered.load(ordering: .acquiring) })
        // The handler holds period 0: the queue takes the next ones until it is full; the rest
        // are dropped.
        var index: Int64 = 1
        while offer(sink, index) { index += 1 }
        let firstDropped = index
        offer(sink, index + 1)
        let next = index + 2
        handler.gate.store(true, ordering: .releasing)
        #expect(waitUntil { handler.seen.withLock { $0.count } == Int(firstDropped) })
        // Room again: this one comes after the two dropped.
        #expect(offer(sink, next))
        #expect(waitUntil { handler.seen.withLock { $0.count } == Int(firstDropped) + 1 })
        offer(sink, next + 1)
        #expect(waitUntil { handler.seen.withLock { $0.count } == Int(firstDropped) + 2 })
        try session.finish()
        _ = try runner.result().get()
        let seen = handler.seen.withLock { $0 }
        #expect(seen.map(\.pts) == Array(0..<firstDropped).map { $0 * Self.period } + [next * Self.period, (next + 1) * Self.period])
        #expect(seen.map(\.followsLoss) == Array(repeating: false, count: Int(firstDropped)) + [true, false])
        #expect(session.statistics()[.audioMic]?.droppedQueueFull == 2)
    }

    @Test func aSourcesOwnDropSaidWithNoteLoss() throws {
        let handler = GatedHandler()
        handler.gate.store(true, ordering: .releasing)
        let source = ManualSource()
        let session = BroadcastSession(
            handler: handler, sources: [(.audioMic, source)],
            options: SessionOptions(reorderWindowNanoseconds: 0, clock: MockClock()))
        let runner = SessionRunner(session)
        #expect(waitUntil { source.sink != nil })
        let sink = source.sink!
        offer(sink, 0)
        offer(sink, 1)
        // Period 2 lost at the source (no free buffer): it says so.
        sink.noteLoss()
        offer(sink, 3)
        offer(sink, 4)
        #expect(waitUntil { handler.seen.withLock { $0.count } == 4 })
        try session.finish()
        _ = try runner.result().get()
        #expect(handler.seen.withLock { $0.map(\.followsLoss) } == [false, false, true, false])
    }
}
