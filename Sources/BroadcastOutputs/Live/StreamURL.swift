import Atomics
public import BroadcastKit

#if canImport(Glibc)
    import Glibc
#endif

/// A live destination: rtmp://, rtmps:// (FLV), srt:// (MPEG-TS) or whip+https:// / whip+http://
/// (WebRTC through a WHIP endpoint, RFC 9725), parsed once, with the form that may be printed.
///
/// The secret parts never leave this value except through `url` (which only the muxer opens):
/// the stream key (an RTMP URL's last path element), a user's password, and query values other
/// than a few known harmless ones. `redacted` shows `rtmp://host/app/****`.
public struct StreamURL: Sendable, Hashable, CustomStringConvertible {
    public enum Scheme: String, Sendable, Hashable, CaseIterable {
        case rtmp, rtmps, srt
        case whipHTTPS = "whip+https"
        case whipHTTP = "whip+http"

        /// libavformat's muxer for the scheme (WHIP has none: WebRTC sends RTP).
        public var formatName: String {
            switch self {
            case .srt: "mpegts"
            case .rtmp, .rtmps: "flv"
            case .whipHTTPS, .whipHTTP: "rtp"
            }
        }
        public var defaultPort: Int {
            switch self {
            case .rtmp: 1935
            case .rtmps, .whipHTTPS: 443
            case .whipHTTP: 80
            case .srt: 0
            }
        }
        /// WebRTC through a WHIP endpoint.
        public var isWHIP: Bool { self == .whipHTTPS || self == .whipHTTP }
    }

    /// The URL as given: open it, never print it.
    public let url: String
    public let scheme: Scheme
    public let host: String
    public let port: Int?
    /// What may be printed: the key, password and query secrets replaced by `****`.
    public let redacted: String
    /// Every secret substring of `url` (key, password, query values) and the bearer token, for
    /// scrubbing text that others (FFmpeg's log) wrote.
    public private(set) var secrets: [String]
    /// WHIP: the bearer token sent with every request (`--whip-token`, `token = "${WHIP_TOKEN}"`);
    /// a secret like a stream key.
    public private(set) var token: String?

    /// WHIP: the endpoint's own URL (https:// or http://).
    public var endpoint: String {
        guard scheme.isWHIP, let rest = url.firstRange(of: "://") else { return url }
        return (scheme == .whipHTTPS ? "https" : "http") + url[rest.lowerBound...]
    }

    /// This URL with `token` as its bearer token (nil: none), the token among its secrets.
    public func withToken(_ token: String?) -> StreamURL {
        var copy = self
        copy.token = token
        if let token, token.count >= Self.shortestScrubbed {
            copy.secrets = Array(Set(secrets + [token])).sorted { $0.count > $1.count }
        }
        return copy
    }

    /// Secrets shorter than this are not looked for in text others wrote: "ab" would mask every
    /// "about". Where they stand (the URL, the header) they are masked whatever their length.
    static let shortestScrubbed = 3

    /// `text` (an error from libcurl, GStreamer or the endpoint) with this URL and the token masked
    /// where they stand: the URL as given or as the endpoint's https:// (http://) URL becomes
    /// `redacted`, `Bearer TOKEN` becomes `Bearer ****`. The secrets' words elsewhere are left as
    /// they are: a token "wrong" leaves "wrong or missing token" alone.
    public func mask(_ text: String) -> String {
        var result = text
        for form in Set([url, endpoint]).sorted(by: { $0.count > $1.count }) where !form.isEmpty {
            result = result.replacing(form, with: redacted)
        }
        if let token, !token.isEmpty { result = result.replacing("Bearer \(token)", with: "Bearer ****") }
        return result
    }

    /// whip+http:// to a host other than this machine: why that is refused unless the user allows
    /// it (`--whip-allow-http`, `allow_http = true`); nil otherwise.
    public var plainHTTPProblem: String? {
        guard scheme == .whipHTTP, !isLoopback else { return nil }
        return "\(redacted): whip+http:// to a host other than this machine sends the token and the session's keys in clear: "
            + "use whip+https://, or allow it with --whip-allow-http (daemon: allow_http = true)"
    }

