public import BroadcastKit
internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CSwResample
internal import CSwScale
public import Logging

/// What to encode audio as.
public struct AudioEncoderSettings: Sendable, Hashable {
    /// An FFmpeg encoder taking planar float: "aac" (FFmpeg's native AAC, the default).
    public var encoder: String
    public var sampleRate: Int
    public var channels: Int
    /// Bits per second.
    public var bitrate: Int

    public init(encoder: String = "aac", sampleRate: Int = 48_000, channels: Int = 2, bitrate: Int = 128_000) {
        self.encoder = encoder
        self.sampleRate = sampleRate
        self.channels = channels
        self.bitrate = bitrate
    }
}

/// Encodes audio to AAC packets.
///
/// Input is planar float at the encoder's rate and channel count (`encode(_: AudioChunk)`, what
/// `AudioMixer` produces), or sample buffers of any format (`encode(_: SampleBuffer)`, converted by
/// a `Resampler`). Samples are collected in an AVAudioFifo and sent in frames of the encoder's
/// `frame_size`. Time base: 1/sample rate; the first pts is the first chunk's position, then pts
/// counts samples, so the audio has no timestamp jitter.
///
/// Not thread-safe: one thread (the session's) calls it.
public final class AudioEncoder {
    public let settings: AudioEncoderSettings
    public let stream: StreamDescription
    public let streamIndex: Int
    /// Samples per encoded frame (1024 for AAC).
    public let frameSize: Int
    private let logger: Logger
    private let context: CodecContext
    private let fifo: AudioFIFO
    private let smallLastFrame: Bool
    /// Position of the FIFO's first sample.
    private var fifoStart: Int64?
    private var flushed = false
    private var resampler: Resampler?
    private let ownMixer: AudioMixer
    /// The frame every encoded frame is read into, with a buffer for `frameSize` samples.
    private let frame: Frame
    /// The FIFO's plane pointers for a write (one per channel), made once.
    private let channelPointers: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    /// A frame of silence, written in pieces to fill a gap.
    private let silence: PlanarStorage
    /// For an encoder of interleaved samples: the planar frame read from the FIFO before it is
    /// interleaved into `frame`. nil: the encoder takes planar samples, read straight into `frame`.
    private let planar: PlanarStorage?
    /// What an error says the encoder was doing (made once, not per call).
    private let encoding: String
    public private(set) var framesEncoded = 0

