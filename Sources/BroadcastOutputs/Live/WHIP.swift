public import BroadcastKit
public import BroadcastMedia
import Logging

// WHIP (RFC 9725): WebRTC to a WHIP endpoint. The worker (the protocol, the state machine, the
// output's figures) is here; the WebRTC itself (webrtcbin) and the HTTP (libcurl) are a
// `WebRTCEngine` that BroadcastWebRTC provides, so BroadcastOutputs, and everything that links it
// without a WHIP output, links no GStreamer.

/// A STUN or TURN server for ICE, from the endpoint's `Link: <...>; rel="ice-server"` headers.
public struct ICEServer: Sendable, Hashable {
    /// "stun:host:port", "turn:host:port?transport=udp", "turns:...".
    public var url: String
    public var username: String?
    public var credential: String?

    public init(url: String, username: String? = nil, credential: String? = nil) {
        self.url = url
        self.username = username
        self.credential = credential
    }

    /// The ice-server links of `headers` (each a Link header's value; one may hold several links
    /// separated by commas).
    public static func parse(linkHeaders headers: [String]) -> [ICEServer] {
        var servers: [ICEServer] = []
        for header in headers {
            var rest = Substring(header)
            while let open = rest.firstIndex(of: "<"), let close = rest[open...].firstIndex(of: ">") {
                let target = String(rest[rest.index(after: open)..<close])
                // The link's parameters run to the next link (a comma outside quotes) or the end.
                var end = rest.index(after: close)
                var quoted = false
                while end < rest.endIndex {
                    let c = rest[end]
                    if c == "\"" { quoted.toggle() } else if c == ",", !quoted { break }
                    end = rest.index(after: end)
                }
                var parameters: [String: String] = [:]
                for part in rest[rest.index(after: close)..<end].split(separator: ";") {
                    let pair = part.split(separator: "=", maxSplits: 1).map { $0.trimmed { " \t\"".contains($0) } }
                    if pair.count == 2 { parameters[pair[0].lowercased()] = pair[1] }
                }
                if parameters["rel"]?.lowercased() == "ice-server",
                    target.hasPrefix("stun:") || target.hasPrefix("turn:") || target.hasPrefix("turns:")
                {
                    servers.append(ICEServer(url: target, username: parameters["username"], credential: parameters["credential"]))
                }
                rest = end < rest.endIndex ? rest[rest.index(after: end)...] : ""
            }
        }
        return servers
    }
}

/// What a WHIP peer sends: H.264 with this profile-level-id (nil: no video), Opus with this many
/// channels (0: no audio), through these ICE servers.
public struct WebRTCMedia: Sendable, Hashable {
    public var h264ProfileLevelID: String?
    public var audioChannels: Int
    public var iceServers: [ICEServer]
}

/// Where a peer connection stands.
public enum WebRTCConnectionState: Sendable, Hashable {
    case connecting
    case connected
    /// ICE or DTLS failed, the connection closed, or the pipeline failed: why.
    case failed(String)
}

/// What the viewer's receiver reports (RTCP) and the sender's counters say.
public struct WebRTCFigures: Sendable, Hashable {
    public var bytesSent: Int64
    public var packetsSent: Int64
    /// nil until a receiver report came.
    public var packetsLost: Int?
    public var fractionLost: Double?
    public var roundTripSeconds: Double?
    /// Changes when a new receiver report came (for any stream); 0 until one came.
    public var reportKey: UInt64

    public init(
        bytesSent: Int64, packetsSent: Int64, packetsLost: Int?, fractionLost: Double?, roundTripSeconds: Double?, reportKey: UInt64 = 0
    ) {
        self.bytesSent = bytesSent
        self.packetsSent = packetsSent
        self.packetsLost = packetsLost
        self.fractionLost = fractionLost
        self.roundTripSeconds = roundTripSeconds
        self.reportKey = reportKey
    }
}

