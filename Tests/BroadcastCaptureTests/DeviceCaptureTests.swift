import BroadcastCapture
import BroadcastKit
import Testing

/// Pure parts of the V4L2 and ALSA sources: format mapping, plane layout, clock mapping, drift.
/// The devices themselves are tested in the VM (vm/guest-tests.sh, `make vm-test`).
@Suite struct V4L2FormatTests {
    @Test func fourCCRoundTrips() {
        #expect(FourCC("YUYV")!.rawValue == 0x5659_5559)
        #expect(FourCC.yuyv.description == "YUYV")
        #expect(FourCC("Y10")!.description == "Y10")
        #expect(FourCC("TOOLONG") == nil)
        #expect(FourCC("") == nil)
    }

    @Test func pixelFormatsMapOntoSampleBufferFormats() {
        #expect(V4L2PixelFormats.pixelFormat(for: .yuyv) == .yuyv422)
        #expect(V4L2PixelFormats.pixelFormat(for: .uyvy) == .uyvy422)
        #expect(V4L2PixelFormats.pixelFormat(for: .nv12) == .nv12)
        #expect(V4L2PixelFormats.pixelFormat(for: .yu12) == .yuv420p)
        #expect(V4L2PixelFormats.pixelFormat(for: .rgb3) == .rgb24)
        #expect(V4L2PixelFormats.pixelFormat(for: .bgr3) == .bgr24)
        // XR24 (V4L2_PIX_FMT_XBGR32) is B G R X in memory: FFmpeg's bgr0.
        #expect(V4L2PixelFormats.pixelFormat(for: .xr24) == .bgr0)
        #expect(V4L2PixelFormats.pixelFormat(for: .grey) == .gray8)
        #expect(V4L2PixelFormats.pixelFormat(for: .mjpg) == .mjpeg)
        #expect(V4L2PixelFormats.pixelFormat(for: FourCC("NV21")!) == nil)
        // MJPEG is captured (decoded by the encoder side) but is not an uncompressed format.
        #expect(!V4L2PixelFormats.isUncompressed(.mjpg))
        #expect(V4L2PixelFormats.isUsable(.mjpg))
        #expect(V4L2PixelFormats.preferred.allSatisfy(V4L2PixelFormats.isUncompressed))
        #expect(V4L2PixelFormats.preferred.first == .yuyv)
    }

    @Test func formatNamesParse() {
        #expect(V4L2PixelFormats.parse("yuyv") == .yuyv)
        #expect(V4L2PixelFormats.parse("I420") == .yu12)
        #expect(V4L2PixelFormats.parse("rgb24") == .rgb3)
        #expect(V4L2PixelFormats.parse("XRGB32") == .xr24)
        #expect(V4L2PixelFormats.parse("MJPEG") == .mjpg)
        #expect(V4L2PixelFormats.parse("NV21") == FourCC("NV21"))
        #expect(V4L2PixelFormats.parse("not a format") == nil)
    }

    @Test func planarLayoutsFollowTheDriversStride() {
        // YU12 320x180 with a padded 384-byte luma stride: chroma stride is half, rows half.
        let yu12 = V4L2PixelFormats.planeLayout(.yuv420p, width: 320, height: 180, bytesPerLine: 384, sizeImage: 384 * 270)
        #expect(yu12.map(\.offset) == [0, 384 * 180, 384 * 180 + 192 * 90])
        #expect(yu12.map(\.bytesPerRow) == [384, 192, 192])
        #expect(yu12.map(\.count) == [384 * 180, 192 * 90, 192 * 90])
        let nv12 = V4L2PixelFormats.planeLayout(.nv12, width: 320, height: 180, bytesPerLine: 320, sizeImage: 320 * 270)
        #expect(nv12.map(\.offset) == [0, 320 * 180])
        #expect(nv12.map(\.bytesPerRow) == [320, 320])
        #expect(nv12.map(\.count) == [320 * 180, 320 * 90])
        let yuyv = V4L2PixelFormats.planeLayout(.yuyv422, width: 320, height: 180, bytesPerLine: 640, sizeImage: 640 * 180)
        #expect(yuyv.count == 1 && yuyv[0].count == 640 * 180 && yuyv[0].bytesPerRow == 640)
    }

    @Test func frameSizesMatchDiscreteAndStepwise() {
        #expect(V4L2FrameSize.discrete(width: 320, height: 180).contains(width: 320, height: 180))
        #expect(!V4L2FrameSize.discrete(width: 320, height: 180).contains(width: 320, height: 240))
        let stepwise = V4L2FrameSize.stepwise(minWidth: 16, maxWidth: 1920, stepWidth: 2, minHeight: 16, maxHeight: 1080, stepHeight: 2)
        #expect(stepwise.contains(width: 1000, height: 1000))
        #expect(!stepwise.contains(width: 1001, height: 1000))
        #expect(!stepwise.contains(width: 4096, height: 1000))
        #expect(stepwise.description == "16x16 to 1920x1080 in steps of 2x2")
        #expect(V4L2Fraction(2, 25).rateText == "12.5")
        #expect(V4L2Fraction(1, 25).rateText == "25")
    }
}

