public import BroadcastKit
import BroadcastMedia
public import BroadcastOutputs
internal import CWebRTCShim

#if canImport(Glibc)
    import Glibc
#endif

/// WHIP's WebRTC on GStreamer's webrtcbin (ICE with libnice, DTLS-SRTP, RTP/RTCP) and its HTTP on
/// libcurl, both through CWebRTCShim. The only target that links them: the executable and the
/// daemon install it in `EncodingConfiguration.webRTC`.
public struct GStreamerWebRTC: WebRTCEngine {
    public init() {}

    public func makePeer(_ media: WebRTCMedia) throws(BroadcastError) -> any WebRTCPeer {
        try GStreamerPeer(media)
    }

    public func request(
        method: String, url: String, token: String?, contentType: String?, body: String?, timeout: Duration,
        tls: TLSVerification, abandon: () -> Bool
    ) -> Result<HTTPAnswer, BroadcastError> {
        var result = CBroadcastHTTPResult()
        let (seconds, attoseconds) = timeout.components
        let milliseconds = max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        let rc = AbandonCheck.with(abandon) { check, context in
            CBroadcastHTTP_request(
                method, url, token, contentType, body, milliseconds, tls.authorityFile, tls.verify ? 1 : 0, check, context, &result)
        }
        defer { CBroadcastHTTP_free(&result) }
        guard rc == 0 else {
            let error = withUnsafeBytes(of: result.error) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            return .failure(BroadcastError(.outputFailed, error.isEmpty ? "no answer" : error))
        }
        return .success(
            HTTPAnswer(
                status: result.status,
                body: result.body.map { String(cString: $0) } ?? "",
                location: result.location.map { String(cString: $0) },
                links: result.links.map { String(cString: $0).split(separator: "\n").map(String.init) } ?? [],
                contentType: result.content_type.map { String(cString: $0) }))
    }
}

/// One webrtcbin pipeline, owned by the output's thread; released, it stops and frees it.
final class GStreamerPeer: WebRTCPeer {
    private let peer: OpaquePointer

    init(_ media: WebRTCMedia) throws(BroadcastError) {
        var stun: String?
        var turns: [String] = []
        for server in media.iceServers {
            if server.url.hasPrefix("stun:") {
                stun = stun ?? "stun://" + server.url.dropFirst(5)
            } else if let colon = server.url.firstIndex(of: ":") {
                // webrtcbin: turn(s)://user:password@host:port?transport=...
                let scheme = server.url[..<colon]
                let user = server.username.map { "\($0.percentEncoded()):\((server.credential ?? "").percentEncoded())@" } ?? ""
                turns.append("\(scheme)://\(user)\(server.url[server.url.index(after: colon)...])")
            }
        }
        var error = [CChar](repeating: 0, count: 256)
        let made: OpaquePointer? = Self.withCStrings(turns) { list in
            CBroadcastWHIP_new(media.h264ProfileLevelID, Int32(media.audioChannels), stun, list, turns.count, &error, error.count)
        }
        guard let made else { throw BroadcastError(.outputFailed, Self.text(error)) }
        peer = made
    }

    deinit { CBroadcastWHIP_free(peer) }

    func offer(timeout: Duration, abandon: () -> Bool) throws(BroadcastError) -> String {
        var error = [CChar](repeating: 0, count: 256)
        let (seconds, attoseconds) = timeout.components
        let sdp = AbandonCheck.with(abandon) { check, context in
            CBroadcastWHIP_offer(peer, seconds * 1000 + attoseconds / 1_000_000_000_000_000, check, context, &error, error.count)
        }
        guard let sdp else {
            throw BroadcastError(.outputFailed, Self.text(error))
        }
        defer { CBroadcastWHIP_freeString(sdp) }
        return String(cString: sdp)
    }

    func accept(answer: String) throws(BroadcastError) {
        var error = [CChar](repeating: 0, count: 256)
        guard CBroadcastWHIP_answer(peer, answer, &error, error.count) == 0 else {
            throw BroadcastError(.outputFailed, Self.text(error))
        }
    }

    func push(_ packet: EncodedPacket, prefix: [UInt8], newest: Int64) -> Bool {
        let scale = 1e9 * packet.timeBase.doubleValue
        let pts = Int64((Double(packet.pts) * scale).rounded())
        let duration = Int64((Double(packet.duration) * scale).rounded())
        return packet.withUnsafeBytes { bytes in
            prefix.withUnsafeBufferPointer { head in
                CBroadcastWHIP_push(
                    peer, packet.mediaType == .video ? 1 : 0, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count,
                    head.baseAddress, head.count, pts, duration, packet.isKeyframe ? 1 : 0, newest) == 0
            }
        }
    }

    var state: WebRTCConnectionState {
        var error = [CChar](repeating: 0, count: 256)
        switch Int(CBroadcastWHIP_state(peer, &error, error.count)) {
        case Int(CBroadcastWHIPState_connected): return .connected
        case Int(CBroadcastWHIPState_failed): return .failed(Self.text(error))
        default: return .connecting
        }
    }

    var keyframeRequests: Int { Int(CBroadcastWHIP_keyframeRequests(peer)) }

    var rtcpReceived: (packets: Int, byes: Int) {
        var byes: UInt64 = 0
        let packets = CBroadcastWHIP_rtcpReceived(peer, &byes)
        return (Int(packets), Int(byes))
    }

    func figures() -> WebRTCFigures? {
        var stats = CBroadcastWHIPStats()
        guard CBroadcastWHIP_stats(peer, &stats) == 0 else { return nil }
        let remote = stats.has_remote != 0
        return WebRTCFigures(
            bytesSent: Int64(stats.bytes_sent), packetsSent: Int64(stats.packets_sent),
            packetsLost: remote ? Int(stats.packets_lost) : nil, fractionLost: remote ? stats.fraction_lost : nil,
            roundTripSeconds: remote && stats.round_trip_seconds > 0 ? stats.round_trip_seconds : nil,
            reportKey: stats.report_key)
    }

    private static func text(_ buffer: [CChar]) -> String {
        let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return text.isEmpty ? "WebRTC failed" : text
    }

    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>?) -> R) -> R {
        if strings.isEmpty { return body(nil) }
        let pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
        defer { for p in pointers { free(p) } }
        let constant = pointers.map { UnsafePointer($0) }
        return constant.withUnsafeBufferPointer { body($0.baseAddress) }
    }
}

/// A Swift closure as the shim's CBroadcastAbandonCheck: called back on this thread, inside the call.
private final class AbandonCheck {
    let check: () -> Bool
    init(_ check: @escaping () -> Bool) { self.check = check }

    static func with<R>(_ check: () -> Bool, _ body: (CBroadcastAbandonCheck, UnsafeMutableRawPointer) -> R) -> R {
        withoutActuallyEscaping(check) { escapable in
            let box = AbandonCheck(escapable)
            return withExtendedLifetime(box) {
                body({ context in Unmanaged<AbandonCheck>.fromOpaque(context!).takeUnretainedValue().check() ? 1 : 0 }, Unmanaged.passUnretained(box).toOpaque())
            }
        }
    }
}
