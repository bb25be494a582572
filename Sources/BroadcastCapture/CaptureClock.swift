/// Mapping device timestamps onto the session clock (CLOCK_MONOTONIC nanoseconds). Pure, so the
/// rules are pinned by unit tests without a device.
public enum DeviceTimestamps {
    /// The session-clock capture time of a V4L2 buffer. V4L2 stamps buffers on CLOCK_MONOTONIC
    /// (V4L2_BUF_FLAG_TIMESTAMP_MONOTONIC), the session's clock, so such a stamp is used as is; a
    /// stamp of another kind, or one that cannot be right (in the future, more than a second old),
    /// falls back to the time the buffer was dequeued.
    public static func videoCaptureTime(bufferTimestamp: Int64, isMonotonic: Bool, dequeuedAt now: Int64) -> Int64 {
        guard isMonotonic, bufferTimestamp > 0, bufferTimestamp <= now + 1_000_000,
            now - bufferTimestamp < 1_000_000_000
        else { return now }
        return bufferTimestamp
    }

    /// The capture time of the first of `framesRead` frames just read from an ALSA PCM, from the
    /// PCM's status timestamp `statusTime` (taken when `framesAvailable` more frames were waiting).
    public static func audioCaptureTime(statusTime: Int64, framesRead: Int, framesAvailable: Int, sampleRate: Int) -> Int64 {
        statusTime - Int64(framesRead + framesAvailable) * 1_000_000_000 / Int64(sampleRate)
    }
}

/// The timeline of one audio device: buffers are stamped by sample count from an anchor, so audio
/// is continuous (no gaps or overlaps from timestamp jitter), and re-anchored on the observed
/// device time when the two part by more than `tolerance` and stay apart for `confirmation` of
/// observed time (the device lost samples without saying so; an overrun it reports restarts the
/// timeline at once: `restart()`). An excursion that comes back sooner is a stall, not a loss:
/// a starved machine reads late, or a device whose position follows the kernel's tick (snd-aloop,
/// jiffies) reports it late while the tick is late; the count goes on through it and the fit
/// leaves those observations out, so neither the stamps nor the drift take a step from a stall.
///
/// The count runs at the device's measured rate, not its nominal one: a device clock is never
/// exactly the monotonic clock (tens to hundreds of ppm apart), and counting at the nominal rate
/// would walk away from the video by that much (0.36 s an hour at 100 ppm). So the timeline fits a
/// line through (samples counted, observed time) since the anchor, by least squares, and stamps
/// each buffer on that line: as smooth as the sample count (the fit averages the observations'
/// jitter away), on the monotonic clock in the long run. The slope gives the drift (`driftPPM`);
/// the consumer then stretches or squeezes the samples to fit the stamps (`Resampler.convert(_:at:)`,
/// libswresample's compensation), so the encoded audio keeps time with the video over hours.
public struct AudioTimeline: Sendable {
    public let sampleRate: Int
    /// Largest difference between counted and observed time before re-anchoring.
    public let toleranceNanoseconds: Int64
    /// Measurement needs at least this much time since the anchor before it reports a drift and
    /// counts on the fitted line alone (before, the stamps move onto it gradually: `fittedSeconds`).
    public let minimumMeasurementNanoseconds: Int64
    /// How long observed time must stay beyond `toleranceNanoseconds` before the timeline moves to it.
    public let confirmationNanoseconds: Int64
    /// Observed time of the first observation of the excursion under way (nil: none).
    private var excursionStart: Int64?
    /// Observations left out of the fit because they strayed beyond the tolerance.
    public private(set) var strayCount = 0

    private var anchorTime: Int64?
    private var samplesSinceAnchor: Int64 = 0
    /// Running least-squares fit of observed time (y, seconds since the anchor) on counted time
    /// (x, nominal seconds since the anchor), in Welford's form (stable over hours of points).
    private var fitCount = 0.0
    private var meanX = 0.0
    private var meanY = 0.0
    private var sumXX = 0.0
    private var sumXY = 0.0
    /// Observed seconds since the anchor of the last observation in the fit.
    private var fitSpan = 0.0
    /// Observed seconds per nominal second, from the last fit (kept across re-anchors).
    private var slope = 1.0
    /// Times the timeline jumped to the observed time.
    public private(set) var reanchorCount = 0
    /// The last jump: observed minus counted time, in nanoseconds (0 before the first).
    public private(set) var lastReanchorNanoseconds: Int64 = 0
    /// The device clock against the monotonic clock, in parts per million (positive: the device
    /// delivers more samples per second than its nominal rate). nil until measured.
    public private(set) var driftPPM: Double?

    public init(
        sampleRate: Int, toleranceNanoseconds: Int64 = 30_000_000, minimumMeasurementNanoseconds: Int64 = 4_000_000_000,
        confirmationNanoseconds: Int64 = 300_000_000
    ) {
        precondition(sampleRate > 0)
        self.sampleRate = sampleRate
        self.toleranceNanoseconds = toleranceNanoseconds
        self.minimumMeasurementNanoseconds = minimumMeasurementNanoseconds
        self.confirmationNanoseconds = confirmationNanoseconds
    }

