import BroadcastKit
import Testing

@testable import BroadcastOutputs

/// WHIP's pure parts: the URL and its token, the endpoint's ICE-server links, the SDP's
/// profile-level-id from an SPS.
@Suite struct WHIPURLTests {
    @Test func whipURLsParseAndHideTheirSecrets() throws {
        let url = try StreamURL("whip+https://whip.example.com/live/abc123secret").withToken("bearer-token-xyz")
        #expect(url.scheme == .whipHTTPS && url.scheme.isWHIP)
        #expect(url.endpoint == "https://whip.example.com/live/abc123secret")
        #expect(url.redacted == "whip+https://whip.example.com/live/****")
        #expect(url.token == "bearer-token-xyz")
        #expect(url.scrub("Authorization: Bearer bearer-token-xyz for abc123secret") == "Authorization: Bearer **** for ****")
        let local = try StreamURL("WHIP+HTTP://127.0.0.1:8889/whip")
        #expect(local.scheme == .whipHTTP && local.port == 8889)
        #expect(local.endpoint == "http://127.0.0.1:8889/whip")
        // No path is fine for a WHIP endpoint (not for RTMP, which needs its application).
        #expect(throws: Never.self) { try StreamURL("whip+http://127.0.0.1:8889") }
        #expect(throws: BroadcastError.self) { try StreamURL("whip+ftp://h/x") }
        #expect(OutputDestination.live(local).withWHIPToken("t0ken-1").isWHIP)
        // A token is only for WHIP: an RTMP destination stays as it was.
        let rtmp = OutputDestination.live(try StreamURL("rtmp://h/app/key"))
        #expect(rtmp.withWHIPToken("t0ken-1") == rtmp)
    }

    @Test func iceServersFromLinkHeaders() {
        let servers = ICEServer.parse(linkHeaders: [
            #"<stun:stun.example.net:3478>; rel="ice-server""#,
            #"<turn:turn.example.net?transport=udp>; rel="ice-server"; username="u1"; credential="p,w"; credential-type="password", <https://example.net/x>; rel="other""#,
        ])
        #expect(servers == [
            ICEServer(url: "stun:stun.example.net:3478"),
            ICEServer(url: "turn:turn.example.net?transport=udp", username: "u1", credential: "p,w"),
        ])
        #expect(ICEServer.parse(linkHeaders: [#"<stun:x>; rel="preconnect""#]).isEmpty)
    }

    @Test func profileLevelIDFromTheSPS() {
        // Annex B: an SPS (type 7) of High profile (100 = 0x64), no constraints, level 3.1 (0x1f).
        let sps: [UInt8] = [0, 0, 0, 1, 0x67, 0x64, 0x00, 0x1F, 0xAC, 0, 0, 1, 0x68, 0xEE]
        #expect(H264ParameterSets.profileLevelID(sps) == "64001f")
        #expect(H264ParameterSets.profileLevelID([0, 0, 1, 0x65, 0x88, 0x84, 0x00]) == nil)
    }
}
