// Parsing of the value syntaxes shared by the command line and the daemon's config. Every failure
// names the value and what is accepted; every number is checked against its range *before* it is
// converted to an integer, so no string can reach a trapping conversion or an overflow.
public import BroadcastKit

public struct ValueError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

public enum Values {
    /// The longest duration any option takes: 3650 days (about 10 years).
    public static let maximumDurationNanoseconds: Int64 = 3650 * 86_400 * 1_000_000_000
    /// The largest byte count: 1000000T.
    public static let maximumBytes: Int64 = 1_000_000 << 40
    /// A frame rate's numerator and denominator, in lowest terms, are at most this.
    public static let maximumRateTerm = 1_000_000

    /// "1280x720": even, positive, at most 8192 on a side.
    public static func size(_ text: String, option: String = "--size") throws -> (width: Int, height: Int) {
        let parts = text.lowercased().split(separator: "x", omittingEmptySubsequences: false)
        guard parts.count == 2, let w = Int(parts[0]), let h = Int(parts[1]) else {
            throw ValueError("invalid \(option) '\(text)': expected WIDTHxHEIGHT, e.g. 1280x720")
        }
        guard (16...8192).contains(w), (16...8192).contains(h), w % 2 == 0, h % 2 == 0 else {
            throw ValueError("invalid \(option) '\(text)': width and height must be even numbers from 16 to 8192")
        }
        return (w, h)
    }

    /// "30", "29.97", "30000/1001": a frame rate from 1 to 240 per second. A fraction is reduced to
    /// lowest terms, which must be at most `maximumRateTerm` each (FFmpeg keeps them in 32 bits).
    public static func frameRate(_ text: String, option: String = "--fps") throws -> (numerator: Int, denominator: Int) {
        let accepted = "expected frames per second as 30, 29.97 or 30000/1001, from 1 to 240"
        let invalid = ValueError("invalid \(option) '\(text)': \(accepted)")
        var rate: (n: Int, d: Int)
        if let slash = text.firstIndex(of: "/") {
            guard let n = Int(text[..<slash]), let d = Int(text[text.index(after: slash)...]), n > 0, d > 0 else { throw invalid }
            let divisor = gcd(n, d)
            rate = (n / divisor, d / divisor)
            guard rate.n <= maximumRateTerm, rate.d <= maximumRateTerm else {
                throw ValueError(
                    "invalid \(option) '\(text)': numerator and denominator in lowest terms must be at most \(maximumRateTerm)")
            }
        } else if let n = Int(text) {
            rate = (n, 1)
        } else if isDecimal(text), let x = Double(text), x >= 1, x <= 240 {
            // NTSC rates written as decimals mean their exact fractions.
            let ntsc = [(23.976, 24000), (29.97, 30000), (59.94, 60000), (119.88, 120000)]
            if let match = ntsc.first(where: { abs($0.0 - x) < 0.005 }) {
                rate = (match.1, 1001)
            } else {
                rate = (Int((x * 1000).rounded()), 1000)
            }
        } else {
            throw invalid
        }
        let fps = Double(rate.n) / Double(rate.d)
        guard fps >= 1, fps <= 240 else { throw invalid }
        return (rate.n, rate.d)
    }

    /// "3M", "2500k", "128000", "1.5M": bits per second, from 8k to 500M.
    public static func bitrate(_ text: String, option: String) throws -> Int {
        let accepted = "expected bits per second as 3M, 2500k or 128000"
        var digits = Substring(text)
        var multiplier = 1.0
        switch text.last {
        case "k", "K": multiplier = 1e3; digits = digits.dropLast()
        case "m", "M": multiplier = 1e6; digits = digits.dropLast()
        default: break
        }
        guard isDecimal(digits), let value = Double(digits), value.isFinite, value > 0 else {
            throw ValueError("invalid \(option) '\(text)': \(accepted)")
        }
        let bits = value * multiplier
        guard bits >= 8_000, bits <= 500_000_000 else {
            throw ValueError("invalid \(option) '\(text)': must be from 8k to 500M")
        }
        return Int(bits.rounded())
    }

    /// "10s", "1.5s", "500ms", "2m", "1h30m", "7d", "90" (seconds), "01:30", "1:00:00": more than zero
    /// and at most 3650d.
    public static func duration(_ text: String, option: String) throws -> MediaTime {
        let accepted = "expected a duration such as 10s, 500ms, 2m, 1h30m, 7d, 90 or 01:30"
        let negative = text.hasPrefix("-")
        guard let nanoseconds = durationNanoseconds(negative ? String(text.dropFirst()) : text) else {
            throw ValueError("invalid \(option) '\(text)': \(accepted)")
        }
        let rounded = nanoseconds.rounded()
        if negative || rounded < 1 {
            throw ValueError("invalid \(option) '\(text)': must be more than zero")
        }
        guard rounded <= Double(maximumDurationNanoseconds) else {
            throw ValueError("invalid \(option) '\(text)': must be at most 3650d (10 years)")
        }
        return MediaTime(nanoseconds: Int64(rounded))
    }

    /// The widest sync offset a source takes (`--mic-offset`, `--app-offset`, `--video-offset`): 2 s either way.
    public static let maximumOffsetNanoseconds: Int64 = 2_000_000_000

