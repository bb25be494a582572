public import BroadcastKit
import Dispatch
import HTTPTypes
import HummingbirdCore
public import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOPosix
public import ServiceLifecycle
import Synchronization

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
    /// More header fields (the page's Content-Security-Policy).
    public var headers: [String: String] = [:]

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

/// The control API's HTTP server: HummingbirdCore (SwiftNIO) on the Unix socket and, only when
/// configured, on a TCP address where every request needs `Authorization: Bearer <token>`.
///
/// Many clients at once (NIO serves each connection on its own; a client that is slow to send
/// holds nothing but its own connection); one request per connection (`Connection: close`); each
/// connection has `requestDeadline` from accept to the end of its request, or it is closed. Limits:
/// 8 KiB of headers (NIO's parser), 64 KiB of body (refused from its Content-Length before any of
/// it is read), and on TCP the token is checked before anything else of the request.
///
/// The handler is synchronous (it takes the daemon's locks, may join a thread at stop): it runs on
/// dispatch queues of its own, actions one at a time, never on Swift's cooperative threads or NIO's
/// event loops. `GET /v1/events` is served here from `events` (server-sent events).
///
/// A `Service`: `run()` binds and serves until graceful shutdown, then ends the event streams,
/// lets open requests finish and removes the socket file.
/// The bearer token the TCP listener checks. A reload replaces it (`replace(with:)`), so a token is
/// rotated without a restart: the next request is checked against the new one, the old one is 401.
public final class ControlToken: Sendable {
    private let value: Mutex<String?>
    public init(_ value: String?) { self.value = Mutex(value) }
    public var current: String? { value.withLock { $0 } }
    public func replace(with token: String?) { value.withLock { $0 = token } }
}

public final class ControlServer: Service, Sendable {
    public typealias Handler = @Sendable (ControlRequest) -> ControlResponse

    public let socketPath: String
    private let mode: UInt32
    /// The socket's group (a gid), given before its mode; nil: the daemon's own group.
    private let group: UInt32?
    private let tcp: (host: String, port: UInt16)?
    /// The TCP listener's token, replaced by a reload.
    public let token: ControlToken
    private let handler: Handler
    private let events: ControlEvents?
    private let snapshot: @Sendable () -> JSONValue
    private let logger: Logger
    let requestDeadline: Duration
    /// Paths answered to GET and HEAD on the TCP listener without the token (the control page's
    /// own files, which hold nothing of the daemon's).
    private let publicPaths: Set<String>
    /// Paths answered to POST on the TCP listener without the token (`broadcast ui`'s login, which
    /// checks a one-time code of its own).
    private let publicPosts: Set<String>
    private let listening = Mutex<ListenState>(.waiting([]))
    private let boundTCPPort = Mutex<Int?>(nil)
    /// The TCP listener's port once it listens (the one the system chose for port 0).
    public var tcpPort: Int? { boundTCPPort.withLock { $0 } }
    private let actions = DispatchQueue(label: "bc-control")
    private let reads = DispatchQueue(label: "bc-control-read", attributes: .concurrent)

    private enum ListenState {
        case waiting([CheckedContinuation<Void, any Error>])
        case listening(Int)
        case failed(any Error)
        case stopped
    }

    /// Connections open at once on the TCP listener; more are answered 503 (each is held at most
    /// `requestDeadline` from its accept, so the descriptors it can take are bounded too).
    static let maxTCPConnections = 64
    private let tcpConnections = ConnectionCount()
    static let maxHeaderBytes = 8 * 1024
    static let maxBodyBytes = 64 * 1024
    /// Event streams at once (each may hold up to `ControlEvents.clientQueueLimit` events).
    static let maxEventClients = 64
    /// How long an events client that was dropped may take to read its `dropped` notice.
    static let droppedGrace: TimeAmount = .seconds(1)

    /// Checks the addresses (a live daemon on the socket, a file that is not a socket, a TCP
    /// listener without a token): nothing is bound until `run`.
    public convenience init(
        socketPath: String,
        mode: UInt32 = 0o660,
        group: UInt32? = nil,
        tcp: (host: String, port: UInt16)? = nil,
        token: String? = nil,
        events: ControlEvents? = nil,
        snapshot: @escaping @Sendable () -> JSONValue = { .object([]) },
        requestDeadline: Duration = .seconds(2),
        publicPaths: Set<String> = [],
        publicPosts: Set<String> = [],
        logger: Logger,
        handler: @escaping Handler
    ) throws(BroadcastError) {
        try self.init(
            socketPath: socketPath, mode: mode, group: group, tcp: tcp, token: ControlToken(token), events: events, snapshot: snapshot,
            requestDeadline: requestDeadline, publicPaths: publicPaths, publicPosts: publicPosts, logger: logger, handler: handler)
    }

