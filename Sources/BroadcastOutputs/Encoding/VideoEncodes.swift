import Atomics
public import BroadcastMedia

/// An encode of an output's own (its `OutputConfiguration.video` differs from the broadcast's):
/// the settings asked, the encoder, the stream its packets carry. Session thread.
final class ExtraVideoEncode {
    /// The settings as the output asked them (the encoder's own may say libx264 after a fallback).
    let asked: VideoEncoderSettings
    let encoder: VideoEncoder
    /// With its stream index: what the outputs taking this encode are opened with.
    let stream: StreamDescription
    let status: VideoEncodeStatus
    /// An adaptive output's encode: its bitrate's controller.
    var controller: AdaptiveBitrateController?
    /// The output's receiver reports (WebRTC) the controller has seen.
    var reportsSeen = 0

    init(asked: VideoEncoderSettings, encoder: VideoEncoder, stream: StreamDescription, adaptiveMinimum: Int?) {
        self.asked = asked
        self.encoder = encoder
        self.stream = stream
        status = VideoEncodeStatus(settings: encoder.settings)
        if asked.adaptiveFor != nil, let minimum = adaptiveMinimum {
            controller = AdaptiveBitrateController(minimum: min(minimum, asked.bitrate), maximum: asked.bitrate)
        }
    }
}

/// One video encode as the status shows it: its settings, the frames and bytes it made (counted on
/// the session's thread, read from any), and the outputs it feeds.
public final class VideoEncodeStatus: Sendable {
    public let settings: VideoEncoderSettings
    /// The outputs it fed when the list was published (a copy per publication; the counters are shared).
    public let outputs: [String]
    private let counters: Counters

    final class Counters: Sendable {
        let frames = ManagedAtomic<Int>(0)
        let bytes = ManagedAtomic<Int64>(0)
        /// Media time (ns) of the last packet, and the bytes and time where the current second began.
        let windowStart = ManagedAtomic<Int64>(-1)
        let windowBytes = ManagedAtomic<Int64>(0)
        let bitrate = ManagedAtomic<Int>(0)
    }

    init(settings: VideoEncoderSettings) {
        self.settings = settings
        outputs = []
        counters = Counters()
    }

    private init(settings: VideoEncoderSettings, outputs: [String], counters: Counters) {
        self.settings = settings
        self.outputs = outputs
        self.counters = counters
    }

    /// The same encode, feeding `outputs`.
    func feeding(_ outputs: [String]) -> VideoEncodeStatus {
        VideoEncodeStatus(settings: settings, outputs: outputs, counters: counters)
    }

    /// Frames encoded so far.
    public var frames: Int { counters.frames.load(ordering: .relaxed) }
    /// Bytes of video encoded so far.
    public var bytes: Int64 { counters.bytes.load(ordering: .relaxed) }
    /// Bits per second over the last whole second of media time.
    public var bitrate: Int { counters.bitrate.load(ordering: .relaxed) }

    /// Counts one of its packets (session thread).
    func count(_ packet: EncodedPacket) {
        counters.frames.wrappingIncrement(ordering: .relaxed)
        counters.bytes.wrappingIncrement(by: Int64(packet.size), ordering: .relaxed)
        let time = Int64((packet.decodingSeconds * 1e9).rounded())
        let start = counters.windowStart.load(ordering: .relaxed)
        let bytes = counters.windowBytes.load(ordering: .relaxed) + Int64(packet.size)
        if start < 0 {
            counters.windowStart.store(time, ordering: .relaxed)
            counters.windowBytes.store(bytes, ordering: .relaxed)
        } else if time - start >= 1_000_000_000 {
            counters.bitrate.store(Int(Double(bytes * 8) / (Double(time - start) / 1e9)), ordering: .relaxed)
            counters.windowStart.store(time, ordering: .relaxed)
            counters.windowBytes.store(0, ordering: .relaxed)
        } else {
            counters.windowBytes.store(bytes, ordering: .relaxed)
        }
    }
}

/// The video encodes as published for other threads (the status): the list is replaced whole by
/// the session's thread.
public final class VideoEncodeList: Sendable {
    final class List: AtomicReference, Sendable {
        let encodes: [VideoEncodeStatus]
        init(_ encodes: [VideoEncodeStatus]) { self.encodes = encodes }
    }
    private let list = ManagedAtomic(List([]))

    /// The broadcast's encode first, then the outputs' own, each with the outputs it feeds.
    public var all: [VideoEncodeStatus] { list.load(ordering: .acquiring).encodes }

    func publish(_ encodes: [VideoEncodeStatus]) { list.store(List(encodes), ordering: .releasing) }
}
