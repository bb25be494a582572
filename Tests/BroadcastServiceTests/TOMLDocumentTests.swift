import BroadcastService
import Foundation
import Testing

@Suite struct TOMLDocumentTests {
    @Test func parsesTheConfigSubsetWithLines() throws {
        let text = """
            # comment
            [video]
            source = "test"   # trailing comment
            size = '1280x720'
            fps = 30

            [encoder]
            video_bitrate = 3_000_000
            ratio = 1.5
            flag = true
            list = [1, 2,
                    3,]   # multi-line
            escaped = "a\\tb\\u00e9\\"q\\""

            [[output]]
            name = "rec"
            [[output]]
            name = "live"
            """
        let doc = try TOMLDocument(parsing: text)
        let video = try #require(doc.tables(named: "video").first)
        #expect(video.line == 2)
        #expect(video.entries["source"]?.value == .string("test"))
        #expect(video.entries["source"]?.line == 3)
        #expect(video.entries["size"]?.value == .string("1280x720"))
        #expect(video.entries["fps"]?.value == .integer(30))
        let encoder = try #require(doc.tables(named: "encoder").first)
        #expect(encoder.entries["video_bitrate"]?.value == .integer(3_000_000))
        #expect(encoder.entries["ratio"]?.value == .float(1.5))
        #expect(encoder.entries["flag"]?.value == .boolean(true))
        #expect(encoder.entries["list"]?.value == .array([.integer(1), .integer(2), .integer(3)]))
        #expect(encoder.entries["escaped"]?.value == .string("a\tbé\"q\""))
        #expect(encoder.keys == ["video_bitrate", "ratio", "flag", "list", "escaped"])
        let outputs = doc.tables(named: "output")
        #expect(outputs.map { $0.entries["name"]?.value } == [.string("rec"), .string("live")])
        #expect(outputs.map(\.line) == [15, 17])
        #expect(doc.arrayTableNames == ["output"])
    }

    @Test(arguments: [
        ("a = ", 1, "missing value"),
        ("[video\nx = 1", 1, "']'"),
        ("x = \"open", 1, "unterminated string"),
        ("x = 1\nx = 2", 2, "set twice (first on line 1)"),
        ("[a]\n[a]", 2, "defined twice"),
        ("[a]\n[[a]]", 2, "already defined as a table"),
        ("x = abc", 1, "strings need quotes"),
        ("x = 1 2", 1, "unexpected"),
        ("x = {a = 1}", 1, "inline tables are not supported"),
        ("a.b = 1", 1, "dotted key"),
        ("x = \"\"\"\nmulti\n\"\"\"", 1, "multi-line strings"),
        ("x = [1, 2", 1, "unterminated array"),
        ("x = \"bad \\q escape\"", 1, "invalid escape"),
        ("= 3", 1, "expected a key"),
        ("x = 012", 1, "invalid value"),
    ] as [(String, Int, String)])
    func rejectsWithLineAndReason(text: String, line: Int, reason: String) {
        let error = #expect(throws: TOMLDocument.ParseError.self) { try TOMLDocument(parsing: text) }
        #expect(error?.line == line, "\(String(describing: error))")
        #expect(error?.message.contains(reason) == true, "\(String(describing: error))")
    }

    /// CRLF line endings (TOML allows them) and a UTF-8 byte order mark (Windows editors) parse as
    /// the same document, with the same line numbers.
    @Test func acceptsCRLFAndAByteOrderMark() throws {
        let text = "[video]\nsize = \"1280x720\"  # c\n\n[[output]]\nname = \"rec\"\nlist = [1,\n  2]\n"
        for variant in [text, text.replacingOccurrences(of: "\n", with: "\r\n"), "\u{FEFF}" + text, "\u{FEFF}" + text.replacingOccurrences(of: "\n", with: "\r\n")] {
            let doc = try TOMLDocument(parsing: variant)
            let video = try #require(doc.tables(named: "video").first)
            #expect(video.line == 1)
            #expect(video.entries["size"]?.value == .string("1280x720"))
            let output = try #require(doc.tables(named: "output").first)
            #expect(output.line == 4)
            #expect(output.entries["name"]?.value == .string("rec"))
            #expect(output.entries["name"]?.line == 5)
            #expect(output.entries["list"]?.value == .array([.integer(1), .integer(2)]))
        }
    }

    /// A value nested 100 000 deep is refused with its line (it overflowed the stack: SIGSEGV);
    /// 32 levels still parse, and inline tables at any depth are refused as before.
    @Test func deepNestingIsRefusedNotAStackOverflow() throws {
        for (open, close) in [("[", "]"), ("[{a = ", "}]")] {
            let deep = "[video]\nx = " + String(repeating: open, count: 100_000) + String(repeating: close, count: 100_000) + "\n"
            #expect {
                _ = try TOMLDocument(parsing: deep)
            } throws: { error in
                let error = error as? TOMLDocument.ParseError
                return error?.line == 2
                    && (error?.message.contains("nested more than 32 deep") == true || error?.message.contains("inline tables") == true)
            }
        }
        let fine = try TOMLDocument(parsing: "[video]\nx = " + String(repeating: "[", count: 32) + String(repeating: "]", count: 32) + "\n")
        #expect(fine.tables(named: "video").first?.entries["x"] != nil)
    }
}

