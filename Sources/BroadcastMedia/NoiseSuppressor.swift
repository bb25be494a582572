import CDenoiseShim

/// The microphone's noise suppression (`--mic-denoise`): WebRTC's noise suppressor
/// (webrtc-audio-processing, through CDenoiseShim) on planar float audio at the encoder's rate.
///
/// The library takes frames of exactly 10 ms; buffers come in any size. Samples are gathered in
/// one preallocated frame (the "ring": at most one frame is ever pending), each full frame is
/// denoised in place and its output copied to an output store that is lent on, so a buffer of any
/// size goes through with no allocation once the store has grown to the largest buffer seen.
///
/// Timestamps stay right: the suppressor delays its output by a constant number of samples
/// (`algorithmicDelay`, measured per rate: 338 at 48 kHz), so a frame's output is placed that many
/// samples before the frame's own position, and the first that many samples of a run (the
/// suppressor's initial state, not ours) are dropped. What comes out sits at the same positions as
/// what went in; it only comes later (up to one frame and the delay: 17 ms at 48 kHz), which the
/// mixer absorbs (it waits up to 200 ms for a late input).
///
/// A run ends where the input jumps (a gap, a resampler jump, a source swapped): what is pending
/// is flushed (the frame filled with silence, then more silent frames until the suppressor has
/// given back every real sample), and the next buffer starts a run of its own. `finish()` does the
/// same at the end. The suppressor keeps its noise estimate across runs.
///
/// One thread (the session's) uses it. Not Sendable.
public final class NoiseSuppressor {
    public let sampleRate: Int
    public let channelCount: Int
    /// Samples per channel in one of the library's frames (10 ms).
    public let frameSize: Int
    /// Samples the library's output lags its input, at this rate.
    public let algorithmicDelay: Int

    /// The library's delay, measured by cross-correlating a chirp in and out (webrtc-audio-processing
    /// 0.3, stereo): the rates it runs at. Other rates are refused.
    public static let delays: [Int: Int] = [8_000: 48, 16_000: 96, 32_000: 196, 44_100: 342, 48_000: 338]

    private let denoiser: OpaquePointer
    /// The frame being gathered: `channelCount` runs of `frameSize` samples.
    private let frame: UnsafeMutablePointer<Float>
    /// One pointer per channel into `frame`, as the library takes them.
    private let channelPointers: UnsafeMutablePointer<UnsafeMutablePointer<Float>?>
    /// Samples a channel gathered in `frame`.
    private var pending = 0
    /// Position of the next input sample expected (nil: no run started).
    private var nextInput: Int64?
    /// Position of the next sample the library gives back (its output for the frame gathered at
    /// position P starts at P - delay).
    private var nextOutput: Int64 = 0
    /// Output samples still to drop at the start of a run.
    private var skip = 0
    /// What `denoise` lends on.
    private let output: PlanarStorage
    private var outputCount = 0
    private var outputStart: Int64 = 0
    /// Frames the library refused (left as they were); 0 in practice.
    public private(set) var failedFrames = 0

    public struct Unsupported: Error, CustomStringConvertible {
        public let description: String
    }

    public init(sampleRate: Int, channelCount: Int) throws(Unsupported) {
        guard let delay = Self.delays[sampleRate] else {
            let rates = Self.delays.keys.sorted().map { "\(Double($0) / 1000)".replacing(".0", with: "") }
            throw Unsupported(description: "noise suppression runs at \(rates.joined(separator: ", ")) kHz, not \(sampleRate) Hz")
        }
        var error = [CChar](repeating: 0, count: 256)
        guard let denoiser = CBroadcastDenoiser_new(Int32(sampleRate), Int32(channelCount), Int32(CBroadcastDenoiserLevel_veryHigh), &error, error.count) else {
            throw Unsupported(description: String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        self.denoiser = denoiser
        self.sampleRate = sampleRate
        self.channelCount = channelCount
        frameSize = CBroadcastDenoiser_frameSize(denoiser)
        algorithmicDelay = delay
        frame = .allocate(capacity: frameSize * channelCount)
        frame.initialize(repeating: 0, count: frameSize * channelCount)
        channelPointers = .allocate(capacity: channelCount)
        for c in 0..<channelCount { (channelPointers + c).initialize(to: frame + c * frameSize) }
        // A second of output: more than any audio period, so the store does not grow in practice.
        output = PlanarStorage(channels: channelCount, capacity: sampleRate)
    }

    deinit {
        CBroadcastDenoiser_free(denoiser)
        frame.deallocate()
        channelPointers.deallocate()
    }

    /// Denoises `samples` (this suppressor's channel count), handing `body` the denoised samples
    /// that are ready, each run at its own position (lent until `body` returns): none while a
    /// frame fills, two runs when the input jumped (the end of the previous run, then the new one).
    public func denoise<E: Error>(_ samples: PlanarAudio, _ body: (PlanarAudio) throws(E) -> Void) throws(E) {
        precondition(samples.channelCount == channelCount, "\(samples.channelCount) channels into a suppressor of \(channelCount)")
        guard samples.frameCount > 0 else { return }
        if let nextInput, nextInput != samples.startSample {
            try finish(body)
        }
        if nextInput == nil {
            nextInput = samples.startSample
            nextOutput = samples.startSample - Int64(algorithmicDelay)
            skip = algorithmicDelay
            pending = 0
        }
        outputCount = 0
        var offset = 0
        while offset < samples.frameCount {
            let n = min(frameSize - pending, samples.frameCount - offset)
            for c in 0..<channelCount {
                (frame + c * frameSize + pending).update(from: samples.channel(c).baseAddress! + offset, count: n)
            }
            pending += n
            offset += n
            if pending == frameSize { processFrame(keepingUpTo: nil) }
        }
        nextInput! += Int64(samples.frameCount)
        if outputCount > 0 { try body(output.samples(startSample: outputStart, frameCount: outputCount)) }
    }

    /// Ends the run: the samples still inside (the frame gathering, the library's delay) come out,
    /// denoised, up to where the input ended. The next buffer starts a new run.
    public func finish<E: Error>(_ body: (PlanarAudio) throws(E) -> Void) throws(E) {
        guard let end = nextInput else { return }
        outputCount = 0
        while nextOutput + Int64(skip) < end {
            for c in 0..<channelCount { (frame + c * frameSize + pending).update(repeating: 0, count: frameSize - pending) }
            pending = frameSize
            processFrame(keepingUpTo: end)
        }
        nextInput = nil
        pending = 0
        if outputCount > 0 { try body(output.samples(startSample: outputStart, frameCount: outputCount)) }
    }

    /// Denoises the full frame and appends its output (less what is still to skip, and what lies
    /// at or after `limit`) to the output store.
    private func processFrame(keepingUpTo limit: Int64?) {
        if CBroadcastDenoiser_process(denoiser, channelPointers) != 0 { failedFrames += 1 }
        pending = 0
        let dropped = min(skip, frameSize)
        skip -= dropped
        var count = frameSize - dropped
        let start = nextOutput + Int64(dropped)
        nextOutput += Int64(frameSize)
        if let limit { count = max(0, min(count, Int(limit - start))) }
        guard count > 0 else { return }
        if outputCount == 0 { outputStart = start }
        output.reserve(frames: outputCount + count, keeping: outputCount)
        for c in 0..<channelCount {
            (output.channel(c).baseAddress! + outputCount).update(from: frame + c * frameSize + dropped, count: count)
        }
        outputCount += count
    }
}