    /// With a `ControlToken` the caller keeps, to replace the token later (a reload).
    public init(
        socketPath: String,
        mode: UInt32 = 0o660,
        group: UInt32? = nil,
        tcp: (host: String, port: UInt16)? = nil,
        token: ControlToken,
        events: ControlEvents? = nil,
        snapshot: @escaping @Sendable () -> JSONValue = { .object([]) },
        requestDeadline: Duration = .seconds(2),
        publicPaths: Set<String> = [],
        publicPosts: Set<String> = [],
        logger: Logger,
        handler: @escaping Handler
    ) throws(BroadcastError) {
        if tcp != nil && (token.current ?? "").isEmpty {
            throw BroadcastError(.invalidArgument, "control tcp: a TCP control listener needs a token")
        }
        try Self.checkSocketPath(socketPath)
        self.socketPath = socketPath
        self.mode = mode
        self.group = group
        self.tcp = tcp
        self.token = token
        self.events = events
        self.snapshot = snapshot
        self.requestDeadline = requestDeadline
        self.publicPaths = publicPaths
        self.publicPosts = publicPosts
        self.handler = handler
        self.logger = logger
    }

    /// Returns once every listener is bound (the socket has its mode); throws why one could not be.
    public func waitUntilListening() async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let result: Result<Void, any Error>? = listening.withLock { state in
                switch state {
                case .waiting(var waiters):
                    waiters.append(continuation)
                    state = .waiting(waiters)
                    return nil
                case .listening: return .success(())
                case .failed(let error): return .failure(error)
                case .stopped: return .failure(BroadcastError(.invalidArgument, "control socket \(socketPath): the server has stopped"))
                }
            }
            if let result { continuation.resume(with: result) }
        }
    }

    private func listened() {
        let waiters = listening.withLock { state -> [CheckedContinuation<Void, any Error>] in
            guard case .waiting(let waiters) = state else { return [] }
            state = .listening(tcp == nil ? 1 : 2)
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    private func ended(_ error: (any Error)?) {
        let waiters = listening.withLock { state -> [CheckedContinuation<Void, any Error>] in
            defer { state = error.map { .failed($0) } ?? .stopped }
            if case .waiting(let waiters) = state { return waiters }
            return []
        }
        let failure = error ?? BroadcastError(.invalidArgument, "control socket \(socketPath): the server has stopped")
        for waiter in waiters { waiter.resume(throwing: failure) }
    }

    public func run() async throws {
        let channel = HTTP1Channel.Configuration(
            additionalChannelHandlers: [ConnectionDeadline(TimeAmount(self.requestDeadline))],
            idleTimeout: nil,
            httpDecoderConfiguration: .init(
                maxHeaderFieldSize: Self.maxHeaderBytes, maxHeaderListSize: Self.maxHeaderBytes, maxHeaderFieldCount: 100)
        )
        let bound = ListenerCount(expected: tcp == nil ? 1 : 2)
        // The socket is bound in a directory of its own that only we can enter (mkdtemp: 0700),
        // given its mode there, and renamed into place: it never exists where clients look with
        // the mode bind gave it (0777 less the umask), and a mode that cannot be set is an error.
        let staging: String
        do {
            staging = try Self.stagingDirectory(beside: socketPath)
        } catch {
            ended(error)
            throw error
        }
        let stagedPath = staging + "/s"
        // Hummingbird's "listening on" line would name the staged path: the daemon names the
        // socket itself once it is in place.
        var unixLogger = logger
        unixLogger.logLevel = max(logger.logLevel, .notice)
        defer {
            unlink(stagedPath)
            rmdir(staging)
        }
        let unix = Server(
            childChannelSetup: HTTP1Channel(
                responder: { request, writer, channel in try await self.respond(request, writer, channel, needsToken: false) },
                configuration: channel),
            configuration: ServerConfiguration(address: .unixDomainSocket(path: stagedPath)),
            onServerRunning: { _ in
                let problem = Self.moveIntoPlace(stagedPath, to: self.socketPath, mode: self.mode, group: self.group)
                rmdir(staging)
                if let problem {
                    // Nobody can reach the staged socket: waiters (the daemon) end with this line.
                    self.ended(BroadcastError(.invalidArgument, "control socket \(self.socketPath): \(problem)"))
                    return
                }
                if bound.one() { self.listened() }
            },
            eventLoopGroup: MultiThreadedEventLoopGroup.singleton,
            logger: unixLogger
        )
        // TCP first: once the socket file exists, both listeners are up (clients wait for the file).
        let (tcpBound, tcpBoundSignal) = AsyncStream.makeStream(of: Void.self)
        var tcpChannel = channel
        let tcpConnections = self.tcpConnections
        tcpChannel.additionalChannelHandlers = { [ConnectionDeadline(TimeAmount(self.requestDeadline), counting: tcpConnections)] }
        let tcpServer = tcp.map { tcp in
            Server(
                childChannelSetup: HTTP1Channel(
                    responder: { request, writer, channel in try await self.respond(request, writer, channel, needsToken: true) },
                    configuration: tcpChannel),
                configuration: ServerConfiguration(address: .hostname(tcp.host, port: Int(tcp.port))),
                onServerRunning: { channel in
                    self.boundTCPPort.withLock { $0 = channel.localAddress?.port }
                    tcpBoundSignal.finish()
                    if bound.one() { self.listened() }
                },
                eventLoopGroup: MultiThreadedEventLoopGroup.singleton,
                logger: logger
            )
        }
        // Every task of the server (one per connection, made by Hummingbird's task group) runs on
        // the control thread, whatever keeps the cooperative pool busy. The process's one: tasks
        // that prefer it may outlive this run (see `ControlExecutor`).
        let executor = ControlExecutor.shared
        do {
            try await withTaskExecutorPreference(executor) {
                try await withGracefulShutdownHandler {
                    try await withThrowingDiscardingTaskGroup { group in
                        if let tcpServer, let tcp {
                            let failed = Mutex(false)
                            group.addTask {
                                do { try await tcpServer.run() } catch {
                                    // A port that is taken: the wait below ends too (it waited for
                                    // ever, and the daemon hung at start with nothing logged).
                                    failed.withLock { $0 = true }
                                    tcpBoundSignal.finish()
                                    throw BroadcastError(.invalidArgument, "control tcp \(tcp.host):\(tcp.port): \(error)")
                                }
                            }
                            for await _ in tcpBound {}
                            if Task.isCancelled || Task.isShuttingDownGracefully || failed.withLock({ $0 }) { return }
                        }
                        group.addTask {
                            do { try await unix.run() } catch {
                                throw BroadcastError(.invalidArgument, "control socket \(self.socketPath): \(error)")
                            }
                        }
                    }
                } onGracefulShutdown: {
                    self.events?.finish()
                    tcpBoundSignal.finish()
                }
            }
        } catch {
            ended(error)
            unlink(socketPath)
            throw error
        }
        ended(nil)
        unlink(socketPath)
    }

    /// A new directory beside `socketPath` only this user can enter, for the socket to be bound in.
    private static func stagingDirectory(beside socketPath: String) throws(BroadcastError) -> String {
        let directory = socketPath.lastIndex(of: "/").map { String(socketPath[..<$0]) } ?? "."
        var template = Array("\(directory.isEmpty ? "" : directory)/.bind-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) != nil }
        guard made else {
            throw BroadcastError(.invalidArgument, "control socket \(socketPath): cannot make a directory beside it: \(String(cString: strerror(errno)))")
        }
        let path = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        guard path.utf8.count + 2 < MemoryLayout.size(ofValue: sockaddr_un().sun_path) else {
            rmdir(path)
            throw BroadcastError(.invalidArgument, "control socket \(socketPath): its directory's path is too long to bind in")
        }
        return path
    }

    /// Gives the bound socket its group and mode and renames it to where clients look; why not, or nil.
    static func moveIntoPlace(_ staged: String, to socketPath: String, mode: UInt32, group: UInt32? = nil) -> String? {
        defer { unlink(staged) }
        // The owner may give a file any group it is a member of (the unit's SupplementaryGroups=).
        if let group, chown(staged, uid_t.max, gid_t(group)) != 0 {
            return "cannot give it group \(group): \(String(cString: strerror(errno))) (the daemon must be a member of the group)"
        }
        var info = stat()
        guard chmod(staged, mode_t(mode)) == 0, stat(staged, &info) == 0, info.st_mode & 0o7777 == mode else {
            return "cannot set its mode \(String(mode, radix: 8)): \(String(cString: strerror(errno)))"
        }
        guard rename(staged, socketPath) == 0 else {
            return "cannot move it into place: \(String(cString: strerror(errno)))"
        }
        return nil
    }

    /// Counts listeners up; true once all are bound.
    private final class ListenerCount: Sendable {
        let expected: Int
        let count = Mutex(0)
        init(expected: Int) { self.expected = expected }
        func one() -> Bool { count.withLock { $0 += 1; return $0 == expected } }
    }

    /// A socket file left by a crashed daemon is stale if nobody accepts on it; a live one, or a
    /// file that is not a socket, is refused.
    private static func checkSocketPath(_ path: String) throws(BroadcastError) {
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
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFSOCK else {
            throw BroadcastError(.invalidArgument, "control socket \(path): exists and is not a socket")
        }
        let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        let live = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(probe, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        }
        close(probe)
        if live {
            throw BroadcastError(.invalidArgument, "control socket \(path): another daemon is listening there")
        }
        unlink(path)
    }

    // MARK: Requests

    private func respond(_ request: Request, _ writer: consuming ResponseWriter, _ channel: any Channel, needsToken: Bool) async throws {
        if needsToken && tcpConnections.current > Self.maxTCPConnections {
            try await Self.send(.error(503, "already \(Self.maxTCPConnections) connections on the TCP control listener: try again later"), with: writer)
            return
        }
        let requestPath = String((request.head.path ?? "").prefix { $0 != "?" })
        let isPublic =
            (request.head.method == .get || request.head.method == .head) && publicPaths.contains(requestPath)
            || request.head.method == .post && publicPosts.contains(requestPath)
        if needsToken && !isPublic {
            let given = request.head.headerFields[values: .authorization]
            guard let token = token.current, given.count == 1, let bearer = Self.bearerToken(given[0]), Self.sameBytes(bearer, token) else {
                try await Self.send(.error(401, "a bearer token is required on the TCP control listener"), with: writer)
                return
            }
        }
        let controlRequest: ControlRequest
        switch Self.controlRequest(request.head) {
        case .failure(let response):
            try await Self.send(response, with: writer)
            return
        case .success(let r): controlRequest = r
        }
        if controlRequest.path == "/v1/events" {
            guard controlRequest.method == "GET", let events else {
                let response: ControlResponse =
                    events == nil ? .error(404, "no events here") : .error(405, "\(controlRequest.method) is not allowed on /v1/events: use GET")
                try await Self.send(response, with: writer)
                return
            }
            try await streamEvents(events, controlRequest, writer, channel)
            return
        }
        var body: [UInt8] = []
        let length = Int(controlRequest.headers["content-length"] ?? "0") ?? 0
        if length > 0 {
            do {
                for try await buffer in request.body {
                    body += buffer.readableBytesView
                    if body.count > Self.maxBodyBytes { break }
                }
            } catch {
                // The connection ended or passed its deadline: nobody to answer.
                channel.close(promise: nil)
                return
            }
            if body.count > Self.maxBodyBytes {
                try await Self.send(.error(413, "request body exceeds \(Self.maxBodyBytes) bytes"), with: writer)
                return
            }
            if body.count < length {
                channel.close(promise: nil)
                return
            }
        }
        var filled = controlRequest
        filled.body = body
        let complete = filled
        let isRead = complete.method == "GET" || complete.method == "HEAD"
        let handler = self.handler
        let response = await withCheckedContinuation { (continuation: CheckedContinuation<ControlResponse, Never>) in
            (isRead ? reads : actions).async { continuation.resume(returning: handler(complete)) }
        }
        try await Self.send(response, with: writer)
    }

    /// `GET /v1/events`: the current state (or, with a `Last-Event-ID` still in the history, the
    /// events missed since), then each event as it is published, until the client goes, falls
    /// behind (told with a `dropped` event) or the daemon stops.
    private func streamEvents(_ events: ControlEvents, _ request: ControlRequest, _ writer: consuming ResponseWriter, _ channel: any Channel) async throws {
        // A client that reads nothing keeps this task waiting in a write: its connection is closed
        // by the publisher's drop, after a moment to read the `dropped` notice if it can. The limit
        // is checked as the client subscribes, before any await.
        let lastEventID = request.headers["last-event-id"].flatMap { UInt64($0) }
        guard
            let subscription = events.subscribe(
                lastEventID: lastEventID, atMost: Self.maxEventClients, transient: request.query["levels"] == "1", onDrop: {
                channel.eventLoop.scheduleTask(in: Self.droppedGrace) { channel.close(promise: nil) }
            })
        else {
            try await Self.send(.error(503, "already \(Self.maxEventClients) event streams: try again later"), with: writer)
            return
        }
        channel.closeFuture.whenComplete { _ in events.unsubscribe(subscription) }
        defer { events.unsubscribe(subscription) }
        // Small socket buffers: what a client has not read stays in its queue here, where it is counted.
        _ = try? await channel.setOption(ChannelOptions.writeBufferWaterMark, value: .init(low: 2048, high: 8192)).get()
        _ = try? await channel.setOption(ChannelOptions.socketOption(.so_sndbuf), value: 8192).get()
        var fields = HTTPFields()
        fields[.contentType] = "text/event-stream"
        fields[.cacheControl] = "no-cache"
        fields[.connection] = "close"
        var body = try await writer.writeHead(HTTPResponse(status: .ok, headerFields: fields))
        if !subscription.resumed {
            let snapshot = self.snapshot
            let state = await withCheckedContinuation { (continuation: CheckedContinuation<JSONValue, Never>) in
                reads.async { continuation.resume(returning: snapshot()) }
            }
            let event = ControlEvent(id: subscription.after, type: "state", time: ControlEvents.now(), fields: [("status", state)])
            try await body.write(ByteBuffer(bytes: event.encoded))
        }
        while true {
            switch await events.next(subscription) {
            case .event(let event):
                try await body.write(ByteBuffer(bytes: event.encoded))
            case .dropped:
                logger.warning("an events client fell behind by \(events.clientQueueLimit) events: dropped")
                let notice = JSONValue.object([
                    ("time", .string(ControlEvents.now())),
                    ("reason", .string("more than \(events.clientQueueLimit) events behind; reconnect with Last-Event-ID")),
                ])
                try await body.write(ByteBuffer(string: "event: dropped\ndata: \(notice.serialized())\n\n"))
                try await body.finish(nil)
                return
            case .finished:
                try await body.finish(nil)
                return
            }
        }
    }

    private static func send(_ response: ControlResponse, with writer: consuming ResponseWriter) async throws {
        var fields = HTTPFields()
        fields[.contentType] = response.contentType
        fields[.contentLength] = "\(response.body.count)"
        fields[.connection] = "close"
        for (name, value) in response.headers.sorted(by: { $0.key < $1.key }) {
            if let name = HTTPField.Name(name) { fields[name] = value }
        }
        let head = HTTPResponse(status: .init(code: response.status, reasonPhrase: reason(response.status)), headerFields: fields)
        try await writer.write(response: head, body: ResponseBody(byteBuffer: ByteBuffer(bytes: response.body)))
    }

    /// The request as the handler sees it; refusals for what NIO's parser lets through.
    static func controlRequest(_ head: HTTPRequest) -> Result<ControlRequest, ControlResponse> {
        var headers: [String: String] = [:]
        if let authority = head.authority { headers["host"] = authority }
        for field in head.headerFields {
            let name = field.name.canonicalName
            if name == "content-length" {
                // Two lengths that disagree would let a proxy and this server see different requests
                // (RFC 9112 6.3); NIO's parser refuses them too.
                let lengths = (headers[name].map { [$0] } ?? []) + field.value.split(separator: ",").map { $0.trimmed { $0 == " " || $0 == "\t" } }
                if Set(lengths).count > 1 { return .failure(.error(400, "conflicting Content-Length headers")) }
                headers[name] = lengths.first ?? field.value
                continue
            }
            if headers[name] != nil && (name == "authorization" || name == "transfer-encoding" || name == "host") {
                return .failure(.error(400, "the \(name) header is given twice"))
            }
            headers[name] = field.value
        }
        if headers["transfer-encoding"] != nil {
            return .failure(.error(501, "Transfer-Encoding is not supported: send Content-Length"))
        }
        if let text = headers["content-length"] {
            guard let n = Int(text), n >= 0 else { return .failure(.error(400, "invalid Content-Length '\(text)'")) }
            if n > maxBodyBytes { return .failure(.error(413, "request body exceeds \(maxBodyBytes) bytes")) }
        }
        let method = head.method.rawValue
        guard !method.isEmpty, method.allSatisfy({ $0.isASCII && $0.isUppercase }) else {
            return .failure(.error(400, "malformed method"))
        }
        switch parseTarget(head.path ?? "") {
        case .failure(let response): return .failure(response)
        case .success(let (path, query)):
            return .success(ControlRequest(method: method, path: path, query: query, headers: headers))
        }
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

    static func reason(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 204: "No Content"
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

    /// The request target as a path and a query, %-escapes decoded; a target that is not an
    /// absolute path, or whose escapes are broken, is refused whole.
    static func parseTarget(_ target: String) -> Result<(String, [String: String]), ControlResponse> {
        guard target.hasPrefix("/"), target.allSatisfy({ $0.isASCII && !$0.isWhitespace }) else {
            return .failure(.error(400, "malformed request target"))
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
        return .success((path, query))
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

/// Per connection: the whole request must arrive within `limit` of the accept (a client sending a
/// byte a second does not get to keep the connection), one response is sent, then the output is
/// closed (the client reads to its end) and the connection is closed at most `limit` later.
final class ConnectionDeadline: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let limit: TimeAmount
    private var timer: Scheduled<Void>?
    private var received = false
    /// A request's head came through the parser (its answer is the responder's).
    private var headSeen = false
    /// A parse error was answered (the first one only).
    private var refused = false
    /// The listener's open connections, this one counted from its start to its end.
    private let connections: ConnectionCount?
    private var counted = false

    init(_ limit: TimeAmount, counting connections: ConnectionCount? = nil) {
        self.limit = limit
        self.connections = connections
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { arm(context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        uncount()
    }

    func channelActive(context: ChannelHandlerContext) {
        arm(context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        uncount()
        context.fireChannelInactive()
    }

    private func uncount() {
        if counted { connections?.closed() }
        counted = false
    }

    private func arm(_ context: ChannelHandlerContext) {
        if !counted, let connections {
            counted = true
            connections.opened()
        }
        guard timer == nil else { return }
        let channel = context.channel
        timer = context.eventLoop.scheduleTask(in: limit) { channel.close(promise: nil) }
    }

    /// A request NIO's parser refused before its head was through (a target or headers over the
    /// limit, a malformed line) is answered here with why: Hummingbird answers such a request with
    /// an empty 400, which a client can only show as nothing.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let parseError = error as? HTTPParserError, !headSeen else {
            context.fireErrorCaught(error)
            return
        }
        // Answered once; the connection is closing.
        guard !refused else { return }
        refused = true
        let response: ControlResponse =
            parseError == .headerOverflow
            ? .error(431, "the request line and headers exceed \(ControlServer.maxHeaderBytes) bytes (a name that long?)")
            : .error(400, "malformed HTTP request: \(parseError)")
        var fields = HTTPFields()
        fields[.contentType] = response.contentType
        fields[.contentLength] = "\(response.body.count)"
        fields[.connection] = "close"
        let head = HTTPResponse(status: .init(code: response.status, reasonPhrase: ControlServer.reason(response.status)), headerFields: fields)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.write(wrapOutboundOut(.body(context.channel.allocator.buffer(bytes: response.body))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head = unwrapInboundIn(data) { headSeen = true }
        if case .end = unwrapInboundIn(data), !received {
            received = true
            timer?.cancel()
            timer = nil
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard case .end = unwrapOutboundIn(data) else {
            context.write(data, promise: promise)
            return
        }
        let written = context.eventLoop.makePromise(of: Void.self)
        if let promise { written.futureResult.cascade(to: promise) }
        context.writeAndFlush(data, promise: written)
        let channel = context.channel
        written.futureResult.whenComplete { _ in channel.close(mode: .output, promise: nil) }
        timer?.cancel()
        timer = context.eventLoop.scheduleTask(in: limit) { channel.close(promise: nil) }
    }
}

/// Connections a listener has open.
final class ConnectionCount: Sendable {
    private let count = Mutex(0)
    var current: Int { count.withLock { $0 } }
    func opened() { count.withLock { $0 += 1 } }
    func closed() { count.withLock { $0 -= 1 } }
}
