/// The timestamps a file output writes across its own pauses and cuts (a recording, a segment, the
/// replay buffer): what it takes off every packet (`shift`), and which packets it must leave out
/// so that no stream goes back in time.
///
/// After an output-level resume the file goes on at a start point (a video keyframe), moved back so
/// that it follows the last packet written without a gap. The encoder's streams do not arrive in
/// strict time order across one another: an audio packet that comes after that keyframe can begin
/// a millisecond before it, which moved back by the same amount lands before the end of the audio
/// written before the pause, and a muxer refuses it (MP4: "non monotonically increasing dts"),
/// failing the whole file. Such a packet belongs to the paused time anyway and is left out.
///
/// Pure arithmetic on nanoseconds, owned by one output's thread.
struct PauseJoin {
    /// Taken off every packet's timestamps.
    private(set) var shift: Int64 = 0
    /// End of the latest packet written, with the shift taken off.
    private(set) var lastEnd: Int64?
    /// Per stream index: dts of its latest packet written, with the shift taken off.
    private var lastDTS: [Int64]

    init(streamCount: Int) {
        lastDTS = Array(repeating: .min, count: max(1, streamCount))
    }

    /// A new file starts with the packet at `dts` (time zero in it).
    mutating func restart(at dts: Int64) {
        shift = dts
        lastEnd = nil
        for i in lastDTS.indices { lastDTS[i] = .min }
    }

    /// The output resumes with the start point at `dts`: it follows what was written, no gap.
    mutating func resume(at dts: Int64) {
        if let lastEnd, dts - shift > lastEnd { shift = dts - lastEnd }
    }

    /// Whether the packet of stream `stream` at `dts`, ending at `end` (both unshifted), may be
    /// written; if so it counts as written.
    mutating func admit(stream: Int, dts: Int64, end: Int64) -> Bool {
        guard lastDTS.indices.contains(stream) else { return false }
        let shifted = dts - shift
        guard shifted > lastDTS[stream] else { return false }
        lastDTS[stream] = shifted
        lastEnd = max(lastEnd ?? .min, end - shift)
        return true
    }
}