    public init(
        settings: AudioEncoderSettings = AudioEncoderSettings(),
        globalHeader: Bool,
        streamIndex: Int = 1,
        logger: Logger
    ) throws(FFmpegError) {
        let what = "opening audio encoder \(settings.encoder)"
        guard settings.sampleRate > 0, settings.channels > 0, settings.bitrate > 0 else {
            throw FFmpegError.invalidArgument("sample rate, channels and bitrate must be positive", what)
        }
        guard let codec = avcodec_find_encoder_by_name(settings.encoder), codec.pointee.type == AVMEDIA_TYPE_AUDIO
        else {
            throw FFmpegError(code: CBroadcastShimBridge.encoderNotFound, operation: what)
        }
        var takesPlanarFloat = false
        var takesFloat = false
        if var format = codec.pointee.sample_fmts {
            while format.pointee != AV_SAMPLE_FMT_NONE {
                if format.pointee == AV_SAMPLE_FMT_FLTP { takesPlanarFloat = true }
                if format.pointee == AV_SAMPLE_FMT_FLT { takesFloat = true }
                format += 1
            }
        }
        // Planar float as the mixer makes it; or interleaved float (libopus), interleaved per frame.
        guard takesPlanarFloat || takesFloat else {
            throw FFmpegError.invalidArgument("\(settings.encoder) does not take float samples", what)
        }
        let sampleFormat = takesPlanarFloat ? AV_SAMPLE_FMT_FLTP : AV_SAMPLE_FMT_FLT
        let context = try CodecContext(codec: codec)
        let c = context.pointer
        c.pointee.sample_fmt = sampleFormat
        c.pointee.sample_rate = Int32(settings.sampleRate)
        av_channel_layout_default(&c.pointee.ch_layout, Int32(settings.channels))
        c.pointee.bit_rate = Int64(settings.bitrate)
        c.pointee.time_base = AVRational(num: 1, den: Int32(settings.sampleRate))
        if globalHeader { c.pointee.flags |= Int32(AV_CODEC_FLAG_GLOBAL_HEADER) }
        try check(avcodec_open2(c, codec, nil), what)

        let frameSize = c.pointee.frame_size > 0 ? Int(c.pointee.frame_size) : 1024
        self.frameSize = frameSize
        self.smallLastFrame = codec.pointee.capabilities & Int32(AV_CODEC_CAP_SMALL_LAST_FRAME) != 0
        self.fifo = try AudioFIFO(
            format: AV_SAMPLE_FMT_FLTP, channels: Int32(settings.channels), capacity: Int32(frameSize * 4))
        self.stream = StreamDescription(
            parameters: try CodecParameters(context: c),
            timeBase: Rational(c.pointee.time_base)
        )
        self.context = context
        self.settings = settings
        self.streamIndex = streamIndex
        self.logger = logger
        self.ownMixer = AudioMixer(channelCount: settings.channels, sampleRate: settings.sampleRate, expectedInputs: 1)
        let frame = try Frame()
        let f = frame.pointer
        f.pointee.nb_samples = Int32(frameSize)
        f.pointee.format = sampleFormat.rawValue
        f.pointee.sample_rate = c.pointee.sample_rate
        try check(av_channel_layout_copy(&f.pointee.ch_layout, &c.pointee.ch_layout), what)
        try check(av_frame_get_buffer(f, 0), what)
        self.frame = frame
        self.planar = takesPlanarFloat ? nil : PlanarStorage(channels: settings.channels, capacity: frameSize)
        self.channelPointers = .allocate(capacity: settings.channels)
        self.channelPointers.initialize(repeating: nil, count: settings.channels)
        self.silence = PlanarStorage(channels: settings.channels, capacity: frameSize)
        self.encoding = "encoding audio with \(settings.encoder)"
        logger.debug(
            "opened audio encoder",
            metadata: [
                "encoder": "\(settings.encoder)", "rate": "\(settings.sampleRate)", "frame_size": "\(frameSize)",
            ]
        )
    }

    deinit { channelPointers.deallocate() }

    /// Encodes one audio sample buffer of any format, placed by its presentation time.
    public func encode(_ buffer: borrowing SampleBuffer) throws(FFmpegError) -> [EncodedPacket] {
        guard let format = buffer.audioFormat else {
            throw FFmpegError.invalidArgument("the buffer holds video", encoding)
        }
        if resampler?.input != format {
            resampler = try Resampler(input: format, outputRate: settings.sampleRate, outputChannels: settings.channels)
        }
        var samples = try resampler!.resample(buffer)
        samples.startSample = buffer.presentationTime.rescaled(to: Int32(settings.sampleRate)).value
        ownMixer.append(samples, from: .audioMic)
        guard let mixed = ownMixer.mixed() else { return [] }
        return try encode(mixed)
    }

    /// Encodes planar float samples at the encoder's rate and channel count. The first chunk's
    /// position sets the stream's first pts; later chunks should follow on without a gap (a gap is
    /// filled with silence, an overlap dropped).
    public func encode(_ chunk: AudioChunk) throws(FFmpegError) -> [EncodedPacket] {
        guard !flushed else { throw FFmpegError.invalidArgument("the encoder was flushed", encoding) }
        guard chunk.channels.count == settings.channels else {
            throw FFmpegError.invalidArgument("\(chunk.channels.count) channels, expected \(settings.channels)", encoding)
        }
        return try chunk.withPlanarAudio { samples throws(FFmpegError) in try encode(samples) }
    }

    /// `encode(_: AudioChunk)` of lent samples (`AudioMixer.mixed(final:)`'s): allocates nothing
    /// of its own; the packets it returns are the encoder's (an `EncodedPacket` and libavcodec's
    /// packet and frame references for each).
    public func encode(_ samples: PlanarAudio) throws(FFmpegError) -> [EncodedPacket] {
        guard !flushed else { throw FFmpegError.invalidArgument("the encoder was flushed", encoding) }
        guard samples.channelCount == settings.channels else {
            throw FFmpegError.invalidArgument("\(samples.channelCount) channels, expected \(settings.channels)", encoding)
        }
        if fifoStart == nil { fifoStart = samples.startSample }
        let expected = fifoStart! + Int64(fifo.count)
        var samples = samples
        if samples.startSample > expected {
            let gap = Int(samples.startSample - expected)
            logger.debug("audio gap of \(gap) samples filled with silence")
            try writeSilence(gap)
        } else if samples.startSample < expected {
            samples = samples.dropping(first: Int(min(Int64(samples.frameCount), expected - samples.startSample)))
        }
        try write(samples)
        var packets: [EncodedPacket] = []
        while Int(fifo.count) >= frameSize {
            try sendFrame(samples: frameSize, into: &packets, encoding)
        }
        return packets
    }

