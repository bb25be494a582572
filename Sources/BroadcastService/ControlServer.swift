import Atomics
public import BroadcastKit
public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// One HTTP request to the control API.
public struct ControlRequest: Sendable {
    public var method: String
    /// The path without the query: "/v1/status".
    public var path: String
    public var query: [String: String]
    /// Header names lowercased.
    public var headers: [String: String]
    public var body: [UInt8]

    public init(method: String, path: String, query: [String: String] = [:], headers: [String: String] = [:], body: [UInt8] = []) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
    }
}

/// An answer; also thrown while reading a request that has to be refused early.
public struct ControlResponse: Error, Sendable, Equatable {
    public var status: Int
    public var contentType: String
    public var body: [UInt8]

    public init(status: Int, contentType: String = "application/json", body: [UInt8]) {
        self.status = status
        self.contentType = contentType
        self.body = body
    }

    public static func json(_ status: Int, _ value: JSONValue) -> ControlResponse {
        ControlResponse(status: status, body: Array((value.serialized() + "\n").utf8))
    }

    public static func error(_ status: Int, _ message: String) -> ControlResponse {
        .json(status, .object([("error", .string(message)), ("status", .number(Double(status)))]))
    }
}

/// A small HTTP/1.1 server for the control API on a Unix socket (and, only when configured, on a
/// TCP address with a bearer token), on a thread of its own.
///
/// One request per connection (`Connection: close`), handled in turn: the API serves a few requests
/// a minute, so a strict, bounded parser matters more than concurrency. Limits: 8 KiB of headers,
/// 64 KiB of body, 2 s to send a request. Anything else is answered 4xx and closed.
///
/// Why not hummingbird/NIO: a control socket does not need an event loop, and the daemon's build
/// stays minutes shorter; the parser is fuzzed by the tests instead.
public final class ControlServer: @unchecked Sendable {
    public typealias Handler = @Sendable (ControlRequest) -> ControlResponse

    public let socketPath: String
    private let unixFD: Int32
    private let tcpFD: Int32?
    private let token: String?
    private let handler: Handler
    private let logger: Logger
    private let running = ManagedAtomic<Bool>(true)
    private var thread: OSThread?
    private let wakeRead: Int32
    private let wakeWrite: Int32

    static let maxHeaderBytes = 8 * 1024
    static let maxBodyBytes = 64 * 1024
    static let requestTimeoutMilliseconds: Int32 = 2000

    /// Binds the Unix socket at `socketPath` (replacing a stale one) with `mode`, and a TCP listener
    /// on `tcp` ("127.0.0.1:9090") when given, which then requires `Authorization: Bearer <token>`.
    public init(
        socketPath: String,
        mode: UInt32 = 0o660,
        tcp: (host: String, port: UInt16)? = nil,
        token: String? = nil,
        logger: Logger,
        handler: @escaping Handler
    ) throws(BroadcastError) {
        if tcp != nil && (token ?? "").isEmpty {
            throw BroadcastError(.invalidArgument, "control tcp: a TCP control listener needs a token")
        }
        self.socketPath = socketPath
        self.handler = handler
        self.logger = logger
        self.token = token
        self.unixFD = try Self.listenUnix(path: socketPath, mode: mode)
        if let tcp {
            do {
                self.tcpFD = try Self.listenTCP(host: tcp.host, port: tcp.port)
            } catch {
                close(unixFD)
                unlink(socketPath)
                throw error
            }
        } else {
            self.tcpFD = nil
        }
        var fds: [Int32] = [-1, -1]
        _ = pipe(&fds)
        wakeRead = fds[0]
        wakeWrite = fds[1]
        thread = OSThread(name: "bc-control") { [self] in serve() }
    }

    /// Stops accepting, waits for the server thread, removes the socket file.
    public func stop() {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        var one: UInt8 = 1
        _ = write(wakeWrite, &one, 1)
        thread?.join()
        thread = nil
        close(unixFD)
        if let tcpFD { close(tcpFD) }
        close(wakeRead)
        close(wakeWrite)
        unlink(socketPath)
    }

    deinit { stop() }

    private static func failure(_ what: String) -> BroadcastError {
        BroadcastError(.invalidArgument, "control socket: \(what): \(String(cString: strerror(errno)))")
    }