@Suite struct DeviceClockTests {
    @Test func monotonicBufferStampsAreUsedAsIs() {
        let now: Int64 = 50_000_000_000
        #expect(DeviceTimestamps.videoCaptureTime(bufferTimestamp: now - 30_000_000, isMonotonic: true, dequeuedAt: now) == now - 30_000_000)
        // Not monotonic, from the future, too old, or missing: the dequeue time stands in.
        #expect(DeviceTimestamps.videoCaptureTime(bufferTimestamp: now - 30_000_000, isMonotonic: false, dequeuedAt: now) == now)
        #expect(DeviceTimestamps.videoCaptureTime(bufferTimestamp: now + 50_000_000, isMonotonic: true, dequeuedAt: now) == now)
        #expect(DeviceTimestamps.videoCaptureTime(bufferTimestamp: now - 2_000_000_000, isMonotonic: true, dequeuedAt: now) == now)
        #expect(DeviceTimestamps.videoCaptureTime(bufferTimestamp: 0, isMonotonic: true, dequeuedAt: now) == now)
    }

    @Test func audioStatusStampGivesTheFirstFramesTime() {
        // 1024 frames read, 512 more waiting, status taken at t: the first frame was 1536 frames before t.
        let t: Int64 = 10_000_000_000
        #expect(DeviceTimestamps.audioCaptureTime(statusTime: t, framesRead: 1024, framesAvailable: 512, sampleRate: 48_000) == t - 32_000_000)
    }

    @Test func timelineCountsSamplesThroughJitter() {
        var timeline = AudioTimeline(sampleRate: 48_000)
        let start: Int64 = 1_000_000_000
        #expect(timeline.place(frames: 480, observedTime: start) == start)
        // Observed stamps jitter by ±2 ms; the timeline stays on the sample count (within the
        // microseconds a young fit, weighing little, moves it: `timelineMovesOntoTheFittedLine…`).
        #expect(abs(timeline.place(frames: 480, observedTime: start + 12_000_000) - (start + 10_000_000)) < 50_000)
        #expect(abs(timeline.place(frames: 480, observedTime: start + 18_000_000) - (start + 20_000_000)) < 50_000)
        #expect(timeline.reanchorCount == 0)
    }

    @Test func timelineReanchorsWhenSamplesWereLost() {
        var timeline = AudioTimeline(sampleRate: 48_000)
        _ = timeline.place(frames: 480, observedTime: 0)
        _ = timeline.place(frames: 480, observedTime: 10_000_000)
        // 100 ms of samples were lost without an overrun being reported: the count goes on while
        // it could be a stall, and moves to the device's time once the gap has lasted 300 ms.
        var t: Int64 = 120_000_000
        var stamps: [Int64] = []
        while t <= 440_000_000 {
            stamps.append(timeline.place(frames: 480, observedTime: t))
            t += 10_000_000
        }
        #expect(stamps.first == 20_000_000)
        #expect(timeline.reanchorCount == 1)
        #expect(stamps.last == 440_000_000)
        #expect(timeline.place(frames: 480, observedTime: 450_000_000) == 450_000_000)
    }

    @Test func timelineStartsAgainAfterARestart() {
        var timeline = AudioTimeline(sampleRate: 48_000)
        _ = timeline.place(frames: 480, observedTime: 0)
        _ = timeline.place(frames: 480, observedTime: 10_000_000)
        // An overrun the device reported: the next run starts where the device says it does.
        timeline.restart()
        #expect(timeline.place(frames: 480, observedTime: 120_000_000) == 120_000_000)
        #expect(timeline.place(frames: 480, observedTime: 130_000_000) == 130_000_000)
    }

    @Test func timelineCountsThroughAStall() {
        // A starved machine, or snd-aloop's position following a late kernel tick: for 150 ms the
        // device's time reads 60 ms late, then right again. The stamps stay on the count (no step
        // either way) and the drift measured is the device's, not the stall's.
        var timeline = AudioTimeline(sampleRate: 48_000)
        var frames: Int64 = 0
        var previous: Int64?
        var worstStep: Int64 = 0
        for i in 0..<1000 {
            let truth = frames * 1_000_000_000 / 48_000
            let stalled = (300..<315).contains(i) || (700..<712).contains(i)
            let stamp = timeline.place(frames: 480, observedTime: truth + (stalled ? 60_000_000 : 0))
            if let previous { worstStep = max(worstStep, abs(stamp - previous - 10_000_000)) }
            previous = stamp
            frames += 480
        }
        #expect(timeline.reanchorCount == 0)
        #expect(worstStep < 100_000, "a step of \(worstStep) ns beyond the 10 ms period")
        let drift = try! #require(timeline.driftPPM)
        #expect(abs(drift) < 5, "measured \(drift) ppm")
    }

