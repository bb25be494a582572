/// A point or span on the media timeline: a rational `value / timescale` seconds, like CoreMedia's CMTime.
///
/// Besides numeric times there are four special values: `.invalid` (no time at all, e.g. an unset
/// timestamp), `.indefinite` (a time that exists but is unknown, e.g. a live stream's duration),
/// and `.positiveInfinity` / `.negativeInfinity`. Arithmetic never traps: it is done in 128 bits and a
/// result that does not fit saturates to an infinity; anything combined with `.invalid` is `.invalid`.
public struct MediaTime: Sendable, Hashable {
    public enum Kind: UInt8, Sendable, Hashable {
        case numeric
        case invalid
        case indefinite
        case positiveInfinity
        case negativeInfinity
    }

    /// How `rescaled(to:rounding:)` rounds a value that falls between two ticks of the new timescale.
    public enum Rounding: Sendable {
        /// To the nearest tick, halfway cases away from zero (FFmpeg's AV_ROUND_NEAR_INF).
        case nearest
        case towardZero
        case awayFromZero
        /// Toward negative infinity.
        case down
        /// Toward positive infinity.
        case up
    }

    public let value: Int64
    /// Ticks per second; always > 0 for numeric times.
    public let timescale: Int32
    public let kind: Kind

    public init(value: Int64, timescale: Int32) {
        precondition(timescale > 0, "MediaTime timescale must be positive, got \(timescale)")
        self.value = value
        self.timescale = timescale
        self.kind = .numeric
    }

    private init(special kind: Kind) {
        self.value = 0
        self.timescale = 0
        self.kind = kind
    }

    public static let invalid = MediaTime(special: .invalid)
    public static let indefinite = MediaTime(special: .indefinite)
    public static let positiveInfinity = MediaTime(special: .positiveInfinity)
    public static let negativeInfinity = MediaTime(special: .negativeInfinity)
    public static let zero = MediaTime(value: 0, timescale: 1)

    /// Nanoseconds: the timescale of the monotonic clock the session runs on.
    public static let nanosecondsPerSecond: Int32 = 1_000_000_000

    public init(nanoseconds: Int64) {
        self.init(value: nanoseconds, timescale: MediaTime.nanosecondsPerSecond)
    }

    /// `seconds` rounded to the nearest tick of `timescale`; non-finite input gives the matching special value.
    public init(seconds: Double, timescale: Int32) {
        if seconds.isNaN {
            self = .invalid
        } else if seconds.isInfinite {
            self = seconds > 0 ? .positiveInfinity : .negativeInfinity
        } else {
            let ticks = (seconds * Double(timescale)).rounded(.toNearestOrAwayFromZero)
            if ticks >= 9.2e18 {
                self = .positiveInfinity
            } else if ticks <= -9.2e18 {
                self = .negativeInfinity
            } else {
                self.init(value: Int64(ticks), timescale: timescale)
            }
        }
    }

    public var isNumeric: Bool { kind == .numeric }
    public var isValid: Bool { kind != .invalid }
    public var isIndefinite: Bool { kind == .indefinite }
    public var isInfinite: Bool { kind == .positiveInfinity || kind == .negativeInfinity }

    /// The time in seconds; NaN for invalid and indefinite, ±infinity for the infinities.
    public var seconds: Double {
        switch kind {
        case .numeric: return Double(value) / Double(timescale)
        case .invalid, .indefinite: return .nan
        case .positiveInfinity: return .infinity
        case .negativeInfinity: return -.infinity
        }
    }

    /// The time in nanoseconds rounded to nearest, or nil when not numeric or out of range.
    public var nanoseconds: Int64? {
        guard isNumeric else { return nil }
        let r = rescaled(to: MediaTime.nanosecondsPerSecond)
        return r.isNumeric ? r.value : nil
    }

    /// The same instant counted in ticks of `newTimescale`, rounded as asked.
    /// A result outside Int64 saturates to an infinity. Special values pass through unchanged.
    public func rescaled(to newTimescale: Int32, rounding: Rounding = .nearest) -> MediaTime {
        precondition(newTimescale > 0, "MediaTime timescale must be positive, got \(newTimescale)")
        guard isNumeric else { return self }
        if newTimescale == timescale { return self }
        return MediaTime.make(
            numerator: Int128(value) * Int128(newTimescale),
            denominator: Int128(timescale),
            timescale: newTimescale,
            rounding: rounding
        )
    }

    /// `numerator / denominator` ticks of `timescale`, rounded; saturates outside Int64.
    private static func make(numerator: Int128, denominator: Int128, timescale: Int32, rounding: Rounding)
        -> MediaTime
    {
        let (q, r) = numerator.quotientAndRemainder(dividingBy: denominator)  // truncates toward zero
        var result = q
        if r != 0 {
            let negative = (numerator < 0) != (denominator < 0)
            let away: Bool
            switch rounding {
            case .towardZero: away = false
            case .awayFromZero: away = true
            case .down: away = negative
            case .up: away = !negative
            case .nearest: away = r.magnitude * 2 >= denominator.magnitude
            }
            if away { result += negative ? -1 : 1 }
        }
        if result > Int128(Int64.max) { return .positiveInfinity }
        if result < Int128(Int64.min) { return .negativeInfinity }
        return MediaTime(value: Int64(result), timescale: timescale)
    }

