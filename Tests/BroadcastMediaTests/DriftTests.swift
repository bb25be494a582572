import BroadcastCapture
import BroadcastKit
import BroadcastMedia
import Foundation
import Testing

/// A capture device whose clock runs `ppm` fast (positive) or slow against the monotonic clock:
/// it delivers `48 000 × (1 + ppm/10⁶)` samples per true second, a 1 kHz sine, in 10 ms periods,
/// each stamped (exactly) with the true time of its first sample.
private struct DriftingDevice {
    let ppm: Double
    let nominalRate = 48_000
    var periodFrames = 480
    var framesDelivered: Int64 = 0

    /// The true rate in samples per second.
    var trueRate: Double { Double(nominalRate) * (1 + ppm / 1e6) }

    /// The next period's samples (s16 stereo) and the position its first sample belongs at, in
    /// samples at the nominal rate on the media timeline.
    mutating func next() -> (samples: [Int16], position: Int64) {
        var samples: [Int16] = []
        samples.reserveCapacity(periodFrames * 2)
        for i in 0..<periodFrames {
            // A sine of 1 kHz in the device's own time: continuous across periods.
            let phase = 2 * Double.pi * 1000 * Double(framesDelivered + Int64(i)) / Double(nominalRate)
            let value = Int16(sin(phase) * 16_000)
            samples += [value, value]
        }
        let position = Int64((Double(framesDelivered) / trueRate * Double(nominalRate)).rounded())
        framesDelivered += Int64(periodFrames)
        return (samples, position)
    }
}

@Suite("Audio clock drift correction")
struct DriftCorrectionTests {
    private static let format = AudioFormat(sampleFormat: .s16, sampleRate: 48_000, channels: 2)

    /// One period of 16-bit samples at `position` (48 kHz ticks) through `resampler`.
    static func convert(
        _ samples: [Int16], at position: Int64, frames: Int, followsLoss: Bool = false, with resampler: Resampler
    ) throws -> AudioChunk {
        try samples.withUnsafeBytes { bytes in
            try resampler.convert(
                SampleBuffer(
                    format: .audio(format),
                    presentationTime: MediaTime(value: position, timescale: 48_000),
                    duration: MediaTime(value: Int64(frames), timescale: 48_000),
                    planes: [Plane(base: bytes.baseAddress!, count: bytes.count, bytesPerRow: bytes.count)],
                    frameCount: frames,
                    followsLoss: followsLoss
                ),
                at: position
            )
        }
    }

    /// Feeds `seconds` of a drifting device through `resampler` and reports the worst distance
    /// between a chunk's place and its timestamp after the first 5 s, whether the chunks were
    /// contiguous, and the largest step between consecutive output samples (a click shows as a jump).
    private func run(
        _ resampler: Resampler, device: inout DriftingDevice, seconds: Double
    ) throws -> (worstError: Int64, contiguous: Bool, largestStep: Float) {
        var worst: Int64 = 0
        var contiguous = true
        var previousEnd: Int64?
        var previousSample: Float?
        var largestStep: Float = 0
        while Double(device.framesDelivered) < seconds * device.trueRate {
            let (samples, position) = device.next()
            let chunk = try Self.convert(samples, at: position, frames: device.periodFrames, with: resampler)
            if let previousEnd, chunk.startSample != previousEnd { contiguous = false }
            previousEnd = chunk.endSample
            if Double(position) > 5 * 48_000 { worst = max(worst, abs(chunk.startSample - position)) }
            for value in chunk.channels[0] {
                if let previousSample, position > 4_800 { largestStep = max(largestStep, abs(value - previousSample)) }
                previousSample = value
            }
        }
        return (worst, contiguous, largestStep)
    }

