import BroadcastCapture
import BroadcastKit
import Testing

/// Finds, in what the session delivers, the media times of white frames and of beep onsets.
final class SyncProbe: BroadcastSampleHandler {
    var flashTimes: [Int64] = []
    var beepTimes: [Int64] = []
    var videoFrames = 0
    var audioFrames = 0
    private var previousSample: Int16 = 0
    private var silentRun = 1_000_000

    func broadcastStarted(setupInfo: SetupInfo) throws {}
    func broadcastFinished() {}

    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        let pts = buffer.presentationTime.nanoseconds!
        if let video = buffer.videoFormat {
            videoFrames += 1
            let luma = buffer.planes[0]
            var sum = 0
            let bytes = luma.bytes
            for y in stride(from: 0, to: video.height, by: 4) {
                for x in stride(from: 0, to: video.width, by: 4) { sum += Int(bytes[y * luma.bytesPerRow + x]) }
            }
            let mean = sum / ((video.height / 4) * (video.width / 4))
            if mean > 250 { flashTimes.append(pts) }
        } else if let audio = buffer.audioFormat {
            #expect(audio.sampleFormat == .s16 && audio.sampleRate == 48_000 && audio.channels == 2)
            let samples = buffer.planes[0].bytes.assumingMemoryBound(to: Int16.self)
            for frame in 0..<buffer.frameCount {
                let s = samples[frame * audio.channels]
                // A beep starts where sound follows at least 100 ms of silence.
                if s != 0 && silentRun > 4800 {
                    beepTimes.append(pts + Int64(frame) * 1_000_000_000 / 48_000)
                }
                silentRun = s == 0 ? silentRun + 1 : 0
            }
            audioFrames += buffer.frameCount
        }
    }
}

@Suite struct TestSourceTests {
    @Test(arguments: [(30, 1), (25, 1), (30000, 1001), (60, 1)])
    func flashFramesAndBeepsLandOnTheSameMediaTimes(rate: (Int, Int)) throws {
        let probe = SyncProbe()
        let session = BroadcastSession(
            handler: probe,
            sources: [
                (.video, TestPatternSource(width: 320, height: 180, frameRate: (rate.0, rate.1), realtime: false)),
                (.audioMic, ToneSource(realtime: false)),
            ],
            options: SessionOptions(duration: MediaTime(value: 4, timescale: 1))
        )
        let summary = try session.run()
        #expect(summary.reason == .durationReached)
        let frameNs = Int64(1_000_000_000) * Int64(rate.1) / Int64(rate.0)
        #expect(probe.flashTimes.count == 4)
        #expect(probe.beepTimes.count == 4)
        for (second, (flash, beep)) in zip(probe.flashTimes, probe.beepTimes).enumerated() {
            #expect(abs(beep - Int64(second) * 1_000_000_000) < 20_834, "beep \(second) at \(beep) ns, more than a sample off")
            #expect(flash >= beep - 20_834 && flash - beep < frameNs, "white frame \(second) at \(flash) ns, beep at \(beep) ns")
        }
        // Exactly the requested media: 4 s of frames, 4 s of samples.
        #expect(probe.videoFrames == Int((4 * Int64(rate.0) + Int64(rate.1) - 1) / Int64(rate.1)))
        #expect(probe.audioFrames == 4 * 48_000)
    }

    @Test func realtimeSourcesArePacedByTheClock() throws {
        let probe = SyncProbe()
        let clock = MonotonicClock()
        let before = clock.now()
        let session = BroadcastSession(
            handler: probe,
            sources: [
                (.video, TestPatternSource(width: 160, height: 90, frameRate: (30, 1))),
                (.audioApp, ToneSource()),
            ],
            options: SessionOptions(duration: MediaTime(value: 1, timescale: 1))
        )
        _ = try session.run()
        // Media time cannot run ahead of the wall clock for a realtime source.
        #expect(clock.now() - before >= 1_000_000_000)
        #expect(probe.videoFrames == 30)
        #expect(probe.audioFrames == 48_000)
    }
}
