import BroadcastKit
import Foundation
import Testing

/// The package's one percent-encoder and one trim (issue 37 item 4): what each former copy did,
/// now one function with the caller's set.
@Suite struct TextTests {
    static let unreserved = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~".utf8)

    static func escape(_ byte: UInt8) -> String {
        "%" + (byte < 16 ? "0" : "") + String(byte, radix: 16, uppercase: true)
    }

    @Test func everyASCIIByteButTheUnreservedIsEscapedInUpperCaseHex() {
        for byte in UInt8(0)..<128 {
            let text = String(Character(Unicode.Scalar(byte)))
            let expected = Self.unreserved.contains(byte) ? text : Self.escape(byte)
            #expect(text.percentEncoded() == expected, "byte \(byte)")
        }
        #expect("a b/c%d\ne".percentEncoded() == "a%20b%2Fc%25d%0Ae")
    }

    @Test func nonASCIIIsEscapedByteByByteOfItsUTF8() {
        #expect("\u{E9}t\u{E9}".percentEncoded() == "%C3%A9t%C3%A9")
        #expect("\u{20AC}".percentEncoded() == "%E2%82%AC")
        #expect("\u{1F600}".percentEncoded() == "%F0%9F%98%80")
        // Only ASCII characters of `kept` are kept: a byte of a longer UTF-8 sequence never is.
        #expect("\u{E9}".percentEncoded(keeping: "\u{E9}") == "%C3%A9")
    }

    /// The page server's forward keeps `/` in the path and, as it always did, escapes `~`; the
    /// query's keys and values keep neither.
    @Test func theKeptSetIsTheCallers() {
        #expect("/v1/scene/a b~".percentEncoded(keeping: "-._/") == "/v1/scene/a%20b%7E")
        #expect("1 2&x=y/~".percentEncoded(keeping: "-._") == "1%202%26x%3Dy%2F%7E")
        #expect("a-b_c.d~e".percentEncoded(keeping: "") == "a%2Db%5Fc%2Ed%7Ee")
        #expect("user:pa@ss".percentEncoded() == "user%3Apa%40ss")
        #expect("sub/string"[...].percentEncoded() == "sub%2Fstring")
    }

    @Test func whatIsEncodedDecodesBackToItself() throws {
        let samples = (1..<0x300).compactMap(Unicode.Scalar.init).map { "x\(Character($0))y" }
            + ["", "%", "%%41", "+ +", "a\r\nX-Injected: 1", "\u{1F3A5} scene \u{2014} two", "\u{65}\u{301}"]
        for text in samples {
            let encoded = text.percentEncoded()
            #expect(encoded.utf8.allSatisfy { Self.unreserved.contains($0) || $0 == UInt8(ascii: "%") }, "\(encoded)")
            #expect(encoded.removingPercentEncoding == text, "\(text.debugDescription) → \(encoded)")
        }
    }

    @Test func trimsWhitespaceAtBothEndsByDefault() {
        #expect(" \t\r\n\u{A0}\u{2003}a b\n\u{3000}".trimmed() == "a b")
        #expect("\r\nnode-42\r\n".trimmed() == "node-42")
        #expect("inner  spaces".trimmed() == "inner  spaces")
        #expect(" \n\t ".trimmed() == "")
        #expect("".trimmed() == "")
    }

    @Test func trimsWhatThePredicateAccepts() {
        let quoteOrSpace: (Character) -> Bool = { " \t\"".contains($0) }
        #expect(" \"p,w\" ".trimmed(where: quoteOrSpace) == "p,w")
        #expect("\"a\"b\"".trimmed(where: quoteOrSpace) == "a\"b")
        #expect("\"\" ".trimmed(where: quoteOrSpace) == "")
        let spaceOrTab: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        #expect("\t 12 , ".trimmed(where: spaceOrTab) == "12 ,")
        // A line break is not a space here.
        #expect("\n12 ".trimmed(where: spaceOrTab) == "\n12")
        #expect(" 1 2 3 "[...].dropFirst(2).trimmed(where: spaceOrTab) == "2 3")
    }

    /// Characters, not scalars: a space followed by a combining mark is one character, not a space.
    @Test func aSpaceWithACombiningMarkStays() {
        #expect(" \u{301}a ".trimmed { $0 == " " } == " \u{301}a")
    }
}
