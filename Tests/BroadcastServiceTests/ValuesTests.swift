import BroadcastKit
import BroadcastService
import PropertyBased
import Testing

/// No string reaches a trap: every value parser either returns a value in its documented range or
/// throws a ValueError. A trapping conversion (Int(Double), Int32(Int), an overflowing product)
/// would crash the test process, which fails the run.
@Suite struct ValuesTests {
    /// Pieces numbers are made of, and the spellings that broke the parsers before (huge, tiny,
    /// negative, NaN, infinities, exponents, hexadecimal, fractions with huge parts).
    static let tokens: [String] = [
        "0", "1", "2", "5", "9", "00", "16", "30", "240", "1280", "8192", ".", "..", "e", "E", "e-", "e+", "-", "+",
        "/", ":", "x", "X", "k", "K", "m", "M", "G", "T", "ms", "s", "h", "d", "nan", "NaN", "inf", "infinity",
        "0x", "0x1p", "p", " ", "_", "1e19", "1e30", "1e300", "1e308", "1e309", "1e-400", "-0", "4.9e-324",
        "99999999999999999999999", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
        "18446744073709551616", "3000000000", "100000000", "2147483647", "2147483648", "200000000000000",
        "½", "٣", "Ⅻ", "\u{0}", "é", "🎬",
    ]

    static let adversarial = Gen<String?>.element(of: tokens).map { $0! }.array(of: 1...7).map { $0.joined() }

    /// Numbers across every magnitude Double has, written as the parsers may see them.
    static let scientific = zip(
        Gen.double(in: -10...10), Gen<Int>.value(in: -400...400),
        Gen<String?>.element(of: ["", "k", "M", "G", "T", "s", "ms", "m", "h", "d", "/1", "/1001"]).map { $0! }
    ).map { mantissa, exponent, suffix in "\(mantissa)e\(exponent)\(suffix)" }

    static let integers = zip(
        Gen<Int>.value(in: Int.min...Int.max), Gen<Int>.value(in: Int.min...Int.max),
        Gen<String?>.element(of: ["", "/", "x", ":", "k", "M", "d", "s"]).map { $0! }
    ).map { a, b, separator in separator.isEmpty ? "\(a)" : "\(a)\(separator)\(b)" }

    static let anyText = Gen.unicodeScalar(in: "\u{0}"..."\u{D7FF}").map(Character.init).string(of: 0...16)

    /// Runs every parser on `text`; each returns within its range or throws a ValueError.
    static func checkAllParsers(_ text: String) {
        expectInRange(text, "size") {
            let (w, h) = try Values.size(text)
            return (16...8192).contains(w) && (16...8192).contains(h) && w % 2 == 0 && h % 2 == 0
        }
        expectInRange(text, "frameRate") {
            let (n, d) = try Values.frameRate(text)
            let fps = Double(n) / Double(d)
            return (1...Values.maximumRateTerm).contains(n) && (1...Values.maximumRateTerm).contains(d) && fps >= 1
                && fps <= 240
        }
        expectInRange(text, "bitrate") { (8_000...500_000_000).contains(try Values.bitrate(text, option: "--video-bitrate")) }
        expectInRange(text, "duration") {
            let ns = try Values.duration(text, option: "--duration").nanoseconds ?? 0
            return (1...Values.maximumDurationNanoseconds).contains(ns)
        }
        expectInRange(text, "offset") {
            (-Values.maximumOffsetNanoseconds...Values.maximumOffsetNanoseconds).contains(try Values.offset(text, option: "--mic-offset"))
        }
        expectInRange(text, "byteCount") { (1...Values.maximumBytes).contains(try Values.byteCount(text, option: "retain_bytes")) }
        expectInRange(text, "memoryBudget") { ((16 << 20)...(1 << 40)).contains(try Values.memoryBudget(text, option: "--memory-budget")) }
    }