    /// The timescale two numeric times are combined in: the larger one when it is a multiple of the
    /// smaller (exact), otherwise their least common multiple when it fits in Int32, else the larger.
    private static func commonTimescale(_ a: Int32, _ b: Int32) -> Int32 {
        if a == b { return a }
        let (big, small) = a > b ? (a, b) : (b, a)
        if big % small == 0 { return big }
        let lcm = Int64(big) / Int64(gcd(big, small)) * Int64(small)
        return lcm <= Int64(Int32.max) ? Int32(lcm) : big
    }

    private static func gcd(_ a: Int32, _ b: Int32) -> Int32 {
        var (x, y) = (a, b)
        while y != 0 { (x, y) = (y, x % y) }
        return x
    }

    private static func combine(_ lhs: MediaTime, _ rhs: MediaTime, negateRight: Bool) -> MediaTime {
        let rhsKind: Kind =
            switch (rhs.kind, negateRight) {
            case (.positiveInfinity, true): .negativeInfinity
            case (.negativeInfinity, true): .positiveInfinity
            default: rhs.kind
            }
        switch (lhs.kind, rhsKind) {
        case (.invalid, _), (_, .invalid): return .invalid
        case (.positiveInfinity, .negativeInfinity), (.negativeInfinity, .positiveInfinity): return .invalid
        case (.positiveInfinity, _), (_, .positiveInfinity): return .positiveInfinity
        case (.negativeInfinity, _), (_, .negativeInfinity): return .negativeInfinity
        case (.indefinite, _), (_, .indefinite): return .indefinite
        case (.numeric, .numeric): break
        }
        let ts = commonTimescale(lhs.timescale, rhs.timescale)
        let a = Int128(lhs.value) * Int128(ts)
        let b = Int128(rhs.value) * Int128(ts)
        let sum = negateRight ? a * Int128(rhs.timescale) - b * Int128(lhs.timescale) : a * Int128(rhs.timescale) + b * Int128(lhs.timescale)
        return make(
            numerator: sum,
            denominator: Int128(lhs.timescale) * Int128(rhs.timescale),
            timescale: ts,
            rounding: .nearest
        )
    }

    public static func + (lhs: MediaTime, rhs: MediaTime) -> MediaTime { combine(lhs, rhs, negateRight: false) }
    public static func - (lhs: MediaTime, rhs: MediaTime) -> MediaTime { combine(lhs, rhs, negateRight: true) }
    public static func += (lhs: inout MediaTime, rhs: MediaTime) { lhs = lhs + rhs }
    public static func -= (lhs: inout MediaTime, rhs: MediaTime) { lhs = lhs - rhs }

    /// The time multiplied by an integer; saturates to an infinity on overflow.
    public static func * (lhs: MediaTime, rhs: Int64) -> MediaTime {
        switch lhs.kind {
        case .numeric:
            return make(
                numerator: Int128(lhs.value) * Int128(rhs),
                denominator: 1,
                timescale: lhs.timescale,
                rounding: .nearest
            )
        case .positiveInfinity, .negativeInfinity:
            if rhs == 0 { return .invalid }
            return (lhs.kind == .positiveInfinity) == (rhs > 0) ? .positiveInfinity : .negativeInfinity
        case .invalid, .indefinite:
            return lhs
        }
    }

    /// Numeric comparison is exact across timescales. Order: -inf < numeric < +inf < indefinite < invalid
    /// (the same total order CMTimeCompare uses, so sorting never traps).
    private var rank: Int {
        switch kind {
        case .negativeInfinity: 0
        case .numeric: 1
        case .positiveInfinity: 2
        case .indefinite: 3
        case .invalid: 4
        }
    }
}

extension MediaTime: Comparable {
    public static func < (lhs: MediaTime, rhs: MediaTime) -> Bool {
        if lhs.rank != rhs.rank { return lhs.rank < rhs.rank }
        guard lhs.kind == .numeric else { return false }
        return Int128(lhs.value) * Int128(rhs.timescale) < Int128(rhs.value) * Int128(lhs.timescale)
    }

    /// Equal instants are equal whatever their timescales (1/2 == 500/1000).
    public static func == (lhs: MediaTime, rhs: MediaTime) -> Bool {
        if lhs.kind != rhs.kind { return false }
        guard lhs.kind == .numeric else { return true }
        return Int128(lhs.value) * Int128(rhs.timescale) == Int128(rhs.value) * Int128(lhs.timescale)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(kind)
        if kind == .numeric {
            // Hash the reduced fraction so equal instants hash alike.
            let g = MediaTime.gcd64(value.magnitude, UInt64(timescale))
            hasher.combine(value / Int64(g))
            hasher.combine(Int64(timescale) / Int64(g))
        }
    }

    private static func gcd64(_ a: UInt64, _ b: UInt64) -> UInt64 {
        var (x, y) = (a, b)
        while y != 0 { (x, y) = (y, x % y) }
        return x == 0 ? 1 : x
    }
}

extension MediaTime: CustomStringConvertible {
    public var description: String {
        switch kind {
        case .numeric:
            let s = seconds
            return "\(value)/\(timescale) (\((s * 1000).rounded() / 1000) s)"
        case .invalid: return "invalid"
        case .indefinite: return "indefinite"
        case .positiveInfinity: return "+infinity"
        case .negativeInfinity: return "-infinity"
        }
    }
}
