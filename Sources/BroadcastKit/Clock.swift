#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The clock every capture timestamp is taken on, in nanoseconds. Production uses CLOCK_MONOTONIC;
/// tests use a clock they move by hand.
public protocol BroadcastClock: Sendable {
    func now() -> Int64
}

public struct MonotonicClock: BroadcastClock {
    public init() {}

    public func now() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }

    /// Sleeps until the clock reads `deadline` (absolute, so sleeps do not accumulate drift).
    public static func sleep(until deadline: Int64) {
        var ts = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nil) == EINTR {}
    }
}
