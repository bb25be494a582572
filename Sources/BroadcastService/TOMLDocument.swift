/// The TOML the daemon's config uses, parsed with the line of every key so that a config error can
/// name file, line and key.
///
/// Supported: comments, `[table]` and `[dotted.table]` headers, `[[array.of.tables]]`, bare and quoted
/// keys, basic strings with escapes, literal strings, integers (with `_`, hex/octal/binary),
/// floats, booleans, and single- or multi-line arrays of those. Not supported (rejected with a clear
/// message): multi-line strings, inline tables, dates, dotted keys on the left of `=`.
public struct TOMLDocument: Sendable {
    public indirect enum Value: Sendable, Equatable {
        case string(String)
        case integer(Int64)
        case float(Double)
        case boolean(Bool)
        case array([Value])

        public var typeName: String {
            switch self {
            case .string: "a string"
            case .integer: "an integer"
            case .float: "a number"
            case .boolean: "a boolean"
            case .array: "an array"
            }
        }
    }

    public struct Entry: Sendable {
        public var value: Value
        public var line: Int

        public init(value: Value, line: Int) {
            self.value = value
            self.line = line
        }
    }

    /// One `[table]` or one element of an `[[array]]`.
    public struct Table: Sendable {
        /// Dotted name: "video", "output".
        public var name: String
        /// Line of the header (0 for the root table).
        public var line: Int
        public var entries: [String: Entry] = [:]
        /// Keys in the order they appear.
        public var keys: [String] = []
    }

    public struct ParseError: Error, Sendable, CustomStringConvertible {
        public var line: Int
        public var message: String
        public var description: String { "line \(line): \(message)" }
    }

    /// The root table (keys before any header), then every table in file order.
    public private(set) var tables: [Table] = [Table(name: "", line: 0)]
    /// Names declared with `[[name]]`.
    public private(set) var arrayTableNames: Set<String> = []

    /// Lines end in LF or CRLF (TOML allows both; Swift sees "\r\n" as one character, so it is
    /// named here). A UTF-8 byte order mark at the start, as Windows editors write it, is skipped.
    public init(parsing text: String) throws(ParseError) {
        let body = text.unicodeScalars.first == "\u{FEFF}" ? Substring(text.unicodeScalars.dropFirst()) : Substring(text)
        let lines = body.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r\n" })
        var parser = Parser(lines: lines)
        try parser.parse(into: &self)
    }

    /// Every table named `name`: one for a `[table]`, each element for an `[[array]]`.
    public func tables(named name: String) -> [Table] { tables.filter { $0.name == name } }

    fileprivate mutating func open(table name: String, array: Bool, line: Int) throws(ParseError) {
        if array {
            if tables.contains(where: { $0.name == name }) && !arrayTableNames.contains(name) {
                throw ParseError(line: line, message: "[[\(name)]] was already defined as a table [\(name)]")
            }
            arrayTableNames.insert(name)
        } else {
            if arrayTableNames.contains(name) {
                throw ParseError(line: line, message: "[\(name)] was already defined as an array of tables [[\(name)]]")
            }
            if let earlier = tables.first(where: { $0.name == name }) {
                throw ParseError(line: line, message: "table [\(name)] is defined twice (first on line \(earlier.line))")
            }
        }
        tables.append(Table(name: name, line: line))
    }

    fileprivate mutating func set(_ key: String, _ value: Value, line: Int) throws(ParseError) {
        let index = tables.count - 1
        if let earlier = tables[index].entries[key] {
            throw ParseError(line: line, message: "key '\(key)' is set twice (first on line \(earlier.line))")
        }
        tables[index].entries[key] = Entry(value: value, line: line)
        tables[index].keys.append(key)
    }
}

private struct Parser {
    let lines: [Substring]
    var lineIndex = 0
    /// The rest of the current logical input, possibly spanning lines (arrays).
    var rest: Substring = ""

    init(lines: [Substring]) { self.lines = lines }

    var lineNumber: Int { lineIndex }

