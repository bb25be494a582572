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
}
