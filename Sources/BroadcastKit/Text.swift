// The package's one percent-encoder and one trim, for every target: the capture sources, the
// outputs and the WebRTC engine use them as well as the control plane, and those sit below
// BroadcastService (which brings an HTTP server), so they live in the one target all of them
// import. `package`, not `public`: they are no part of the handler contract BroadcastKit documents.

extension StringProtocol {
    /// This text's UTF-8 bytes with every one %-escaped (`%XX`, upper-case hex) but ASCII letters,
    /// digits and the ASCII characters in `kept`, which stay as they are. The default keeps RFC
    /// 3986's unreserved characters: the text then fits in any part of a URL (a path segment, a
    /// query's key or value, a user name or password) and reads back as itself once decoded.
    package func percentEncoded(keeping kept: String = "-._~") -> String {
        var out = ""
        out.unicodeScalars.reserveCapacity(utf8.count)
        for byte in utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case _ where byte < 0x80 && kept.utf8.contains(byte):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out.unicodeScalars.append("%")
                out.unicodeScalars.append(hexDigits[Int(byte >> 4)])
                out.unicodeScalars.append(hexDigits[Int(byte & 0xF)])
            }
        }
        return out
    }

    /// This text without the characters `isTrimmed` accepts at its start and at its end (by
    /// default whitespace, line breaks included). Characters, not bytes: a space that a combining
    /// mark follows is one character with it, and stays.
    package func trimmed(where isTrimmed: (Character) -> Bool = { $0.isWhitespace }) -> String {
        guard let first = firstIndex(where: { !isTrimmed($0) }), let last = lastIndex(where: { !isTrimmed($0) }) else {
            return ""
        }
        return String(self[first...last])
    }
}

private let hexDigits: [Unicode.Scalar] = Array("0123456789ABCDEF".unicodeScalars)