/// One send-only WebRTC peer connection. Used by one thread (the output's) from creation to
/// release, which closes it.
public protocol WebRTCPeer: AnyObject {
    /// The offer with every ICE candidate gathered (at most `timeout`, or until `abandon` says
    /// true: it is asked about ten times a second on the caller's thread).
    func offer(timeout: Duration, abandon: () -> Bool) throws(BroadcastError) -> String
    func accept(answer: String) throws(BroadcastError)
    /// Hands one packet to the peer (`prefix` first: SPS/PPS before a keyframe); never blocks.
    /// `newest`: the newest media time encoded (ns), what "now" is when the peer maps the
    /// encoder's times onto its clock.
    func push(_ packet: EncodedPacket, prefix: [UInt8], newest: Int64) -> Bool
    var state: WebRTCConnectionState { get }
    /// Keyframe requests (PLI/FIR) from the viewer so far.
    var keyframeRequests: Int { get }
    /// RTCP packets from the viewer so far, and its BYEs.
    var rtcpReceived: (packets: Int, byes: Int) { get }
    func figures() -> WebRTCFigures?
}

/// An HTTP answer.
public struct HTTPAnswer: Sendable, Hashable {
    public var status: Int
    public var body: String
    /// Resolved against the request's URL.
    public var location: String?
    public var links: [String]
    public var contentType: String?

    public init(status: Int, body: String, location: String?, links: [String], contentType: String?) {
        self.status = status
        self.body = body
        self.location = location
        self.links = links
        self.contentType = contentType
    }
}

/// WebRTC and HTTP for WHIP outputs: BroadcastWebRTC's `GStreamerWebRTC`.
public protocol WebRTCEngine: Sendable {
    func makePeer(_ media: WebRTCMedia) throws(BroadcastError) -> any WebRTCPeer
    /// One request; `.failure` when no answer came (refused connection, timeout, TLS, or
    /// `abandon` said true: it is asked about ten times a second on the caller's thread).
    func request(
        method: String, url: String, token: String?, contentType: String?, body: String?, timeout: Duration,
        tls: TLSVerification, abandon: () -> Bool
    ) -> Result<HTTPAnswer, BroadcastError>
}

/// An http(s) URL's origin (RFC 6454): scheme, host and port, the default port filled in.
struct Origin: Hashable, CustomStringConvertible {
    var scheme: String
    var host: String
    var port: Int

    /// nil when `url` is not an absolute http:// or https:// URL.
    init?(_ url: String) {
        guard let separator = url.firstRange(of: "://") else { return nil }
        let scheme = url[..<separator.lowerBound].lowercased()
        guard scheme == "http" || scheme == "https" else { return nil }
        var authority = url[separator.upperBound...].prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
        var host = authority
        var port = scheme == "https" ? 443 : 80
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            host = authority[..<colon]
            guard let p = Int(authority[authority.index(after: colon)...]), (1...65535).contains(p) else { return nil }
            port = p
        }
        guard !host.isEmpty else { return nil }
        self.scheme = scheme
        self.host = host.lowercased()
        self.port = port
    }

    var description: String { "\(scheme)://\(host):\(port)" }
}

/// What may go to the session's URL (the 201's `Location`, RFC 9725 §4.2), judged against the
/// endpoint's own URL: the token goes to the endpoint's origin only, and nothing goes over plain
/// http:// when the endpoint is https://.
enum SessionTarget: Equatable {
    /// The endpoint's own origin: requests carry the token.
    case endpointOrigin
    /// Another host, port or scheme (not a downgrade): requests go without the token.
    case otherOrigin(Origin)
    /// Nothing is sent there; why.
    case refused(String)

    static func judge(location: String, endpoint: String) -> SessionTarget {
        guard let origin = Origin(location) else { return .refused("its Location is not an http(s) URL") }
        guard let own = Origin(endpoint) else { return .refused("the endpoint's URL has no origin") }
        if origin == own { return .endpointOrigin }
        if own.scheme == "https", origin.scheme != "https" {
            return .refused("its Location (\(origin)) is plain http:// while the endpoint is https://")
        }
        return .otherOrigin(origin)
    }
}

/// H.264 parameter sets as SDP needs them.
enum H264ParameterSets {
    /// "profile_idc constraint_flags level_idc" of the first SPS in Annex B `bytes`, six hex digits
    /// (RFC 6184's profile-level-id), or nil when there is none.
    static func profileLevelID(_ bytes: [UInt8]) -> String? {
        var i = 0
        while i + 3 < bytes.count {
            if bytes[i] == 0, bytes[i + 1] == 0, bytes[i + 2] == 1 {
                let start = i + 3
                if bytes[start] & 0x1F == 7, start + 3 < bytes.count {
                    return bytes[(start + 1)...(start + 3)].map { hex($0) }.joined()
                }
                i = start
            } else {
                i += 1
            }
        }
        return nil
    }