    @Test func timelineKeepsTimeAcrossASkippedRun() {
        var timeline = AudioTimeline(sampleRate: 48_000)
        _ = timeline.place(frames: 480, observedTime: 0)
        timeline.skip(frames: 480)  // read and dropped
        #expect(timeline.place(frames: 480, observedTime: 20_000_000) == 20_000_000)
    }

    @Test func driftIsMeasuredInPartsPerMillion() {
        // A device 100 ppm fast: 48 004.8 frames per monotonic second.
        var timeline = AudioTimeline(sampleRate: 48_000, toleranceNanoseconds: 1_000_000_000)
        var frames: Int64 = 0
        var measured: Double?
        for _ in 0..<1000 {
            let observed = frames * 1_000_000_000_000 / 48_004_800  // when this frame really happened
            _ = timeline.place(frames: 480, observedTime: observed)
            frames += 480
            measured = timeline.driftPPM
        }
        let drift = try! #require(measured)
        #expect(abs(drift - 100) < 2, "measured \(drift) ppm")
    }

    @Test func timelineMovesOntoTheFittedLineWithoutAStep() {
        // snd-aloop's capture clock 0.5 % slow, as the VM's drift section runs it, in ALSA's
        // 1024-frame periods observed with up to ±2 ms of jitter. Counted at the nominal rate the
        // stamps part from the device's times by 5 ms a second; the timeline must bring them onto
        // its fitted line without a step (it once stamped at the nominal rate for 4 s and then
        // stepped 20 ms onto the fit, which the resampler took for an error to steer out).
        var timeline = AudioTimeline(sampleRate: 48_000)
        var frames: Int64 = 0
        var generator = SystemRandomNumberGenerator()
        var previousStamp: Int64?
        var previousStep: Int64?
        var worstStepChange: Int64 = 0
        var worstAfterMeasuring: Int64 = 0
        while frames < 10 * 47_760 {
            let truth = Int64((Double(frames) * 1e9 / 47_760).rounded())
            let observed = truth + Int64.random(in: -2_000_000...2_000_000, using: &generator)
            let stamp = timeline.place(frames: 1024, observedTime: observed)
            if let previousStamp {
                let step = stamp - previousStamp
                if let previousStep { worstStepChange = max(worstStepChange, abs(step - previousStep)) }
                previousStep = step
            }
            previousStamp = stamp
            if timeline.driftPPM != nil { worstAfterMeasuring = max(worstAfterMeasuring, abs(stamp - truth)) }
            frames += 1024
        }
        #expect(timeline.reanchorCount == 0)
        // A period is 21.3 ms at the nominal rate and 21.4 ms at the device's: the stamps' step
        // moves from one to the other a little at a time (about 0.1 ms at worst, while the fit is
        // young; the resampler leaves 1 ms alone), never by the 20 ms of a switch.
        #expect(worstStepChange < 500_000, "consecutive periods' steps differed by up to \(worstStepChange) ns")
        #expect(worstAfterMeasuring < 1_000_000, "once measured, stamps strayed \(worstAfterMeasuring) ns from the device's times")
        let drift = try! #require(timeline.driftPPM)
        #expect(abs(drift + 5000) < 50, "measured \(drift) ppm")
    }

    @Test func timelineFollowsADriftingDeviceWithoutJumps() {
        // A device 1000 ppm fast, observed with up to ±2 ms of jitter, for ten minutes. Counting at
        // the nominal rate would part from the monotonic clock by 30 ms every 30 s and jump back;
        // counting at the measured rate stays on the device's true times, and smooth.
        var timeline = AudioTimeline(sampleRate: 48_000)
        var frames: Int64 = 0
        var generator = SystemRandomNumberGenerator()
        var worst: Int64 = 0
        var previousStep: Int64?
        var worstStepChange: Int64 = 0
        var previousStamp: Int64?
        for _ in 0..<(600 * 100) {
            let truth = Int64((Double(frames) * 1e9 / 48_048).rounded())
            let observed = truth + Int64.random(in: -2_000_000...2_000_000, using: &generator)
            let stamp = timeline.place(frames: 480, observedTime: observed)
            if truth > 10_000_000_000 { worst = max(worst, abs(stamp - truth)) }
            if let previousStamp {
                let step = stamp - previousStamp
                if let previousStep, truth > 10_000_000_000 { worstStepChange = max(worstStepChange, abs(step - previousStep)) }
                previousStep = step
            }
            previousStamp = stamp
            frames += 480
        }
        #expect(timeline.reanchorCount == 0)
        #expect(worst < 1_000_000, "stamps strayed \(worst) ns from the device's true times")
        #expect(worstStepChange < 100_000, "consecutive 10 ms steps differed by up to \(worstStepChange) ns")
        let drift = try! #require(timeline.driftPPM)
        #expect(abs(drift - 1000) < 5, "measured \(drift) ppm")
    }
}
