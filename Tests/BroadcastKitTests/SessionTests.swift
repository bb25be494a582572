import Atomics
import BroadcastKit
import Testing

@Suite struct SessionLifecycleTests {
    private func makeSession(_ handler: RecordingHandler, source: ManualSource = ManualSource()) -> BroadcastSession {
        // The clock stands still here: no reorder window, or a pause would wait for it for ever.
        BroadcastSession(
            handler: handler, sources: [(.video, source)],
            options: SessionOptions(reorderWindowNanoseconds: 0, clock: MockClock()))
    }

    @Test func callsBeforeStartAreIllegal() {
        let session = makeSession(RecordingHandler())
        for call in [session.pause, session.resume, session.finish] {
            let error = #expect(throws: BroadcastError.self) { try call() }
            #expect(error?.code == .illegalTransition)
            #expect(error?.message.contains("has not started") == true)
        }
        #expect(session.state == .idle)
    }

    @Test func fullLifecycleAndIllegalCallsWhileRunning() throws {
        let handler = RecordingHandler()
        let session = makeSession(handler)
        let runner = SessionRunner(session)
        #expect(waitUntil { session.state == .started && handler.events.contains(.started) })

        #expect(throws: BroadcastError.self) { try session.resume() }  // not paused
        try session.pause()
        #expect(session.state == .paused)
        #expect(throws: BroadcastError.self) { try session.pause() }  // already paused
        try session.resume()
        #expect(session.state == .started)
        try session.pause()
        try session.finish()  // finish from paused is legal
        #expect(session.state == .finished)

        let summary = try runner.result().get()
        #expect(summary.reason == .finished)
        #expect(handler.events == [.started, .paused, .resumed, .paused, .finished])
        #expect(handler.overlaps.load(ordering: .relaxed) == 0)

        // Anything after finish, including a second run, is a clear error.
        for call in [session.pause, session.resume, session.finish] {
            let error = #expect(throws: BroadcastError.self) { try call() }
            #expect(error?.message.contains("has finished") == true)
        }
        let again = #expect(throws: BroadcastError.self) { _ = try session.run() }
        #expect(again?.code == .illegalTransition)
    }

    @Test func startingTwiceIsIllegal() throws {
        let handler = RecordingHandler()
        let session = makeSession(handler)
        let runner = SessionRunner(session)
        #expect(waitUntil { handler.events.contains(.started) })
        let error = #expect(throws: BroadcastError.self) { _ = try session.run() }
        #expect(error?.message.contains("already started") == true)
        try session.finish()
        _ = try runner.result().get()
        #expect(handler.events.filter { $0 == .started }.count == 1)
    }

    @Test func finishWithErrorIsReportedByRun() throws {
        let handler = RecordingHandler()
        let session = makeSession(handler)
        let runner = SessionRunner(session)
        #expect(waitUntil { session.state == .started })
        try session.finishBroadcast(with: BroadcastError(.sourceFailed, "camera unplugged"))
        let result = runner.result()
        #expect(throws: BroadcastError(.sourceFailed, "camera unplugged")) { try result.get() }
        #expect(handler.events.last == .finished)
    }

    @Test func handlerThrowingAbortsTheBroadcast() throws {
        let handler = RecordingHandler()
        handler.failAfter = 3
        let source = ManualSource()
        let session = makeSession(handler, source: source)
        let runner = SessionRunner(session)
        #expect(waitUntil { source.sink != nil })
        for i in 0..<10 { source.push(format: videoFormat, at: source.sink!.startTime + Int64(i) * 1000, durationNanoseconds: 1000) }
        let error = #expect(throws: BroadcastError.self) { try runner.result().get() }
        #expect(error?.code == .handlerAborted)
        #expect(session.state == .finished)
        #expect(handler.events.last == .finished)
        #expect(handler.delivered.load(ordering: .relaxed) == 3)
    }
}

