@testable import BroadcastService
import Testing

/// `broadcast status` for people, on fixed status documents: every state, long names and
/// targets, narrow terminals. Judged by what a reader needs (every state word, figures in units,
/// nothing wider than the terminal), not by a copy of the output.
@Suite struct StatusSummaryTests {
    static func output(_ name: String, kind: String = "recording", state: String, paused: Bool = false,
                       target: String = "/var/lib/broadcast/rec.mkv", bitrate: Int = 2_500_000, error: String? = nil,
                       extra: String = "") -> String {
        """
        {"name":"\(name)","kind":"\(kind)","target":"\(target)","state":"\(state)","paused":\(paused),\
        "bitrate":\(bitrate),"bytes":3145728,"backlog_ms":120,"reconnects":2,"drops":{"queue_full":7,"paused":3},\
        "error":\(error.map { "\"\($0)\"" } ?? "null")\(extra)}
        """
    }

    static func document(state: String = "started", outputs: [String], error: String? = nil) -> JSONValue {
        let text = """
            {"state":"\(state)","uptime_seconds":3725.5,"media_seconds":3720.25,"fps":29.97,"bitrate":3015424,\
            "types":{"video":{"source_state":"capturing","device_losses":0,"delivered":111600,"dropped":{"queue_full":0,"source":12}},\
            "audioMic":{"source_state":"device-lost","device_losses":1,"delivered":174000,"dropped":{"queue_full":0,"source":0}}},\
            "outputs":[\(outputs.joined(separator: ","))],\
            "memory":{"resident_bytes":72720384,"replay_buffers_bytes":3202156,"private_dirty_bytes":18534400,"budget_bytes":167772160},\
            "audio_drift_ppm":-4.6,"error":\(error.map { "\"\($0)\"" } ?? "null")}
            """
        return JSONValue.parse(text)!
    }

    static let states = ["starting", "recording", "live", "reconnecting", "stalled", "failed", "finished", "paused"]

    @Test("every output state is said in the API's own words, with its figures in units")
    func everyState() {
        let outputs = Self.states.enumerated().map { i, state in
            Self.output("out\(i)", kind: i % 2 == 0 ? "recording" : "live", state: state,
                        target: i % 2 == 0 ? "/rec/\(i).mkv" : "rtmp://a.example/live/****")
        }
        let text = StatusSummary(width: 100).render(Self.document(outputs: outputs))
        for (i, state) in Self.states.enumerated() {
            let line = text.split(separator: "\n").first { $0.hasPrefix("  out\(i) ") }
            #expect(line?.contains(" \(state) ") == true, "out\(i): \(line ?? "missing")\n\(text)")
        }
        #expect(text.contains("2500 kbit/s"), "\(text)")
        #expect(text.contains("3.0 MiB"), "\(text)")
        #expect(text.contains("backlog 120 ms"), "\(text)")
        #expect(text.contains("10 dropped"), "\(text)")
        #expect(text.contains("2 reconnects"), "\(text)")
        #expect(text.contains("rtmp://a.example/live/****"), "\(text)")
        #expect(text.hasPrefix("broadcast: started"), "\(text)")
        #expect(text.contains("up 1:02:05"), "\(text)")
        #expect(text.contains("media 1:02:00"), "\(text)")
        #expect(text.contains("30.0 fps"), "\(text)")
        #expect(text.contains("3015 kbit/s"), "\(text)")
        #expect(text.contains("17.7 MiB of a 160.0 MiB budget"), "\(text)")
        #expect(text.contains("drift -5 ppm"), "\(text)")
        #expect(text.contains("device-lost"), "\(text)")
        #expect(text.contains("12 source"), "\(text)")
    }

    @Test("sync offsets are shown only when a source is moved")
    func offsets() {
        func render(_ offsets: String) -> String {
            var text = Self.document(outputs: []).serialized()
            text.removeLast()
            return StatusSummary(width: 100).render(JSONValue.parse(text + ",\"offsets_ms\":\(offsets)}")!)
        }
        let moved = render("{\"video\":0,\"mic\":120,\"app\":-50.5}")
        #expect(moved.contains("offsets:   video 0 ms, mic +120 ms, app -50.5 ms"), "\(moved)")
        #expect(!render("{\"video\":0,\"mic\":0}").contains("offsets"))
    }

