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
/// An input may carry a sync offset (`lead`, in samples: its samples are placed that much later than
/// they were captured). The lag between inputs is judged on capture time, less each one's lead, so
/// an input delayed by 2 s is not taken for one 2 s ahead of the others; a lane whose lead changes
/// continues exactly at the new position (no jitter snap): a gap in silence, an overlap dropped. At
/// the start a positive lead is silence from where its capture began, so the track starts there.
///
/// At the start the mixer waits until `lagLimit` of audio has come in (unless `expectedInputs`
/// inputs have all delivered) so that a second input starting a little later is mixed from its first
/// sample rather than cut.
///
/// Each input's pending samples and the mixed output live in storage the mixer owns, grown when a
/// call needs more and otherwise reused: `append(_:from:)` and `mixed(final:)` allocate nothing
/// in the steady state (`append(_:at:from:)` and `mix(final:)` are the same with arrays, copied).
/// A class for that reason: copies would share the storage. Not thread-safe: one thread calls it.
public final class AudioMixer {
    public let channelCount: Int
    public let sampleRate: Int
    public let expectedInputs: Int
    /// Samples an input may fall behind the most advanced one before it is treated as silent.
    public let lagLimit: Int64
    /// Samples of timestamp jitter absorbed between consecutive buffers of one input.
    public let jitterTolerance: Int64

    private final class Lane {
        let input: SampleBufferType
        /// Position of the first sample held; when empty, where the next buffer is expected.
        var start: Int64
        /// The input's sync offset in samples, as of its last buffer.
        var lead: Int64 = 0
        /// Where the input's capture has got to (its last buffer's end less its lead), once it has
        /// had a lead: after a lead made shorter, the lane's end runs ahead of it until the dropped
        /// overlap is caught up. nil: never a lead, the lane's end.
        var capturedEnd: Int64?
        var captured: Int64 { capturedEnd ?? end - lead }
        let samples: PlanarFIFO
        var end: Int64 { start + Int64(samples.count) }
        var isEmpty: Bool { samples.count == 0 }

        init(input: SampleBufferType, start: Int64, channels: Int, capacity: Int) {
            self.input = input
            self.start = start
            self.samples = PlanarFIFO(channels: channels, capacity: capacity)
        }
    }

