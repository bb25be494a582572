#if canImport(Glibc)
import Glibc
#endif

/// A recording's path template: strftime(3) conversions, expanded when each file starts, possibly
/// in the directories too (`/var/lib/broadcast/%Y/%m/rec-%d-%H%M%S.mp4`).
public enum RecordingTemplate {
    /// The deepest directory of `template` that has no conversion in it: where the daemon's lock
    /// and manifest go, and what exists before any file is written.
    public static func baseDirectory(of template: String) -> String {
        let parts = template.split(separator: "/", omittingEmptySubsequences: false).dropLast()
        var fixed: [Substring] = []
        for part in parts {
            if part.contains("%") { break }
            fixed.append(part)
        }
        let directory = fixed.joined(separator: "/")
        return directory.isEmpty ? "/" : directory
    }

    static func join(_ directory: String, _ name: String) -> String {
        directory == "/" ? "/" + name : directory + "/" + name
    }

    /// Creates the directories above `path` that are missing (mode 0750); nil, or why not.
    public static func makeParentDirectories(of path: String) -> String? {
        guard let slash = path.lastIndex(of: "/"), slash != path.startIndex else { return nil }
        return makeDirectories(String(path[..<slash]))
    }

    /// Creates `directory` and its missing parents (mode 0750); nil, or why not.
    public static func makeDirectories(_ directory: String) -> String? {
        var info = stat()
        if stat(directory, &info) == 0 {
            return info.st_mode & S_IFMT == S_IFDIR ? nil : "\(directory) exists and is not a directory"
        }
        if let slash = directory.lastIndex(of: "/"), slash != directory.startIndex,
            let problem = makeDirectories(String(directory[..<slash]))
        {
            return problem
        }
        guard mkdir(directory, 0o750) == 0 || errno == EEXIST else {
            return "cannot create the directory \(directory): \(String(cString: strerror(errno)))"
        }
        return nil
    }

    private enum Token: Equatable {
        case literal(Character)
        /// Exactly this many digits.
        case digits(Int)
        /// One or more digits.
        case number
        /// One or more characters other than '/' (names of days and months, time zones, ...).
        case text
    }

    /// Whether `path` is a name `template` produces: each conversion stands for what it expands to
    /// (`%Y` four digits, `%H` two, `%b` a word, ...), everything else for itself. Exactly: a `-2`
    /// before the extension is not part of the template (see `isNamed(by:path:used:)`).
    public static func matches(_ template: String, path: String) -> Bool {
        match(tokenize(template)[...], Array(path)[...])
    }

    /// Whether `path` is a name `template` gave: one it produces (`matches`), or such a name with
    /// the number N a taken name got before its extension (`rec-2.mp4`, see
    /// `RecordingRetention.nextPath`) when `used` (a manifest's `usedNumbers()`) says that name was
    /// given out with N. Any other `-DIGITS` is not this template's: another output's
    /// `rec-%H%M%S.mp4` makes `rec-120000.mp4`, which is not `rec.mp4`'s 120000th file.
    public static func isNamed(by template: String, path: String, used: [String: Int]) -> Bool {
        if matches(template, path: path) { return true }
        guard let (base, number) = RecordingRetention.unnumbered(path), number <= (used[base] ?? 0) else { return false }
        return matches(template, path: base)
    }

    private static func tokenize(_ template: String) -> [Token] {
        var tokens: [Token] = []
        var rest = Substring(template)
        while let c = rest.first {
            rest = rest.dropFirst()
            guard c == "%" else {
                tokens.append(.literal(c))
                continue
            }
            // glibc's flags and field width change the padding: then any run of characters.
            var modified = false
            while let f = rest.first, "_-0^#".contains(f) || f.isASCIIDigit || f == "E" || f == "O" {
                modified = true
                rest = rest.dropFirst()
            }
            guard let conversion = rest.first else {
                tokens.append(.literal("%"))
                break
            }
            rest = rest.dropFirst()
            if modified && conversion != "%" {
                tokens.append(.text)
                continue
            }
            switch conversion {
            case "%": tokens.append(.literal("%"))
            case "Y": tokens.append(.digits(4))
            case "C", "y", "m", "d", "H", "I", "M", "S", "U", "W", "V", "g": tokens.append(.digits(2))
            case "j": tokens.append(.digits(3))
            case "u", "w": tokens.append(.digits(1))
            case "s", "G": tokens.append(.number)
            case "F": tokens += [.digits(4), .literal("-"), .digits(2), .literal("-"), .digits(2)]
            case "T": tokens += [.digits(2), .literal(":"), .digits(2), .literal(":"), .digits(2)]
            case "R": tokens += [.digits(2), .literal(":"), .digits(2)]
            case "D": tokens += [.digits(2), .literal("/"), .digits(2), .literal("/"), .digits(2)]
            case "n": tokens.append(.literal("\n"))
            case "t": tokens.append(.literal("\t"))
            default: tokens.append(.text)
            }
        }
        return tokens
    }

    private static func match(_ tokens: ArraySlice<Token>, _ text: ArraySlice<Character>) -> Bool {
        guard let token = tokens.first else { return text.isEmpty }
        let rest = tokens.dropFirst()
        switch token {
        case .literal(let c):
            return text.first == c && match(rest, text.dropFirst())
        case .digits(let n):
            return text.count >= n && text.prefix(n).allSatisfy(\.isASCIIDigit) && match(rest, text.dropFirst(n))
        case .number, .text:
            var count = 0
            for c in text {
                if token == .number ? !c.isASCIIDigit : c == "/" { break }
                count += 1
                if match(rest, text.dropFirst(count)) { return true }
            }
            return false
        }
    }
}

extension Character {
    fileprivate var isASCIIDigit: Bool { isASCII && isNumber }
}
