import Foundation
import Testing

/// The package's root (this file is Tests/BroadcastCLITests/JanusWHIPTests.swift).
private let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// Debian's Janus gateway (1.1.2, package `janus`) on 127.0.0.1, a production SFU: its VideoRoom
/// takes an RTP stream only by an SSRC the SDP announced or by the `sdes:mid` header extension and
/// drops every other packet ("Unknown SSRC"). A private config directory (the HTTP API alone, the
/// VideoRoom alone, no STUN), the room records each publisher into `rec` (.mjr files, turned into
/// media files by `janus-pp-rec` from `janus-tools`). WHIP reaches it through scripts/janus-whip.py,
/// a front-end of the tests' own (python3, standard library) that turns the POST and DELETE into
/// Janus API calls as Debian's `simple-whip-server` does (that package's nodejs cannot be installed
/// beside every machine's node).
final class JanusGateway {
    let directory: TemporaryDirectory
    let apiPort: Int
    let whipPort: Int
    private var janus: Child?
    private var frontEnd: Child?
    var recordDirectory: String { directory.path("rec") }
    var url: String { "whip+http://127.0.0.1:\(whipPort)/whip/janus" }
    /// Janus's own log so far.
    var log: String { janus?.stdoutSoFar ?? "" }

    /// What the front-end changes in the SDP it passes on.
    enum Munging: String, CaseIterable, Sendable {
        /// Nothing.
        case none
        /// The offer's a=ssrc lines are taken out before Janus sees it: the streams can only be
        /// told apart by the mid header extension.
        case ssrcTakenOut
        /// The answer's a=extmap for the mid extension is taken out: an endpoint that does not take it.
        case midRefused
    }