    private static func listenUnix(path: String, mode: UInt32) throws(BroadcastError) -> Int32 {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard path.utf8.count < capacity else {
            throw BroadcastError(.invalidArgument, "control socket \(path): path longer than \(capacity - 1) bytes")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path.utf8)
            raw[path.utf8.count] = 0
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure("socket") }
        // A socket file left by a crashed daemon is stale if nobody accepts on it.
        var info = stat()
        if lstat(path, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFSOCK else {
                close(fd)
                throw BroadcastError(.invalidArgument, "control socket \(path): exists and is not a socket")
            }
            let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            let live = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(probe, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
                }
            }
            close(probe)
            if live {
                close(fd)
                throw BroadcastError(.invalidArgument, "control socket \(path): another daemon is listening there")
            }
            unlink(path)
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else {
            let error = failure("bind \(path)")
            close(fd)
            throw error
        }
        chmod(path, mode_t(mode))
        guard listen(fd, 16) == 0 else {
            let error = failure("listen \(path)")
            close(fd)
            throw error
        }
        return fd
    }

    private static func listenTCP(host: String, port: UInt16) throws(BroadcastError) -> Int32 {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else {
            throw BroadcastError(.invalidArgument, "control tcp \(host):\(port): not an IPv4 address")
        }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure("socket") }
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 16) == 0 else {
            let error = failure("bind \(host):\(port)")
            close(fd)
            throw error
        }
        return fd
    }

    private func serve() {
        var fds = [pollfd(fd: unixFD, events: Int16(POLLIN), revents: 0), pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
        if let tcpFD { fds.append(pollfd(fd: tcpFD, events: Int16(POLLIN), revents: 0)) }
        while running.load(ordering: .acquiring) {
            let n = poll(&fds, nfds_t(fds.count), 1000)
            if n <= 0 { continue }
            for i in fds.indices where fds[i].revents & Int16(POLLIN) != 0 && fds[i].fd != wakeRead {
                let client = accept(fds[i].fd, nil, nil)
                guard client >= 0 else { continue }
                _ = fcntl(client, F_SETFD, FD_CLOEXEC)
                let needsToken = fds[i].fd == tcpFD
                let response = respond(to: client, needsToken: needsToken)
                send(response, to: client)
                close(client)
            }
        }
    }

    private func respond(to client: Int32, needsToken: Bool) -> ControlResponse {
        let request: ControlRequest
        switch Self.readRequest(from: client) {
        case .failure(let response): return response
        case .success(let r): request = r
        }
        if needsToken {
            guard let token, Self.bearerToken(request.headers["authorization"]).map({ Self.sameBytes($0, token) }) == true else {
                return .error(401, "a bearer token is required on the TCP control listener")
            }
        }
        return handler(request)
    }

    /// The credentials of an `Authorization: Bearer ...` header; the scheme's name is
    /// case-insensitive (RFC 9110 11.1), so `bearer` and `BEARER` count too.
    static func bearerToken(_ header: String?) -> String? {
        guard let header, let space = header.firstIndex(where: { $0 == " " || $0 == "\t" }) else { return nil }
        guard header[..<space].lowercased() == "bearer" else { return nil }
        let credentials = header[space...].drop { $0 == " " || $0 == "\t" }
        return credentials.isEmpty ? nil : String(credentials)
    }

    /// Compares without stopping at the first difference (no timing hint about the token).
    static func sameBytes(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        var difference = UInt8(x.count == y.count ? 0 : 1)
        for i in 0..<min(x.count, y.count) { difference |= x[i] ^ y[i] }
        return difference == 0
    }

    private func send(_ response: ControlResponse, to client: Int32) {
        let head =
            "HTTP/1.1 \(response.status) \(Self.reason(response.status))\r\n"
            + "Content-Type: \(response.contentType)\r\nContent-Length: \(response.body.count)\r\nConnection: close\r\n\r\n"
        var bytes = Array(head.utf8)
        bytes.append(contentsOf: response.body)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(client, $0.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            offset += n
        }
    }

    static func reason(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 409: "Conflict"
        case 411: "Length Required"
        case 413: "Content Too Large"
        case 431: "Request Header Fields Too Large"
        case 501: "Not Implemented"
        case 505: "HTTP Version Not Supported"
        default: status < 500 ? "Client Error" : "Server Error"
        }
    }

    /// Reads one request: bounded in size and time.
    static func readRequest(from fd: Int32) -> Result<ControlRequest, ControlResponse> {
        var buffer: [UInt8] = []
        var headerEnd: Int?
        var chunk = [UInt8](repeating: 0, count: 4096)
        while headerEnd == nil {
            guard let n = readSome(fd, into: &chunk) else { return .failure(.error(408, "request not received in time")) }
            if n == 0 { return .failure(.error(400, "connection closed before the request was complete")) }
            buffer.append(contentsOf: chunk[0..<n])
            headerEnd = findHeaderEnd(buffer)
            if headerEnd == nil && buffer.count > maxHeaderBytes {
                return .failure(.error(431, "request headers exceed \(maxHeaderBytes) bytes"))
            }
        }
        let end = headerEnd!
        if end > maxHeaderBytes { return .failure(.error(431, "request headers exceed \(maxHeaderBytes) bytes")) }
        switch parseHead(Array(buffer[0..<end])) {
        case .failure(let response):
            return .failure(response)
        case .success(var request):
            var body = Array(buffer[(end + 4)...])
            if request.headers["transfer-encoding"] != nil {
                return .failure(.error(501, "Transfer-Encoding is not supported: send Content-Length"))
            }
            let length: Int
            if let text = request.headers["content-length"] {
                guard let n = Int(text), n >= 0 else { return .failure(.error(400, "invalid Content-Length '\(text)'")) }
                length = n
            } else {
                length = 0
            }
            if length > maxBodyBytes { return .failure(.error(413, "request body exceeds \(maxBodyBytes) bytes")) }
            while body.count < length {
                guard let n = readSome(fd, into: &chunk) else { return .failure(.error(408, "request body not received in time")) }
                if n == 0 { return .failure(.error(400, "connection closed before the body was complete")) }
                body.append(contentsOf: chunk[0..<n])
            }
            request.body = Array(body.prefix(length))
            return .success(request)
        }
    }

    private static func readSome(_ fd: Int32, into chunk: inout [UInt8]) -> Int? {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, requestTimeoutMilliseconds) > 0 else { return nil }
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        return n < 0 ? 0 : n
    }

    private static func findHeaderEnd(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for i in 0...(bytes.count - 4) where bytes[i] == 13 && bytes[i + 1] == 10 && bytes[i + 2] == 13 && bytes[i + 3] == 10 {
            return i
        }
        return nil
    }

    /// Parses the request line and headers (without the blank line).
    static func parseHead(_ head: [UInt8]) -> Result<ControlRequest, ControlResponse> {
        guard let text = String(validating: head, as: UTF8.self) else {
            return .failure(.error(400, "request head is not UTF-8"))
        }
        var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)
        let requestLine = lines.removeFirst().split(separator: " ", omittingEmptySubsequences: false)
        guard requestLine.count == 3 else { return .failure(.error(400, "malformed request line")) }
        let method = String(requestLine[0])
        guard !method.isEmpty, method.allSatisfy({ $0.isASCII && $0.isUppercase }) else {
            return .failure(.error(400, "malformed method"))
        }
        guard requestLine[2] == "HTTP/1.1" || requestLine[2] == "HTTP/1.0" else {
            return .failure(.error(505, "only HTTP/1.0 and HTTP/1.1 are spoken here"))
        }
        let target = requestLine[1]
        guard target.hasPrefix("/"), target.allSatisfy({ $0.isASCII && !$0.isWhitespace }) else {
            return .failure(.error(400, "malformed request target"))
        }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":"), colon != line.startIndex else {
                return .failure(.error(400, "malformed header line"))
            }
            let name = line[..<colon].lowercased()
            guard name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else {
                return .failure(.error(400, "malformed header name"))
            }
            let value = line[line.index(after: colon)...].trimmingSpaces()
            // Two lengths that disagree ("Content-Length: 5" and "Content-Length: 50", or "5, 50")
            // would let a proxy and this parser see different requests: refused (RFC 9112 6.3).
            if name == "content-length" {
                let lengths = (headers[name].map { [$0] } ?? []) + value.split(separator: ",").map { String($0).trimmingSpaces() }
                if Set(lengths).count > 1 { return .failure(.error(400, "conflicting Content-Length headers")) }
                headers[name] = lengths.first ?? value
                continue
            }
            if headers[name] != nil && (name == "authorization" || name == "transfer-encoding" || name == "host") {
                return .failure(.error(400, "the \(name) header is given twice"))
            }
            headers[name] = value
        }
        let pathAndQuery = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        guard let path = percentDecoded(pathAndQuery[0], plusIsSpace: false) else {
            return .failure(.error(400, "malformed percent-encoding in the request path"))
        }
        var query: [String: String] = [:]
        if pathAndQuery.count == 2 {
            for pair in pathAndQuery[1].split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                guard let key = percentDecoded(kv[0]), let value = kv.count == 2 ? percentDecoded(kv[1]) : "" else {
                    return .failure(.error(400, "malformed percent-encoding in the query"))
                }
                query[key] = value
            }
        }
        return .success(ControlRequest(method: method, path: path, query: query, headers: headers))
    }

    /// `text` with its %XX escapes (and in a query, `+` for space) decoded; nil when a `%` is not
    /// followed by two hex digits or the result is not UTF-8: such a target is refused, not guessed at.
    static func percentDecoded(_ text: Substring, plusIsSpace: Bool = true) -> String? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        var iterator = text.utf8.makeIterator()
        func hexValue(_ c: UInt8?) -> UInt8? {
            switch c {
            case let c? where (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c): c - UInt8(ascii: "0")
            case let c? where (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(c): c - UInt8(ascii: "a") + 10
            case let c? where (UInt8(ascii: "A")...UInt8(ascii: "F")).contains(c): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        while let c = iterator.next() {
            if c == UInt8(ascii: "%") {
                guard let high = hexValue(iterator.next()), let low = hexValue(iterator.next()) else { return nil }
                bytes.append(high << 4 | low)
            } else {
                bytes.append(plusIsSpace && c == UInt8(ascii: "+") ? UInt8(ascii: " ") : c)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }
}

extension StringProtocol {
    fileprivate func trimmingSpaces() -> String {
        String(self.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