    @Test("a device 1000 ppm fast stays on its timestamps for two minutes, without jumps or clicks", arguments: [1000.0, -1000.0, 100.0])
    func driftIsResampledAway(ppm: Double) throws {
        var device = DriftingDevice(ppm: ppm)
        let resampler = try Resampler(input: Self.format, outputRate: 48_000, outputChannels: 2)
        let result = try run(resampler, device: &device, seconds: 120)
        // Uncorrected, the samples laid end to end would be 120 ms (1000 ppm) off their stamps by now.
        #expect(result.worstError <= 96, "a chunk landed \(result.worstError) samples from its timestamp")
        #expect(result.contiguous)
        #expect(resampler.jumps == 0)
        // The 1 kHz sine at half scale moves at most 0.065 a sample; a dropped or repeated run would jump.
        #expect(result.largestStep < 0.1, "largest sample-to-sample step \(result.largestStep)")
        // Fast device: samples are squeezed out (negative correction), by about the drift.
        #expect(abs(resampler.correctionPPM + ppm) < max(300, abs(ppm) * 0.3), "correction \(resampler.correctionPPM) ppm")
    }

    @Test("without correction the same device walks off its timestamps and has to jump")
    func uncorrectedDriftJumps() throws {
        var device = DriftingDevice(ppm: 1000)
        let resampler = try Resampler(input: Self.format, outputRate: 48_000, outputChannels: 2, maximumCorrectionPPM: 0)
        _ = try run(resampler, device: &device, seconds: 60)
        #expect(resampler.jumps > 0)
    }

    @Test("a jump in the timestamps (an overrun lost samples) moves the output instead of stretching it")
    func overrunJumps() throws {
        let resampler = try Resampler(input: Self.format, outputRate: 48_000, outputChannels: 2)
        let silence = [Int16](repeating: 0, count: 960)
        func convert(at position: Int64) throws -> AudioChunk {
            try Self.convert(silence, at: position, frames: 480, with: resampler)
        }
        #expect(try convert(at: 0).startSample == 0)
        #expect(try convert(at: 480).startSample == 480)
        // 100 ms lost.
        #expect(try convert(at: 960 + 4_800).startSample == 960 + 4_800)
        #expect(resampler.jumps == 1)
        #expect(resampler.correctionPPM == 0)
    }

    /// The VM's drift section on a starved guest: snd-aloop's capture clock 0.5 % slow, in ALSA's
    /// 1024-frame periods (21 ms: a lost one is a hole under the 25 ms hard limit), and the session
    /// too slow to take every period (`lostEvery`: one in so many lost, as its queue full dropped
    /// them; the next delivered says so). Every chunk must land on its timestamp, jump once per
    /// hole, and the correction must still be the drift's. (Before lost periods were jumped, the
    /// holes were stretched at the 10 000 ppm limit or, added up past 25 ms, jumped: chunks up to
    /// 25 ms off their timestamps, the correction at its limit or anywhere.)
    @Test("periods lost before the handler are jumped, and the drift is still resampled away", arguments: [2, 3, 5, 11])
    func lostPeriodsAreJumpedNotStretched(lostEvery: Int) throws {
        var device = DriftingDevice(ppm: -5000)
        device.periodFrames = 1024
        let resampler = try Resampler(input: Self.format, outputRate: 48_000, outputChannels: 2)
        var period = 0
        var lost = 0
        var lostBefore = false
        var worst: Int64 = 0
        var contiguous = true
        var previousEnd: Int64?
        while Double(device.framesDelivered) < 14 * device.trueRate {
            let (samples, position) = device.next()
            period += 1
            // A second of steady capture first (as the recordings start), then the losses.
            if period > 50, period % lostEvery == 0 {
                lost += 1
                lostBefore = true
                previousEnd = nil
                continue
            }
            let chunk = try Self.convert(samples, at: position, frames: device.periodFrames, followsLoss: lostBefore, with: resampler)
            // Between losses the output runs on without a break.
            if let previousEnd, chunk.startSample != previousEnd { contiguous = false }
            previousEnd = chunk.endSample
            lostBefore = false
            if period > 100 { worst = max(worst, abs(chunk.startSample - position)) }
        }
        #expect(lost > 50)
        #expect(contiguous)
        #expect(resampler.jumps == lost, "\(resampler.jumps) jumps for \(lost) holes")
        #expect(resampler.jumpsOverLosses == lost)
        // The proportional controller's steady error at 5000 ppm is 120 samples (2.5 ms); the
        // hard limit alone would have let a chunk drift up to 1200 (25 ms).
        #expect(worst <= 240, "a chunk landed \(worst) samples from its timestamp")
        #expect(abs(resampler.correctionPPM - 5000) < 1000, "correction \(resampler.correctionPPM) ppm")
    }

