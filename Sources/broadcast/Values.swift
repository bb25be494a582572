// Parsing of the command line's value syntaxes. Every failure names the value and what is accepted.
import BroadcastKit

struct ValueError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

enum Values {
    /// "1280x720": even, positive, at most 8192 on a side.
    static func size(_ text: String, option: String = "--size") throws -> (width: Int, height: Int) {
        let parts = text.lowercased().split(separator: "x", omittingEmptySubsequences: false)
        guard parts.count == 2, let w = Int(parts[0]), let h = Int(parts[1]) else {
            throw ValueError("invalid \(option) '\(text)': expected WIDTHxHEIGHT, e.g. 1280x720")
        }
        guard (16...8192).contains(w), (16...8192).contains(h), w % 2 == 0, h % 2 == 0 else {
            throw ValueError("invalid \(option) '\(text)': width and height must be even numbers from 16 to 8192")
        }
        return (w, h)
    }

    /// "30", "29.97", "30000/1001": a frame rate from 1 to 240 per second.
    static func frameRate(_ text: String, option: String = "--fps") throws -> (numerator: Int, denominator: Int) {
        let accepted = "expected frames per second as 30, 29.97 or 30000/1001, from 1 to 240"
        var rate: (Int, Int)?
        if let slash = text.firstIndex(of: "/") {
            if let n = Int(text[..<slash]), let d = Int(text[text.index(after: slash)...]), n > 0, d > 0 { rate = (n, d) }
        } else if let n = Int(text) {
            rate = (n, 1)
        } else if let x = Double(text), x.isFinite, x > 0 {
            // NTSC rates written as decimals mean their exact fractions.
            let ntsc = [(23.976, 24000), (29.97, 30000), (59.94, 60000), (119.88, 120000)]
            if let match = ntsc.first(where: { abs($0.0 - x) < 0.005 }) {
                rate = (match.1, 1001)
            } else {
                rate = (Int((x * 1000).rounded()), 1000)
            }
        }
        guard let (n, d) = rate, n > 0, d > 0 else { throw ValueError("invalid \(option) '\(text)': \(accepted)") }
        let fps = Double(n) / Double(d)
        guard fps >= 1, fps <= 240 else { throw ValueError("invalid \(option) '\(text)': \(accepted)") }
        return (n, d)
    }

    /// "3M", "2500k", "128000", "1.5M": bits per second, from 8k to 500M.
    static func bitrate(_ text: String, option: String) throws -> Int {
        let accepted = "expected bits per second as 3M, 2500k or 128000"
        var digits = Substring(text)
        var multiplier = 1.0
        switch text.last {
        case "k", "K": multiplier = 1e3; digits = digits.dropLast()
        case "m", "M": multiplier = 1e6; digits = digits.dropLast()
        default: break
        }
        guard let value = Double(digits), value.isFinite, value > 0 else {
            throw ValueError("invalid \(option) '\(text)': \(accepted)")
        }
        let bits = Int((value * multiplier).rounded())
        guard (8_000...500_000_000).contains(bits) else {
            throw ValueError("invalid \(option) '\(text)': must be from 8k to 500M")
        }
        return bits
    }

    /// "10s", "1.5s", "500ms", "2m", "1h30m", "90" (seconds), "01:30", "1:00:00".
    static func duration(_ text: String, option: String) throws -> MediaTime {
        let accepted = "expected a duration such as 10s, 500ms, 2m, 1h30m, 90 or 01:30"
        let invalid = ValueError("invalid \(option) '\(text)': \(accepted)")
        var nanoseconds: Double = 0
        if text.contains(":") {
            let fields = text.split(separator: ":", omittingEmptySubsequences: false)
            guard fields.count <= 3 else { throw invalid }
            for field in fields {
                guard let v = Double(field), v >= 0 else { throw invalid }
                nanoseconds = nanoseconds * 60 + v * 1e9
            }
        } else if let seconds = Double(text) {
            nanoseconds = seconds * 1e9
        } else {
            let units: [(String, Double)] = [("ms", 1e6), ("h", 3.6e12), ("m", 6e10), ("s", 1e9)]
            var rest = Substring(text)
            guard !rest.isEmpty else { throw invalid }
            while !rest.isEmpty {
                let number = rest.prefix { $0.isNumber || $0 == "." }
                rest = rest.dropFirst(number.count)
                guard let value = Double(number), let unit = units.first(where: { rest.hasPrefix($0.0) }) else { throw invalid }
                rest = rest.dropFirst(unit.0.count)
                nanoseconds += value * unit.1
            }
        }
        guard nanoseconds.isFinite, nanoseconds > 0, nanoseconds < 1e18 else {
            throw ValueError("invalid \(option) '\(text)': must be more than zero")
        }
        return MediaTime(nanoseconds: Int64(nanoseconds.rounded()))
    }

    /// "key=value" for --setup.
    static func setupPair(_ text: String) throws -> (String, String) {
        guard let eq = text.firstIndex(of: "="), eq != text.startIndex else {
            throw ValueError("invalid --setup '\(text)': expected KEY=VALUE")
        }
        return (String(text[..<eq]), String(text[text.index(after: eq)...]))
    }
}
