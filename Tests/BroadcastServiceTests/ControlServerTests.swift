import BroadcastKit
import BroadcastService
import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import Testing

/// Runs `server` in a service group around `body`, then shuts it down gracefully.
func serving<T: Sendable>(_ server: ControlServer, _ body: () async throws -> T) async throws -> T {
    let group = ServiceGroup(services: [server], logger: Logger(label: "test"))
    return try await withThrowingTaskGroup(of: Void.self) { tasks in
        tasks.addTask { try await group.run() }
        do {
            try await server.waitUntilListening()
            let result = try await body()
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
            return result
        } catch {
            await group.triggerGracefulShutdown()
            try? await tasks.waitForAll()
            throw error
        }
    }
}

@Suite(.serialized) struct ControlServerTests {
    final class Counter: Sendable {
        let value = Mutex(0)
    }

    static func socketPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("ctl-\(UUID().uuidString.prefix(8)).sock").path
    }

    /// A server whose handler counts valid POST /v1/count requests and answers GET /v1/count.
    func withServer(
        deadline: Duration = .seconds(2),
        events: ControlEvents? = nil,
        _ body: (String, Counter) throws -> Void
    ) async throws {
        let path = Self.socketPath()
        let counter = Counter()
        let server = try ControlServer(socketPath: path, events: events, requestDeadline: deadline, logger: Logger(label: "test")) { request in
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
        // The body's socket calls block the test's thread, one of Swift's cooperative pool: the
        // server does not need it (its tasks run on its own thread; see answersWhileTheCooperativePoolIsBlocked).
        try await serving(server) { try body(path, counter) }
        #expect(!FileManager.default.fileExists(atPath: path), "the socket file is removed at stop")
    }

    @Test func servesRequestsAndSetsTheSocketMode() async throws {
        try await withServer { path, counter in
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
        let answer = readAnswer(fd)
        let text = String(decoding: answer.prefix(16), as: UTF8.self)
        guard text.hasPrefix("HTTP/1.1 "), let code = Int(text.dropFirst(9).prefix(3)) else { return 0 }
        return code
    }

    /// A request NIO's parser refuses is answered with why, not an empty 400 (a 10 000-character
    /// scene name made `broadcast scene` print "the daemon refused: " and nothing; issue 35 item 22).
    @Test func aRequestTheParserRefusesIsAnsweredWithWhy() async throws {
        try await withServer { path, counter in
            let client = ControlClient(socketPath: path)
            let long = try client.send(method: "POST", path: "/v1/scene/" + String(repeating: "a", count: 10_000))
            let text = String(decoding: long.body, as: UTF8.self)
            #expect(long.status == 431, "\(long.status) \(text)")
            guard case .object(let fields)? = JSONValue.parse(text), case .string(let message)? = fields.first(where: { $0.0 == "error" })?.1 else {
                Issue.record("no JSON error in \(long.status) '\(text)'")
                return
            }
            #expect(message.contains("\(8 * 1024) bytes"), "\(message)")
            // A header line without a colon: malformed, said so.
            let fd = Self.connectUnix(path)
            defer { close(fd) }
            let bytes = Array("GET /v1/count HTTP/1.1\r\nNo colon here\r\n\r\n".utf8)
            _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            let answer = String(decoding: Self.readAnswer(fd), as: UTF8.self)
            #expect(answer.hasPrefix("HTTP/1.1 400") && answer.contains("{\"error\":\"malformed HTTP request"), "\(answer)")
            #expect(counter.value.withLock { $0 } == 0)
            // The server goes on.
            #expect(try client.send(method: "POST", path: "/v1/count").status == 200)
        }
    }

    /// Targets with broken %-escapes are refused whole, whatever the method: a POST whose query
    /// cannot be decoded must not act on the path.
    @Test(arguments: ["/v1/count?x=%", "/v1/count?x=%4", "/v1/count?%zz=1", "/v1/c%zzount", "/v1/count?x=%ff", "/v1/count%"])
    func brokenPercentEncodingIsRefused(target: String) async throws {
        try await withServer { path, counter in
            let code = Self.raw(path, Array("POST \(target) HTTP/1.1\r\nContent-Length: 0\r\n\r\n".utf8))
            #expect(code == 400, "\(target) got \(code)")
            #expect(counter.value.withLock { $0 } == 0)
            // The same path, well formed, is served.
            #expect(Self.raw(path, Array("POST /v1/count?x=%41+b HTTP/1.1\r\nContent-Length: 0\r\n\r\n".utf8)) == 200)
        }
    }

    /// 10 000 random and malformed requests: the server never crashes, answers every complete one
    /// with a 4xx (never a 200 for garbage), and the state it guards is intact afterwards.
    @Test func fuzzedRequestsGetClientErrorsAndLeaveStateIntact() async throws {
        try await withServer { path, counter in
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
                case 1:  // random pieces of HTTP, never a well-formed POST /v1/count (about once in 200
                    // runs the pieces "POST", "/v1/count", "HTTP/1.1" come out in that order, spaced)
                    repeat {
                        bytes = Array((0..<Int.random(in: 1...8, using: &generator)).map { _ in pieces.randomElement(using: &generator)! }
                            .joined(separator: ["", " ", "\r\n"].randomElement(using: &generator)!).utf8) + Array("\r\n\r\n".utf8)
                    } while Self.isTheCountRequest(bytes)
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

    /// Whether `bytes` begin with the request line of a valid count request.
    static func isTheCountRequest(_ bytes: [UInt8]) -> Bool {
        let requestLine = Array("POST /v1/count HTTP/1.1".utf8)
        return bytes.starts(with: requestLine)
    }

    /// Two Content-Length headers that disagree are refused (request smuggling: a proxy in front
    /// could take the other one); the request is not executed. Equal ones are one length.
    @Test(arguments: [
        "Content-Length: 0\r\nContent-Length: 5",
        "Content-Length: 5\r\nContent-Length: 0",
        "Content-Length: 0, 5",
        "Content-length: 0\r\ncontent-LENGTH: 1",
    ])
    func conflictingContentLengthsAreRefused(headers: String) async throws {
        try await withServer { path, counter in
            let code = Self.raw(path, Array("POST /v1/count HTTP/1.1\r\n\(headers)\r\n\r\nhello".utf8))
            #expect(code == 400, "\(headers) got \(code)")
            #expect(counter.value.withLock { $0 } == 0, "the request was executed")
            // (Two equal lengths, which the old parser took as one, are refused by NIO's parser.)
            #expect(Self.raw(path, Array("POST /v1/count HTTP/1.1\r\nContent-Length: 0\r\n\r\n".utf8)) == 200)
        }
    }

    /// A port nobody listens on now (the kernel's choice).
    static func freePort() -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        return UInt16(bigEndian: address.sin_port)
    }

    /// Connects to 127.0.0.1:`port`, sends `request`, returns the answer's status code (0: none).
    static func tcpStatus(_ port: UInt16, _ request: String) -> Int {
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
        _ = Array(request.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        let answer = readAnswer(fd)
        return Int(String(decoding: answer.dropFirst(9).prefix(3), as: UTF8.self)) ?? 0
    }

    /// Reads until the server closes (or 30 s pass without a byte: a server that hangs fails the
    /// test instead of hanging it).
    static func readAnswer(_ fd: Int32) -> [UInt8] {
        var answer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 30_000) > 0 else { break }
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            answer += chunk[0..<n]
        }
        return answer
    }

    /// On TCP the token is required, and checked before anything else of the request (a body
    /// announced but never sent does not delay the 401); the scheme "Bearer" is case-insensitive,
    /// the token is not.
    @Test func tcpNeedsTheTokenBeforeAnythingElse() async throws {
        let path = Self.socketPath()
        let token = "0123456789abcdef-token"
        let port = Self.freePort()
        let server = try ControlServer(socketPath: path, tcp: ("127.0.0.1", port), token: token, logger: Logger(label: "test")) { _ in
            .json(200, .object([("ok", .bool(true))]))
        }
        try await serving(server) {
            do {
                func status(_ authorization: String?, body: String = "") -> Int {
                    Self.tcpStatus(port, "GET /v1/status HTTP/1.1\r\n" + (authorization.map { "Authorization: \($0)\r\n" } ?? "") + body + "\r\n")
                }
                #expect(status(nil) == 401)
                #expect(status("Bearer nope") == 401)
                #expect(status("Bearer \(token.uppercased())") == 401)
                #expect(status("Basic \(token)") == 401)
                #expect(status("Bearer \(token)\r\nAuthorization: Bearer \(token)") == 401, "two tokens")
                // A body announced and never sent: the 401 comes without waiting for it (this
                // would be cut off at the deadline with no answer if the body were read first).
                #expect(status("Bearer nope", body: "Content-Length: 60000\r\n") == 401)
                // And before the other checks of the request.
                #expect(Self.tcpStatus(port, "GET /v1/%zz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") == 401)
                for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
                    #expect(status("\(scheme) \(token)") == 200, "\(scheme)")
                }
            }
        }
    }

    /// A TCP listener without a token is an error, not a crash.
    @Test func tcpWithoutATokenIsAnError() throws {
        let path = Self.socketPath()
        #expect(throws: BroadcastError.self) {
            _ = try ControlServer(socketPath: path, tcp: ("127.0.0.1", 1), token: nil, logger: Logger(label: "test")) { _ in .error(404, "") }
        }
        #expect(!FileManager.default.fileExists(atPath: path))
    }

    /// Connects to the Unix socket at `path` (-1 when it cannot).
    static func connectUnix(_ path: String) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path.utf8)
            raw[path.utf8.count] = 0
        }
        let ok = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if ok != 0 {
            close(fd)
            return -1
        }
        return fd
    }

    /// Whether the server has closed `fd` (waiting at most `milliseconds` for it).
    static func closedByServer(_ fd: Int32, within milliseconds: Int32) -> Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, milliseconds) > 0 else { return false }
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK)) <= 0
    }

    /// A client sending its request a byte every 1.9 s (each byte within the old per-read timeout)
    /// is cut off by the deadline for the whole request, long before its request is complete.
    @Test func aClientDribblingBytesIsCutOff() async throws {
        try await withServer(deadline: .seconds(2)) { path, counter in
            let fd = Self.connectUnix(path)
            defer { close(fd) }
            let request = Array("POST /v1/count HTTP/1.1\r\nContent-Length: 0\r\n\r\n".utf8)
            var sent = 0
            var cut = false
            // 8 bytes take 15 s: the deadline (2 s) cuts in after the second or third.
            while sent < 8 && !cut {
                _ = request.withUnsafeBytes { send(fd, $0.baseAddress! + sent, 1, Int32(MSG_NOSIGNAL)) }
                sent += 1
                cut = Self.closedByServer(fd, within: 1900)
            }
            #expect(cut, "still connected after \(sent) bytes sent a byte every 1.9 s")
            #expect(counter.value.withLock { $0 } == 0)
        }
    }

    /// 20 clients that send half a request and then nothing hold only their own connections:
    /// 200 other clients at once are all answered while the 20 are still connected; a 1 MB body
    /// is refused from its Content-Length, before any of it is sent.
    @Test func stuckClientsDoNotBlockOthers() async throws {
        try await withServer(deadline: .seconds(120)) { path, counter in
            let stuck = (0..<20).map { _ in Self.connectUnix(path) }
            defer { for fd in stuck { close(fd) } }
            for fd in stuck {
                #expect(fd >= 0)
                _ = Array("POST /v1/count HTTP/1.1\r\nContent-".utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
            // 200 clients connected at once, each sending its request, then all answers read.
            let clients = (0..<200).map { _ in Self.connectUnix(path) }
            defer { for fd in clients where fd >= 0 { close(fd) } }
            #expect(clients.allSatisfy { $0 >= 0 }, "\(clients.filter { $0 < 0 }.count) could not connect")
            for fd in clients where fd >= 0 {
                _ = Array("GET /v1/count HTTP/1.1\r\n\r\n".utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
            let answered = clients.filter { $0 >= 0 && String(decoding: Self.readAnswer($0).prefix(12), as: UTF8.self) == "HTTP/1.1 200" }.count
            #expect(answered == 200)
            // The 1 MB body: announced, not sent; the 413 comes anyway.
            let big = Self.connectUnix(path)
            defer { close(big) }
            _ = Array("POST /v1/count HTTP/1.1\r\nContent-Length: 1048576\r\n\r\n".utf8).withUnsafeBytes {
                send(big, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            #expect(String(decoding: Self.readAnswer(big).prefix(12), as: UTF8.self) == "HTTP/1.1 413")
            // The stuck ones were not cut off meanwhile (their deadline is 2 minutes away).
            #expect(stuck.filter { Self.closedByServer($0, within: 0) }.isEmpty)
            #expect(counter.value.withLock { $0 } == 0)
        }
    }

    /// Reads from `fd` until the text read contains `needle` (or 30 s pass without a byte, or EOF).
    static func read(_ fd: Int32, until needle: String) -> String {
        var text = ""
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !text.contains(needle) {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 30_000) > 0 else { break }
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            text += String(decoding: chunk[0..<n], as: UTF8.self)
        }
        return text
    }

    static func eventIDs(_ text: String) -> [UInt64] {
        // (By line, "\r\n" of the chunked encoding included: one Character in Swift.)
        text.split(whereSeparator: { $0 == "\n" || $0 == "\r\n" }).compactMap { $0.hasPrefix("id: ") ? UInt64($0.dropFirst(4)) : nil }
    }

    /// `GET /v1/events`: the state first (with the last id), then each event in order; reconnecting
    /// with `Last-Event-ID` gets exactly the events missed, without the state.
    @Test func eventsStreamTheStateThenEachEventAndResume() async throws {
        let events = ControlEvents()
        events.publish("broadcast", [("state", .string("started"))])
        try await withServer(events: events) { path, _ in
            let fd = Self.connectUnix(path)
            _ = Array("GET /v1/events HTTP/1.1\r\n\r\n".utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            let head = Self.read(fd, until: "event: state")
            #expect(head.hasPrefix("HTTP/1.1 200") && head.lowercased().contains("content-type: text/event-stream"), "\(head)")
            for i in 0..<3 { events.publish("output", [("name", .string("rec")), ("n", .number(Double(i)))]) }
            let first = head + Self.read(fd, until: "id: 4\n")
            close(fd)
            #expect(Self.eventIDs(first) == [1, 2, 3, 4], "\(first)")
            // Missed while disconnected: 5 and 6.
            events.publish("output", [("name", .string("rec")), ("state", .string("paused"))])
            events.publish("broadcast", [("state", .string("finished"))])
            let again = Self.connectUnix(path)
            defer { close(again) }
            _ = Array("GET /v1/events HTTP/1.1\r\nLast-Event-ID: 4\r\n\r\n".utf8).withUnsafeBytes {
                send(again, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            let resumed = Self.read(again, until: "id: 6\n")
            #expect(Self.eventIDs(resumed) == [5, 6], "\(resumed)")
            #expect(!resumed.contains("event: state"))
            #expect(resumed.contains("event: broadcast\ndata: {\"time\":"), "\(resumed)")
        }
    }

    /// An events client that reads nothing is dropped once its queue is full and its connection
    /// closed; publishing never waits for it and the server answers others meanwhile.
    @Test func anEventsClientThatNeverReadsIsDropped() async throws {
        let events = ControlEvents(clientQueueLimit: 16)
        try await withServer(events: events) { path, _ in
            let fd = Self.connectUnix(path)
            defer { close(fd) }
            var small: Int32 = 4096
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
            _ = Array("GET /v1/events HTTP/1.1\r\n\r\n".utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            while events.clientCount == 0 { usleep(1000) }
            let padding = JSONValue.string(String(repeating: "x", count: 500))
            // Far more than the socket, NIO's buffer and the queue hold together.
            var published = 0
            // Slowly enough that the server's writer keeps up until the client's socket is full:
            // then it waits in a write that never completes, and only the drop ends it.
            while events.clientCount > 0 && published < 20_000 {
                events.publish("output", [("padding", padding)])
                published += 1
                usleep(200)
            }
            #expect(events.clientCount == 0, "still subscribed after \(published) events")
            #expect(Self.raw(path, Array("GET /v1/count HTTP/1.1\r\n\r\n".utf8)) == 200)
            // The connection is closed: reading drains what was buffered, then ends.
            var chunk = [UInt8](repeating: 0, count: 65536)
            var total = 0
            while true {
                var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                guard poll(&pfd, 1, 30_000) > 0 else { break }
                let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
                if n <= 0 { break }
                total += n
            }
            #expect(total < published * 500, "got \(total) bytes of \(published) events")
        }
    }

    /// 64 event streams at once; the 65th is refused (503) and the others go on.
    @Test func eventStreamsAreBounded() async throws {
        let events = ControlEvents()
        try await withServer(events: events) { path, _ in
            var streams: [Int32] = []
            defer { for fd in streams { close(fd) } }
            for _ in 0..<64 {
                let fd = Self.connectUnix(path)
                streams.append(fd)
                _ = Array("GET /v1/events HTTP/1.1\r\n\r\n".utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                _ = Self.read(fd, until: "event: state")
            }
            #expect(events.clientCount == 64)
            #expect(Self.raw(path, Array("GET /v1/events HTTP/1.1\r\n\r\n".utf8)) == 503)
            events.publish("output", [("name", .string("rec"))])
            #expect(streams.allSatisfy { Self.read($0, until: "id: 1\n").contains("event: output") })
        }
    }

    /// 100 clients ask for the events at once: exactly 64 streams, the others 503 (before: the
    /// limit was checked two awaits before the subscription, and 96 of 100 got through).
    @Test func aBurstOfEventClientsStaysWithinTheLimit() async throws {
        let events = ControlEvents()
        try await withServer(events: events) { path, _ in
            let fds = (0..<100).map { _ in Self.connectUnix(path) }
            defer { for fd in fds { close(fd) } }
            #expect(fds.allSatisfy { $0 >= 0 })
            for fd in fds {
                _ = Array("GET /v1/events HTTP/1.1\r\n\r\n".utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
            let heads = fds.map { Self.read($0, until: "\r\n\r\n") }
            let streams = heads.filter { $0.hasPrefix("HTTP/1.1 200") }.count
            let refused = heads.filter { $0.hasPrefix("HTTP/1.1 503") }.count
            #expect(streams == 64 && refused == 36, "\(streams) streams, \(refused) refused")
            #expect(events.clientCount == 64)
        }
    }

    /// The TCP listener holds at most 64 connections: with 80 open and silent, a request with
    /// the token is answered 503; once they are closed, 200 again (before: no cap at all).
    @Test func tcpConnectionsAreCapped() async throws {
        let path = Self.socketPath()
        let token = "0123456789abcdef-token"
        let port = Self.freePort()
        let server = try ControlServer(
            socketPath: path, tcp: ("127.0.0.1", port), token: token, requestDeadline: .seconds(60), logger: Logger(label: "test")
        ) { _ in .json(200, .object([("ok", .bool(true))])) }
        try await serving(server) {
            let request = "GET /v1/status HTTP/1.1\r\nAuthorization: Bearer \(token)\r\n\r\n"
            var silent: [Int32] = []
            for _ in 0..<80 {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var address = sockaddr_in()
                address.sin_family = sa_family_t(AF_INET)
                address.sin_port = port.bigEndian
                address.sin_addr.s_addr = inet_addr("127.0.0.1")
                _ = withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                }
                silent.append(fd)
            }
            // Accepted in their own time: once 65 or more are counted, the answer is 503.
            var capped = 0
            for _ in 0..<300 {
                capped = Self.tcpStatus(port, request)
                if capped == 503 { break }
                usleep(100_000)
            }
            #expect(capped == 503)
            for fd in silent { close(fd) }
            var after = 0
            for _ in 0..<300 {
                after = Self.tcpStatus(port, request)
                if after == 200 { break }
                usleep(100_000)
            }
            #expect(after == 200, "after the silent connections closed: \(after)")
        }
    }

    /// The socket never exists where clients look with another mode than its own: a watcher
    /// polling the path from before the start sees 0660 the first time it sees the socket (before:
    /// bind made it 0777 less the umask, and a chmod followed, unchecked). Nothing is left beside it.
    @Test func theSocketAppearsWithItsMode() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ctl-mode-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for round in 0..<10 {
            let path = directory + "/control.sock"
            let firstSeen = Mutex<mode_t?>(nil)
            let stop = Mutex(false)
            let watcher = Thread {
                var info = stat()
                while !stop.withLock({ $0 }) {
                    if lstat(path, &info) == 0 {
                        firstSeen.withLock { $0 = info.st_mode & 0o7777 }
                        return
                    }
                }
            }
            watcher.start()
            let server = try ControlServer(socketPath: path, mode: 0o660, logger: Logger(label: "test")) { _ in .error(404, "") }
            try await serving(server) {
                // Listening: the socket is there; the watcher sees it within moments.
                for _ in 0..<3000 where firstSeen.withLock({ $0 }) == nil { try await Task.sleep(for: .milliseconds(10)) }
            }
            stop.withLock { $0 = true }
            let mode = firstSeen.withLock { $0 }
            #expect(mode == 0o660, "round \(round): the socket was first seen with mode \(mode.map { String($0, radix: 8) } ?? "none")")
            let left = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
            #expect(left.isEmpty, "left beside the socket: \(left)")
        }
    }

    /// Requests are answered while every thread of Swift's cooperative pool is blocked (by other
    /// work of the process: a host's services, a test runner's synchronous tests): the server's
    /// tasks run on a thread of its own.
    @Test func answersWhileTheCooperativePoolIsBlocked() async throws {
        try await withServer { path, counter in
            let blockers = 2 * ProcessInfo.processInfo.activeProcessorCount + 2
            let release = DispatchSemaphore(value: 0)
            let started = DispatchSemaphore(value: 0)
            for _ in 0..<blockers {
                Task.detached {
                    started.signal()
                    release.wait()
                }
            }
            // The pool has a thread per core: this test's body holds one, blockers hold the others.
            for _ in 0..<(ProcessInfo.processInfo.activeProcessorCount - 1) { started.wait() }
            let code = Self.raw(path, Array("POST /v1/count HTTP/1.1\r\nContent-Length: 0\r\n\r\n".utf8))
            for _ in 0..<blockers { release.signal() }
            #expect(code == 200)
            #expect(counter.value.withLock { $0 } == 1)
        }
    }
}