    static func profileLevelID(_ packet: EncodedPacket) -> String? {
        packet.withUnsafeBytes { profileLevelID(Array($0)) }
    }

    private static func hex(_ byte: UInt8) -> String {
        let digits = Array("0123456789abcdef")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 0xF)]])
    }
}

/// A WHIP output's thread: offers a WebRTC session to the endpoint (POST, 201 + answer), sends the
/// queue through it, and reconnects with the same state machine (backoff, refusals, drops,
/// finish) as the RTMP/SRT outputs. The peer and every HTTP request are this thread's alone;
/// GStreamer's threads meet it only through the peer's atomic counters.
final class WHIPWorker: OutputWorker, @unchecked Sendable {
    private let output: Output
    private let url: StreamURL
    private let settings: LiveStreamSettings
    private let engine: any WebRTCEngine
    private let logger: Logger
    private let report: LiveStreamReport
    private let hasVideo: Bool
    private let audioChannels: Int
    /// SPS/PPS to put before each keyframe when the encoder keeps them in its global header.
    private let parameterSets: [UInt8]

    private var machine: LiveStreamStateMachine<EncodedPacket>
    private var peer: (any WebRTCPeer)?
    /// The session's URL (the 201's Location), to DELETE.
    private var session: String?
    private var profileLevelID: String?
    /// From the endpoint's Link headers: used from the next session on.
    private var iceServers: [ICEServer] = []
    /// The viewer's keyframe requests seen, and when the encoder was last asked for one.
    private var keyframeRequestsSeen = 0
    private var keyframeAskedAt: MonotonicInstant?
    /// A request came within the interval after the last one asked: asked when it has passed.
    private var keyframePending = false
    /// When RTCP from the viewer last came (a connection that hears nothing is dead).
    private var rtcpSeen = 0
    private var rtcpAt = MonotonicInstant.now()
    private var figuresAt = MonotonicInstant.now()
    /// When webrtcbin's stats were last read, and the receiver reports they held then.
    private var statsAt = MonotonicInstant.now()
    private var reportsSeen: UInt64 = 0
    private var bytesBefore: Int64 = 0
    private var windowBytes: Int64 = 0
    private var windowStart = MonotonicInstant.now()
    /// When the peer's state and RTCP were last looked at (on the tick, not per packet: the state
    /// empties GStreamer's bus and reads webrtcbin's property under its lock).
    private var livenessCheckedAt: MonotonicInstant?
    /// What "now" is for every decision (the tests' own clock in unit tests).
    private let clock: @Sendable () -> MonotonicInstant

    /// How often webrtcbin's stats (the viewer's receiver reports) are read: a few times for each
    /// report (a viewer sends one about every second), never per packet.
    static var statsInterval: Duration { .milliseconds(500) }

    /// How often a live session's peer is asked whether it still stands.
    static var livenessInterval: Duration { .milliseconds(100) }

    /// A viewer asks for keyframes as often as it likes; the encoder (which every output shares)
    /// makes at most one a second for them.
    static var keyframeRequestInterval: Duration { .seconds(1) }

    init(
        output: Output, url: StreamURL, streams: [StreamDescription], engine: any WebRTCEngine, logger: Logger,
        clock: @escaping @Sendable () -> MonotonicInstant = { .now() }
    ) {
        self.clock = clock
        self.output = output
        self.url = url
        self.settings = output.configuration.live
        self.engine = engine
        self.logger = logger
        self.report = LiveStreamReport(output: output, url: url, logger: logger)
        let video = streams.first { $0.parameters.mediaType == .video }
        self.hasVideo = video != nil
        self.audioChannels = streams.first { $0.parameters.mediaType == .audio }?.parameters.channels ?? 0
        let extradata = video?.parameters.extradata ?? []
        self.parameterSets = extradata.first == 0 ? extradata : []
        self.profileLevelID = H264ParameterSets.profileLevelID(extradata)
        self.machine = LiveStreamStateMachine(settings: settings, hasVideo: video != nil, now: clock())
    }

    private var status: OutputStatus { output.status }
    private var feed: PacketFeed { output.feed }

