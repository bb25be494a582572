public import BroadcastKit

#if canImport(Glibc)
import Glibc
#endif

/// Talks to a daemon's control socket: one HTTP/1.1 request per connection.
public struct ControlClient: Sendable {
    public let socketPath: String

    public init(socketPath: String) { self.socketPath = socketPath }

    /// Sends the request and returns the status code and body. Errors name the socket and why.
    public func send(method: String, path: String, body: [UInt8] = []) throws(BroadcastError) -> (status: Int, body: [UInt8]) {
        let fd = try connect()
        defer { close(fd) }
        var request = Array("\(method) \(path) HTTP/1.1\r\nHost: localhost\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n".utf8)
        request += body
        var offset = 0
        while offset < request.count {
            let n = request.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, request.count - offset, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw BroadcastError(.outputFailed, "control socket \(socketPath): the daemon closed the connection") }
            offset += n
        }
        var response: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 30_000) > 0 else {
                throw BroadcastError(.outputFailed, "control socket \(socketPath): no answer within 30 s")
            }
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            response += chunk[0..<n]
        }
        guard let split = Self.headerEnd(response),
            let head = String(validating: response[0..<split], as: UTF8.self),
            let statusText = head.split(separator: " ").dropFirst().first, let status = Int(statusText)
        else {
            throw BroadcastError(.outputFailed, "control socket \(socketPath): malformed answer")
        }
        return (status, Array(response[(split + 4)...]))
    }

    /// A connected socket to the daemon; errors name the socket and the likely cause.
    private func connect() throws(BroadcastError) -> Int32 {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        guard socketPath.utf8.count < MemoryLayout.size(ofValue: address.sun_path) else {
            throw BroadcastError(.invalidArgument, "control socket \(socketPath): path too long")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: socketPath.utf8)
            raw[socketPath.utf8.count] = 0
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw BroadcastError(.outputFailed, "control socket: \(String(cString: strerror(errno)))") }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            let reason = String(cString: strerror(errno))
            throw BroadcastError(
                .invalidArgument,
                "cannot reach the daemon at \(socketPath): \(reason) (is `broadcast daemon` running? see --socket)"
            )
        }
        return fd
    }

    /// `events` throws this when the connection ends before the stream's end (no last chunk): the
    /// daemon went away without ending it (killed, crashed).
    public static let streamCut = BroadcastError.Code(rawValue: "stream-cut")

    /// One server-sent event.
    public struct Event: Sendable {
        public var id: UInt64?
        public var type: String
        public var data: String
    }

    /// Follows `GET /v1/events` (from after `lastEventID` when given), calling `onEvent` for each
    /// event until it returns false or the daemon ends the stream. Returns the HTTP status when the
    /// daemon refused the stream, 200 when it ended.
    @discardableResult
    /// `query`: "levels=1" for the transient `levels` and `status` events too.
    public func events(lastEventID: UInt64? = nil, query: String = "", _ onEvent: (Event) -> Bool) throws(BroadcastError) -> Int {
        let fd = try connect()
        defer { close(fd) }
        let request = "GET /v1/events\(query.isEmpty ? "" : "?" + query) HTTP/1.1\r\nHost: localhost\r\n" + (lastEventID.map { "Last-Event-ID: \($0)\r\n" } ?? "") + "\r\n"
        let bytes = Array(request.utf8)
        guard bytes.withUnsafeBytes({ Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == bytes.count else {
            throw BroadcastError(.outputFailed, "control socket \(socketPath): the daemon closed the connection")
        }
        var received: [UInt8] = []
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        var headDone = false
        var chunked = false
        var ended = false
        var event = Event(id: nil, type: "message", data: "")
        var hasData = false
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n <= 0 {
                // A stream the daemon ended has its last chunk; one cut short (the daemon killed)
                // has not. (A connection closed before any answer: a daemon on its way out.)
                if headDone && chunked { throw BroadcastError(Self.streamCut, "control socket \(socketPath): the event stream was cut off") }
                return 200
            }
            received += chunk[0..<n]
            if !headDone {
                guard let end = Self.headerEnd(received) else { continue }
                let head = String(decoding: received[0..<end], as: UTF8.self)
                let status = head.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
                if status != 200 { return status }
                chunked = head.lowercased().contains("transfer-encoding: chunked")
                received.removeFirst(end + 4)
                headDone = true
            }
            if chunked {
                // Each chunk: its size in hex, CRLF, the bytes, CRLF; size 0 ends the stream.
                while let lineEnd = Self.crlf(in: received) {
                    let sizeText = String(decoding: received[..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
                    guard let size = Int(String(sizeText.filter { $0 != " " }), radix: 16) else {
                        throw BroadcastError(.outputFailed, "control socket \(socketPath): malformed event stream")
                    }
                    if size == 0 {
                        // The end: what came before it in this read is still to be handed on.
                        ended = true
                        break
                    }
                    guard received.count >= lineEnd + 2 + size + 2 else { break }
                    buffer += received[(lineEnd + 2)..<(lineEnd + 2 + size)]
                    received.removeFirst(lineEnd + 2 + size + 2)
                }
            } else {
                buffer += received
                received = []
            }
            while let newline = buffer.firstIndex(of: 0x0A) {
                var line = String(decoding: buffer[..<newline], as: UTF8.self)
                buffer.removeFirst(newline + 1)
                if line.hasSuffix("\r") { line.removeLast() }
                if line.isEmpty {
                    if hasData && !onEvent(event) { return 200 }
                    event = Event(id: event.id, type: "message", data: "")
                    hasData = false
                    continue
                }
                if line.hasPrefix(":") { continue }
                let colon = line.firstIndex(of: ":") ?? line.endIndex
                let field = line[..<colon]
                var value = colon < line.endIndex ? line[line.index(after: colon)...] : ""
                if value.hasPrefix(" ") { value = value.dropFirst() }
                switch field {
                case "id": event.id = UInt64(value)
                case "event": event.type = String(value)
                case "data":
                    event.data += hasData ? "\n" + value : String(value)
                    hasData = true
                default: break
                }
            }
            if ended { return 200 }
        }
    }

    static func crlf(in bytes: [UInt8]) -> Int? {
        guard bytes.count >= 2 else { return nil }
        for i in 0..<(bytes.count - 1) where bytes[i] == 13 && bytes[i + 1] == 10 { return i }
        return nil
    }

    static func headerEnd(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for i in 0...(bytes.count - 4) where bytes[i] == 13 && bytes[i + 1] == 10 && bytes[i + 2] == 13 && bytes[i + 3] == 10 {
            return i
        }
        return nil
    }
}
