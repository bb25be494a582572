/// A live output's video bitrate that follows its network (`adaptive`): lowered within about a
/// second of the backlog growing, raised in growing steps while it stays calm, never below
/// `minimum` nor above `maximum`. A pure state machine: the encoding handler feeds it the output's
/// backlog and the path's rate at every video frame and gives the encoder each new target (libx264
/// takes a new bitrate between two frames, without a keyframe). The drop policy stays the last
/// resort.
///
/// Why these rules (OBS's dynamic bitrate and TCP's congestion control work the same way, on
/// their own figures): a backlog that grows means the path takes less than the encoder makes. The
/// backlog counts what the output's queue holds and, where the transport tells, what it holds
/// beyond (an RTMP output's socket: how long ago the oldest byte it holds was written; SRT: its
/// unacknowledged timespan): a socket's buffer holds half a second of media the queue never sees.
/// The rate the path took while it was the limit (RTMP: written less held) is the best estimate
/// of it, so the target goes under it at once, by enough that the backlog drains in about two
/// seconds: a picture late by a second is frozen for the viewer until it catches up. Raising is a
/// probe: 3 % after a second of calm, each next step 3 % larger (to 15 %), held while the
/// backlog's floor rises (a path a few per cent narrower than the stream shows there seconds
/// before the backlog leaves calm). Near the width that congested last the steps are small; a path
/// that widened is back to 80 % in about 10 s.
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
    /// A window of the backlog's floor, and the rise of the floor from one to the next that holds
    /// the target (the backlog growing by 3 % of the time: a path about 3 % narrower than the
    /// stream).
    static let floorWindowLength: Int64 = 500_000_000
    public static let risingFloor: Int64 = 15_000_000
    /// How long the backlog may stay above calm and the calm still count (a keyframe's passing).
    public static let keyframeSpike: Int64 = 400_000_000
    /// Time between two decreases (the last one must show in the backlog first).
    public static let decreaseInterval: Int64 = 1_000_000_000
    /// Calm time before a step up, after a change.
    public static let calmBeforeIncrease: Int64 = 1_000_000_000
    /// The first step up (a fraction of the target), and the most a step grows to.
    public static let firstStep = 0.03
    public static let largestStep = 0.15
    /// Near the path's measured width (from this share of it): a careful step every
    /// `calmNearWidth`; forgotten after this many steps past it.
    public static let nearWidth = 0.95
    public static let calmNearWidth: Int64 = 1_500_000_000
    public static let stepsBeforeForgettingWidth = 2
    /// Decreases closer than this belong to one congestion (the path's width is their highest).
    static let congestionEpisode: Int64 = 3_000_000_000
    /// The share of a measured path rate a decrease aims under, and the time it gives the backlog
    /// to drain.
    public static let measuredShare = 0.9
    public static let drainTime: Int64 = 2_000_000_000

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
    /// Steps up since the last decrease (each one larger).
    private var probes = 0
    /// The path's rate (all streams) measured when it last congested, and the careful steps taken
    /// past it since (nil: never measured, or forgotten).
    private var width: Int?
    private var stepsPastWidth = 0
    /// The backlog's lowest in the current half-second window, and in the last two whole ones.
    private var floors: (window: (start: Int64, lowest: Int64)?, previous: (before: Int64, last: Int64)?) = (nil, nil)
    /// Since when the backlog has been above calm (nil: calm, or congested).
    private var aboveCalmSince: Int64?
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
    /// sent, or written and not yet taken by the path), what its socket accepted over the last
    /// second (`sentBitsPerSecond`, all streams; 0 unknown) and, where the transport tells, what
    /// the path itself took lately (`pathBitsPerSecond`: the better measure; the socket's rate
    /// still holds the time before a dip while its buffer fills). Returns the new target when it
    /// changed.
    public mutating func observe(
        now: Int64, backlog: Int64, sentBitsPerSecond: Int, pathBitsPerSecond: Int? = nil, audioBitsPerSecond: Int = 0
    ) -> Int? {
        defer { previousBacklog = backlog }
        if let window = growthWindow {
            if now - window.time >= Self.growthWindowLength {
                growth = Double(backlog - window.backlog) / Double(now - window.time)
                growthWindow = (now, backlog)
            }
        } else {
            growthWindow = (now, backlog)
        }
        noteFloor(backlog, at: now)
        if backlog >= Self.congestedBacklog {
            calmSince = nil
            aboveCalmSince = nil
            let growing = backlog >= previousBacklog
            guard growing || backlog >= 2 * Self.congestedBacklog else { return nil }
            // The path's rate, where the transport measured it.
            let measured = pathBitsPerSecond.flatMap { $0 > 0 ? $0 : nil }
            // The path taking more than the encode makes is a burst passing (a keyframe), not a
            // narrow path.
            if let measured, measured > (target + audioBitsPerSecond) * 11 / 10 { return nil }
            // Past twice the threshold and still growing, the last decrease was not enough: the
            // next may come after half the interval (a loaded run's first estimate of the path
            // still held the fast path's last second, and its backlog reached 1.3 s).
            let severe = backlog >= 2 * Self.congestedBacklog && growing
            let interval = severe ? Self.decreaseInterval / 2 : Self.decreaseInterval
            if let lastDecrease, now - lastDecrease < interval { return nil }
            // What the path takes: measured where the transport tells; else the socket's rate
            // over the last second, less the part of it that is only the backlog growing (the
            // rate still holds the time before the dip: growing by half a second a second, the
            // path takes half of it).
            let path: Double
            if let measured {
                path = Double(measured) * Self.measuredShare
            } else {
                path = Double(sentBitsPerSecond) * max(0.2, min(1, 1 - growth)) * (severe ? 0.7 : 0.85)
            }
            // Below what the path takes (its video part), by enough that the backlog drains in
            // about `drainTime`, and at least a quarter down.
            let backlogBits = Double(backlog) / 1e9 * Double(target + audioBitsPerSecond)
            let video = path - Double(audioBitsPerSecond)
            let draining = video - backlogBits * 1e9 / Double(Self.drainTime)
            let next = max(minimum, Int(min(Double(target) * 0.75, video > 0 ? draining : 0)))
            probes = 0
            if let measured {
                // Within one congestion (decreases seconds apart) the highest measure: a path
                // whose backlog drains is read a little under its width (the test proxy's pace,
                // a reader starved by a loaded machine).
                let sameCongestion = lastDecrease.map { now - $0 < Self.congestionEpisode } ?? false
                width = sameCongestion ? max(width ?? 0, measured) : measured
                stepsPastWidth = 0
            }
            lastDecrease = now
            return change(to: next, at: now)
        }
        if backlog < Self.calmBacklog {
            aboveCalmSince = nil
            // The backlog's floor rising: the path takes a little less than is sent (a probe went
            // past it), long before the backlog leaves calm.
            if floorRising {
                calmSince = nil
                return nil
            }
            let since = calmSince ?? now
            calmSince = since
            guard target < maximum else { return nil }
            // Raising is a probe: a step of 3 % of the target after a second of calm, each
            // next one 3 % larger up to 15 %. Near the width the path had when it last congested
            // the steps are small, so a path still that narrow shows as a rising backlog (which
            // holds the target) long before a frozen picture; a path that widened gets the larger
            // steps a few seconds on (from a quarter to 80 % of the range in about 10 s).
            //
            // Near the width the path was measured at when it last congested (its rate while the
            // socket held bytes), the steps stay at 3 % and come every 1.5 s: a path's own buffers
            // (a router's queue; the test proxy's receive buffer) hide a small excess for seconds.
            // Two such steps past it without congestion: the path widened, it is forgotten.
            let reference = max(since, lastChange ?? since)
            let total = target + audioBitsPerSecond
            let growing = min(Self.largestStep, Self.firstStep * Double(probes + 1))
            var step = growing
            if let width, Double(total) * (1 + growing) > Double(width) * Self.nearWidth {
                guard now - reference >= Self.calmNearWidth else { return nil }
                step = Self.firstStep
                if total > width {
                    stepsPastWidth += 1
                    if stepsPastWidth >= Self.stepsBeforeForgettingWidth {
                        self.width = nil
                        probes = 0
                    }
                }
            } else {
                guard now - reference >= Self.calmBeforeIncrease else { return nil }
                probes += 1
            }
            let next = max(target + max(1, (maximum - minimum) / 100), Int(Double(target) * (1 + step)))
            return change(to: min(maximum, next), at: now)
        }
        // Between calm and congested: a keyframe passing (it takes a moment longer than the frames
        // around it) leaves the calm as it was; longer, the path is no longer calm.
        let since = aboveCalmSince ?? now
        aboveCalmSince = since
        if now - since >= Self.keyframeSpike { calmSince = nil }
        return nil
    }

    /// Whether the backlog's floor rose from the window before the last to the last. (Judging the
    /// current window's lowest so far as well answers half a second sooner, but jitter then
    /// holds the way back up too often: measured, 13.9 and 22.4 s back to 80 % after the dip.)
    private var floorRising: Bool {
        guard let previous = floors.previous else { return false }
        return previous.last - previous.before > Self.risingFloor
    }

    /// Notes the backlog in the floor's windows (the lowest backlog of each half second).
    private mutating func noteFloor(_ backlog: Int64, at now: Int64) {
        guard var window = floors.window, now - window.start < Self.floorWindowLength else {
            if let window = floors.window {
                floors.previous = (before: floors.previous?.last ?? window.lowest, last: window.lowest)
            }
            floors.window = (now, backlog)
            return
        }
        window.lowest = min(window.lowest, backlog)
        floors.window = window
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
        probes = 0
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