    /// Nanoseconds `samples` last at the nominal rate.
    func nanoseconds(_ samples: Int64) -> Int64 { samples * 1_000_000_000 / Int64(sampleRate) }

    /// The capture time to give a run of `frames` frames whose first frame the device says was
    /// captured at `observedTime`; advances the timeline past it.
    public mutating func place(frames: Int, observedTime: Int64) -> Int64 {
        defer { samplesSinceAnchor += Int64(frames) }
        guard let anchor = anchorTime else {
            startTimeline(at: observedTime)
            return observedTime
        }
        let x = Double(samplesSinceAnchor) / Double(sampleRate)
        let y = Double(observedTime - anchor) / 1e9
        // Where the count puts this run, on the fit so far (this observation not in it yet).
        let counted = anchor + Int64((fittedSeconds(at: x) * 1e9).rounded())
        if abs(counted - observedTime) > toleranceNanoseconds {
            let since = excursionStart ?? observedTime
            excursionStart = since
            if observedTime - since >= confirmationNanoseconds {
                // It stayed: samples were lost (or the device's clock stepped). Move to it.
                startTimeline(at: observedTime)
                reanchorCount += 1
                lastReanchorNanoseconds = observedTime - counted
                return observedTime
            }
            // Maybe a stall: count on through it, and keep it out of the fit.
            strayCount += 1
            return counted
        }
        excursionStart = nil
        addPoint(x: x, y: y)
        return anchor + Int64((fittedSeconds(at: x) * 1e9).rounded())
    }

    /// Observed seconds since the anchor for `x` counted (nominal) seconds: on the fitted line once
    /// there is `minimumMeasurementNanoseconds` of it (which also gives `driftPPM` and the rate kept
    /// for the next anchor). Before that, a blend that moves from the last measured rate (`slope`,
    /// the nominal rate at first) to the young fit as the fit's span grows towards
    /// `minimumMeasurementNanoseconds`. Switching at once when the fit came of age would
    /// step the stamps by the drift over that time (20 ms at 0.5 % over 4 s: a device's whole error
    /// handed to the resampler in one buffer, which a starved session, jumping its lost periods,
    /// then keeps at the correction's limit to the end); the blend's stamps move onto the fitted
    /// line a little every buffer, their rate up to about 1.7 times the fit's difference from the
    /// old rate off the old one on the way (the time lost at the old rate is made up), and a young
    /// fit's noisy slope weighs little while it is noisy.
    private mutating func fittedSeconds(at x: Double) -> Double {
        let atLastRate = slope * x
        guard fitCount >= 2, sumXX > 0 else { return atLastRate }
        let fitSlope = sumXY / sumXX
        let fitted = meanY + fitSlope * (x - meanX)
        let age = minimumMeasurementNanoseconds > 0 ? max(0, fitSpan * 1e9 / Double(minimumMeasurementNanoseconds)) : 1
        guard age >= 1 else {
            // Smoothstep: the stamps' rate moves from the old rate to the fit's without a jump at
            // either end (a straight ramp would leave the fit's rate at twice the drift at once).
            let weight = age * age * (3 - 2 * age)
            return atLastRate + weight * (fitted - atLastRate)
        }
        slope = fitSlope
        driftPPM = (1 / slope - 1) * 1e6
        return fitted
    }

    /// Forget the anchor (after the stream restarted, or an overrun lost samples): the next run
    /// starts a new timeline at its observed time.
    public mutating func restart() {
        anchorTime = nil
        samplesSinceAnchor = 0
        excursionStart = nil
    }

    /// Counts `frames` read from the device but not placed (dropped), so the next run keeps its time.
    public mutating func skip(frames: Int) {
        if anchorTime != nil { samplesSinceAnchor += Int64(frames) }
    }

    private mutating func startTimeline(at time: Int64) {
        anchorTime = time
        excursionStart = nil
        samplesSinceAnchor = 0
        fitCount = 0
        meanX = 0
        meanY = 0
        sumXX = 0
        sumXY = 0
        addPoint(x: 0, y: 0)
    }

    private mutating func addPoint(x: Double, y: Double) {
        fitCount += 1
        let dx = x - meanX
        meanX += dx / fitCount
        meanY += (y - meanY) / fitCount
        sumXX += dx * (x - meanX)
        sumXY += dx * (y - meanY)
        fitSpan = y
    }
}

/// The output rate's frame slots on the session clock, for the sources that deliver at the output
/// rate and repeat their last frame when nothing changed (X11, PipeWire video): slot n starts n frame
/// intervals after the session's start.
struct FrameSlots {
    let numerator: Int64
    let denominator: Int64

    init(_ rate: (numerator: Int, denominator: Int)) {
        numerator = Int64(rate.numerator)
        denominator = Int64(rate.denominator)
    }

    /// Start of slot `index`, in nanoseconds after the session's start.
    func start(_ index: Int64) -> Int64 {
        index * 1_000_000_000 * denominator / numerator
    }

    /// The last slot that has begun `elapsed` nanoseconds after the start.
    func index(at elapsed: Int64) -> Int64 {
        elapsed * numerator / (1_000_000_000 * denominator)
    }
}
