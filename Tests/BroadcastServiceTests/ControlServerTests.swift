import BroadcastKit
import BroadcastService
import Foundation
import Logging
import Synchronization
import Testing

@Suite(.serialized) struct ControlServerTests {
    final class Counter: Sendable {
        let value = Mutex(0)
    }

    /// A server whose handler counts valid POST /v1/count requests and answers GET /v1/count.
    func withServer(_ body: (String, Counter) throws -> Void) throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("ctl-\(UUID().uuidString.prefix(8)).sock").path
        let counter = Counter()
        let server = try ControlServer(socketPath: path, logger: Logger(label: "test")) { request in
            switch (request.method, request.path) {
            case ("POST", "/v1/count"):
                let n = counter.value.withLock { $0 += 1; return $0 }
                return .json(200, .object([("count", .number(Double(n)))]))
            case ("GET", "/v1/count"):
                return .json(200, .object([("count", .number(Double(counter.value.withLock { $0 })))]))
            default:
                return .error(404, "no such endpoint")
            }
        }
        defer { server.stop() }
        try body(path, counter)
    }

    @Test func servesRequestsAndSetsTheSocketMode() throws {
        try withServer { path, counter in
            var info = stat()
            #expect(stat(path, &info) == 0)
            #expect(info.st_mode & 0o777 == 0o660)
            let client = ControlClient(socketPath: path)
            let (status, body) = try client.send(method: "POST", path: "/v1/count")
            #expect(status == 200)
            #expect(String(decoding: body, as: UTF8.self).contains("\"count\":1"))
            #expect(try client.send(method: "GET", path: "/nope").status == 404)
            #expect(counter.value.withLock { $0 } == 1)
        }
    }

    /// Sends raw bytes, returns the status code of the answer (0 when there was none).
    static func raw(_ path: String, _ bytes: [UInt8], closeEarly: Bool = false) -> Int {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path.utf8)
            raw[path.utf8.count] = 0
        }
        let ok = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard ok == 0 else { return -1 }
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if closeEarly { shutdown(fd, Int32(SHUT_WR)) }
        var answer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            answer += chunk[0..<n]
        }
        let text = String(decoding: answer.prefix(16), as: UTF8.self)
        guard text.hasPrefix("HTTP/1.1 "), let code = Int(text.dropFirst(9).prefix(3)) else { return 0 }
        return code
    }

    /// Targets with broken %-escapes are refused whole, whatever the method: a POST whose query
    /// cannot be decoded must not act on the path.
    @Test(arguments: ["/v1/count?x=%", "/v1/count?x=%4", "/v1/count?%zz=1", "/v1/c%zzount", "/v1/count?x=%ff", "/v1/count%"])
    func brokenPercentEncodingIsRefused(target: String) throws {
        try withServer { path, counter in
            let code = Self.raw(path, Array("POST \(target) HTTP/1.1\r\nContent-Length: 0\r\n\r\n".utf8))
            #expect(code == 400, "\(target) got \(code)")
            #expect(counter.value.withLock { $0 } == 0)
            // The same path, well formed, is served.
            #expect(Self.raw(path, Array("POST /v1/count?x=%41+b HTTP/1.1\r\nContent-Length: 0\r\n\r\n".utf8)) == 200)
        }
    }

    /// 10 000 random and malformed requests: the server never crashes, answers every complete one
    /// with a 4xx (never a 200 for garbage), and the state it guards is intact afterwards.
    @Test func fuzzedRequestsGetClientErrorsAndLeaveStateIntact() throws {
        try withServer { path, counter in
            var generator = SystemRandomNumberGenerator()
            let pieces: [String] = [
                "GET", "POST", "PUT", "get", "", " ", "/v1/count", "/v1/status", "//", "/%zz", "/v1/count?x=%", "*",
                "HTTP/1.1", "HTTP/2", "HTTP/1.1\r\n", "\r\n", "\r\n\r\n", "Content-Length: 5", "Content-Length: -1",
                "Content-Length: 999999999", "Transfer-Encoding: chunked", "Host: x", ":", "X:\u{0}", "\u{FF}\u{FE}", "\n",
            ]
            var answered4xx = 0
            for i in 0..<10_000 {
                var bytes: [UInt8]
                switch i % 4 {
                case 0:  // random bytes
                    bytes = (0..<Int.random(in: 0...300, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
                    bytes += Array("\r\n\r\n".utf8)
                case 1:  // random pieces of HTTP
                    bytes = Array((0..<Int.random(in: 1...8, using: &generator)).map { _ in pieces.randomElement(using: &generator)! }
                        .joined(separator: ["", " ", "\r\n"].randomElement(using: &generator)!).utf8) + Array("\r\n\r\n".utf8)
                case 2:  // a valid request with one byte flipped, never a valid POST
                    var request = Array("POST /v1/count HTTP/1.1\r\nContent-Length: 0\r\n\r\n".utf8)
                    let at = Int.random(in: 0..<14, using: &generator)
                    request[at] = request[at] == UInt8(ascii: "_") ? UInt8(ascii: "-") : UInt8(ascii: "_")
                    bytes = request
                default:  // oversized or truncated
                    bytes = Bool.random(using: &generator)
                        ? Array("GET /v1/count HTTP/1.1\r\nX: \(String(repeating: "a", count: 9000))\r\n\r\n".utf8)
                        : Array("POST /v1/count HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc".utf8)
                }
                let code = Self.raw(path, bytes, closeEarly: i % 4 == 3)
                #expect(code == 0 || (400..<600).contains(code), "request \(i) got \(code): \(String(decoding: bytes.prefix(60), as: UTF8.self))")
                if (400..<500).contains(code) { answered4xx += 1 }
            }
            #expect(answered4xx > 5_000)
            #expect(counter.value.withLock { $0 } == 0, "a malformed request changed state")
            // Still serving, state intact.
            let (status, body) = try ControlClient(socketPath: path).send(method: "GET", path: "/v1/count")
            #expect(status == 200)
            #expect(String(decoding: body, as: UTF8.self).contains("\"count\":0"))
        }
    }

    /// Two Content-Length headers that disagree are refused (request smuggling: a proxy in front
    /// could take the other one); the request is not executed. Equal ones are one length.
    @Test(arguments: [
        "Content-Length: 0\r\nContent-Length: 5",
        "Content-Length: 5\r\nContent-Length: 0",
        "Content-Length: 0, 5",
        "Content-length: 0\r\ncontent-LENGTH: 1",
    ])
    func conflictingContentLengthsAreRefused(headers: String) throws {
        try withServer { path, counter in
            let code = Self.raw(path, Array("POST /v1/count HTTP/1.1\r\n\(headers)\r\n\r\nhello".utf8))
            #expect(code == 400, "\(headers) got \(code)")
            #expect(counter.value.withLock { $0 } == 0, "the request was executed")
            #expect(Self.raw(path, Array("POST /v1/count HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n".utf8)) == 200)
        }
    }

    /// On TCP the token is required; the scheme "Bearer" is case-insensitive, the token is not.
    @Test func bearerSchemeIsCaseInsensitive() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("ctl-\(UUID().uuidString.prefix(8)).sock").path
        let token = "0123456789abcdef-token"
        var server: ControlServer?
        var port: UInt16 = 0
        for attempt in 0..<20 where server == nil {
            port = UInt16(30_000 + Int(getpid() % 10_000) + attempt * 11)
            server = try? ControlServer(socketPath: path, tcp: ("127.0.0.1", port), token: token, logger: Logger(label: "test")) { _ in
                .json(200, .object([("ok", .bool(true))]))
            }
        }
        let running = try #require(server)
        defer { running.stop() }
        func status(_ authorization: String?) -> Int {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let ok = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard ok == 0 else { return -1 }
            let request = "GET /v1/status HTTP/1.1\r\n" + (authorization.map { "Authorization: \($0)\r\n" } ?? "") + "\r\n"
            _ = Array(request.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            var answer: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n <= 0 { break }
                answer += chunk[0..<n]
            }
            return Int(String(decoding: answer.dropFirst(9).prefix(3), as: UTF8.self)) ?? 0
        }
        #expect(status(nil) == 401)
        #expect(status("Bearer nope") == 401)
        #expect(status("Bearer \(token.uppercased())") == 401)
        #expect(status("Basic \(token)") == 401)
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            #expect(status("\(scheme) \(token)") == 200, "\(scheme)")
        }
    }

    /// A TCP listener without a token is an error, not a crash.
    @Test func tcpWithoutATokenIsAnError() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("ctl-\(UUID().uuidString.prefix(8)).sock").path
        #expect(throws: BroadcastError.self) {
            _ = try ControlServer(socketPath: path, tcp: ("127.0.0.1", 1), token: nil, logger: Logger(label: "test")) { _ in .error(404, "") }
        }
        #expect(!FileManager.default.fileExists(atPath: path))
    }
}