    init(token: String?, munging: Munging = .none) throws {
        directory = try TemporaryDirectory()
        apiPort = try freePort()
        whipPort = try freePort()
        let conf = directory.path("conf")
        try FileManager.default.createDirectory(atPath: conf, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: recordDirectory, withIntermediateDirectories: true)
        // Debian's multiarch folder: /usr/lib/x86_64-linux-gnu/janus on amd64.
        let arches = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib")) ?? []
        let lib = try #require(
            arches.map { "/usr/lib/\($0)/janus" }.first {
                FileManager.default.fileExists(atPath: "\($0)/plugins/libjanus_videoroom.so")
            },
            "Janus's VideoRoom plugin not found: install janus (make deps)")
        func others(_ folder: String, keeping: String) -> String {
            let names = (try? FileManager.default.contentsOfDirectory(atPath: "\(lib)/\(folder)")) ?? []
            return names.filter { $0.hasSuffix(".so") && $0 != keeping }.sorted().joined(separator: ",")
        }
        let files = [
            "janus.jcfg": """
                general: {
                    configs_folder = "\(conf)"
                    plugins_folder = "\(lib)/plugins"
                    transports_folder = "\(lib)/transports"
                    events_folder = "\(lib)/events"
                    loggers_folder = "\(lib)/loggers"
                    debug_level = 4
                    session_timeout = 0
                    protected_folders = []
                }
                media: {
                }
                nat: {
                    nice_debug = false
                }
                plugins: {
                    disable = "\(others("plugins", keeping: "libjanus_videoroom.so"))"
                }
                transports: {
                    disable = "\(others("transports", keeping: "libjanus_http.so"))"
                }
                loggers: {
                    disable = "\(others("loggers", keeping: ""))"
                }
                events: {
                    broadcast = false
                    disable = "\(others("events", keeping: ""))"
                }
                """,
            "janus.transport.http.jcfg": """
                general: {
                    json = "plain"
                    base_path = "/janus"
                    http = true
                    port = \(apiPort)
                    ip = "127.0.0.1"
                    https = false
                }
                admin: {
                    admin_http = false
                }
                """,
            "janus.plugin.videoroom.jcfg": "general: {\n}\n",
        ]
        for (name, text) in files { try text.write(toFile: "\(conf)/\(name)", atomically: true, encoding: .utf8) }
        janus = try Child("/usr/bin/janus", ["-F", conf, "-C", "\(conf)/janus.jcfg", "--disable-colors"])
        let deadline = Date().addingTimeInterval(60)
        while connectLocal(apiPort) < 0 {
            guard janus!.process.isRunning, Date() < deadline else {
                throw ProbeError(message: "Janus did not start: \(log.suffix(2000))")
            }
            usleep(50_000)
        }
        var arguments = [packageRoot.appendingPathComponent("scripts/janus-whip.py").path, "--port", "\(whipPort)",
                         "--janus", "http://127.0.0.1:\(apiPort)/janus", "--rec-dir", recordDirectory]
        if let token { arguments += ["--token", token] }
        if munging == .ssrcTakenOut { arguments.append("--strip-ssrc") }
        if munging == .midRefused { arguments.append("--refuse-mid") }
        frontEnd = try Child("/usr/bin/python3", arguments)
        while !frontEnd!.stdoutSoFar.contains("listening") {
            guard frontEnd!.process.isRunning, Date() < deadline else {
                throw ProbeError(message: "the WHIP front-end did not start: \(frontEnd!.stderrSoFar)")
            }
            usleep(50_000)
        }
    }

    func state() throws -> [String: Any] {
        let r = try run("/usr/bin/curl", ["-sf", "http://127.0.0.1:\(whipPort)/state"])
        guard r.status == 0, let object = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]
        else {
            throw ProbeError(message: "GET /state: \(r.status) \(r.stderr)")
        }
        return object
    }

    /// Stops the front-end, then Janus (SIGINT: it closes its recordings and exits). Janus's log.
    @discardableResult
    func stop() -> String {
        frontEnd?.signal(SIGTERM)
        _ = frontEnd?.wait(timeout: 10)
        frontEnd = nil
        guard let janus else { return "" }
        janus.signal(SIGINT)
        let ended = janus.wait(timeout: 60)
        self.janus = nil
        return ended.stdout
    }

    /// What Janus recorded of `kind` ("video" or "audio"), turned by janus-pp-rec into `.mp4`
    /// (H.264) or `.opus`: one file per recording that had packets.
    func media(_ kind: String) throws -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: recordDirectory)) ?? []
        var files: [String] = []
        for name in names.sorted() where name.hasSuffix(".mjr") && name.contains("-\(kind)-") {
            let output = directory.path(name.replacingOccurrences(of: ".mjr", with: kind == "video" ? ".mp4" : ".opus"))
            let r = try run("/usr/bin/janus-pp-rec", ["\(recordDirectory)/\(name)", output], timeout: 300)
            if r.status != 0 { print("Janus: janus-pp-rec \(name): exit \(r.status): \(r.stderr.suffix(500))") }
            if r.status == 0, FileManager.default.fileExists(atPath: output) { files.append(output) }
        }
        return files
    }

    /// The RTP packets Janus recorded of `kind` (mjr2pcap: Ethernet, IPv4, UDP), and how many of
    /// them carry a header extension (the X bit).
    func rtpPackets(_ kind: String) throws -> (packets: Int, extended: Int) {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: recordDirectory)) ?? []
        var packets = 0
        var extended = 0
        for name in names.sorted() where name.hasSuffix(".mjr") && name.contains("-\(kind)-") {
            let pcap = directory.path(name.replacingOccurrences(of: ".mjr", with: ".pcap"))
            let r = try run("/usr/bin/mjr2pcap", ["\(recordDirectory)/\(name)", pcap], timeout: 300)
            guard r.status == 0, let data = FileManager.default.contents(atPath: pcap), data.count >= 24 else {
                print("Janus: mjr2pcap \(name): exit \(r.status): \(r.stderr.suffix(500))")
                continue
            }
            let bytes = [UInt8](data)
            func le32(_ at: Int) -> Int {
                Int(bytes[at]) | Int(bytes[at + 1]) << 8 | Int(bytes[at + 2]) << 16 | Int(bytes[at + 3]) << 24
            }
            try #require(le32(0) == 0xa1b2c3d4 && le32(20) == 1, "\(name): not a little-endian Ethernet pcap")
            var offset = 24
            while offset + 16 <= bytes.count {
                let length = le32(offset + 8)
                let frame = offset + 16
                offset = frame + length
                guard offset <= bytes.count, length > 14 + 20 + 8 + 12 else { continue }
                let rtp = frame + 14 + Int(bytes[frame + 14] & 0x0f) * 4 + 8
                guard rtp < offset else { continue }
                packets += 1
                if bytes[rtp] & 0x10 != 0 { extended += 1 }
            }
        }
        return (packets, extended)
    }

    func cleanup() {
        stop()
        directory.cleanup()
    }
}

