/// A live output's video bitrate that follows its network (`adaptive`): lowered within about a
/// second of the send backlog growing, raised in steps while it stays empty, never below `minimum`
/// nor above `maximum`. A pure state machine: the encoding handler feeds it the output's backlog and
/// measured send rate at every video frame and gives the encoder each new target (libx264 takes a
/// new bitrate between two frames, without a keyframe). The drop policy stays the last resort.
///
/// Why these rules (OBS's dynamic bitrate works the same way, on its own figures): a backlog that
/// grows means the path takes less than the encoder makes; the rate it does take (what the socket
/// accepted over the last second) is the best estimate of the path, so the target goes a little
/// below it at once. Raising is a probe: a step of a tenth of the range after a calm stretch, so a
/// path that is still narrow costs a short backlog, not a frozen picture.
///
/// A WebRTC (WHIP) output has a second input: what the receiver reports over RTCP (its receiver
/// reports: the fraction of packets lost since its last report, and the round-trip time). Its
/// packets leave at once (the output's backlog stays near zero whatever the path does) and a
/// congested path shows as loss and a growing round trip instead. The rules are those of the
/// loss-based half of browsers' congestion control (GCC): loss over 10 % lowers the target to
/// `target × (1 − loss / 2)`, loss from 2 % to 10 % holds it, less lets it rise as above; a round
/// trip grown well past its baseline (the lowest of the last 10 to 20 s) holds it, and lowers it
/// to 85 % past 250 ms. Decreases, whichever input asks, come at most once a second.
public struct AdaptiveBitrateController: Sendable {
    public let minimum: Int
    public let maximum: Int
    /// The bitrate asked of the encoder now.
    public private(set) var target: Int

    /// Backlog past which the path counts as congested (and the target goes down).
    public static let congestedBacklog: Int64 = 250_000_000
    /// Backlog under which the path counts as calm.
    public static let calmBacklog: Int64 = 100_000_000
    /// Time between two decreases (the last one must show in the backlog first).
    public static let decreaseInterval: Int64 = 1_000_000_000
    /// Calm time before a step up, after a change.
    public static let calmBeforeIncrease: Int64 = 2_000_000_000
    /// Calm time before a step up after a decrease (the path was narrow a moment ago).
    public static let calmAfterDecrease: Int64 = 4_000_000_000

    /// Receiver reports: loss past which the target goes down, and under which it may go up.
    public static let lossyFraction = 0.10
    public static let cleanFraction = 0.02
    /// Round-trip growth past the baseline that holds the target, and that lowers it (the path's
    /// queue grew by that much).
    public static let roundTripHoldGrowth: Int64 = 100_000_000
    public static let roundTripDecreaseGrowth: Int64 = 250_000_000
    /// The round trip's baseline is the lowest of this window and the one before.
    static let roundTripWindowLength: Int64 = 10_000_000_000

    private var lastChange: Int64?
    private var lastDecrease: Int64?
    private var calmSince: Int64?
    private var previousBacklog: Int64 = 0
    /// Where the current measuring window of the backlog's growth began (time, backlog), and the
    /// growth measured over the last whole window: seconds of media per second (0.5: the path
    /// takes half of what is sent).
    private var growthWindow: (time: Int64, backlog: Int64)?
    private var growth = 0.0
    /// A window of the backlog's growth.
    static let growthWindowLength: Int64 = 250_000_000
    /// The lowest round trip in the current window (which began at `start`) and in the one before.
    private var roundTrips: (start: Int64, current: Int64, previous: Int64?)?

    public init(minimum: Int, maximum: Int) {
        precondition(minimum > 0 && minimum <= maximum, "adaptive range \(minimum)...\(maximum)")
        self.minimum = minimum
        self.maximum = maximum
        target = maximum
    }