@Suite struct SessionDeliveryTests {
    /// Three producer threads, 120 000 buffers: the handler never sees two calls at once, and
    /// buffers arrive in capture order across types.
    @Test func serialAcrossTypesUnderLoad() throws {
        let handler = RecordingHandler()
        handler.keepEvents = false
        let perSource = 40_000
        let sources: [(type: SampleBufferType, source: any CaptureSource)] = [
            (.video, CountingSource(count: perSource, stepNanoseconds: 33_333, format: videoFormat)),
            (.audioMic, CountingSource(count: perSource, stepNanoseconds: 21_333, format: audioFormat)),
            (.audioApp, CountingSource(count: perSource, stepNanoseconds: 10_000, format: audioFormat)),
        ]
        let session = BroadcastSession(handler: handler, sources: sources, options: SessionOptions(queueCapacity: 32))
        let summary = try session.run()
        #expect(summary.reason == .sourcesEnded)
        #expect(handler.overlaps.load(ordering: .relaxed) == 0)
        #expect(handler.delivered.load(ordering: .relaxed) == 3 * perSource)
        for type in SampleBufferType.allCases {
            #expect(summary.statistics[type]?.delivered == perSource)
        }
    }

    @Test func deliveryFollowsCaptureOrderAndIsMonotonicPerType() throws {
        let handler = RecordingHandler()
        let sources: [(type: SampleBufferType, source: any CaptureSource)] = [
            (.video, CountingSource(count: 3000, stepNanoseconds: 33_333_333, format: videoFormat)),
            (.audioMic, CountingSource(count: 4000, stepNanoseconds: 21_333_333, format: audioFormat)),
        ]
        _ = try BroadcastSession(handler: handler, sources: sources).run()
        var lastAny = Int64.min
        var lastByType: [SampleBufferType: Int64] = [:]
        for case .buffer(let type, let pts, _, _) in handler.events {
            #expect(pts >= lastAny, "delivered out of capture order")
            #expect(pts > (lastByType[type] ?? -1), "\(type) timestamps not increasing")
            lastAny = pts
            lastByType[type] = pts
        }
        #expect(lastByType.count == 2)
    }

    @Test func durationStopsDeliveryExactly() throws {
        let handler = RecordingHandler()
        let sources: [(type: SampleBufferType, source: any CaptureSource)] = [
            (.video, CountingSource(count: 1000, stepNanoseconds: 100_000_000, format: videoFormat)),
        ]
        let options = SessionOptions(duration: MediaTime(value: 2, timescale: 1))
        let summary = try BroadcastSession(handler: handler, sources: sources, options: options).run()
        #expect(summary.reason == .durationReached)
        #expect(summary.statistics[.video]?.delivered == 20)
    }

    /// Pause at 1.005 s, resume at 3.002 s on a hand-moved clock: nothing reaches the handler while
    /// paused, audio is cut at the exact sample and continues without a gap, video timestamps go on
    /// from where they stopped.
    @Test func pauseDeliversNothingAndResumeHasNoGap() throws {
        let clock = MockClock()
        let handler = RecordingHandler()
        let video = ManualSource()
        let audio = ManualSource()
        let session = BroadcastSession(
            handler: handler,
            sources: [(.video, video), (.audioMic, audio)],
            options: SessionOptions(queueCapacity: 512, reorderWindowNanoseconds: 1_000_000, clock: clock)
        )
        let runner = SessionRunner(session)
        #expect(waitUntil { video.sink != nil && audio.sink != nil })
        let frame: Int64 = 33_333_333
        let chunk: Int64 = 10_000_000  // 480 frames at 48 kHz
        var nextVideo: Int64 = 0
        var nextAudio: Int64 = 0
        func feed(until end: Int64) {
            while nextVideo < end {
                video.push(format: videoFormat, at: nextVideo, durationNanoseconds: frame)
                nextVideo += frame
            }
            while nextAudio < end {
                audio.push(format: audioFormat, at: nextAudio, durationNanoseconds: chunk, frames: 480)
                nextAudio += chunk
            }
        }
        feed(until: 1_000_000_000)
        clock.set(1_005_000_000)
        #expect(waitUntil { handler.delivered.load(ordering: .relaxed) == 31 + 100 })
        try session.pause()
        // Captured around the pause at 1.005 s, handed over after it: audio from 1.0 s (a device
        // delivers a period once it is over), a frame at 1.033 s.
        audio.push(format: audioFormat, at: nextAudio, durationNanoseconds: chunk, frames: 480)
        nextAudio += chunk
        video.push(format: videoFormat, at: nextVideo, durationNanoseconds: frame)
        nextVideo += frame
        // The pause waits for what was captured before it: the audio up to 1.005 s goes out first.
        #expect(waitUntil { handler.delivered.load(ordering: .relaxed) == 31 + 100 + 1 })
        #expect(!handler.events.contains(.paused))
        clock.set(1_007_000_000)  // the reorder window (1 ms) has passed
        #expect(waitUntil { handler.events.last == .paused })
        clock.set(3_000_000_000)
        feed(until: 3_000_000_000)
        clock.set(3_002_000_000)
        try session.resume()
        feed(until: 4_000_000_000)
        clock.set(5_000_000_000)
        #expect(waitUntil { (session.statistics()[.audioMic]?.mediaTimeNanoseconds ?? 0) >= 2_003_000_000 - 1_000_000 })
        try session.finish()
        _ = try runner.result().get()

        let events = handler.events
        let pausedAt = events.firstIndex(of: .paused)!
        let resumedAt = events.firstIndex(of: .resumed)!
        #expect(pausedAt + 1 == resumedAt, "buffers were delivered while paused")

        var audioEnd: Int64 = 0
        var audioFrames = 0
        var lastVideo: Int64 = -1
        var videoPTS: [Int64] = []
        for case .buffer(let type, let pts, let duration, let frames) in events {
            if type == .audioMic {
                #expect(abs(pts - audioEnd) <= 21_000, "audio gap or overlap at \(pts): expected \(audioEnd)")
                audioEnd = pts + duration
                audioFrames += frames
            } else {
                #expect(pts > lastVideo)
                lastVideo = pts
                videoPTS.append(pts)
            }
        }
        // 4 s captured, 1.997 s of it paused: 2.003 s of media, to the sample.
        #expect(audioFrames == 2_003 * 48)
        // The first frame after resume (captured at 3.0333 s) continues 1.997 s earlier.
        let resumed = videoPTS.first { $0 > 1_000_000_000 }
        #expect(resumed == 91 * frame - 1_997_000_000)
        #expect(videoPTS.contains(30 * frame), "the frame captured before the pause began is delivered")
    }