    func error(_ message: String) -> TOMLDocument.ParseError {
        TOMLDocument.ParseError(line: lineNumber, message: message)
    }

    mutating func parse(into document: inout TOMLDocument) throws(TOMLDocument.ParseError) {
        while lineIndex < lines.count {
            rest = lines[lineIndex]
            lineIndex += 1
            skipSpaces()
            if rest.isEmpty || rest.first == "#" { continue }
            if rest.hasPrefix("[[") {
                rest = rest.dropFirst(2)
                let name = try tableName(closing: "]]")
                try document.open(table: name, array: true, line: lineNumber)
            } else if rest.first == "[" {
                rest = rest.dropFirst()
                let name = try tableName(closing: "]")
                try document.open(table: name, array: false, line: lineNumber)
            } else {
                let keyLine = lineNumber
                let key = try self.key()
                skipSpaces()
                if rest.first == "." {
                    throw error("dotted key '\(key).…' is not supported: use a [table] header")
                }
                guard rest.first == "=" else { throw error("expected '=' after key '\(key)'") }
                rest = rest.dropFirst()
                skipSpaces()
                let value = try self.value(key: key)
                try document.set(key, value, line: keyLine)
            }
            try endOfLine()
        }
    }

    mutating func skipSpaces() {
        while let c = rest.first, c == " " || c == "\t" || c == "\r" { rest = rest.dropFirst() }
    }

    /// Spaces, comments and line breaks (inside arrays).
    mutating func skipSpacesAndNewlines() throws(TOMLDocument.ParseError) {
        while true {
            skipSpaces()
            if rest.first == "#" { rest = "" }
            if !rest.isEmpty { return }
            guard lineIndex < lines.count else { throw error("unterminated array: missing ']'") }
            rest = lines[lineIndex]
            lineIndex += 1
        }
    }

    mutating func endOfLine() throws(TOMLDocument.ParseError) {
        skipSpaces()
        if rest.isEmpty || rest.first == "#" { return }
        throw error("unexpected '\(rest.prefix(20))' after the value")
    }

    static func isBare(_ c: Character) -> Bool {
        c.isASCII && (c.isLetter || c.isNumber || c == "_" || c == "-")
    }

    mutating func key() throws(TOMLDocument.ParseError) -> String {
        if rest.first == "\"" || rest.first == "'" {
            guard case .string(let s) = try value(key: "") else { throw error("expected a key") }
            return s
        }
        let bare = rest.prefix(while: Self.isBare)
        guard !bare.isEmpty else { throw error("expected a key, found '\(rest.prefix(20))'") }
        rest = rest.dropFirst(bare.count)
        return String(bare)
    }

    mutating func tableName(closing: String) throws(TOMLDocument.ParseError) -> String {
        var parts: [String] = []
        while true {
            skipSpaces()
            parts.append(try key())
            skipSpaces()
            if rest.first == "." {
                rest = rest.dropFirst()
                continue
            }
            guard rest.hasPrefix(closing) else { throw error("expected '\(closing)' to close the table header") }
            rest = rest.dropFirst(closing.count)
            return parts.joined(separator: ".")
        }
    }

    /// Arrays nest at most this deep: each level is a call, and 100 000 of them overflowed the stack.
    static let maximumDepth = 32