    @Test("a paused output reads paused; an output's error and the broadcast's error are shown")
    func pausedAndErrors() {
        let text = StatusSummary().render(Self.document(
            state: "paused",
            outputs: [Self.output("rec", state: "recording", paused: true),
                      Self.output("live", kind: "live", state: "failed", error: "refused: the server said 403 Forbidden")],
            error: "the video source failed"))
        #expect(text.hasPrefix("broadcast: paused"), "\(text)")
        #expect(text.split(separator: "\n").contains { $0.hasPrefix("  rec ") && $0.contains(" paused ") }, "\(text)")
        #expect(text.contains("error: refused: the server said 403 Forbidden"), "\(text)")
        #expect(text.contains("\nerror: the video source failed"), "\(text)")
    }

    @Test("a replay output shows its buffered seconds and saves")
    func replay() {
        let replay = Self.output("replay", kind: "replay", state: "recording", extra: """
            ,"buffered_seconds":28.4,"replay_seconds":30,"saves_done":3,"saves_failed":1,"last_saved_path":"/r/last.mp4"
            """)
        let text = StatusSummary().render(Self.document(outputs: [replay]))
        #expect(text.contains("buffered 28.4 of 30 s"), "\(text)")
        #expect(text.contains("3 saved, 1 failed"), "\(text)")
        #expect(text.contains("last saved /r/last.mp4"), "\(text)")
    }

    @Test("no line wider than the terminal, long names and targets kept readable at both ends", arguments: [40, 60, 80, 132])
    func narrowTerminals(width: Int) {
        let longName = "a-very-long-output-name-that-goes-on-and-on"
        let longPath = "/var/lib/broadcast/recordings/2026/11/26/" + String(repeating: "x", count: 90) + "-final.mkv"
        let text = StatusSummary(width: width).render(Self.document(
            outputs: [Self.output(longName, state: "recording", target: longPath,
                                  error: "writing " + longPath + ": No space left on device")],
            error: String(repeating: "e", count: 300)), events: ["18:00:00  " + String(repeating: "v", count: 200)])
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            #expect(line.count <= width, "\(line.count) > \(width): \(line)")
        }
        let targetLine = text.split(separator: "\n").first { $0.contains("…") && $0.contains("/var/lib") }
        #expect(targetLine?.hasSuffix(width >= 60 ? "-final.mkv" : ".mkv") == true, "the target's end stays: \(text)")
        #expect(text.contains("recording"), "\(text)")
    }

    @Test("units people read")
    func units() {
        #expect(StatusSummary.bytes(512) == "512 B")
        #expect(StatusSummary.bytes(1536) == "1.5 KiB")
        #expect(StatusSummary.bytes(5 * 1024 * 1024 * 1024) == "5.00 GiB")
        #expect(StatusSummary.rate(999_499) == "999 kbit/s")
        #expect(StatusSummary.rate(12_340_000) == "12.3 Mbit/s")
        #expect(StatusSummary.clock(8.26) == "8.3 s")
        #expect(StatusSummary.clock(245) == "4:05")
        #expect(StatusSummary.clock(3723) == "1:02:03")
        #expect(StatusSummary.decimal(-0.04, 1) == "0.0")
        #expect(StatusSummary.decimal(-1.25, 1) == "-1.3" || StatusSummary.decimal(-1.25, 1) == "-1.2")
    }

    @Test("events as the watch view lists them")
    func events() {
        let output = JSONValue.parse(#"{"time":"2026-11-26T18:27:25.123Z","name":"live","state":"reconnecting"}"#)!
        #expect(StatusSummary.describe("output", output) == "18:27:25  live reconnecting")
        let refused = JSONValue.parse(#"{"trigger":"POST","result":"refused","message":"d.toml:3: video.size: bad"}"#)!
        #expect(StatusSummary.describe("reload", refused).contains("refused: d.toml:3: video.size: bad"))
    }

    @Test("an idle daemon: its state, no figures")
    func idle() {
        let text = StatusSummary().render(JSONValue.parse(#"{"state":"idle","outputs":[],"types":{},"error":null}"#)!)
        #expect(text == "broadcast: idle\n")
    }
}