    /// A 20 ms pause (not a whole frame) while the video source runs late: its frame captured before
    /// the pause arrives after the resume. The frame after that would land 13.3 ms after it (what
    /// `record` gave under load with fast SIGUSR1 toggles: ffmpeg's "non monotonically increasing
    /// dts" at 1/fps); the session leaves it out, so frames stay at least a period apart.
    @Test func aFrameThatWouldFallWithinAPeriodAfterAPauseIsLeftOut() throws {
        let clock = MockClock()
        let handler = RecordingHandler()
        let video = ManualSource()
        let session = BroadcastSession(
            handler: handler, sources: [(.video, video)],
            options: SessionOptions(queueCapacity: 64, reorderWindowNanoseconds: 1_000_000, clock: clock)
        )
        let runner = SessionRunner(session)
        #expect(waitUntil { video.sink != nil })
        let frame: Int64 = 33_333_333
        for i in 0..<3 { video.push(format: videoFormat, at: Int64(i) * frame, durationNanoseconds: frame) }
        clock.set(110_000_000)
        #expect(waitUntil { handler.delivered.load(ordering: .relaxed) == 3 })
        try session.pause()
        clock.set(112_000_000)  // the reorder window has passed: paused with the source behind
        #expect(waitUntil { handler.events.last == .paused })
        clock.set(130_000_000)
        try session.resume()
        #expect(waitUntil { handler.events.last == .resumed })
        // Late: the frame captured at 100 ms (before the pause), then 133 ms and 166 ms (after it).
        for i in 3..<6 { video.push(format: videoFormat, at: Int64(i) * frame, durationNanoseconds: frame) }
        clock.set(300_000_000)
        #expect(waitUntil { (session.statistics()[.video]?.droppedPaused ?? 0) + handler.delivered.load(ordering: .relaxed) == 6 })
        try session.finish()
        _ = try runner.result().get()
        var pts: [Int64] = []
        for case .buffer(_, let time, _, _) in handler.events { pts.append(time) }
        // 0, 33.3, 66.7, 100 (the late one), [113.3 left out], 146.7 (166.7 less the 20 ms pause).
        #expect(pts == [0, frame, 2 * frame, 3 * frame, 5 * frame - 20_000_000], "\(pts)")
        #expect(session.statistics()[.video]?.droppedPaused == 1)
    }
}