    func run() {
        status.set(.connecting)
        if url.scheme == .whipHTTPS, !settings.tls.verify {
            let who = "whoever answers at \(url.host) receives the offer and the token"
            logger.warning("stream \(url.redacted): the endpoint's certificate is not checked (--tls-insecure, tls_verify = false): \(who)")
        }
        loop: while true {
            intake()
            if feed.ended.load(ordering: .acquiring) {
                machine.finishRequested(by: output.finishBy.instant ?? clock())
            }
            publishState()
            // The offer names the H.264 profile: wait for the first keyframe's SPS when the
            // encoder has no global header.
            if hasVideo, profileLevelID == nil, machine.finishDeadline == nil {
                feed.waitForPackets(timeout: .milliseconds(200))
                continue
            }
            let now = clock()
            switch machine.nextAction(now: now) {
            case .wait(let until):
                if machine.isConnected {
                    status.setBacklog(0)
                    watchFigures(now: now)
                }
                var timeout = Duration.milliseconds(200)
                if let until { timeout = max(.milliseconds(1), min(now.duration(to: until), timeout)) }
                feed.waitForPackets(timeout: timeout)
            case .connect(let deadline):
                connect(deadline: deadline)
            case .send(let packet, _):
                send(packet)
            case .finish(let closeConnection, let closeDeadline, let dropped):
                if closeConnection { endSession(by: closeDeadline) }
                machine.closed()
                drop(.offline, dropped)
                break loop
            case .stop:
                break loop
            }
        }
        endSession(by: clock() + LiveStreamStateMachine<EncodedPacket>.lostCloseTimeout)
        status.setBacklog(0)
        if status.current != .failed { status.set(.finished) }
        feed.close()
    }

    // MARK: Connecting

    private func connect(deadline: MonotonicInstant) {
        publishState()
        let media = WebRTCMedia(h264ProfileLevelID: hasVideo ? profileLevelID : nil, audioChannels: audioChannels, iceServers: iceServers)
        let offer: String
        do {
            let made = try engine.makePeer(media)
            peer = made
            offer = try made.offer(timeout: remaining(until: deadline), abandon: stopping)
        } catch {
            return connectFailed(url.mask(error.message), refused: false)
        }
        let answer: HTTPAnswer
        switch engine.request(
            method: "POST", url: url.endpoint, token: url.token, contentType: "application/sdp", body: offer,
            timeout: remaining(until: deadline), tls: settings.tls, abandon: stopping)
        {
        case .failure(let error):
            return connectFailed("POST \(url.redacted): \(url.mask(error.message))", refused: false)
        case .success(let a):
            answer = a
        }
        let servers = ICEServer.parse(linkHeaders: answer.links)
        if !servers.isEmpty, servers != iceServers {
            iceServers = servers
            logger.info("stream \(url.redacted): the endpoint names \(servers.count) ICE server(s): used from the next session on")
        }
        switch answer.status {
        case 200, 201:
            break
        case 401, 403, 404:
            // A wrong token or endpoint does not fix itself: counted; three in a row give up.
            let why = answer.status == 404 ? "no such endpoint" : "wrong or missing token (--whip-token, token)"
            return connectFailed("the endpoint refused the session: HTTP \(answer.status) (\(why))", refused: true)
        default:
            let detail = answer.body.split(separator: "\n").first.map { ": \(url.mask(String($0.prefix(200))))" } ?? ""
            return connectFailed("POST \(url.redacted): HTTP \(answer.status)\(detail)", refused: false)
        }
        session = answer.location
        if session == nil { logger.warning("stream \(url.redacted): the endpoint's 201 has no Location: the session cannot be ended") }
        do {
            try peer!.accept(answer: answer.body)
        } catch {
            endSession(by: deadline)
            return connectFailed("the endpoint's answer: \(url.mask(error.message))", refused: true)
        }
        // ICE checks and the DTLS handshake run on GStreamer's threads; packets keep coming off
        // the encoder's queue meanwhile (queued, or dropped by the state machine's policy).
        while true {
            switch peer!.state {
            case .connected:
                return connected()
            case .failed(let why):
                endSession(by: clock() + LiveStreamStateMachine<EncodedPacket>.lostCloseTimeout)
                return connectFailed(url.mask(why), refused: false)
            case .connecting:
                let now = clock()
                let finishing = machine.finishDeadline.map { now > $0 } ?? false
                if now > deadline || finishing {
                    endSession(by: now + LiveStreamStateMachine<EncodedPacket>.lostCloseTimeout)
                    return connectFailed("ICE/DTLS did not connect within \(LiveStreamReport.seconds(settings.timeout))", refused: false)
                }
                feed.waitForPackets(timeout: .milliseconds(20))
                intake()
                if feed.ended.load(ordering: .acquiring) { machine.finishRequested(by: output.finishBy.instant ?? clock()) }
            }
        }
    }

