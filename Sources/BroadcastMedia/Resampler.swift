public import BroadcastKit
internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CSwResample
internal import CSwScale

extension AudioSampleFormat {
    var avSampleFormat: AVSampleFormat {
        switch self {
        case .s16: AV_SAMPLE_FMT_S16
        case .s32: AV_SAMPLE_FMT_S32
        case .f32: AV_SAMPLE_FMT_FLT
        case .f32Planar: AV_SAMPLE_FMT_FLTP
        }
    }
}

/// Converts audio buffers of one format, rate and channel count to planar float at another rate
/// and channel count (libswresample): what the mixer and the AAC encoder take.
///
/// `convert(_:at:)` also keeps the output on the buffers' timestamps. A capture device's clock runs
/// a little fast or slow against the monotonic clock (its timestamps say so: `AudioTimeline`), so
/// its samples, laid end to end, drift away from their timestamps and from the video. The converter
/// compares where each buffer's first sample should land with where the output has got to and,
/// when they part by more than `deadband`, stretches or squeezes the samples to close the gap
/// over the next half second (libswresample's compensation: its resampling filter runs at a rate
/// `correctionPPM` off nominal, at most `maximumCorrectionPPM`), without clicks, gaps or an
/// audible pitch change (1000 ppm is 1.7 cents). A jump beyond `hardLimit` (an overrun lost
/// samples, the device stalled) is not stretched: the output moves to the new position, and the
/// mixer fills the hole with silence or drops the overlap. Nor is a hole of any size left by
/// buffers lost just before (``SampleBuffer/followsLoss``: the session fell behind, a source had
/// no buffer): a lost 21 ms period is under `hardLimit`, and stretched it would hold the output
/// up to 25 ms off its timestamps and the correction at its limit, far from the drift.
///
/// Not thread-safe: one thread calls it.
public final class Resampler {
    public let input: AudioFormat
    public let outputRate: Int
    public let outputChannels: Int
    /// Largest stretch or squeeze, in parts per million of the output rate.
    public let maximumCorrectionPPM: Int
    /// Output samples of timestamp error left alone (until the output first strays beyond it).
    public let deadband: Int64
    /// Output samples of timestamp error beyond which the output jumps instead of stretching.
    public let hardLimit: Int64
    private let context: ResampleContext
    /// Planes of the input format (one when interleaved).
    private let inputPlanes: Int
    /// libswresample's input and output plane pointers, and the output's samples: made once,
    /// reused by every call.
    private let inputPointers: UnsafeMutablePointer<UnsafePointer<UInt8>?>
    private let outputPointers: UnsafeMutablePointer<UnsafeMutablePointer<UInt8>?>
    private let output: PlanarStorage
    /// Position (output samples on the media timeline) of the next sample `convert(_:at:)` returns.
    private var nextOutput: Int64?
    private var compensating = false
    /// The stretch in force: positive adds samples (the device is slow against its timestamps).
    public private(set) var correctionPPM: Double = 0
    /// Times the output jumped to a buffer's timestamp.
    public private(set) var jumps = 0
    /// Of `jumps`, those over buffers lost just before (``SampleBuffer/followsLoss``).
    public private(set) var jumpsOverLosses = 0
    /// The timestamp error (output samples) at the last buffer, as it was steered on.
    private var lastError: Int64?

    public init(
        input: AudioFormat,
        outputRate: Int,
        outputChannels: Int,
        maximumCorrectionPPM: Int = 10_000,
        deadbandSeconds: Double = 0.001,
        hardLimitSeconds: Double = 0.025
    ) throws(FFmpegError) {
        let what = "converting audio \(input) to float \(outputRate) Hz \(outputChannels) ch"
        guard input.sampleRate > 0, input.channels > 0, outputRate > 0, outputChannels > 0 else {
            throw FFmpegError.invalidArgument("rates and channel counts must be positive", what)
        }
        var inLayout = AVChannelLayout()
        var outLayout = AVChannelLayout()
        av_channel_layout_default(&inLayout, Int32(input.channels))
        av_channel_layout_default(&outLayout, Int32(outputChannels))
        defer {
            av_channel_layout_uninit(&inLayout)
            av_channel_layout_uninit(&outLayout)
        }
        var swr: OpaquePointer? = nil
        try check(
            swr_alloc_set_opts2(
                &swr, &outLayout, AV_SAMPLE_FMT_FLTP, Int32(outputRate),
                &inLayout, input.sampleFormat.avSampleFormat, Int32(input.sampleRate), 0, nil
            ),
            what
        )
        guard let swr else { throw FFmpegError.outOfMemory(what) }
        let context = ResampleContext(swr)
        try check(swr_init(swr), what)
        self.context = context
        self.input = input
        self.outputRate = outputRate
        self.outputChannels = outputChannels
        self.maximumCorrectionPPM = maximumCorrectionPPM
        self.deadband = Int64(deadbandSeconds * Double(outputRate))
        self.hardLimit = Int64(hardLimitSeconds * Double(outputRate))
        self.inputPlanes = input.sampleFormat.isPlanar ? input.channels : 1
        self.inputPointers = .allocate(capacity: inputPlanes)
        self.inputPointers.initialize(repeating: nil, count: inputPlanes)
        self.outputPointers = .allocate(capacity: outputChannels)
        self.outputPointers.initialize(repeating: nil, count: outputChannels)
        // 100 ms of output, more than a capture period; grown if a buffer ever needs more.
        self.output = PlanarStorage(channels: outputChannels, capacity: max(4096, outputRate / 10))
    }

