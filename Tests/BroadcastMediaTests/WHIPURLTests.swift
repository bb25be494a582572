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

    /// The session's URL against the endpoint's: the token goes to the endpoint's own origin only,
    /// nothing goes from https:// to plain http:// (issue 35, item 1).
    @Test(arguments: [
        ("https://w.example/whip/x", "https://w.example/session/1", SessionTarget.endpointOrigin),
        ("https://w.example/whip/x", "https://W.EXAMPLE:443/session/1", .endpointOrigin),
        ("http://127.0.0.1:8080/whip", "http://127.0.0.1:8080/s/1?x=y", .endpointOrigin),
        ("http://127.0.0.1:8080/whip", "http://127.0.0.1:9/s/1", .otherOrigin(Origin("http://127.0.0.1:9")!)),
        ("https://w.example/whip/x", "https://other.example/session/1", .otherOrigin(Origin("https://other.example")!)),
        ("https://w.example/whip/x", "https://user:pw@w.example:8443/s", .otherOrigin(Origin("https://w.example:8443")!)),
        ("http://127.0.0.1/whip", "https://127.0.0.1/s/1", .otherOrigin(Origin("https://127.0.0.1")!)),
        ("https://w.example/whip/x", "http://w.example/session/1",
         .refused("its Location (http://w.example:80) is plain http:// while the endpoint is https://")),
        ("https://w.example/whip/x", "http://w.example:443/session/1",
         .refused("its Location (http://w.example:443) is plain http:// while the endpoint is https://")),
        ("https://w.example/whip/x", "ftp://w.example/s", .refused("its Location is not an http(s) URL")),
        ("https://w.example/whip/x", "/session/1", .refused("its Location is not an http(s) URL")),
    ] as [(String, String, SessionTarget)])
    func sessionTargets(endpoint: String, location: String, expected: SessionTarget) {
        #expect(SessionTarget.judge(location: location, endpoint: endpoint) == expected)
    }

    /// Secrets are masked where they stand (the URL, the header), never as words of a message; an
    /// empty or tiny one is never looked for (issue 35, item 4).
    @Test func secretsAreMaskedWhereTheyStand() throws {
        let url = try StreamURL("whip+http://127.0.0.1:8889/whip/endpoint/broadcast").withToken("wrong")
        let ours = "the endpoint refused the session: HTTP 403 (wrong or missing token (--whip-token, token))"
        #expect(url.mask(ours) == ours)
        #expect(url.mask("POST http://127.0.0.1:8889/whip/endpoint/broadcast: Authorization: Bearer wrong")
            == "POST whip+http://127.0.0.1:8889/whip/****: Authorization: Bearer ****")
        #expect(url.mask("whip+http://127.0.0.1:8889/whip/endpoint/broadcast") == url.redacted)
        let empty = try StreamURL("rtmp://h/live//x?a=&b=&passphrase=")
        #expect(!empty.secrets.contains(""), "\(empty.secrets)")
        #expect(empty.scrub("about a b") == "about a b")
        let tiny = try StreamURL("whip+https://h/whip").withToken("ab")
        #expect(tiny.scrub("about") == "about")
        #expect(tiny.mask("Authorization: Bearer ab") == "Authorization: Bearer ****")
        #expect(StreamURL.scrub("x", secrets: [""]) == "x")
    }

    /// Plain http:// goes to this machine only unless allowed (issue 35, item 3).
    @Test(arguments: [
        ("whip+http://127.0.0.1:8889/whip", true), ("whip+http://127.8.9.10/whip", true), ("whip+http://localhost/whip", true),
        ("whip+http://LOCALHOST:80/whip", true), ("whip+http://[::1]:8889/whip", true), ("whip+http://[::ffff:127.0.0.1]/w", true),
        ("whip+http://192.0.2.7/whip", false), ("whip+http://[2001:db8::1]/whip", false), ("whip+http://example.com/whip", false),
        ("whip+http://128.0.0.1/whip", false), ("whip+http://localhost.example.com/whip", false),
    ] as [(String, Bool)])
    func loopbackHosts(url: String, loopback: Bool) throws {
        let parsed = try StreamURL(url)
        #expect(parsed.isLoopback == loopback)
        #expect((parsed.plainHTTPProblem == nil) == loopback)
        #expect(try StreamURL(url.replacing("whip+http", with: "whip+https")).plainHTTPProblem == nil)
    }
}
