import Foundation
import Testing

/// rtmps:// checks the server's certificate (issue 24, item 3): nginx's stream module ends TLS in
/// front of nginx-rtmp with a certificate signed by a private CA. Trusted by no system store, it is
/// refused by default, accepted with --tls-ca (daemon: tls_ca), and skipped with a warning by
/// --tls-insecure (tls_verify = false). FFmpeg's own default is to check nothing.
@Suite(.serialized) struct TLSTests {
    static let key = StreamTests.key
    static let short = ["--size", "320x180", "--preset", "ultrafast", "--video-bitrate", "1M"]

    /// By default a certificate no trusted authority signed is a refusal that says "certificate"
    /// and why; three in a row give up (exit 1). The server got nothing, the key was not printed.
    @Test func untrustedCertificateIsRefused() throws {
        let server = try RTMPServer(tls: true)
        defer { server.cleanup() }
        let url = "rtmps://127.0.0.1:\(try #require(server.tlsPort))/live/\(Self.key)"
        let r = try broadcast(["stream", url, "--duration", "60s"] + Self.short, timeout: 90)
        #expect(r.status == 1, "exit \(r.status): \(r.stderr.suffix(3000))")
        StreamTests.expectNoKey(r)
        #expect(r.stderr.contains("certificate of 127.0.0.1 not accepted: it is not signed by the system's certificate authorities"),
            "\(r.stderr.suffix(3000))")
        #expect(r.stderr.contains("the server's certificate was refused 3 times in a row; giving up"), "\(r.stderr.suffix(3000))")
        server.stop()
        #expect(server.recordings.isEmpty, "the server received a stream: \(server.recordings)")
    }

    /// A certificate from the trusted CA but for another host name is refused too.
    @Test func certificateForAnotherHostIsRefused() throws {
        let server = try RTMPServer(tls: true, certificateName: "DNS:elsewhere.example")
        defer { server.cleanup() }
        let url = "rtmps://127.0.0.1:\(try #require(server.tlsPort))/live/\(Self.key)"
        let r = try broadcast(["stream", url, "--tls-ca", server.caFile, "--duration", "60s"] + Self.short, timeout: 90)
        #expect(r.status == 1, "exit \(r.status): \(r.stderr.suffix(3000))")
        StreamTests.expectNoKey(r)
        #expect(r.stderr.contains("certificate of 127.0.0.1 not accepted: it is not issued for 127.0.0.1"), "\(r.stderr.suffix(3000))")
        server.stop()
        #expect(server.recordings.isEmpty, "the server received a stream: \(server.recordings)")
    }

    /// --tls-insecure streams to the same server, and says that nothing was checked.
    @Test func insecureStreamsWithAWarning() throws {
        let server = try RTMPServer(tls: true)
        defer { server.cleanup() }
        let url = "rtmps://127.0.0.1:\(try #require(server.tlsPort))/live/\(Self.key)"
        let r = try broadcast(["stream", url, "--tls-insecure", "--duration", "4s"] + Self.short, timeout: 60)
        #expect(r.status == 0, "exit \(r.status): \(r.stderr.suffix(3000))")
        StreamTests.expectNoKey(r)
        #expect(r.stderr.contains("the server's certificate is not checked"), "\(r.stderr.suffix(3000))")
        server.stop()
        let copy = try #require(server.recordings.first, "nginx recorded nothing")
        #expect((try probe(copy).video?.frames ?? 0) > 60)
    }

    /// Bad TLS flags are exit 2 with one line, before anything starts.
    @Test(arguments: [
        (["--tls-ca", "/nonexistent/ca.pem"], "invalid --tls-ca '/nonexistent/ca.pem': cannot read"),
        (["--tls-ca", "/etc/hostname"], "holds no PEM certificate"),
        (["--tls-ca", "/etc/ssl/certs/ca-certificates.crt", "--tls-insecure"], "--tls-ca and --tls-insecure contradict"),
    ] as [([String], String)])
    func badFlagsAreRefused(flags: [String], expected: String) throws {
        let r = try broadcast(["stream", "rtmps://127.0.0.1:1/live/\(Self.key)", "--duration", "1s"] + flags, timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains(expected), "\(r.stderr)")
        StreamTests.expectNoKey(r)
    }

    @Test func tlsFlagsWithoutRTMPSAreRefused() throws {
        let r = try broadcast(["stream", "rtmp://127.0.0.1:1/live/\(Self.key)", "--tls-insecure", "--duration", "1s"], timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("--tls-insecure applies to rtmps:// and whip+https:// outputs, and none is given"), "\(r.stderr)")
    }

    /// The daemon's tls_ca and tls_verify: a bad one is exit 2 with file:line: key.
    @Test(arguments: [
        ("url = \"rtmps://h/app/key\"\ntls_ca = \"ca.pem\"", "6: output.tls_ca: expected an absolute path"),
        ("url = \"rtmps://h/app/key\"\ntls_ca = \"/nonexistent/ca.pem\"", "6: output.tls_ca: cannot read /nonexistent/ca.pem"),
        ("url = \"rtmps://h/app/key\"\ntls_ca = \"/etc/hostname\"", "6: output.tls_ca: /etc/hostname holds no PEM certificate"),
        ("url = \"rtmps://h/app/key\"\ntls_verify = \"no\"", "6: output.tls_verify: expected true or false"),
        ("url = \"rtmp://h/app/key\"\ntls_verify = false", "6: output.tls_verify: applies to rtmps:// and whip+https:// outputs"),
        ("path = \"/tmp/r.mp4\"\ntls_ca = \"/etc/ssl/certs/ca-certificates.crt\"", "6: output.tls_ca: applies to rtmps:// and whip+https:// outputs"),
        ("url = \"rtmps://h/app/key\"\ntls_ca = \"/etc/ssl/certs/ca-certificates.crt\"\ntls_verify = false",
         "6: output.tls_ca: tls_ca and tls_verify = false contradict"),
    ] as [(String, String)])
    func badDaemonKeysAreRefused(output: String, expected: String) throws {
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

    /// The daemon: an rtmps output with tls_ca goes live and the server records the stream; one
    /// without it is refused, saying "certificate", and fails after three refusals.
    @Test func daemonChecksCertificates() throws {
        let server = try RTMPServer(tls: true)
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let port = try #require(server.tlsPort)
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "trusted"
            url = "rtmps://127.0.0.1:\(port)/live/\(Self.key)-a"
            tls_ca = "\(server.caFile)"
            [[output]]
            name = "untrusted"
            url = "rtmps://127.0.0.1:\(port)/live/\(Self.key)-b"
            """)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        var outputs: [String: [String: Any]] = [:]
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            let r = try broadcast(["status", "--socket", socket], timeout: 30)
            let status = (try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8))) as? [String: Any] ?? [:]
            for output in status["outputs"] as? [[String: Any]] ?? [] { outputs[output["name"] as? String ?? ""] = output }
            if outputs["trusted"]?["state"] as? String == "live", outputs["untrusted"]?["state"] as? String == "failed" { break }
            usleep(300_000)
        }
        #expect(outputs["trusted"]?["state"] as? String == "live", "\(outputs)")
        #expect(outputs["untrusted"]?["state"] as? String == "failed", "\(outputs)")
        let untrustedError = outputs["untrusted"]?["error"].map { "\($0)" } ?? ""
        #expect(untrustedError.contains("certificate of 127.0.0.1 not accepted"), "\(outputs)")
        usleep(2_000_000)
        daemon.signal(SIGTERM)
        let ended = daemon.wait(timeout: 60)
        #expect(!ended.stderr.contains(Self.key), "the key in the log: \(ended.stderr.suffix(2000))")
        server.stop()
        let copies = server.recordings
        #expect(copies.count == 1, "\(copies)")
        if let copy = copies.first { #expect((try probe(copy).video?.codec) == "h264") }
    }
}