    /// One observation at `now` (ns, monotonic): the output's `backlog` (ns of media waiting to be
    /// sent) and what it sent over the last second (`sentBitsPerSecond`, all streams; 0 unknown).
    /// Returns the new target when it changed.
    public mutating func observe(now: Int64, backlog: Int64, sentBitsPerSecond: Int, audioBitsPerSecond: Int = 0) -> Int? {
        defer { previousBacklog = backlog }
        if let window = growthWindow {
            if now - window.time >= Self.growthWindowLength {
                growth = Double(backlog - window.backlog) / Double(now - window.time)
                growthWindow = (now, backlog)
            }
        } else {
            growthWindow = (now, backlog)
        }
        if backlog >= Self.congestedBacklog {
            calmSince = nil
            let growing = backlog >= previousBacklog
            guard growing || backlog >= 2 * Self.congestedBacklog else { return nil }
            // Past twice the threshold and still growing, the last decrease was not enough: the
            // next may come after half the interval (a loaded run's first estimate of the path
            // still held the fast path's last second, and its backlog reached 1.3 s).
            let severe = backlog >= 2 * Self.congestedBacklog && growing
            let interval = severe ? Self.decreaseInterval / 2 : Self.decreaseInterval
            if let lastDecrease, now - lastDecrease < interval { return nil }
            // Below what the path took (its video part), and at least a quarter down; further
            // below when the backlog is long, so it drains.
            let share = severe ? 0.7 : 0.85
            // What the path takes: the socket's rate over the last second, less the part of it
            // that is only the backlog growing (the rate still holds the time before the dip:
            // growing by half a second a second, the path takes half of it).
            let taken = Double(sentBitsPerSecond) * max(0.2, min(1, 1 - growth)) - Double(audioBitsPerSecond)
            let path = sentBitsPerSecond > audioBitsPerSecond && taken > 0 ? taken * share : Double(minimum)
            let next = max(minimum, Int(min(Double(target) * 0.75, path)))
            lastDecrease = now
            return change(to: next, at: now)
        }
        if backlog < Self.calmBacklog {
            let since = calmSince ?? now
            calmSince = since
            guard target < maximum else { return nil }
            let needed = lastDecrease.map { now - $0 < Self.calmAfterDecrease + Self.decreaseInterval } == true
                ? Self.calmAfterDecrease : Self.calmBeforeIncrease
            let reference = max(since, lastChange ?? since)
            guard now - reference >= needed else { return nil }
            let step = max(1, (maximum - minimum) / 10)
            return change(to: min(maximum, target + step), at: now)
        }
        calmSince = nil
        return nil
    }

    private mutating func change(to next: Int, at now: Int64) -> Int? {
        guard next != target else { return nil }
        target = next
        lastChange = now
        return next
    }

    /// One receiver report (WebRTC's RTCP) at `now`: the fraction of packets it says were lost
    /// since its previous one (0...1) and the round-trip time it gave (ns; nil unknown). Feed each
    /// report once. Returns the new target when it changed.
    public mutating func observe(now: Int64, fractionLost: Double, roundTrip: Int64?) -> Int? {
        var lowered: Double?
        var held = false
        if fractionLost > Self.lossyFraction {
            lowered = Double(target) * (1 - 0.5 * min(1, fractionLost))
        } else if fractionLost >= Self.cleanFraction {
            held = true
        }
        if let roundTrip, roundTrip > 0 {
            let baseline = noteRoundTrip(roundTrip, at: now)
            let growth = roundTrip - baseline
            if growth > Self.roundTripDecreaseGrowth, roundTrip > 2 * baseline {
                lowered = min(lowered ?? .infinity, Double(target) * 0.85)
            } else if growth > Self.roundTripHoldGrowth, roundTrip > 2 * baseline {
                held = true
            }
        }
        // Lossy or slow: the calm that lets the target rise starts again.
        if lowered != nil || held { calmSince = nil }
        guard let lowered else { return nil }
        if let lastDecrease, now - lastDecrease < Self.decreaseInterval { return nil }
        lastDecrease = now
        return change(to: max(minimum, Int(lowered)), at: now)
    }

    /// Notes a round trip; returns the baseline (the lowest of this window and the one before).
    private mutating func noteRoundTrip(_ roundTrip: Int64, at now: Int64) -> Int64 {
        guard var windows = roundTrips else {
            roundTrips = (now, roundTrip, nil)
            return roundTrip
        }
        if now - windows.start >= Self.roundTripWindowLength {
            windows = (now, roundTrip, windows.current)
        } else {
            windows.current = min(windows.current, roundTrip)
        }
        roundTrips = windows
        return min(windows.current, windows.previous ?? windows.current)
    }
}