    /// The VM's drift section on a starved guest, the whole chain: the device's observed times
    /// (±2 ms of jitter) through the ALSA timeline, its stamps through the resampler, and a session
    /// whose queue fills (the ring keeps 64 periods, and `phase` more arrive) and then takes runs of
    /// 3 periods with 7 lost between them (r4's guest: 301 of 1002 delivered, 93 holes). The holes
    /// are jumped and the error the drift built up kept across them, so only the runs steer the
    /// correction: a timeline that stepped 20 ms onto its fit at 4 s put the step in a run's error
    /// whenever it landed in one (the phases here place it everywhere in the cycle), and the
    /// correction stayed at its 10 000 ppm limit to the end.
    @Test("the ALSA timeline's stamps keep a starved session's correction on the drift", arguments: 0..<10)
    func timelineStampsKeepTheCorrectionThroughLosses(phase: Int) throws {
        var device = DriftingDevice(ppm: -5000)
        device.periodFrames = 1024
        var timeline = AudioTimeline(sampleRate: 48_000)
        let resampler = try Resampler(input: Self.format, outputRate: 48_000, outputChannels: 2)
        var generator = SystemRandomNumberGenerator()
        var period = 0
        var lost = 0
        var lostBefore = false
        var worst: Int64 = 0
        while Double(device.framesDelivered) < 14 * device.trueRate {
            let (samples, truePosition) = device.next()
            period += 1
            let truth = truePosition * 1_000_000_000 / 48_000
            let observed = 1_000_000_000 + truth + Int64.random(in: -2_000_000...2_000_000, using: &generator)
            let stamp = timeline.place(frames: device.periodFrames, observedTime: observed) - 1_000_000_000
            if period > 64 + phase, (period - 65 - phase) % 10 >= 3 {
                lost += 1
                lostBefore = true
                continue
            }
            let position = stamp * 48_000 / 1_000_000_000
            let chunk = try Self.convert(samples, at: position, frames: device.periodFrames, followsLoss: lostBefore, with: resampler)
            lostBefore = false
            if period > 300 { worst = max(worst, abs(chunk.startSample - truePosition)) }
        }
        #expect(lost > 300)
        #expect(timeline.reanchorCount == 0)
        #expect(resampler.jumps == resampler.jumpsOverLosses, "\(resampler.jumps) jumps, \(resampler.jumpsOverLosses) over holes")
        // On the device's true times to the end, within the controller's steady error and the
        // stamps' jitter left after the fit (120 samples + 1 ms).
        #expect(worst <= 240, "a chunk landed \(worst) samples from the device's true time")
        #expect(abs(resampler.correctionPPM - 5000) < 1000, "correction \(resampler.correctionPPM) ppm")
    }

    @Test("a buffer said to follow a loss but on time is not jumped")
    func followsLossWithoutAHoleIsNotAJump() throws {
        var device = DriftingDevice(ppm: -5000)
        device.periodFrames = 1024
        let resampler = try Resampler(input: Self.format, outputRate: 48_000, outputChannels: 2)
        var period = 0
        while Double(device.framesDelivered) < 4 * device.trueRate {
            let (samples, position) = device.next()
            period += 1
            _ = try Self.convert(samples, at: position, frames: device.periodFrames, followsLoss: period % 3 == 0, with: resampler)
        }
        #expect(resampler.jumps == 0)
        #expect(abs(resampler.correctionPPM - 5000) < 1000, "correction \(resampler.correctionPPM) ppm")
    }
}