    /// A sync offset: "200ms", "-0.15s", "+1s", "0", "-0.2" (seconds), from -2s to +2s, in
    /// nanoseconds. Positive delays the source (its buffers are stamped later).
    public static func offset(_ text: String, option: String) throws -> Int64 {
        let accepted = "expected an offset from -2s to +2s, such as 200ms, -0.15s or 0"
        var body = Substring(text)
        let negative = body.hasPrefix("-")
        if negative || body.hasPrefix("+") { body = body.dropFirst() }
        guard !body.hasPrefix("-"), !body.hasPrefix("+"), let nanoseconds = durationNanoseconds(String(body)), nanoseconds.isFinite else {
            throw ValueError("invalid \(option) '\(text)': \(accepted)")
        }
        let rounded = nanoseconds.rounded()
        guard rounded <= Double(maximumOffsetNanoseconds) else { throw ValueError("invalid \(option) '\(text)': \(accepted)") }
        return negative ? -Int64(rounded) : Int64(rounded)
    }

    /// An offset as the options spell it: "+200ms", "-150ms", "0ms".
    public static func offsetText(_ nanoseconds: Int64) -> String {
        let milliseconds = Double(nanoseconds) / 1e6
        let text = milliseconds == milliseconds.rounded() ? String(Int64(milliseconds)) : String(milliseconds)
        return (nanoseconds > 0 ? "+" : "") + text + "ms"
    }

    /// "10G", "500M", "64k", "1000000": bytes (powers of 1024 for the suffixes), from 1 to 1000000T.
    public static func byteCount(_ text: String, option: String) throws -> Int64 {
        let units: [Character: Double] = ["k": 0x1p10, "K": 0x1p10, "M": 0x1p20, "G": 0x1p30, "T": 0x1p40]
        var digits = Substring(text)
        var unit = 1.0
        if let last = text.last, let u = units[last] {
            unit = u
            digits = digits.dropLast()
        }
        guard isDecimal(digits), let n = Double(digits), n.isFinite else {
            throw ValueError("invalid \(option) '\(text)': expected a size such as 10G, 500M or 1000000")
        }
        let bytes = (n * unit).rounded()
        guard bytes >= 1 else { throw ValueError("invalid \(option) '\(text)': must be at least 1 byte") }
        guard bytes <= Double(maximumBytes) else { throw ValueError("invalid \(option) '\(text)': must be at most 1000000T") }
        return Int64(bytes)
    }

    /// A memory budget: "160M", "1G", from 16M (less than the process itself needs) to 1T.
    public static func memoryBudget(_ text: String, option: String) throws -> Int64 {
        let bytes = try byteCount(text, option: option)
        guard bytes >= 16 << 20, bytes <= 1 << 40 else {
            throw ValueError("invalid \(option) '\(text)': expected a size from 16M to 1T, such as 160M or 1G")
        }
        return bytes
    }

    /// A replay buffer's byte limit (`--replay-max-memory`, `max_memory`): from 1M to 1T, the
    /// largest memory budget, which the whole process and so every buffer must fit in.
    public static func replayMaxMemory(_ text: String, option: String) throws -> Int64 {
        let accepted = "expected a size from 1M to 1T, such as 200M or 1G"
        guard let bytes = try? byteCount(text, option: option), bytes >= 1 << 20, bytes <= 1 << 40 else {
            throw ValueError("invalid \(option) '\(text)': \(accepted)")
        }
        return bytes
    }

    /// "key=value" for --setup.
    public static func setupPair(_ text: String) throws -> (String, String) {
        guard let eq = text.firstIndex(of: "="), eq != text.startIndex else {
            throw ValueError("invalid --setup '\(text)': expected KEY=VALUE")
        }
        return (String(text[..<eq]), String(text[text.index(after: eq)...]))
    }

    // MARK: Helpers

    /// A duration without sign in nanoseconds (possibly huge or tiny, never NaN), or nil when the
    /// text is not one.
    private static func durationNanoseconds(_ text: String) -> Double? {
        guard !text.isEmpty else { return nil }
        var nanoseconds: Double = 0
        if text.contains(":") {
            let fields = text.split(separator: ":", omittingEmptySubsequences: false)
            guard fields.count <= 3 else { return nil }
            for field in fields {
                guard isPlainNumber(field), let v = Double(field) else { return nil }
                nanoseconds = nanoseconds * 60 + v * 1e9
            }
        } else if isDecimal(text), let seconds = Double(text) {
            nanoseconds = seconds * 1e9
        } else {
            let units: [(String, Double)] = [("ms", 1e6), ("h", 3.6e12), ("m", 6e10), ("s", 1e9), ("d", 8.64e13)]
            var rest = Substring(text)
            while !rest.isEmpty {
                let number = rest.prefix { $0.isASCII && ($0.isNumber || $0 == ".") }
                rest = rest.dropFirst(number.count)
                guard isPlainNumber(number), let value = Double(number), let unit = units.first(where: { rest.hasPrefix($0.0) })
                else { return nil }
                rest = rest.dropFirst(unit.0.count)
                nanoseconds += value * unit.1
            }
        }
        return nanoseconds.isNaN ? nil : nanoseconds
    }

    /// ASCII digits with at most one '.', and at least one digit.
    private static func isPlainNumber(_ text: some StringProtocol) -> Bool {
        var digits = 0
        var dots = 0
        for c in text.utf8 {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digits += 1
            case UInt8(ascii: "."): dots += 1
            default: return false
            }
        }
        return digits > 0 && dots <= 1
    }

    /// A decimal number as Double reads it, without hexadecimal, "nan" or "inf" spellings: digits,
    /// '.', a sign and an exponent.
    private static func isDecimal(_ text: some StringProtocol) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy { c in
            (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || c == UInt8(ascii: ".") || c == UInt8(ascii: "e")
                || c == UInt8(ascii: "E") || c == UInt8(ascii: "+") || c == UInt8(ascii: "-")
        }
    }

    private static func gcd(_ a: Int, _ b: Int) -> Int {
        var (a, b) = (a, b)
        while b != 0 { (a, b) = (b, a % b) }
        return a
    }
}
