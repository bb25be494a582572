import Atomics
@testable import BroadcastKit
import Synchronization
import Testing

/// A non-realtime source with no thread: in the session's look between `ended` and the ring it
/// hands over its last buffers and ends, once (what a producer on its own thread can do at any
/// instant; here at the worst one, every time).
final class EndsBetweenLooksSource: CaptureSource, @unchecked Sendable {
    let name = "ends between looks"
    let isRealtime = false
    let count: Int
    let backing = Bytes(count: 16)

    init(count: Int) { self.count = count }

    func start(into sink: SourceSink) throws {
        let (count, backing) = (count, backing)
        var done = false
        sink.betweenEndAndRingForTesting = {
            guard !done, sink.ring.isEmpty else { return }
            done = true
            for i in 0..<count {
                sink.push(
                    CapturedBuffer(
                        format: videoFormat, captureTime: sink.startTime + Int64(i) * 33_333_333,
                        duration: MediaTime(nanoseconds: 33_333_333),
                        planes: [Plane(base: backing.pointer, count: 16, bytesPerRow: 16)]))
            }
            sink.endOfStream()
        }
    }

    func stop() {}
}

/// A source that never delivers and whose `stop()` takes until the test lets it go (a device
/// draining for seconds); says when a stop has begun.
final class SlowStopSource: CaptureSource, @unchecked Sendable {
    let name: String
    let isRealtime = false
    let stopBegan = ManagedAtomic<Bool>(false)
    let letGo = ManagedAtomic<Bool>(false)

    init(name: String) { self.name = name }

    func start(into sink: SourceSink) throws {}

    func stop() {
        stopBegan.store(true, ordering: .releasing)
        _ = waitUntil(seconds: 120) { letGo.load(ordering: .acquiring) }
    }
}

/// A source that never delivers (a session that only takes commands).
final class SilentSource: CaptureSource, @unchecked Sendable {
    let name = "silent"
    let isRealtime = false
    func start(into sink: SourceSink) throws {}
    func stop() {}
}

@Suite struct SessionRaceTests {
    /// A producer pushes its last buffers and ends while the session looks: they are delivered.
    /// (The session read the ring, found it empty, and then read `ended`: the buffers pushed
    /// between the two were never delivered, and the run ended "sources ended" without them.)
    @Test(arguments: [1, 3]) func buffersPushedJustBeforeTheEndAreDelivered(count: Int) throws {
        let handler = RecordingHandler()
        let source = EndsBetweenLooksSource(count: count)
        let session = BroadcastSession(handler: handler, sources: [(.video, source)])
        let summary = try session.run()
        #expect(summary.reason == .sourcesEnded)
        #expect(summary.statistics[.video]?.delivered == count)
    }

    /// The same race left to the scheduler: many short sessions whose producers on their own
    /// threads push a few buffers and end at once, beside a busy second type. Every buffer pushed
    /// is delivered in every round.
    @Test func everyRoundDeliversEveryBufferBeforeTheEnd() throws {
        var short: [Int] = []
        for round in 0..<300 {
            let handler = RecordingHandler()
            handler.keepEvents = false
            let count = 1 + round % 4
            let video = CountingSource(count: count, stepNanoseconds: 33_333_333, format: videoFormat)
            let audio = CountingSource(count: 400, stepNanoseconds: 10_000, format: audioFormat)
            let session = BroadcastSession(handler: handler, sources: [(.video, video), (.audioMic, audio)])
            let summary = try session.run()
            if summary.statistics[.video]?.delivered != count { short.append(round) }
        }
        #expect(short == [])
    }

    /// Pause and resume from two threads, many times: the handler hears them alternate, pause
    /// first, whichever thread's push reached the session first. (The commands were sorted within
    /// one batch only: a resume pushed before the pause it follows, and taken alone, reached the
    /// handler first, and the session stayed paused while its state said started.)
    @Test func pauseAndResumeFromTwoThreadsReachTheHandlerInOrder() throws {
        let rounds = 20_000
        let handler = RecordingHandler()
        let session = BroadcastSession(handler: handler, sources: [(.video, SilentSource())])
        let runner = SessionRunner(session)
        #expect(waitUntil(seconds: 60) { session.state == .started })
        let pauser = OSThread(name: "test-pause") {
            var done = 0
            while done < rounds {
                if session.state == .started, (try? session.pause()) != nil { done += 1 }
            }
        }
        let resumer = OSThread(name: "test-resume") {
            var done = 0
            while done < rounds {
                if session.state == .paused, (try? session.resume()) != nil { done += 1 }
            }
        }
        pauser.join()
        resumer.join()
        let heard = { handler.events.filter { $0 == .paused || $0 == .resumed } }
        #expect(waitUntil(seconds: 60) { heard().count == 2 * rounds })
        let events = heard()
        let firstWrong = events.indices.first { events[$0] != ($0 % 2 == 0 ? .paused : .resumed) }
        #expect(firstWrong == nil, "call \(firstWrong ?? -1) of \(events.count) out of order")
        try session.finish()
        _ = try runner.result().get()
    }

    /// `statistics()` (what /v1/status, /metrics and the watchdog read) while a replacement's old
    /// source takes long to stop: it returns while the swap is still under way. Judged by order:
    /// the old source is let go only after statistics returned, or after a minute.
    @Test func statisticsDoNotWaitForASwap() throws {
        let handler = RecordingHandler()
        handler.keepEvents = false
        let old = SlowStopSource(name: "old")
        let session = BroadcastSession(handler: handler, sources: [(.video, old)])
        let runner = SessionRunner(session)
        let swapped = ManagedAtomic<Bool>(false)
        let swapper = OSThread(name: "test-swap") {
            // Until the session has started its sources, a replacement is refused: try again.
            while (try? session.replaceSource(of: .video, with: { SilentSource() })) == nil {
                if session.state == .finished { return }
                MonotonicClock.sleep(until: MonotonicClock().now() + 1_000_000)
            }
            swapped.store(true, ordering: .releasing)
        }
        #expect(waitUntil(seconds: 60) { old.stopBegan.load(ordering: .acquiring) })
        let read = ManagedAtomic<Bool>(false)
        let reader = OSThread(name: "test-read") {
            _ = session.statistics()
            read.store(true, ordering: .releasing)
        }
        let readDuringSwap = waitUntil(seconds: 60) { read.load(ordering: .acquiring) }
        let swapStillUnderWay = !swapped.load(ordering: .acquiring)
        old.letGo.store(true, ordering: .releasing)
        reader.join()
        swapper.join()
        #expect(readDuringSwap && swapStillUnderWay)
        let swapEnded = swapped.load(ordering: .acquiring)
        #expect(swapEnded)
        try session.finish()
        _ = try runner.result().get()
    }
}
