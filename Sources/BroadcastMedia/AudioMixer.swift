public import BroadcastKit

/// A run of audio as planar 32-bit float at a known position on the media timeline.
public struct AudioChunk: Sendable, Hashable {
    /// Index of the first sample: presentation time × sample rate.
    public var startSample: Int64
    /// One array per channel, all the same length.
    public var channels: [[Float]]

    public init(startSample: Int64, channels: [[Float]]) {
        self.startSample = startSample
        self.channels = channels
    }

    public var frameCount: Int { channels.first?.count ?? 0 }
    public var endSample: Int64 { startSample + Int64(frameCount) }
}

/// Mixes the microphone and the application audio into one track (sum, clipped to ±1).
///
/// Each input's samples are placed by their presentation time (sample index = pts × rate). A
/// buffer that starts within `jitterTolerance` of where the input's previous buffer ended continues
/// it exactly (timestamps jitter; audio must not); a later one leaves silence in between, an earlier
/// one loses its overlap. `mix()` returns the range every input has covered; an input more than
/// `lagLimit` behind the others counts as silent there, and what it delivers later for time already
/// mixed is dropped. One input alone passes through unchanged.
///
/// At the start the mixer waits until `lagLimit` of audio has come in (unless `expectedInputs`
/// inputs have all delivered) so that a second input starting a little later is mixed from its first
/// sample rather than cut.
public struct AudioMixer: Sendable {
    public let channelCount: Int
    public let sampleRate: Int
    public let expectedInputs: Int
    /// Samples an input may fall behind the most advanced one before it is treated as silent.
    public let lagLimit: Int64
    /// Samples of timestamp jitter absorbed between consecutive buffers of one input.
    public let jitterTolerance: Int64

    private struct Lane: Sendable {
        /// Position of `samples[c][0]`; when empty, where the next buffer is expected.
        var start: Int64
        var samples: [[Float]]
        var end: Int64 { start + Int64(samples.first?.count ?? 0) }
    }

    private var lanes: [SampleBufferType: Lane] = [:]
    /// Everything before this position has been mixed and returned.
    private var cursor: Int64?

    public init(
        channelCount: Int,
        sampleRate: Int,
        expectedInputs: Int = 2,
        lagLimitSeconds: Double = 0.2,
        jitterToleranceSeconds: Double = 0.01
    ) {
        self.channelCount = channelCount
        self.sampleRate = sampleRate
        self.expectedInputs = expectedInputs
        self.lagLimit = Int64(lagLimitSeconds * Double(sampleRate))
        self.jitterTolerance = Int64(jitterToleranceSeconds * Double(sampleRate))
    }

    /// Adds `samples` (planar, `channelCount` arrays) of `input` starting at sample `position`.
    public mutating func append(_ samples: [[Float]], at position: Int64, from input: SampleBufferType) {
        precondition(samples.count == channelCount, "the mixer takes \(channelCount) channels, got \(samples.count)")
        let count = samples.first?.count ?? 0
        guard count > 0 else { return }
        var data = samples
        var lane = lanes[input] ?? Lane(start: position, samples: Array(repeating: [], count: channelCount))
        var position = position
        if abs(position - lane.end) <= jitterTolerance { position = lane.end }
        if position > lane.end {
            if lane.samples[0].isEmpty {
                lane.start = position
            } else {
                let gap = Int(position - lane.end)
                for c in 0..<channelCount { lane.samples[c].append(contentsOf: repeatElement(0, count: gap)) }
            }
        } else if position < lane.end {
            let overlap = Int(min(Int64(count), lane.end - position))
            for c in 0..<channelCount { data[c].removeFirst(overlap) }
            position = lane.end
        }
        for c in 0..<channelCount { lane.samples[c].append(contentsOf: data[c]) }
        if let cursor, lane.start < cursor { Self.trim(&lane, upTo: cursor) }
        lanes[input] = lane
    }

    /// The next mixed run, or nil when nothing is ready. `final`: the inputs have ended, mix all.
    public mutating func mix(final: Bool = false) -> AudioChunk? {
        let active = lanes.values.filter { !$0.samples[0].isEmpty || cursor != nil }
        guard let maxEnd = active.map(\.end).max() else { return nil }
        if cursor == nil {
            guard let first = active.filter({ !$0.samples[0].isEmpty }).map(\.start).min() else { return nil }
            if !final, lanes.count < expectedInputs, maxEnd - first < lagLimit { return nil }
            cursor = first
        }
        let from = cursor!
        let limit = final ? maxEnd : lanes.values.map { max($0.end, maxEnd - lagLimit) }.min()!
        guard limit > from else { return nil }
        let length = Int(limit - from)
        var output = Array(repeating: [Float](repeating: 0, count: length), count: channelCount)
        for lane in lanes.values {
            let overlapStart = max(from, lane.start)
            let overlapEnd = min(limit, lane.end)
            guard overlapEnd > overlapStart else { continue }
            let source = Int(overlapStart - lane.start)
            let destination = Int(overlapStart - from)
            let n = Int(overlapEnd - overlapStart)
            for c in 0..<channelCount {
                lane.samples[c].withUnsafeBufferPointer { input in
                    output[c].withUnsafeMutableBufferPointer { out in
                        for i in 0..<n { out[destination + i] += input[source + i] }
                    }
                }
            }
        }
        if lanes.count > 1 {
            for c in 0..<channelCount {
                output[c].withUnsafeMutableBufferPointer { out in
                    for i in out.indices { out[i] = min(1, max(-1, out[i])) }
                }
            }
        }
        for key in Array(lanes.keys) { Self.trim(&lanes[key]!, upTo: limit) }
        cursor = limit
        return AudioChunk(startSample: from, channels: output)
    }

    /// Drops a lane's samples before `position`; an emptied lane keeps its end as the next expected position.
    private static func trim(_ lane: inout Lane, upTo position: Int64) {
        guard lane.start < position else { return }
        let count = lane.samples[0].count
        let drop = Int(min(Int64(count), position - lane.start))
        if drop == count {
            let end = lane.end
            for c in lane.samples.indices { lane.samples[c].removeAll(keepingCapacity: true) }
            lane.start = end
        } else {
            for c in lane.samples.indices { lane.samples[c].removeFirst(drop) }
            lane.start += Int64(drop)
        }
    }
}
