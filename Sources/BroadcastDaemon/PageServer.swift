public import BroadcastKit
import BroadcastService
public import Logging
public import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// `broadcast ui`: the control page for someone who has only the daemon's Unix socket. Serves the
/// page on 127.0.0.1 (TCP, with a fresh token of its own) and forwards every API request to the
/// socket; the daemon's event stream is relayed into an event list of its own (a thread follows
/// the socket's `/v1/events` and publishes what comes), which the page's stream is served from.
///
/// The TCP listener is a `ControlServer` like the daemon's, so it has the same limits and the
/// same token check; it also needs a Unix socket, which is made in a private directory and never
/// used.
public final class PageServer: Sendable {
    /// The token the page must send (printed in the URL's fragment, never logged).
    public let token: String
    public let daemonSocket: String
    /// The one-time codes `loginURL()` gives out, each exchanged once for `token` (`POST /v1/login`).
    let logins: LoginCodes
    private let server: ControlServer
    private let events: ControlEvents
    private let directory: String
    private let relaying = Mutex(true)

    /// `port` 0: a free one (see `port` once listening).
    /// `loginLifetime`: how long a login code from `loginURL()` may wait for its one use.
    public init(daemonSocket: String, port: UInt16, loginLifetime: Duration = LoginCodes.lifetime, logger: Logger) throws(BroadcastError) {
        self.daemonSocket = daemonSocket
        let token = try Self.freshToken()
        self.token = token
        let logins = LoginCodes(lifetime: loginLifetime)
        self.logins = logins
        var template = Array("/tmp/broadcast-ui-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw BroadcastError(.invalidArgument, "cannot make a private directory in /tmp: \(String(cString: strerror(errno)))")
        }
        directory = String(cString: made)
        let events = ControlEvents()
        self.events = events
        let client = ControlClient(socketPath: daemonSocket)
        server = try ControlServer(
            socketPath: directory + "/unused.sock", mode: 0o600, tcp: ("127.0.0.1", port), token: token, events: events,
            snapshot: { Self.status(client) }, publicPaths: ControlPage.publicPaths, publicPosts: [Self.loginPath], logger: logger
        ) { request in
            if request.path == Self.loginPath { return Self.login(request, logins: logins, token: token) }
            return ControlPage.fileAnswer(request) ?? Self.forward(request, to: client)
        }
    }

    /// Where the page exchanges a login code for the token (answered without the token).
    static let loginPath = "/v1/login"

    /// The URL to open, token included (in the fragment, which browsers never send), for whoever
    /// started the server (it is printed on its standard output, never put in a program's arguments).
    public var url: String? { server.tcpPort.map { "http://127.0.0.1:\($0)/#token=\(token)" } }

    /// A URL with a fresh one-time login code instead of the token (`#login=CODE`), for another
    /// program's arguments (`xdg-open`), which every local user can read in /proc/PID/cmdline: the
    /// page exchanges the code for the token with `POST /v1/login`, once, within `loginLifetime`.
    public func loginURL() throws(BroadcastError) -> String? {
        guard let port = server.tcpPort else { return nil }
        return "http://127.0.0.1:\(port)/#login=\(try logins.mint())"
    }

    /// `POST /v1/login` with a code as the body: the token (JSON, never cached), or 403 for a code
    /// that is unknown, used or expired.
    static func login(_ request: ControlRequest, logins: LoginCodes, token: String) -> ControlResponse {
        guard request.method == "POST" else { return .error(405, "\(request.method) is not allowed on \(loginPath): use POST") }
        let code = String(decoding: request.body, as: UTF8.self).filter { !$0.isWhitespace }
        guard logins.redeem(code) else {
            return .error(
                403,
                "that login code is unknown, used or expired: open the URL broadcast ui printed (if you did not use this code, someone else may have: stop that broadcast ui)")
        }
        var response = ControlResponse.json(200, .object([("token", .string(token))]))
        response.headers = ["Cache-Control": "no-store"]
        return response
    }

    /// Serves until the task group shuts down gracefully; the relay thread follows the daemon's
    /// events meanwhile.
    public func run() async throws {
        let thread = OSThread(name: "bc-ui-relay") { [self] in relay() }
        defer {
            // The relay may be waiting in a read of the daemon's stream: it ends at its next event
            // or with the process, and nobody joins it.
            relaying.withLock { $0 = false }
            thread.detach()
            rmdir(directory)
        }
        try await server.run()
    }