/// The offer's media sections (from each "m=" line to the next).
private func mediaSections(_ sdp: String) -> [String] {
    sdp.components(separatedBy: "m=").dropFirst().map { "m=" + $0 }
}

/// The WHIP output into Janus's VideoRoom: both media reach an SFU that maps RTP by the SSRCs the
/// SDP announced (or, those lines taken out, by the mid header extension alone), seen in what Janus
/// recorded; the extension goes only to an endpoint whose answer took it.
@Suite(.serialized) struct JanusWHIPTests {
    static let token = "janus-test-token-51c2e8"

    @Test(arguments: JanusGateway.Munging.allCases)
    func mediaReachesJanus(munging: JanusGateway.Munging) throws {
        let gateway = try JanusGateway(token: Self.token, munging: munging)
        defer { gateway.cleanup() }
        let r = try broadcast(
            ["stream", gateway.url, "--whip-token", Self.token, "--duration", "12s", "--size", "320x240", "--quiet"],
            timeout: 180)
        #expect(r.status == 0, "\(r.stderr)")
        // One session, ended with a DELETE when the stream stopped.
        let state = try gateway.state()
        #expect(state["sessions"] as? Int == 1 && state["deletes"] as? Int == 1, "\(state)")
        let offers = state["offers"] as? [String] ?? []
        let log = gateway.stop()
        let sent = try #require(packetsSent(r.stderr), "\(r.stderr)")
        #expect(sent.video >= 200 && sent.audio >= 400, "\(r.stderr)")
        let unknown = log.components(separatedBy: "Unknown SSRC").count - 1
        // Every medium the offer sends is announced by SSRC and offers the mid header extension.
        let offer = try #require(offers.first, "no offer reached the front-end")
        for section in mediaSections(offer) {
            #expect(section.contains("a=ssrc:"), "no a=ssrc in \(section)")
            #expect(section.contains("urn:ietf:params:rtp-hdrext:sdes:mid"), "no mid extension in \(section)")
        }
        // What Janus recorded, decoded: as many frames as were sent (a few may be lost on a busy host).
        let video = try gateway.media("video")
        let audio = try gateway.media("audio")
        let videoFrames = try video.map { try probe($0).video?.frames ?? 0 }.reduce(0, +)
        let audioFrames = try audio.map { try probe($0).audio?.frames ?? 0 }.reduce(0, +)
        print(
            "Janus (\(munging)): recorded \(videoFrames) of \(sent.video) video frames, \(audioFrames) of \(sent.audio)"
                + " Opus packets; \(unknown) 'Unknown SSRC' lines in its log")
        #expect(
            Double(videoFrames) >= 0.9 * Double(sent.video),
            "\(videoFrames) of \(sent.video) video frames reached Janus; \(log.suffix(3000))")
        #expect(
            Double(audioFrames) >= 0.9 * Double(sent.audio),
            "\(audioFrames) of \(sent.audio) audio packets reached Janus")
        // Every packet carries the mid, unless the answer did not take the extension: then none.
        for kind in ["video", "audio"] {
            let rtp = try gateway.rtpPackets(kind)
            print("Janus (\(munging)): \(rtp.extended) of \(rtp.packets) \(kind) RTP packets carry a header extension")
            #expect(rtp.packets > 0)
            #expect(
                rtp.extended == (munging == .midRefused ? 0 : rtp.packets),
                "\(kind): \(rtp.extended) of \(rtp.packets) packets extended")
        }
        #expect(!r.stderr.contains(Self.token))
    }
}