    deinit {
        inputPointers.deallocate()
        outputPointers.deallocate()
    }

    /// Converts one buffer whose first sample belongs at `position` (in output samples on the
    /// media timeline: presentation time × output rate) and returns the output placed on the
    /// timeline: continuous with the previous call's, steered onto the timestamps (see above).
    /// A copy of what `resample(_:at:)` lends.
    public func convert(_ buffer: borrowing SampleBuffer, at position: Int64) throws(FFmpegError) -> AudioChunk {
        AudioChunk(try resample(buffer, at: position))
    }

    /// `convert(_:at:)` without the copy: the samples are lent from the resampler's own storage
    /// until its next call, so the steady state allocates nothing.
    public func resample(_ buffer: borrowing SampleBuffer, at position: Int64) throws(FFmpegError) -> PlanarAudio {
        if let nextOutput {
            // Where this buffer's first sample will come out: after what the filter still holds.
            let expected = nextOutput + swr_get_delay(context.pointer, Int64(outputRate))
            var error = position - expected
            if buffer.followsLoss, let lastError, error - lastError > deadband {
                // Buffers were lost just before this one (the session's queue was full, the source
                // had no buffer): the step in the error since the last buffer is their samples,
                // missing, not the clock's drift. Jumped (the mixer fills the hole with silence),
                // whatever its size; the error the drift had built up is kept and steered on as
                // before, so a run of losses neither stretches the audio off its timestamps nor
                // pulls the correction away from the drift.
                self.nextOutput = nextOutput + (error - lastError)
                error = lastError
                jumps += 1
                jumpsOverLosses += 1
            }
            if abs(error) > hardLimit {
                self.nextOutput = self.nextOutput! + error
                jumps += 1
                lastError = 0
            } else {
                if compensating || abs(error) > deadband {
                    try steer(by: error)
                }
                lastError = error
            }
        } else {
            nextOutput = position
            lastError = 0
        }
        var samples = try resample(buffer)
        samples.startSample = nextOutput!
        nextOutput! += Int64(samples.frameCount)
        return samples
    }

    /// Sets the compensation that closes `error` output samples over the next half second of
    /// output. Renewed with every buffer, this is a proportional controller: a steady drift of
    /// d ppm leaves the output d × 0.5 µs behind or ahead (50 µs at 100 ppm).
    private func steer(by error: Int64) throws(FFmpegError) {
        let distance = Int32(outputRate / 2)
        let limit = Int64(distance) * Int64(maximumCorrectionPPM) / 1_000_000
        let delta = Int32(max(-limit, min(limit, error)))
        // The first call switches libswresample's resampling filter on (same rates convert
        // without it until then).
        try check(swr_set_compensation(context.pointer, delta, distance), "compensating audio clock drift for \(input)")
        compensating = true
        correctionPPM = Double(delta) / Double(distance) * 1e6
    }

    /// Converts one buffer; may return fewer samples than a rate change implies (libswresample
    /// keeps some back for its filter until `drain()`).
    public func convert(_ buffer: borrowing SampleBuffer) throws(FFmpegError) -> [[Float]] {
        AudioChunk(try resample(buffer)).channels
    }

    /// `convert(_:)` lent from the resampler's storage (until its next call), at position 0.
    func resample(_ buffer: borrowing SampleBuffer) throws(FFmpegError) -> PlanarAudio {
        guard let format = buffer.audioFormat, format == input else {
            throw FFmpegError.invalidArgument("the buffer is \(buffer.format), not audio \(input)", "converting audio \(input)")
        }
        guard buffer.planes.count >= inputPlanes else {
            throw FFmpegError.invalidArgument(
                "\(format) needs \(inputPlanes) planes, got \(buffer.planes.count)", "converting audio \(input)")
        }
        for p in 0..<inputPlanes {
            inputPointers[p] = UnsafePointer(buffer.planes[p].base.assumingMemoryBound(to: UInt8.self))
        }
        return try run(input: inputPointers, count: Int32(buffer.frameCount), "converting audio \(input)")
    }

    /// The samples libswresample still holds, at the end of the stream.
    public func drain() throws(FFmpegError) -> [[Float]] {
        AudioChunk(try run(input: nil, count: 0, "draining the audio converter for \(input)")).channels
    }

    /// Converts `count` samples at `input` (nil: drain) into `output`, and lends them.
    private func run(
        input: UnsafeMutablePointer<UnsafePointer<UInt8>?>?, count: Int32, _ what: @autoclosure () -> String
    ) throws(FFmpegError) -> PlanarAudio {
        let capacity = swr_get_out_samples(context.pointer, count)
        guard capacity > 0 else {
            return output.samples(startSample: 0, frameCount: 0)
        }
        output.reserve(frames: Int(capacity))
        for c in 0..<outputChannels {
            outputPointers[c] = UnsafeMutableRawPointer(output.channel(c).baseAddress!).assumingMemoryBound(to: UInt8.self)
        }
        let produced = swr_convert(context.pointer, outputPointers, capacity, input, input == nil ? 0 : count)
        try check(produced, what())
        return output.samples(startSample: 0, frameCount: Int(produced))
    }
}