    /// One lane per input that has delivered, in the order they first did (two at most: a list
    /// searched in place rather than a dictionary, so reaching a lane copies nothing).
    private var lanes: [Lane] = []
    /// Everything before this position has been mixed and returned.
    private var cursor: Int64?
    /// What `mixed(final:)` lends.
    private let output: PlanarStorage

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
        self.output = PlanarStorage(channels: channelCount, capacity: Self.initialCapacity(sampleRate: sampleRate))
        lanes.reserveCapacity(2)
    }

    /// Samples a channel each lane and the output start with: the lag limit's worth and a little
    /// (what a lane holds while it waits for the other), grown when a call needs more.
    private static func initialCapacity(sampleRate: Int) -> Int { max(4096, sampleRate / 2) }

    /// Adds `samples` (planar, `channelCount` arrays) of `input` starting at sample `position`.
    public func append(_ samples: [[Float]], at position: Int64, from input: SampleBufferType, lead: Int64 = 0) {
        precondition(samples.count == channelCount, "the mixer takes \(channelCount) channels, got \(samples.count)")
        AudioChunk(startSample: position, channels: samples).withPlanarAudio { append($0, from: input, lead: lead) }
    }

    /// Adds lent `samples` of `input`, placed at their `startSample`; they are copied in, times
    /// `gain` (a source's volume; 0 mutes it, keeping its place on the timeline). `lead`: the
    /// input's sync offset in samples, already in `startSample` (see above).
    public func append(_ samples: PlanarAudio, from input: SampleBufferType, gain: Float = 1, lead: Int64 = 0) {
        precondition(
            samples.channelCount == channelCount, "the mixer takes \(channelCount) channels, got \(samples.channelCount)")
        let count = samples.frameCount
        guard count > 0 else { return }
        var data = samples
        let lane = lane(for: input, startingAt: data.startSample, lead: lead)
        var position = data.startSample
        if lead != 0 || lane.capturedEnd != nil { lane.capturedEnd = position + Int64(count) - lead }
        if lead != lane.lead {
            // The offset changed: the samples go exactly where it puts them.
            lane.lead = lead
        } else if abs(position - lane.end) <= jitterTolerance {
            position = lane.end
        }
        if position > lane.end {
            if lane.isEmpty {
                lane.start = position
            } else {
                lane.samples.appendSilence(Int(position - lane.end))
            }
        } else if position < lane.end {
            let overlap = Int(min(Int64(count), lane.end - position))
            data = data.dropping(first: overlap)
            position = lane.end
        }
        lane.samples.append(data, gain: gain)
        if let cursor, lane.start < cursor { Self.trim(lane, upTo: cursor) }
    }

    private func lane(for input: SampleBufferType, startingAt position: Int64, lead: Int64) -> Lane {
        for i in 0..<lanes.count where lanes[i].input == input { return lanes[i] }
        let lane = Lane(
            input: input, start: position, channels: channelCount, capacity: Self.initialCapacity(sampleRate: sampleRate))
        lanes.append(lane)
        // The first buffer's lead is the lane's own: no change to react to.
        lane.lead = lead
        return lane
    }

    /// The next mixed run, or nil when nothing is ready. `final`: the inputs have ended, mix all.
    /// A copy of what `mixed(final:)` lends.
    public func mix(final: Bool = false) -> AudioChunk? {
        mixed(final: final).map(AudioChunk.init)
    }

    /// `mix(final:)` without the copy: the samples are lent from the mixer's own storage until
    /// its next call.
    /// `end` (with `final`): the mix ends there, cut or filled with silence (a source's offset moved
    /// its last samples past, or short of, the end of the broadcast).
    public func mixed(final: Bool = false, until end: Int64? = nil) -> PlanarAudio? {
        // The lanes that count: those holding samples, or all once mixing has started.
        var maxEnd: Int64?
        var first: Int64?
        // The furthest any counted lane has got in capture time (its end less its lead), and
        // where the earliest one's capture began (a delayed lane starts in silence from there).
        var maxCapturedEnd: Int64?
        var firstCaptured: Int64?
        for i in 0..<lanes.count {
            let lane = lanes[i]
            guard !lane.isEmpty || cursor != nil else { continue }
            maxEnd = max(maxEnd ?? lane.end, lane.end)
            maxCapturedEnd = max(maxCapturedEnd ?? lane.captured, lane.captured)
            if !lane.isEmpty {
                first = min(first ?? lane.start, lane.start)
                let captured = lane.lead > 0 ? min(lane.start, max(0, lane.start - lane.lead)) : lane.start
                firstCaptured = min(firstCaptured ?? captured, captured)
            }
        }
        guard let maxEnd, let maxCapturedEnd else { return nil }
        if cursor == nil {
            guard let first, let firstCaptured else { return nil }
            if !final, lanes.count < expectedInputs, maxEnd - first < lagLimit { return nil }
            cursor = firstCaptured
        }
        let from = cursor!
        var limit = maxEnd
        if let end, final {
            limit = end
        } else if !final {
            // A lane more than the lag limit behind (in capture time) is silent up to there.
            for i in 0..<lanes.count { limit = min(limit, max(lanes[i].end, maxCapturedEnd - lagLimit + lanes[i].end - lanes[i].captured)) }
            // Not past where capture has got to: a delayed lane's last samples wait there, so
            // the final call (`end`: where capture ended) can cut them and the track ends with
            // the broadcast. Without leads this is `maxEnd`, no limit.
            limit = min(limit, maxCapturedEnd)
        }
        guard limit > from else { return nil }
        let length = Int(limit - from)
        output.reserve(frames: length)
        for c in 0..<channelCount { output.channel(c).baseAddress!.update(repeating: 0, count: length) }
        for i in 0..<lanes.count {
            let lane = lanes[i]
            let overlapStart = max(from, lane.start)
            let overlapEnd = min(limit, lane.end)
            guard overlapEnd > overlapStart else { continue }
            let source = Int(overlapStart - lane.start)
            let destination = Int(overlapStart - from)
            let n = Int(overlapEnd - overlapStart)
            for c in 0..<channelCount {
                let input = lane.samples.channel(c)
                let out = output.channel(c)
                for j in 0..<n { out[destination + j] += input[source + j] }
            }
        }
        // Clipped whatever the number of inputs: a source's gain (up to +20 dB) can take even a
        // single input past full scale, and an encoder given samples beyond ±1 makes a track that
        // decodes above 0 dBFS.
        do {
            for c in 0..<channelCount {
                let out = output.channel(c)
                for j in 0..<length { out[j] = min(1, max(-1, out[j])) }
            }
        }
        for i in 0..<lanes.count { Self.trim(lanes[i], upTo: limit) }
        cursor = limit
        return output.samples(startSample: from, frameCount: length)
    }

    /// Drops a lane's samples before `position`; an emptied lane keeps its end as the next expected position.
    private static func trim(_ lane: Lane, upTo position: Int64) {
        guard lane.start < position else { return }
        let count = lane.samples.count
        let drop = Int(min(Int64(count), position - lane.start))
        if drop == count {
            let end = lane.end
            lane.samples.dropFirst(count)
            lane.start = end
        } else {
            lane.samples.dropFirst(drop)
            lane.start += Int64(drop)
        }
    }
}
