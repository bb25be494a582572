internal import BroadcastKit

#if canImport(Glibc)
import Glibc
#endif

/// Benchmark instrumentation, off unless the environment variable `BROADCAST_LATENCY_FILE` names a
/// file: for every video packet, the time from its frame's capture to the packet leaving the
/// encoder (from where the handler hands it to every output's queue at once), written to that
/// file as JSON when the encoder is flushed. `benchmarks/bench.py` reads it.
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

    init?(origin: Int64, timeBase: Rational) {
        guard let value = getenv(Self.environmentKey), value.pointee != 0 else { return nil }
        path = String(cString: value)
        self.origin = origin
        self.timeBase = timeBase
        nanoseconds.reserveCapacity(1 << 16)
    }

    /// Notes that `packets` leave the encoder now.
    func handOver(_ packets: [EncodedPacket]) {
        guard !packets.isEmpty else { return }
        let now = MonotonicClock().now()
        for packet in packets {
            let captured = origin + packet.pts * 1_000_000_000 * Int64(timeBase.numerator) / Int64(timeBase.denominator)
            nanoseconds.append(now - captured)
        }
    }

    /// Writes count, p50, p90, p99 and max in milliseconds.
    func write() {
        let sorted = nanoseconds.sorted()
        func percentile(_ p: Double) -> Double {
            guard !sorted.isEmpty else { return 0 }
            let index = min(sorted.count - 1, Int((p * Double(sorted.count - 1)).rounded()))
            return Double(sorted[index]) / 1_000_000
        }
        let json =
            "{\"count\": \(sorted.count), \"p50_ms\": \(percentile(0.5)), \"p90_ms\": \(percentile(0.9)), "
            + "\"p99_ms\": \(percentile(0.99)), \"max_ms\": \(percentile(1))}\n"
        guard let file = fopen(path, "w") else { return }
        fputs(json, file)
        fclose(file)
    }
}