    mutating func value(key: String, depth: Int = 0) throws(TOMLDocument.ParseError) -> TOMLDocument.Value {
        guard let first = rest.first else { throw error("missing value for key '\(key)'") }
        switch first {
        case "\"":
            if rest.hasPrefix("\"\"\"") { throw error("multi-line strings are not supported (key '\(key)')") }
            rest = rest.dropFirst()
            return .string(try basicString())
        case "'":
            if rest.hasPrefix("'''") { throw error("multi-line strings are not supported (key '\(key)')") }
            rest = rest.dropFirst()
            guard let end = rest.firstIndex(of: "'") else { throw error("unterminated string for key '\(key)'") }
            let s = String(rest[..<end])
            rest = rest[rest.index(after: end)...]
            return .string(s)
        case "[":
            guard depth < Self.maximumDepth else {
                throw error("arrays nested more than \(Self.maximumDepth) deep for key '\(key)'")
            }
            rest = rest.dropFirst()
            var items: [TOMLDocument.Value] = []
            while true {
                try skipSpacesAndNewlines()
                if rest.first == "]" {
                    rest = rest.dropFirst()
                    return .array(items)
                }
                items.append(try value(key: key, depth: depth + 1))
                try skipSpacesAndNewlines()
                if rest.first == "," {
                    rest = rest.dropFirst()
                } else if rest.first != "]" {
                    throw error("expected ',' or ']' in the array for key '\(key)'")
                }
            }
        case "{":
            throw error("inline tables are not supported (key '\(key)'): use a [table] header")
        default:
            let token = rest.prefix { !" \t\r,]#".contains($0) }
            rest = rest.dropFirst(token.count)
            if token == "true" { return .boolean(true) }
            if token == "false" { return .boolean(false) }
            if let n = Self.integer(token) { return .integer(n) }
            if let x = Self.float(token) { return .float(x) }
            if token.isEmpty { throw error("missing value for key '\(key)'") }
            throw error("invalid value '\(token)' for key '\(key)' (strings need quotes)")
        }
    }

    mutating func basicString() throws(TOMLDocument.ParseError) -> String {
        var out = ""
        while let c = rest.first {
            rest = rest.dropFirst()
            switch c {
            case "\"":
                return out
            case "\\":
                guard let e = rest.first else { break }
                rest = rest.dropFirst()
                switch e {
                case "n": out.append("\n")
                case "t": out.append("\t")
                case "r": out.append("\r")
                case "\"": out.append("\"")
                case "\\": out.append("\\")
                case "b": out.append("\u{08}")
                case "f": out.append("\u{0C}")
                case "u", "U":
                    let digits = rest.prefix(e == "u" ? 4 : 8)
                    guard digits.count == (e == "u" ? 4 : 8), let code = UInt32(digits, radix: 16),
                        let scalar = Unicode.Scalar(code)
                    else { throw error("invalid unicode escape in string") }
                    rest = rest.dropFirst(digits.count)
                    out.unicodeScalars.append(scalar)
                default:
                    throw error("invalid escape '\\\(e)' in string")
                }
            default:
                out.append(c)
            }
        }
        throw error("unterminated string: missing closing '\"'")
    }

    static func integer(_ token: Substring) -> Int64? {
        var t = token.withoutUnderscores[...]
        guard !t.isEmpty, !token.hasPrefix("_"), !token.hasSuffix("_"), !token.contains("__") else { return nil }
        var negative = false
        if t.first == "+" || t.first == "-" {
            negative = t.first == "-"
            t = t.dropFirst()
        }
        var radix = 10
        for (prefix, r) in [("0x", 16), ("0o", 8), ("0b", 2)] where t.hasPrefix(prefix) {
            radix = r
            t = t.dropFirst(2)
        }
        guard !t.isEmpty, t.allSatisfy({ $0.isHexDigit }), let magnitude = Int64(t, radix: radix) else { return nil }
        if radix == 10 && t.count > 1 && t.first == "0" { return nil }
        return negative ? -magnitude : magnitude
    }

    static func float(_ token: Substring) -> Double? {
        switch token {
        case "inf", "+inf": return .infinity
        case "-inf": return -.infinity
        case "nan", "+nan", "-nan": return .nan
        default: break
        }
        let t = token.withoutUnderscores
        guard t.contains(where: { $0 == "." || $0 == "e" || $0 == "E" }), !t.hasPrefix("."), !t.hasSuffix(".") else {
            return nil
        }
        return Double(t)
    }
}

extension StringProtocol {
    /// The text without TOML's digit separators.
    fileprivate var withoutUnderscores: String { String(self.filter { $0 != "_" }) }
}