    /// Encodes what is left (the last frame short or padded with silence) and drains the encoder.
    public func flush() throws(FFmpegError) -> [EncodedPacket] {
        guard !flushed else { return [] }
        let what = "flushing audio encoder \(settings.encoder)"
        var packets: [EncodedPacket] = []
        if let resampler {
            let rest = try resampler.drain()
            if let position = fifoStart.map({ $0 + Int64(fifo.count) }), !(rest.first?.isEmpty ?? true) {
                ownMixer.append(rest, at: position, from: .audioMic)
            }
        }
        if let chunk = ownMixer.mixed(final: true) { packets += try encode(chunk) }
        flushed = true
        while fifo.count > 0 {
            try sendFrame(samples: min(Int(fifo.count), frameSize), into: &packets, what)
        }
        try send(nil, into: &packets, what)
        return packets
    }

    /// Writes the lent samples into the FIFO, by the pointers made once at init.
    private func write(_ samples: PlanarAudio) throws(FFmpegError) {
        guard samples.frameCount > 0 else { return }
        for c in 0..<settings.channels {
            channelPointers[c] = UnsafeMutableRawPointer(mutating: samples.channel(c).baseAddress!)
        }
        try check(av_audio_fifo_write(fifo.pointer, channelPointers, Int32(samples.frameCount)), encoding)
    }

    /// Writes `count` samples of silence into the FIFO, a frame's worth at a time from `silence`.
    private func writeSilence(_ count: Int) throws(FFmpegError) {
        var left = count
        while left > 0 {
            let n = min(left, frameSize)
            try write(silence.samples(startSample: 0, frameCount: n))
            left -= n
        }
    }

    /// Reads `samples` from the FIFO into the frame (padded with silence to a full frame when the
    /// encoder cannot take a short last one) and sends it. The frame and its buffer are made once:
    /// libavcodec takes its own reference to the data when the frame is sent and lets go of it once
    /// encoded, so the buffer is writable again by the next frame (`av_frame_make_writable`
    /// copies only if it is not).
    private func sendFrame(samples: Int, into packets: inout [EncodedPacket], _ what: @autoclosure () -> String)
        throws(FFmpegError)
    {
        let c = context.pointer
        let f = frame.pointer
        f.pointee.nb_samples = Int32(frameSize)
        try check(av_frame_make_writable(f), what())
        let length = samples < frameSize && !smallLastFrame ? frameSize : samples
        f.pointee.nb_samples = Int32(length)
        let data = UnsafeMutableRawPointer(f.pointee.extended_data!).assumingMemoryBound(
            to: UnsafeMutableRawPointer?.self)
        if length > samples {
            av_samples_set_silence(
                f.pointee.extended_data, 0, Int32(length), c.pointee.ch_layout.nb_channels, c.pointee.sample_fmt)
        }
        if let planar {
            let channels = settings.channels
            for ch in 0..<channels { channelPointers[ch] = UnsafeMutableRawPointer(planar.channel(ch).baseAddress!) }
            try check(av_audio_fifo_read(fifo.pointer, channelPointers, Int32(samples)), what())
            let out = UnsafeMutableRawPointer(f.pointee.data.0!).assumingMemoryBound(to: Float.self)
            for ch in 0..<channels {
                let lane = planar.channel(ch)
                for i in 0..<samples { out[i * channels + ch] = lane[i] }
            }
        } else {
            try check(av_audio_fifo_read(fifo.pointer, data, Int32(samples)), what())
        }
        f.pointee.pts = fifoStart!
        fifoStart! += Int64(samples)
        framesEncoded += 1
        try send(f, into: &packets, what())
    }

    private func send(_ frame: UnsafeMutablePointer<AVFrame>?, into packets: inout [EncodedPacket], _ what: String)
        throws(FFmpegError)
    {
        try context.encode(frame, into: &packets, mediaType: .audio, streamIndex: streamIndex, timeBase: stream.timeBase, what)
    }
}
