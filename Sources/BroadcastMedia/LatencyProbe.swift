internal import BroadcastKit

#if canImport(Glibc)
import Glibc
#endif

/// Benchmark instrumentation, off unless the environment variable `BROADCAST_LATENCY_FILE` names a
/// file: for every video packet, the time from its frame's capture to the packet leaving the
/// encoder (from where the handler hands it to every output's queue at once), and the part of it
/// before the frame went into the encoder (capture, queue, session, conversion: what broadcast
/// adds to the encoder's own delay), written to that file as JSON when the encoder is flushed.
/// `benchmarks/bench.py` reads it.
///
/// Capture time is reconstructed as (media time zero + the frame's presentation time): the
/// handler marks media time zero at the end of `broadcastStarted`, microseconds before the session
/// reads its start time, and a frame's presentation time is its capture time minus that start.
/// So the figure means something for realtime sources without pauses, and under-reads by those
/// microseconds. (Until marked, zero is when the encoder began opening.)
final class LatencyProbe {
    static let environmentKey = "BROADCAST_LATENCY_FILE"

    private let path: String
    var origin: Int64
    private let timeBase: Rational
    private var nanoseconds: [Int64] = []
    /// The same less the encoder's own delay (the frame's send to the encoder → its packet): what
    /// capture, the queue, the session and conversion add.
    private var beyondEncoder: [Int64] = []
    /// When each frame (by pts) went into the encoder, until its packet comes out.
    private var sentAt: [Int64: Int64] = [:]

    init?(origin: Int64, timeBase: Rational) {
        guard let value = getenv(Self.environmentKey), value.pointee != 0 else { return nil }
        path = String(cString: value)
        self.origin = origin
        self.timeBase = timeBase
        nanoseconds.reserveCapacity(1 << 16)
        beyondEncoder.reserveCapacity(1 << 16)
    }

    /// Per-frame stage times, when `BROADCAST_STAGES_FILE` is set too (see `StageLog`).
    private let stages = StageLog(part: "session", columns: ["pts", "captured", "handler_in", "encoder_in", "encoder_out"])
    private var enteredAt: [Int64: Int64] = [:]

    /// Notes that the frame with `pts` reached the encoder (before any conversion) now.
    func entering(pts: Int64) { if stages != nil { enteredAt[pts] = MonotonicClock().now() } }

    /// Notes that the frame with `pts` goes into the encoder now.
    func sending(pts: Int64) { sentAt[pts] = MonotonicClock().now() }

    /// Notes that `packets` leave the encoder now.
    func handOver(_ packets: [EncodedPacket]) {
        guard !packets.isEmpty else { return }
        let now = MonotonicClock().now()
        for packet in packets {
            let captured = origin + packet.pts * 1_000_000_000 * Int64(timeBase.numerator) / Int64(timeBase.denominator)
            nanoseconds.append(now - captured)
            let sent = sentAt.removeValue(forKey: packet.pts)
            if let sent { beyondEncoder.append(sent - captured) }
            stages?.add([packet.pts, captured, enteredAt.removeValue(forKey: packet.pts) ?? 0, sent ?? 0, now])
        }
    }

    /// Writes count, p50, p90, p99 and max in milliseconds, and p50/p99 of the part beyond the encoder.
    func write() {
        stages?.write()
        let sorted = nanoseconds.sorted()
        let beyond = beyondEncoder.sorted()
        func percentile(_ p: Double, of sorted: [Int64]) -> Double {
            guard !sorted.isEmpty else { return 0 }
            let index = min(sorted.count - 1, Int((p * Double(sorted.count - 1)).rounded()))
            return Double(sorted[index]) / 1_000_000
        }
        let json =
            "{\"count\": \(sorted.count), \"p50_ms\": \(percentile(0.5, of: sorted)), \"p90_ms\": \(percentile(0.9, of: sorted)), "
            + "\"p99_ms\": \(percentile(0.99, of: sorted)), \"max_ms\": \(percentile(1, of: sorted)), "
            + "\"beyond_encoder_p50_ms\": \(percentile(0.5, of: beyond)), \"beyond_encoder_p99_ms\": \(percentile(0.99, of: beyond))}\n"
        guard let file = fopen(path, "we") else { return }
        fputs(json, file)
        fclose(file)
    }
}

/// Benchmark instrumentation, off unless the environment variable `BROADCAST_STAGES_FILE` names a
/// file: one tab-separated row per video frame of CLOCK_MONOTONIC times (ns) at each stage, written
/// to `<file>.<part>.tsv` at the end. The session's part (capture, handler, encoder in/out) and each
/// output thread's part (taken from its queue, written to the socket) are joined by pts
/// (`benchmarks/glass.py --stages`). Single-threaded: one log per recording thread.
public final class StageLog {
    public static let environmentKey = "BROADCAST_STAGES_FILE"
    private let path: String
    private let columns: [String]
    private var rows: [Int64] = []

    public init?(part: String, columns: [String]) {
        guard let value = getenv(Self.environmentKey), value.pointee != 0 else { return nil }
        path = String(cString: value) + ".\(part).tsv"
        self.columns = columns
        rows.reserveCapacity(columns.count << 16)
    }

    public func add(_ row: [Int64]) {
        precondition(row.count == columns.count)
        rows += row
    }

    public static func now() -> Int64 { MonotonicClock().now() }

    public func write() {
        guard let file = fopen(path, "we") else { return }
        fputs(columns.joined(separator: "\t") + "\n", file)
        var i = 0
        while i + columns.count <= rows.count {
            fputs(rows[i..<(i + columns.count)].map(String.init).joined(separator: "\t") + "\n", file)
            i += columns.count
        }
        fclose(file)
    }
}