    public func waitUntilListening() async throws { try await server.waitUntilListening() }

    /// The daemon's events, published here as they come (the daemon's own `state` snapshot is not:
    /// each client of this server gets one from `snapshot`); reconnects after a second when the
    /// stream ends, from the last id seen.
    private func relay() {
        let client = ControlClient(socketPath: daemonSocket)
        var lastID: UInt64?
        while relaying.withLock({ $0 }) {
            _ = try? client.events(lastEventID: lastID, query: "levels=1") { event in
                if let id = event.id { lastID = id }
                guard event.type != "state", case .object(let fields)? = JSONValue.parse(event.data) else {
                    return relaying.withLock { $0 }
                }
                let kept = fields.filter { $0.0 != "time" }
                if event.id == nil {
                    events.publishTransient(event.type, kept)
                } else {
                    events.publish(event.type, kept)
                }
                return relaying.withLock { $0 }
            }
            if relaying.withLock({ $0 }) { sleep(1) }
        }
    }

    static func status(_ client: ControlClient) -> JSONValue {
        guard let answer = try? client.send(method: "GET", path: "/v1/status"), answer.status == 200,
            let status = JSONValue.parse(String(decoding: answer.body, as: UTF8.self))
        else { return .object([("state", .string("unreachable"))]) }
        return status
    }

    /// One API request passed on to the daemon's socket, its answer passed back. The path and query
    /// were %-decoded here: they are %-encoded again, so the daemon decodes what this server did
    /// (a decoded CR, LF or space would split the request line, a `?` start a query, a `%` be
    /// decoded twice).
    static func forward(_ request: ControlRequest, to client: ControlClient) -> ControlResponse {
        var target = request.path.percentEncoded(keeping: "-._/")
        if !request.query.isEmpty {
            target += "?" + request.query.sorted { $0.key < $1.key }
                .map { "\($0.key.percentEncoded(keeping: "-._"))=\($0.value.percentEncoded(keeping: "-._"))" }.joined(separator: "&")
        }
        do {
            let answer = try client.send(method: request.method, path: target, body: request.body)
            let type =
                request.path == "/v1/preview.jpg" && answer.status == 200 ? "image/jpeg"
                : request.path == "/metrics" && answer.status == 200 ? "text/plain; version=0.0.4" : "application/json"
            return ControlResponse(status: answer.status, contentType: type, body: answer.body)
        } catch {
            return .error(502, "the daemon at \(client.socketPath) did not answer: \(error.message)")
        }
    }

    /// 128 random bits as hex (the system generator: getrandom(2) on Linux).
    static func freshToken() throws(BroadcastError) -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<16).map { _ in String(UInt8.random(in: 0...255, using: &generator), radix: 16).leftPadded(to: 2) }.joined()
    }
}

extension PageServer: Service {}

/// One-time login codes: each is redeemed at most once, and only within `lifetime` of being made.
public final class LoginCodes: Sendable {
    /// Long enough for a desktop to start its browser on a busy machine.
    public static let lifetime: Duration = .seconds(60)
    private let lifetime: Duration
    private let now: @Sendable () -> ContinuousClock.Instant
    private let codes = Mutex<[String: ContinuousClock.Instant]>([:])

    init(lifetime: Duration = LoginCodes.lifetime, now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }) {
        self.lifetime = lifetime
        self.now = now
    }

    /// A fresh code (128 random bits as hex), valid once until `lifetime` from now.
    func mint() throws(BroadcastError) -> String {
        let code = try PageServer.freshToken()
        let at = now()
        let expiry = at + lifetime
        codes.withLock { codes in
            codes = codes.filter { $0.value > at }
            codes[code] = expiry
        }
        return code
    }

    /// True once for a code `mint` made and that has not expired; the code is gone afterwards
    /// either way.
    func redeem(_ code: String) -> Bool {
        let at = now()
        guard let expiry = codes.withLock({ $0.removeValue(forKey: code) }) else { return false }
        return at < expiry
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String { String(repeating: "0", count: max(0, width - count)) + self }
}
