import Atomics
import BroadcastKit
import Synchronization
import Testing

/// A source whose device the test takes away and gives back.
final class FlakySource: CaptureSource, @unchecked Sendable {
    let name = "flaky"
    let isRealtime = true
    private let lost = ManagedAtomic<Bool>(false)
    private let losses = ManagedAtomic<Int>(0)
    func start(into sink: SourceSink) throws {}
    func stop() {}

    func loseDevice() {
        losses.wrappingIncrement(ordering: .relaxed)
        lost.store(true, ordering: .releasing)
    }
    func deviceReturns() { lost.store(false, ordering: .releasing) }

    var health: CaptureHealth {
        CaptureHealth(state: lost.load(ordering: .acquiring) ? .deviceLost : .capturing, deviceLosses: losses.load(ordering: .relaxed))
    }
}

final class HealthHandler: BroadcastSampleHandler, @unchecked Sendable {
    let changes = Mutex<[(CaptureHealth, SampleBufferType)]>([])
    func broadcastStarted(setupInfo: SetupInfo) throws {}
    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {}
    func broadcastFinished() {}
    func sourceHealthChanged(_ health: CaptureHealth, of type: SampleBufferType) {
        changes.withLock { $0.append((health, type)) }
    }
}

@Suite struct SourceHealthTests {
    @Test func deviceLossAndReturnReachTheHandlerAndTheStatistics() throws {
        let handler = HealthHandler()
        let source = FlakySource()
        let session = BroadcastSession(handler: handler, sources: [(.video, source)], options: SessionOptions(clock: MockClock()))
        let runner = SessionRunner(session)
        #expect(waitUntil { session.state == .started })
        #expect(session.statistics()[.video]?.sourceHealth.state == .capturing)

        source.loseDevice()
        // The session looks between buffers and at least every 250 ms while idle.
        #expect(waitUntil { handler.changes.withLock { $0.count } == 1 })
        #expect(session.statistics()[.video]?.sourceHealth == CaptureHealth(state: .deviceLost, deviceLosses: 1))

        source.deviceReturns()
        #expect(waitUntil { handler.changes.withLock { $0.count } == 2 })
        try session.finish()
        _ = try runner.result().get()

        let seen = handler.changes.withLock { $0.map { "\($0.0.state.rawValue)/\($0.0.deviceLosses)/\($0.1)" } }
        #expect(seen == ["deviceLost/1/video", "capturing/1/video"])
    }
}
