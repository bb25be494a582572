import Atomics
import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Foundation
import Testing

/// Issue 18: a frame must never wait for a timer when there is work. Frames flow at a steady rate
/// (realtime test pattern, no audio) through session → encoder → an output's thread; every sleep of
/// the session thread and of the output thread must end by a wake-up, not by its timeout with a
/// wake-up pending (a lost wake-up, which the 200–250 ms timeouts would otherwise hide as a tail).
/// Checked to fail: with `wake()` made to never write, 14 session sleeps and 17 output sleeps ended
/// late in 4 s. (A wake-up lost while frames keep coming is rescued by the next frame's wake-up and
/// ends "signalled", one period late: this test sees the timeout case, the stage timestamps of the
/// glass-to-glass benchmark see the other.)
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
        let source = SteadyVideoSource(width: 160, height: 120, framesPerSecond: 50)
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

/// A realtime video source at a steady rate: a grey yuv420p frame every period, captured on the
/// period's grid (the session clock), handed over without waiting, like a device.
final class SteadyVideoSource: CaptureSource, @unchecked Sendable {
    let name = "steady"
    let isRealtime = true
    private let width: Int
    private let height: Int
    private let period: Int64
    private let running = ManagedAtomic<Bool>(false)
    private var thread: OSThread?
    private let frame: UnsafeMutableRawPointer

    init(width: Int, height: Int, framesPerSecond: Int) {
        self.width = width
        self.height = height
        self.period = 1_000_000_000 / Int64(framesPerSecond)
        frame = .allocate(byteCount: width * height * 3 / 2, alignment: 64)
        frame.initializeMemory(as: UInt8.self, repeating: 128, count: width * height * 3 / 2)
    }

    deinit { frame.deallocate() }

    func start(into sink: SourceSink) throws {
        running.store(true, ordering: .releasing)
        let (width, height, period, running) = (width, height, period, running)
        let luma = width * height
        thread = OSThread(name: "test-flow") { [self] in
            let base = UnsafeRawPointer(frame)
            let format = MediaFormat.video(VideoFormat(pixelFormat: .yuv420p, width: width, height: height))
            var index: Int64 = 0
            while running.load(ordering: .acquiring), !sink.isStopping {
                let due = sink.startTime + index * period
                MonotonicClock.sleep(until: due)
                sink.offer(
                    CapturedBuffer(
                        format: format, captureTime: due, duration: MediaTime(nanoseconds: period),
                        planes: [
                            Plane(base: base, count: luma, bytesPerRow: width),
                            Plane(base: base + luma, count: luma / 4, bytesPerRow: width / 2),
                            Plane(base: base + luma * 5 / 4, count: luma / 4, bytesPerRow: width / 2),
                        ]))
                index += 1
            }
        }
    }

    func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        thread = nil
    }
}
