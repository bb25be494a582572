/// What an output writes per second, averaged over a window of a few seconds: the bytes of the
/// packets it wrote, counted as they go, turned into bits per second when the window is over.
/// (A fragmented recording's file grows a fragment at a time; its packets give a steady figure.)
struct BitrateWindow {
    let length: Duration
    private var start: MonotonicInstant
    private var bytes = 0

    init(length: Duration = .seconds(2), now: MonotonicInstant = .now()) {
        self.length = length
        start = now
    }

    /// Counts `bytes` written at `now`; the rate once the window is over (and a new one begins),
    /// else nil (the last rate stands).
    mutating func add(_ bytes: Int, now: MonotonicInstant) -> Int? {
        self.bytes += bytes
        let elapsed = start.duration(to: now)
        guard elapsed >= length else { return nil }
        defer { restart(at: now) }
        return Int(Double(self.bytes) * 8 / elapsed.inSeconds)
    }

    /// Starts a new window (after a pause: the paused time is not averaged in).
    mutating func restart(at now: MonotonicInstant) {
        start = now
        bytes = 0
    }
}