    private func connected() {
        let connected = machine.connected(now: clock())
        if connected.isReconnect { status.reconnects.wrappingIncrement(ordering: .relaxed) }
        status.attempt.store(0, ordering: .relaxed)
        status.everDelivered.store(true, ordering: .releasing)
        let now = clock()
        rtcpSeen = peer!.rtcpReceived.packets
        rtcpAt = now
        keyframeRequestsSeen = peer!.keyframeRequests
        livenessCheckedAt = nil
        figuresAt = now
        statsAt = now
        reportsSeen = 0
        windowStart = now
        windowBytes = 0
        publishState()
        logger.notice("stream \(url.redacted): live (WebRTC)")
        drop(.offline, connected.dropped)
        if connected.requestKeyframe { output.keyframeRequest.store(true, ordering: .releasing) }
    }

    private func connectFailed(_ message: String, refused: Bool) {
        peer = nil
        lost(machine.connectFailed(isNetworkFailure: !refused, now: clock()), message, sending: false)
    }

    /// A stop came and its deadline (`finishTimeout` after it) passed: a wait for the offer or the
    /// endpoint's answer ends there, not after the whole `--timeout`.
    private func stopping() -> Bool {
        if machine.finishDeadline == nil, feed.ended.load(ordering: .acquiring) {
            machine.finishRequested(by: output.finishBy.instant ?? clock())
        }
        return machine.finishDeadline.map { clock() > $0 } ?? false
    }

    private func remaining(until deadline: MonotonicInstant) -> Duration {
        var end = deadline
        if let finish = machine.finishDeadline, finish < end { end = finish }
        return max(.milliseconds(1), clock().duration(to: end))
    }

    /// DELETE of the session (RFC 9725 §4.3), then the peer closes. The token goes with it only to
    /// the endpoint's own origin, and nothing goes to plain http:// from an https:// endpoint.
    private func endSession(by deadline: MonotonicInstant) {
        if let session {
            self.session = nil
            var token = url.token
            switch SessionTarget.judge(location: session, endpoint: url.endpoint) {
            case .endpointOrigin:
                break
            case .otherOrigin(let origin):
                if token != nil {
                    logger.warning("stream \(url.redacted): the session is at \(origin), not the endpoint's origin: its DELETE goes without the token")
                }
                token = nil
            case .refused(let why):
                logger.warning("stream \(url.redacted): the session's DELETE is not sent (nor the token): \(why)")
                closePeer()
                return
            }
            let timeout = max(.milliseconds(200), clock().duration(to: deadline))
            // A DELETE is the stop's own last request: bounded by its deadline, never abandoned.
            switch engine.request(
                method: "DELETE", url: session, token: token, contentType: nil, body: nil, timeout: timeout, tls: settings.tls,
                abandon: { false })
            {
            case .success(let answer) where (200..<300).contains(answer.status):
                logger.info("stream \(url.redacted): session ended (DELETE: HTTP \(answer.status))")
            case .success(let answer):
                logger.info("stream \(url.redacted): DELETE of the session: HTTP \(answer.status)")
            case .failure(let error):
                logger.info("stream \(url.redacted): DELETE of the session: \(url.mask(error.message))")
            }
        }
        closePeer()
    }

    private func closePeer() {
        if peer != nil {
            bytesBefore += peer!.figures()?.bytesSent ?? 0
            peer = nil
        }
    }

    // MARK: Sending

    private func send(_ packet: EncodedPacket) {
        if let why = livenessDue(now: clock()) ? lostReason(now: clock()) : nil {
            let action = machine.writeFailed(isNetworkFailure: true, now: clock())
            endSession(by: clock() + LiveStreamStateMachine<EncodedPacket>.lostCloseTimeout)
            lost(action, why, sending: true)
            return
        }
        let prefix = packet.mediaType == .video && packet.isKeyframe ? parameterSets : []
        if !peer!.push(packet, prefix: prefix, newest: feed.newestDTS.load(ordering: .relaxed)) { drop(.queueFull) }
        _ = machine.written(now: clock())
        status.sent(packet)
        windowBytes += Int64(packet.size)
        status.setBacklog(max(0, feed.newestDTS.load(ordering: .relaxed) - packet.dtsNanoseconds))
        watchFigures(now: clock())
    }

