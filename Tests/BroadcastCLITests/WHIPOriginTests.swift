import Foundation
import Testing

/// A plain HTTP server of the tests' own on loopback (python3's http.server), standing in for a
/// WHIP endpoint where what matters is what reaches it, not WebRTC: two ports, every request
/// recorded (port, method, path, Authorization) as a JSON line in `log`.
///
/// Modes: `elsewhere` answers the POST 201 with a `Location` on the second port (and a body that
/// is no SDP: the session is DELETEd at once); `refuse` answers 401; `silent` takes the request
/// and never answers.
final class LoopbackHTTP {
    static let script = #"""
        import http.server, json, ssl, sys, threading, time
        mode, log_path = sys.argv[1], sys.argv[2]
        # With a certificate and key: the endpoint's port speaks HTTPS; the other stays plain HTTP.
        tls = sys.argv[3:5]
        log = open(log_path, "a", buffering=1)
        servers = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def record(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                log.write(json.dumps({"port": self.server.server_address[1], "method": self.command, "path": self.path,
                                      "authorization": self.headers.get("Authorization")}) + "\n")

            def answer(self, status, body=b"", headers=()):
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.record()
                if mode == "silent":
                    while True:
                        time.sleep(3600)
                if mode == "refuse":
                    return self.answer(401, b"wrong token")
                location = "http://127.0.0.1:%d/session/1" % servers[1].server_address[1]
                self.answer(201, b"no SDP here", [("Location", location), ("Content-Type", "application/sdp")])

            def do_DELETE(self):
                self.record()
                self.answer(200)

            def log_message(self, *arguments):
                pass

        for index in range(2):
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            server.daemon_threads = True
            if index == 0 and tls:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(tls[0], tls[1])
                server.socket = context.wrap_socket(server.socket, server_side=True)
            servers.append(server)
            threading.Thread(target=server.serve_forever, daemon=True).start()
        print("listening", *(s.server_address[1] for s in servers), flush=True)
        threading.Event().wait()
        """#

    struct Request {
        var port: Int
        var method: String
        var path: String
        var authorization: String?
    }

    let directory: TemporaryDirectory
    let child: Child
    /// The endpoint's port, and the other one.
    let ports: [Int]

    /// With `tls`: the endpoint's port speaks HTTPS with a certificate for 127.0.0.1 signed by a
    /// private CA made here with openssl (`caFile`).
    let tls: Bool
    var caFile: String { directory.path("ca.pem") }

    init(mode: String, tls: Bool = false) throws {
        directory = try TemporaryDirectory()
        self.tls = tls
        try Self.script.write(toFile: directory.path("server.py"), atomically: true, encoding: .utf8)
        var arguments = [directory.path("server.py"), mode, directory.path("requests.log")]
        if tls {
            try "subjectAltName=IP:127.0.0.1\n".write(toFile: directory.path("san.cnf"), atomically: true, encoding: .utf8)
            for step in [
                ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=broadcast test CA",
                 "-keyout", directory.path("ca-key.pem"), "-out", directory.path("ca.pem")],
                ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=broadcast test endpoint",
                 "-keyout", directory.path("key.pem"), "-out", directory.path("cert.csr")],
                ["x509", "-req", "-in", directory.path("cert.csr"), "-CA", directory.path("ca.pem"), "-CAkey", directory.path("ca-key.pem"),
                 "-CAcreateserial", "-days", "1", "-extfile", directory.path("san.cnf"), "-out", directory.path("cert.pem")],
            ] {
                let made = try run("/usr/bin/openssl", step)
                guard made.status == 0 else { throw ProbeError(message: "openssl \(step[0]): \(made.stderr)") }
            }
            arguments += [directory.path("cert.pem"), directory.path("key.pem")]
        }
        child = try Child("/usr/bin/python3", arguments)
        let deadline = Date().addingTimeInterval(60)
        while !child.stdoutSoFar.contains("\n") {
            guard child.process.isRunning, Date() < deadline else {
                throw ProbeError(message: "the HTTP server did not start: \(child.stderrSoFar)")
            }
            usleep(50_000)
        }
        ports = child.stdoutSoFar.split(whereSeparator: \.isWhitespace).dropFirst().compactMap { Int($0) }
        guard ports.count == 2 else { throw ProbeError(message: "the HTTP server said \(child.stdoutSoFar)") }
    }

    var endpoint: String { "whip+\(tls ? "https" : "http")://127.0.0.1:\(ports[0])/whip/cam" }

    var requests: [Request] {
        let text = (try? String(contentsOfFile: directory.path("requests.log"), encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { line in
            guard let json = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            return Request(
                port: json["port"] as? Int ?? 0, method: json["method"] as? String ?? "", path: json["path"] as? String ?? "",
                authorization: json["authorization"] as? String)
        }
    }

    func stop() {
        child.signal(SIGKILL)
        _ = child.wait(timeout: 10)
        directory.cleanup()
    }
}

/// What a WHIP endpoint, or whatever answers in its place, gets to see (issue 35).
@Suite(.serialized) struct WHIPOriginTests {
    static let token = "whip-origin-token-5c2e81"

    /// A 201 whose Location is on another port: the session's DELETE goes there without the
    /// token (seen before: `Authorization: Bearer TOKEN` on the other port, once per attempt), and
    /// the log says so. The POSTs to the endpoint itself carry it.
    @Test func theTokenGoesToTheEndpointsOriginOnly() throws {
        let server = try LoopbackHTTP(mode: "elsewhere")
        defer { server.stop() }
        let r = try broadcast(
            ["stream", server.endpoint, "--whip-token", Self.token, "--duration", "60s", "--size", "320x240", "--quiet"], timeout: 120)
        #expect(r.status == 1, "\(r.stderr)")
        let requests = server.requests
        let posts = requests.filter { $0.port == server.ports[0] }
        let elsewhere = requests.filter { $0.port == server.ports[1] }
        #expect(posts.count == 3 && posts.allSatisfy { $0.method == "POST" && $0.authorization == "Bearer \(Self.token)" }, "\(posts)")
        #expect(!elsewhere.isEmpty && elsewhere.allSatisfy { $0.method == "DELETE" && $0.path == "/session/1" }, "\(elsewhere)")
        #expect(elsewhere.allSatisfy { $0.authorization == nil }, "the token went to another port: \(elsewhere)")
        #expect(r.stderr.contains("the session is at http://127.0.0.1:\(server.ports[1]), not the endpoint's origin: its DELETE goes without the token"), "\(r.stderr)")
        #expect(!r.stderr.contains(Self.token))
    }

    /// From an https:// endpoint to a plain http:// Location nothing is sent: not the token, not
    /// even the DELETE (before: the DELETE went in clear to the other port with the token, once
    /// per attempt). The endpoint's private CA is trusted with --tls-ca, as for rtmps://.
    @Test func nothingGoesFromHTTPSToAPlainHTTPLocation() throws {
        let server = try LoopbackHTTP(mode: "elsewhere", tls: true)
        defer { server.stop() }
        let r = try broadcast(
            ["stream", server.endpoint, "--whip-token", Self.token, "--tls-ca", server.caFile, "--duration", "60s", "--size", "320x240",
             "--quiet"], timeout: 120)
        #expect(r.status == 1, "\(r.stderr)")
        let requests = server.requests
        let posts = requests.filter { $0.port == server.ports[0] }
        #expect(posts.count == 3 && posts.allSatisfy { $0.method == "POST" && $0.authorization == "Bearer \(Self.token)" }, "\(posts)")
        #expect(requests.allSatisfy { $0.port == server.ports[0] }, "something went to the plain port: \(requests)")
        #expect(r.stderr.contains(
            "the session's DELETE is not sent (nor the token): its Location (http://127.0.0.1:\(server.ports[1])) is plain http:// while the endpoint is https://"),
            "\(r.stderr)")
        #expect(!r.stderr.contains(Self.token))
        // --tls-insecure takes whip+https:// too, and says so.
        let insecure = try broadcast(
            ["stream", server.endpoint, "--whip-token", Self.token, "--tls-insecure", "--duration", "60s", "--size", "320x240", "--quiet"],
            timeout: 120)
        #expect(insecure.status == 1, "\(insecure.stderr)")
        #expect(insecure.stderr.contains("the endpoint's certificate is not checked (--tls-insecure, tls_verify = false)"), "\(insecure.stderr)")
        #expect(server.requests.filter { $0.port == server.ports[0] }.count == 6, "\(server.requests)")
    }

    /// A GStreamer without rtpbin (gstreamer1.0-plugins-good's rtpmanager left out of the plugin
    /// path): webrtcbin goes on without one, and broadcast crashed at the offer (SIGSEGV, after
    /// GStreamer's criticals). Now each attempt says what is missing and the stream fails (exit 1).
    @Test func aGStreamerWithoutRTPBinIsSaidNotCrashedOn() throws {
        let server = try LoopbackHTTP(mode: "refuse")
        defer { server.stop() }
        let plugins = try Self.pluginsWithout("libgstrtpmanager.so")
        defer { plugins.cleanup() }
        let stream = try Child(
            broadcastBinary, ["stream", server.endpoint, "--duration", "3s", "--size", "320x240", "--quiet"],
            environment: ["GST_PLUGIN_SYSTEM_PATH_1_0": plugins.path(""), "GST_REGISTRY_1_0": plugins.path("registry.bin")])
        let r = stream.wait(timeout: 120)
        #expect(r.reason == .exit && r.status == 1, "\(r.reason) \(r.status): \(r.stderr.suffix(3000))")
        #expect(r.stderr.contains("GStreamer's rtpbin not found (webrtcbin sends RTP through it): install gstreamer1.0-plugins-good"),
            "\(r.stderr.suffix(3000))")
        #expect(server.requests.isEmpty, "\(server.requests)")
    }

    /// A plugin directory of links to every installed GStreamer plugin but `left`.
    static func pluginsWithout(_ left: String) throws -> TemporaryDirectory {
        let plugins = try TemporaryDirectory()
        let dir = try run("/usr/bin/pkg-config", ["--variable=pluginsdir", "gstreamer-1.0"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let all = try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".so") }
        try #require(all.contains(left) && all.contains("libgstwebrtc.so"), "\(dir): \(all)")
        for name in all where name != left {
            try FileManager.default.createSymbolicLink(atPath: plugins.path(name), withDestinationPath: "\(dir)/\(name)")
        }
        return plugins
    }

    /// A GStreamer without h264parse: each attempt fails to make the video branch, and every
    /// element it made is freed (GStreamer's own refcount log: appsrc, rtph264pay and capsfilter
    /// were made at every attempt and never finalized before).
    @Test func aFailedPeerLeavesNoElementBehind() throws {
        let plugins = try Self.pluginsWithout("libgstvideoparsersbad.so")
        defer { plugins.cleanup() }
        let log = plugins.path("gst.log")
        let r = try Child(
            broadcastBinary, ["stream", "whip+http://127.0.0.1:9/whip/x", "--duration", "3s", "--size", "320x240", "--quiet"],
            environment: [
                "GST_PLUGIN_SYSTEM_PATH_1_0": plugins.path(""), "GST_REGISTRY_1_0": plugins.path("registry.bin"),
                "GST_DEBUG": "GST_REFCOUNTING:7,GST_ELEMENT_FACTORY:5", "GST_DEBUG_NO_COLOR": "1", "GST_DEBUG_FILE": log,
            ]
        ).wait(timeout: 120)
        #expect(r.reason == .exit && r.status == 1, "\(r.reason) \(r.status): \(r.stderr.suffix(3000))")
        #expect(r.stderr.contains("GStreamer element h264parse not found"), "\(r.stderr.suffix(3000))")
        let lines = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n")
        for factory in ["appsrc", "rtph264pay", "capsfilter"] {
            let made = lines.filter { $0.contains("created element \"\(factory)\"") }.count
            let finalized = try Regex("gst_object_finalize:<\(factory)[0-9]+>")
            let freed = lines.filter { $0.contains(finalized) }.count
            #expect(made > 0 && freed == made, "\(factory): \(made) made, \(freed) finalized")
        }
    }

    /// A token that is also a word, and a path whose elements are words: the refusal reads as it
    /// was written ("the **** refused the session: HTTP 401 (**** or missing token" before); the
    /// URL is shown redacted.
    @Test func aSecretThatIsAWordLeavesTheMessageAlone() throws {
        let server = try LoopbackHTTP(mode: "refuse")
        defer { server.stop() }
        let url = "whip+http://127.0.0.1:\(server.ports[0])/whip/endpoint/broadcast"
        let r = try broadcast(["stream", url, "--whip-token", "wrong", "--duration", "60s", "--size", "320x240", "--quiet"], timeout: 120)
        #expect(r.status == 1, "\(r.stderr)")
        #expect(server.requests.count == 3 && server.requests.allSatisfy { $0.authorization == "Bearer wrong" }, "\(server.requests)")
        #expect(r.stderr.contains("the endpoint refused the session: HTTP 401 (wrong or missing token"), "\(r.stderr)")
        #expect(r.stderr.contains("whip+http://127.0.0.1:\(server.ports[0])/whip/****"), "\(r.stderr)")
        #expect(!r.stderr.contains("/whip/endpoint") && !r.stderr.contains("broadcast/"), "\(r.stderr)")
    }

    /// whip+http:// to a host other than this machine is refused before anything starts (exit 2,
    /// one line) unless --whip-allow-http says so; loopback needs nothing.
    @Test func plainHTTPToAnotherHostIsRefused() throws {
        let url = "whip+http://192.0.2.7:8080/whip/cam"
        let r = try broadcast(["stream", url, "--whip-token", Self.token, "--duration", "1s", "--size", "320x240"], timeout: 60)
        #expect(r.status == 2, "\(r.stderr)")
        #expect(r.stderr.contains("whip+http:// to a host other than this machine sends the token and the session's keys in clear"), "\(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "\(r.stderr)")
        #expect(!r.stderr.contains(Self.token))
        // Allowed: it starts, and fails only to reach the address (TEST-NET-1, routed nowhere).
        let allowed = try broadcast(
            ["stream", url, "--whip-token", Self.token, "--whip-allow-http", "--duration", "2s", "--timeout", "2s", "--size", "320x240", "--quiet"],
            timeout: 120)
        #expect(allowed.status != 2 && !allowed.stderr.contains("in clear"), "\(allowed.stderr)")
        let flagAlone = try broadcast(["stream", "whip+https://192.0.2.7/whip/cam", "--whip-allow-http", "--duration", "1s"], timeout: 60)
        #expect(flagAlone.status == 2 && flagAlone.stderr.contains("--whip-allow-http applies to whip+http:// outputs"), "\(flagAlone.stderr)")
    }

    /// The daemon: the same refusal at the url's line, and allow_http only on whip+http://.
    @Test(arguments: [
        ("url = \"whip+http://192.0.2.7/whip/cam\"", "5: output.url: whip+http://192.0.2.7/whip/****: whip+http:// to a host other than this machine"),
        ("url = \"whip+https://192.0.2.7/whip/cam\"\nallow_http = true", "6: output.allow_http: applies to whip+http:// outputs"),
        ("url = \"whip+http://192.0.2.7/whip/cam\"\nallow_http = \"yes\"", "6: output.allow_http: expected true or false"),
    ] as [(String, String)])
    func daemonRefusesPlainHTTPToAnotherHost(output: String, expected: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("bad.toml")
        try "[control]\nsocket = \"\(dir.path("c.sock"))\"\n[[output]]\nname = \"live\"\n\(output)\n"
            .write(toFile: file, atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", file], timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("\(file):\(expected)"), "expected '\(file):\(expected)' in: \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line: \(r.stderr)")
    }

    /// SIGINT while the endpoint took the POST and never answers: broadcast ends within the stop's
    /// own deadline, not after the request's --timeout (90 s here; it waited for all of it before).
    /// The bound is logical: the exit must come before that timeout could have fired.
    @Test func aStopDoesNotWaitForAnEndpointThatNeverAnswers() throws {
        let server = try LoopbackHTTP(mode: "silent")
        defer { server.stop() }
        let stream = try Child(
            broadcastBinary, ["stream", server.endpoint, "--whip-token", Self.token, "--timeout", "90s", "--size", "320x240", "--quiet"])
        let deadline = Date().addingTimeInterval(60)
        while server.requests.isEmpty, stream.process.isRunning, Date() < deadline { usleep(100_000) }
        try #require(server.requests.count == 1, "no POST came: \(stream.stderrSoFar)")
        stream.signal(SIGINT)
        // Killed after 60 s, which the reason then shows: less than the 90 s the POST may take.
        let r = stream.wait(timeout: 60)
        #expect(r.reason == .exit, "still waiting for the answer 60 s after SIGINT: \(r.stderr)")
        #expect(r.status == 1, "\(r.stderr)")
        #expect(server.requests.count == 1, "\(server.requests)")
    }
}