    /// The host is this machine: `localhost`, 127.0.0.0/8, ::1 (or ::ffff:127.x.y.z).
    public var isLoopback: Bool {
        if host.lowercased() == "localhost" || host.lowercased().hasSuffix(".localhost") { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 { return UInt32(bigEndian: v4.s_addr) >> 24 == 127 }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, host, &v6) == 1 else { return false }
        let bytes = withUnsafeBytes(of: v6) { Array($0) }
        if bytes[..<15].allSatisfy({ $0 == 0 }) && bytes[15] == 1 { return true }
        return bytes[..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF && bytes[12] == 127
    }

    /// Query keys whose values are settings, not secrets.
    static let harmlessQueryKeys: Set<String> = [
        "mode", "latency", "transtype", "timeout", "rw_timeout", "pkt_size", "payload_size", "maxbw",
        "connect_timeout", "tlpktdrop", "nakreport", "rcvlatency", "peerlatency", "listen_timeout",
    ]

    public var description: String { redacted }

    /// Parses `text`; a scheme other than rtmp, rtmps or srt, a missing host, or a bad port is an
    /// `invalidArgument` error that names the URL (redacted) and what is accepted.
    public init(_ text: String) throws(BroadcastError) {
        guard let schemeEnd = text.firstRange(of: "://") else {
            throw BroadcastError(.invalidArgument, "not a stream URL: expected rtmp://, rtmps://, srt:// or whip+https://")
        }
        let schemeText = text[..<schemeEnd.lowerBound].lowercased()
        var rest = Substring(text[schemeEnd.upperBound...])
        var query: Substring = ""
        if let q = rest.firstIndex(of: "?") {
            query = rest[rest.index(after: q)...]
            rest = rest[..<q]
        }
        var authority = rest
        var path: Substring = ""
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            path = rest[rest.index(after: slash)...]
        }
        var secrets: [String] = []
        var userPrefix = ""
        if let at = authority.lastIndex(of: "@") {
            let userInfo = authority[..<at]
            authority = authority[authority.index(after: at)...]
            if let colon = userInfo.firstIndex(of: ":") {
                secrets.append(String(userInfo[userInfo.index(after: colon)...]))
                userPrefix = "\(userInfo[..<colon]):****@"
            } else {
                userPrefix = "\(userInfo)@"
            }
        }
        var host = String(authority)
        var port: Int?
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            host = String(authority[..<colon])
            guard let p = Int(authority[authority.index(after: colon)...]), (1...65535).contains(p) else {
                throw BroadcastError(
                    .invalidArgument,
                    "stream URL \(schemeText)://\(authority)/...: invalid port: expected a number from 1 to 65535")
            }
            port = p
        }
        // Path: only the first element (the RTMP application) is shown; everything after it is the
        // stream key, which may itself hold slashes (rtmp://h/live/KEY/extra). A lone element
        // (rtmp://h/KEY) is masked too: a server may take the key there. SRT carries its stream id
        // and passphrase in the query instead.
        var elements = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        if elements.last == "" { elements.removeLast() }
        var shownPath = elements
        if elements.count >= 2 {
            secrets.append(elements[1...].joined(separator: "/"))
            secrets += elements[1...]
            shownPath = [elements[0], "****"]
        } else if elements.count == 1 {
            secrets.append(elements[0])
            shownPath = ["****"]
        }
        var shownQuery: [String] = []
        for pair in query.split(separator: "&") {
            if let eq = pair.firstIndex(of: "=") {
                let key = String(pair[..<eq])
                let value = String(pair[pair.index(after: eq)...])
                if Self.harmlessQueryKeys.contains(key.lowercased()) {
                    shownQuery.append("\(key)=\(value)")
                } else {
                    secrets.append(value)
                    shownQuery.append("\(key)=****")
                }
            } else {
                secrets.append(String(pair))
                shownQuery.append("****")
            }
        }
        var redacted = "\(schemeText)://\(userPrefix)\(authority)"
        if !shownPath.isEmpty { redacted += "/" + shownPath.joined(separator: "/") }
        if !shownQuery.isEmpty { redacted += "?" + shownQuery.joined(separator: "&") }