    static func expectInRange(_ text: String, _ parser: String, _ parse: () throws -> Bool) {
        do {
            #expect(try parse(), "\(parser)('\(text)') returned a value out of its range")
        } catch let error as ValueError {
            #expect(error.description.contains("'\(text)'"), "\(parser)('\(text)'): the message should quote the value: \(error)")
        } catch {
            Issue.record("\(parser)('\(text)') threw \(error), not a ValueError")
        }
    }

    @Test func adversarialNumbersNeverTrap() async {
        await propertyCheck(count: 3000, input: Self.adversarial) { Self.checkAllParsers($0) }
    }

    @Test func numbersOfEveryMagnitudeNeverTrap() async {
        await propertyCheck(count: 2000, input: Self.scientific) { Self.checkAllParsers($0) }
        await propertyCheck(count: 2000, input: Self.integers) { Self.checkAllParsers($0) }
    }

    @Test func arbitraryStringsNeverTrap() async {
        await propertyCheck(count: 2000, input: Self.anyText) { Self.checkAllParsers($0) }
    }

    /// The values the adversarial run crashed on (exit 132) are refused with a message saying why.
    @Test(arguments: [
        ("bitrate", "1e19", "must be from 8k to 500M"),
        ("bitrate", "99999999999999999999999", "must be from 8k to 500M"),
        ("bitrate", "1e30", "must be from 8k to 500M"),
        ("bitrate", "1e300", "must be from 8k to 500M"),
        ("fps", "1e16", "from 1 to 240"),
        ("fps", "3000000001/100000000", "at most 1000000"),
        ("duration", "200000000000000d", "must be at most 3650d"),
        ("duration", "1e300", "must be at most 3650d"),
        ("duration", "-5d", "must be more than zero"),
        ("duration", "-1.5s", "must be more than zero"),
        ("duration", "0s", "must be more than zero"),
        ("bytes", "1e300G", "must be at most 1000000T"),
        ("bytes", "-5G", "must be at least 1 byte"),
    ])
    func refusedWithTheReason(parser: String, text: String, reason: String) {
        do {
            switch parser {
            case "bitrate": _ = try Values.bitrate(text, option: "--video-bitrate")
            case "fps": _ = try Values.frameRate(text)
            case "duration": _ = try Values.duration(text, option: "retain_for")
            default: _ = try Values.byteCount(text, option: "retain_bytes")
            }
            Issue.record("\(parser) '\(text)' was accepted")
        } catch {
            #expect("\(error)".contains("'\(text)'"), "\(error)")
            #expect("\(error)".contains(reason), "\(error)")
        }
    }

    @Test func acceptedValuesKeepTheirMeaning() throws {
        #expect(try Values.frameRate("3000000000/100000000") == (30, 1))
        #expect(try Values.frameRate("29.97") == (30000, 1001))
        #expect(try Values.bitrate("1.5M", option: "b") == 1_500_000)
        #expect(try Values.duration("7d", option: "d").nanoseconds == 7 * 86_400 * 1_000_000_000)
        #expect(try Values.duration("1h30m", option: "d").nanoseconds == 5_400 * 1_000_000_000)
        #expect(try Values.duration("01:30", option: "d").nanoseconds == 90 * 1_000_000_000)
        #expect(try Values.byteCount("10G", option: "b") == 10 << 30)
        #expect(try Values.byteCount("1000000", option: "b") == 1_000_000)
    }

    @Test(arguments: [
        ("200ms", 200_000_000), ("-0.15s", -150_000_000), ("+1s", 1_000_000_000), ("0", 0), ("-0.2", -200_000_000),
        ("2s", 2_000_000_000), ("-2000ms", -2_000_000_000), ("1s500ms", 1_500_000_000),
    ] as [(String, Int64)])
    func offsetsParse(text: String, nanoseconds: Int64) throws {
        #expect(try Values.offset(text, option: "--mic-offset") == nanoseconds)
    }

    @Test(arguments: ["2.001s", "-3s", "--1s", "+-1s", "", "-", "soon", "1e400", "nan", "200 ms"])
    func offsetsRefused(text: String) {
        #expect(throws: ValueError.self) { try Values.offset(text, option: "--mic-offset") }
    }
}