    /// The liveness tick: true at most once per `livenessInterval`.
    private func livenessDue(now: MonotonicInstant) -> Bool {
        if let last = livenessCheckedAt, last.duration(to: now) < Self.livenessInterval { return false }
        livenessCheckedAt = now
        return true
    }

    /// Why the session is lost, or nil: ICE/DTLS failed, the viewer said BYE, or no RTCP came
    /// from it for the timeout (a send-only peer hears of a vanished endpoint no other way).
    private func lostReason(now: MonotonicInstant) -> String? {
        guard let peer else { return "no session" }
        if case .failed(let why) = peer.state { return url.mask(why) }
        let rtcp = peer.rtcpReceived
        if rtcp.byes > 0 { return "the endpoint ended the session (RTCP BYE)" }
        if rtcp.packets != rtcpSeen {
            rtcpSeen = rtcp.packets
            rtcpAt = now
        } else if rtcpAt.duration(to: now) > .seconds(settings.timeout) {
            return "no RTCP from the endpoint for \(LiveStreamReport.seconds(settings.timeout)): it is gone"
        }
        return nil
    }

    /// The viewer's keyframe requests (at most one a second reaches the encoder) and, once a
    /// `statsInterval`, the RTCP figures: round-trip time, loss (a new receiver report counted for
    /// an adaptive output's controller), and once a second the bitrate.
    private func watchFigures(now: MonotonicInstant) {
        guard let peer else { return }
        let requests = peer.keyframeRequests
        if requests != keyframeRequestsSeen {
            keyframeRequestsSeen = requests
            status.keyframeRequests.store(requests, ordering: .relaxed)
            keyframePending = true
        }
        if keyframePending, keyframeAskedAt.map({ $0.duration(to: now) >= Self.keyframeRequestInterval }) ?? true {
            keyframePending = false
            keyframeAskedAt = now
            output.keyframeRequest.store(true, ordering: .releasing)
            logger.debug("stream \(url.redacted): the viewer asked for a keyframe (PLI/FIR)")
        }
        guard statsAt.duration(to: now) >= Self.statsInterval else { return }
        statsAt = now
        guard let figures = peer.figures() else { return }
        let window = figuresAt.duration(to: now)
        if window >= .seconds(1) {
            let total = bytesBefore + figures.bytesSent
            status.bitrate.store(Int(Double(max(0, total - status.bytes.load(ordering: .relaxed)) * 8) / window.inSeconds), ordering: .relaxed)
            status.bytes.store(total, ordering: .relaxed)
            figuresAt = now
        }
        if let rtt = figures.roundTripSeconds { status.roundTripMicroseconds.store(Int((rtt * 1e6).rounded()), ordering: .relaxed) }
        if let lost = figures.packetsLost { status.packetsLost.store(lost, ordering: .relaxed) }
        if let fraction = figures.fractionLost { status.fractionLostPPM.store(Int((fraction * 1e6).rounded()), ordering: .relaxed) }
        // A new receiver report (not the viewer's NACKs or PLIs: they are RTCP too).
        if figures.fractionLost != nil, figures.reportKey != reportsSeen {
            reportsSeen = figures.reportKey
            // After the figures: a reader that sees the count sees them (or newer).
            status.receiverReports.wrappingIncrement(ordering: .releasing)
        }
    }

    /// Performs what the state machine decided after a connect failed or the session was lost.
    private func lost(_ action: LiveStreamReport.LossAction, _ text: String, sending: Bool) {
        peer = nil
        machine.closed()
        // `text` is ours, with what others wrote already masked: a secret that is also a word
        // ("endpoint" in the path, a token "wrong") leaves the message's own words alone.
        report.lost(action, message: text, failures: machine.failures, state: machine.outputState, sending: sending) {
            "the endpoint refused the session \($0) times in a row"
        }
    }

    // MARK: The queue

    private func publishState() { report.publish(machine.outputState) }
    private func drop(_ reason: DropReason, _ count: Int = 1) { report.drop(reason, count) }

    private func intake() {
        report.count(machine.paused(output.isPaused))
        if feed.overflowed.exchange(false, ordering: .acquiringAndReleasing) { machine.feedOverflowed() }
        while let packet = feed.pop() {
            if hasVideo, profileLevelID == nil, packet.mediaType == .video, packet.isKeyframe {
                profileLevelID = H264ParameterSets.profileLevelID(packet)
            }
            report.count(machine.packet(packet))
        }
    }
}