        guard let scheme = Scheme(rawValue: schemeText) else {
            throw BroadcastError(
                .invalidArgument,
                "unsupported stream URL scheme '\(schemeText)://' in \(redacted): accepted are rtmp://, rtmps://, srt://, whip+https:// and whip+http://"
            )
        }
        guard !host.isEmpty else {
            throw BroadcastError(.invalidArgument, "stream URL \(redacted) has no host: expected \(schemeText)://HOST[:PORT]/...")
        }
        if scheme == .srt, port == nil {
            throw BroadcastError(.invalidArgument, "stream URL \(redacted) has no port: expected srt://HOST:PORT")
        }
        if scheme != .srt, !scheme.isWHIP, elements.isEmpty {
            throw BroadcastError(
                .invalidArgument, "stream URL \(redacted) has no application: expected \(schemeText)://HOST/APP/KEY")
        }
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.url = text
        self.scheme = scheme
        self.host = host
        self.port = port
        self.redacted = redacted
        // Longest first, so a secret containing another is replaced whole; tiny ones would
        // mangle unrelated text and are not worth hiding.
        self.secrets = Array(Set(secrets.filter { $0.count >= Self.shortestScrubbed })).sorted { $0.count > $1.count }
    }

    /// True when `text` looks like a URL (has a scheme), so a file path is not mistaken for one.
    public static func looksLikeURL(_ text: String) -> Bool {
        guard let r = text.firstRange(of: "://") else { return false }
        let scheme = text[..<r.lowerBound]
        guard !scheme.isEmpty else { return false }
        return scheme.allSatisfy { (c: Character) -> Bool in c.isLetter || c.isNumber || c == "+" || c == "-" || c == "." }
    }

    /// `text` with every occurrence of this URL's secrets replaced by `****`: for text that may
    /// name a secret alone (FFmpeg's "Sending publish command for 'KEY'"), never for our own
    /// messages, whose words a secret may share.
    public func scrub(_ text: String) -> String {
        Self.scrub(text, secrets: secrets)
    }

    /// `text` with every stream URL in it redacted and every one of `secrets` replaced by `****`.
    public static func scrub(_ text: String, secrets: [String]) -> String {
        var result = text
        for secret in secrets where !secret.isEmpty && result.contains(secret) {
            result = result.replacing(secret, with: "****")
        }
        return result
    }
}

/// The secrets of every stream URL a process was given, for scrubbing text that others write
/// (FFmpeg's log, on any thread). Secrets are only added (a reload's new outputs), never removed:
/// an output that ended may still be named in a late line. Reading is one atomic load, no lock.
public final class StreamSecrets: Sendable {
    private final class List: AtomicReference, Sendable {
        let secrets: [String]
        init(_ secrets: [String]) { self.secrets = secrets }
    }

    private let list = ManagedAtomic(List([]))

    public init(_ urls: [StreamURL] = []) { add(urls) }

    /// Adds the secrets of `urls` (kept longest first, so one containing another is replaced whole).
    public func add(_ urls: [StreamURL]) {
        let new = urls.flatMap(\.secrets)
        guard !new.isEmpty else { return }
        var current = list.load(ordering: .acquiring)
        while true {
            let merged = Array(Set(current.secrets + new)).sorted { $0.count > $1.count || ($0.count == $1.count && $0 < $1) }
            if merged == current.secrets { return }
            let (exchanged, original) = list.compareExchange(expected: current, desired: List(merged), ordering: .acquiringAndReleasing)
            if exchanged { return }
            current = original
        }
    }

    /// `text` with every known secret replaced by `****`.
    public func scrub(_ text: String) -> String {
        StreamURL.scrub(text, secrets: list.load(ordering: .acquiring).secrets)
    }
}
