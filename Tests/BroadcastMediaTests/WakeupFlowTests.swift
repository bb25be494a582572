import BroadcastCapture
import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Foundation
import Testing

/// Issue 18: a frame must never wait for a timer when there is work. Frames flow at a steady rate
/// (realtime test pattern, no audio) through session → encoder → an output's thread; every sleep of
/// the session thread and of the output thread must end by a wake-up, not by its timeout with a
/// wake-up pending (a lost wake-up, which the 200–250 ms timeouts would otherwise hide as a tail).
@Suite("Wake-ups under steady flow", .serialized)
struct WakeupFlowTests {
    @Test("session → encoder → output: no frame is delivered by a timeout")
    func noFrameWaitsForATimeout() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("steady.mkv")
        let handler = EncodingHandler(
            configuration: EncodingConfiguration(
                video: VideoEncoderSettings(width: 160, height: 120, frameRate: FrameRate(50), bitrate: 300_000),
                audio: nil,
                recordings: [file]),
            logger: quietLogger())
        let source = TestPatternSource(width: 160, height: 120, frameRate: (50, 1))
        let session = BroadcastSession(
            handler: handler, sources: [(.video, source)],
            options: SessionOptions(duration: MediaTime(value: 4, timescale: 1)), logger: quietLogger())
        // Read while running: the output's thread is joined (and its queue gone) after the finish.
        let output = try #require(handler.outputs.first)
        let summary = try session.run()
        #expect(summary.reason == .durationReached)
        #expect(handler.failures.isEmpty, "\(handler.failures)")
        let frames = handler.statistics().videoFramesEncoded
        #expect(frames >= 190, "\(frames) frames")

        let sessionWakeups = session.wakeupStatistics
        let outputWakeups = output.wakeupStatistics
        // Both threads really slept and were woken (the test exercises the hand-off)...
        #expect(sessionWakeups.signalled > 0, "session: \(sessionWakeups)")
        #expect(outputWakeups.signalled > 0, "output: \(outputWakeups)")
        // ...and no sleep ended by its timeout while a wake-up was due.
        #expect(sessionWakeups.late == 0, "session sleeps ended by the timeout with work waiting: \(sessionWakeups)")
        #expect(outputWakeups.late == 0, "output sleeps ended by the timeout with packets waiting: \(outputWakeups)")
        // (A sleep that times out with nothing due is not a fault: frames come every 20 ms and the
        // timeouts are 200–250 ms, so that needs a machine that stops the producer for longer.)
    }
}
