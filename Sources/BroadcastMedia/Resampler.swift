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
/// Not thread-safe: one thread calls it.
public final class Resampler {
    public let input: AudioFormat
    public let outputRate: Int
    public let outputChannels: Int
    private let context: ResampleContext

    public init(input: AudioFormat, outputRate: Int, outputChannels: Int) throws(FFmpegError) {
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
    }

    /// Converts one buffer; may return fewer samples than a rate change implies (libswresample
    /// keeps some back for its filter until `drain()`).
    public func convert(_ buffer: borrowing SampleBuffer) throws(FFmpegError) -> [[Float]] {
        let what = "converting audio \(input)"
        guard let format = buffer.audioFormat, format == input else {
            throw FFmpegError.invalidArgument("the buffer is \(buffer.format), not audio \(input)", what)
        }
        let planes = format.sampleFormat.isPlanar ? format.channels : 1
        guard buffer.planes.count >= planes else {
            throw FFmpegError.invalidArgument("\(format) needs \(planes) planes, got \(buffer.planes.count)", what)
        }
        var pointers: [UnsafePointer<UInt8>?] = buffer.planes.prefix(planes).map {
            $0.base.assumingMemoryBound(to: UInt8.self)
        }
        return try run(input: &pointers, count: Int32(buffer.frameCount), what)
    }

    /// The samples libswresample still holds, at the end of the stream.
    public func drain() throws(FFmpegError) -> [[Float]] {
        var none: [UnsafePointer<UInt8>?] = []
        return try run(input: &none, count: 0, "draining the audio converter for \(input)")
    }

    private func run(input: inout [UnsafePointer<UInt8>?], count: Int32, _ what: String) throws(FFmpegError)
        -> [[Float]]
    {
        let capacity = swr_get_out_samples(context.pointer, count)
        guard capacity > 0 else { return Array(repeating: [], count: outputChannels) }
        let storage = UnsafeMutablePointer<Float>.allocate(capacity: Int(capacity) * outputChannels)
        defer { storage.deallocate() }
        var outputs: [UnsafeMutablePointer<UInt8>?] = (0..<outputChannels).map {
            UnsafeMutableRawPointer(storage + $0 * Int(capacity)).assumingMemoryBound(to: UInt8.self)
        }
        let produced: Int32
        if input.isEmpty {
            produced = swr_convert(context.pointer, &outputs, capacity, nil, 0)
        } else {
            produced = swr_convert(context.pointer, &outputs, capacity, &input, count)
        }
        try check(produced, what)
        return (0..<outputChannels).map {
            Array(UnsafeBufferPointer(start: storage + $0 * Int(capacity), count: Int(produced)))
        }
    }
}
