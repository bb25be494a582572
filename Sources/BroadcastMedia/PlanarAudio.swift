/// A run of planar 32-bit float samples at a known position on the media timeline, lent by the
/// stage that made it (`Resampler.resample(_:at:)`, `AudioMixer.mixed(final:)`): the samples live
/// in that stage's own storage and are valid until its next call. Passing one on allocates
/// nothing, which is why the audio path hands these from stage to stage rather than `AudioChunk`s.
///
/// Channel `c` is `frameCount` samples at `base + c × stride`.
public struct PlanarAudio {
    /// Index of the first sample: presentation time × sample rate.
    public var startSample: Int64
    public let channelCount: Int
    public private(set) var frameCount: Int
    /// Nil only when `frameCount` is 0.
    private var base: UnsafePointer<Float>?
    private let stride: Int

    init(startSample: Int64, channelCount: Int, frameCount: Int, base: UnsafePointer<Float>?, stride: Int) {
        precondition(frameCount == 0 || base != nil, "samples without storage")
        self.startSample = startSample
        self.channelCount = channelCount
        self.frameCount = frameCount
        self.base = base
        self.stride = stride
    }

    public var endSample: Int64 { startSample + Int64(frameCount) }

    /// Channel `c`'s samples.
    public func channel(_ c: Int) -> UnsafeBufferPointer<Float> {
        precondition(c >= 0 && c < channelCount, "channel \(c) of \(channelCount)")
        return UnsafeBufferPointer(start: base.map { $0 + c * stride }, count: frameCount)
    }

    /// The same run without its first `count` samples.
    public func dropping(first count: Int) -> PlanarAudio {
        let n = min(max(count, 0), frameCount)
        var rest = self
        rest.startSample += Int64(n)
        rest.frameCount -= n
        rest.base = rest.frameCount == 0 ? nil : base.map { $0 + n }
        return rest
    }
}

extension AudioChunk {
    /// A copy of lent samples.
    public init(_ samples: PlanarAudio) {
        self.init(startSample: samples.startSample, channels: (0..<samples.channelCount).map { Array(samples.channel($0)) })
    }

    /// Lends the chunk's samples as `PlanarAudio` (copied once into contiguous storage; the
    /// allocation-free path hands `PlanarAudio` on instead).
    public func withPlanarAudio<R, E: Error>(_ body: (PlanarAudio) throws(E) -> R) throws(E) -> R {
        let count = frameCount
        let storage = PlanarStorage(channels: channels.count)
        storage.reserve(frames: count)
        for (c, channel) in channels.enumerated() where count > 0 {
            precondition(channel.count == count, "channels of different lengths")
            channel.withUnsafeBufferPointer { storage.channel(c).baseAddress!.update(from: $0.baseAddress!, count: count) }
        }
        return try body(storage.samples(startSample: startSample, frameCount: count))
    }
}

/// Planar float storage owned by one audio stage: `channels` runs of `capacity` samples in one
/// allocation, grown (never shrunk) when a call needs more, so the steady state reuses it.
final class PlanarStorage {
    let channels: Int
    private(set) var capacity = 0
    private(set) var base: UnsafeMutablePointer<Float>

    init(channels: Int, capacity: Int = 0) {
        precondition(channels > 0, "no channels")
        self.channels = channels
        // One sample a channel at least, so `base` always points at storage.
        self.capacity = max(capacity, 1)
        base = .allocate(capacity: self.capacity * channels)
        base.initialize(repeating: 0, count: self.capacity * channels)
    }

    deinit { base.deallocate() }

    /// Makes room for `frames` samples a channel; the first `keeping` samples of each channel are
    /// kept (none by default).
    func reserve(frames: Int, keeping: Int = 0) {
        guard frames > capacity else { return }
        let old = base, oldCapacity = capacity
        // Doubling, so a stream whose chunks vary a little settles after a reallocation or two.
        capacity = max(frames, capacity * 2)
        base = .allocate(capacity: capacity * channels)
        base.initialize(repeating: 0, count: capacity * channels)
        for c in 0..<channels where keeping > 0 { (base + c * capacity).update(from: old + c * oldCapacity, count: min(keeping, oldCapacity)) }
        old.deallocate()
    }

    func channel(_ c: Int) -> UnsafeMutableBufferPointer<Float> {
        UnsafeMutableBufferPointer(start: base + c * capacity, count: capacity)
    }

    func samples(startSample: Int64, frameCount: Int, offset: Int = 0) -> PlanarAudio {
        precondition(offset + frameCount <= capacity, "\(offset + frameCount) samples a channel in storage for \(capacity)")
        return PlanarAudio(
            startSample: startSample, channelCount: channels, frameCount: frameCount,
            base: UnsafePointer(base + offset), stride: capacity)
    }
}

/// A planar float FIFO: samples appended at the end, dropped from the front, kept in one
/// `PlanarStorage`-like allocation that is compacted (moved to the front) instead of reallocated
/// while what it holds fits, so the steady state allocates nothing.
final class PlanarFIFO {
    let channels: Int
    private var capacity: Int
    private var base: UnsafeMutablePointer<Float>
    /// Index of the first sample held.
    private var head = 0
    /// Samples held, per channel.
    private(set) var count = 0

    init(channels: Int, capacity: Int = 1024) {
        precondition(channels > 0, "no channels")
        self.channels = channels
        self.capacity = max(capacity, 1)
        base = .allocate(capacity: self.capacity * channels)
    }

    deinit { base.deallocate() }

    /// Channel `c`'s samples held.
    func channel(_ c: Int) -> UnsafeBufferPointer<Float> {
        UnsafeBufferPointer(start: base + c * capacity + head, count: count)
    }

    /// Makes room for `extra` more samples at the end.
    private func makeRoom(_ extra: Int) {
        guard head + count + extra > capacity else { return }
        if count + extra <= capacity {
            for c in 0..<channels {
                let channel = base + c * capacity
                (channel).update(from: channel + head, count: count)
            }
        } else {
            let newCapacity = max(count + extra, capacity * 2)
            let storage = UnsafeMutablePointer<Float>.allocate(capacity: newCapacity * channels)
            for c in 0..<channels {
                (storage + c * newCapacity).initialize(from: base + c * capacity + head, count: count)
            }
            base.deallocate()
            base = storage
            capacity = newCapacity
        }
        head = 0
    }

    /// Appends `frames` samples of silence.
    func appendSilence(_ frames: Int) {
        guard frames > 0 else { return }
        makeRoom(frames)
        for c in 0..<channels { (base + c * capacity + head + count).initialize(repeating: 0, count: frames) }
        count += frames
    }

    /// Appends the samples of `samples` (which must have this FIFO's channel count), times `gain`.
    func append(_ samples: PlanarAudio, gain: Float = 1) {
        precondition(samples.channelCount == channels, "\(samples.channelCount) channels into a FIFO of \(channels)")
        let frames = samples.frameCount
        guard frames > 0 else { return }
        makeRoom(frames)
        for c in 0..<channels {
            let destination = base + c * capacity + head + count
            let source = samples.channel(c).baseAddress!
            if gain == 1 {
                destination.initialize(from: source, count: frames)
            } else {
                for j in 0..<frames { (destination + j).initialize(to: source[j] * gain) }
            }
        }
        count += frames
    }

    /// Drops the first `frames` samples (all of them when `frames` ≥ `count`).
    func dropFirst(_ frames: Int) {
        let n = min(max(frames, 0), count)
        count -= n
        head = count == 0 ? 0 : head + n
    }
}
