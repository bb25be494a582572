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
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        guard socketPath.utf8.count < MemoryLayout.size(ofValue: address.sun_path) else {
            throw BroadcastError(.invalidArgument, "control socket \(socketPath): path too long")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: socketPath.utf8)
            raw[socketPath.utf8.count] = 0
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BroadcastError(.outputFailed, "control socket: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            let reason = String(cString: strerror(errno))
            throw BroadcastError(
                .invalidArgument,
                "cannot reach the daemon at \(socketPath): \(reason) (is `broadcast daemon` running? see --socket)"
            )
        }
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

    static func headerEnd(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for i in 0...(bytes.count - 4) where bytes[i] == 13 && bytes[i + 1] == 10 && bytes[i + 2] == 13 && bytes[i + 3] == 10 {
            return i
        }
        return nil
    }
}
