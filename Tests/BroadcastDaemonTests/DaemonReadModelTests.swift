import BroadcastKit
import BroadcastMedia
import BroadcastService
import Testing

@testable import BroadcastComposition
@testable import BroadcastDaemon
@testable import BroadcastOutputs

/// `DaemonReadModel`: the status document, the /metrics figures and text, the events' state and
/// the STATUS= line, each from a `DaemonSnapshot` built by hand: no devices, no daemon. (The
/// end-to-end suites read the same documents from a running daemon.)
@Suite struct DaemonReadModelTests {
    final class Session: Sendable {}
    static let session = Session()

    static func output(
        _ name: String, target: String, live: Bool, state: OutputState, bitrate: Int = 0, bytes: Int64 = 0,
        targetBitrate: Int? = nil, maximumBitrate: Int? = nil, replay: ReplayStatistics? = nil
    ) -> DaemonSnapshot.Output {
        var statistics = OutputStatistics(
            name: name, target: target, isLive: live, state: state, attempt: 0, reconnects: 0, videoPacketsSent: 0,
            audioPacketsSent: 0, bytesSent: bytes, bitrate: bitrate, backlogMilliseconds: live ? 120 : 0, maxBacklogMilliseconds: 0,
            drops: [:], lastError: nil)
        statistics.targetBitrate = targetBitrate
        statistics.maximumBitrate = maximumBitrate
        return DaemonSnapshot.Output(
            serial: 1, statistics: statistics, state: state, paused: false, isReplay: replay != nil, replay: replay, files: 0,
            lastFile: nil, fileMarks: live || replay != nil ? nil : [])
    }

    /// A broadcast 10 s in: video and a microphone, `outputs`, `encodes`, `audio` and `offsets` as given.
    static func running(
        outputs: [DaemonSnapshot.Output], encodes: [DaemonSnapshot.Encode] = [],
        audio: [(name: String, level: AudioLevel)] = [("mic", AudioLevel())],
        offsets: [(name: String, nanoseconds: Int64)] = [("video", 0), ("mic", 0)]
    ) -> DaemonSnapshot {
        var video = SampleBufferStatistics()
        video.delivered = 300
        video.mediaTimeNanoseconds = 10_000_000_000
        var mic = SampleBufferStatistics()
        mic.delivered = 500
        mic.mediaTimeNanoseconds = 9_980_000_000
        var encoding = EncodingStatistics()
        encoding.videoFramesEncoded = 300
        encoding.audioFramesEncoded = 470
        encoding.bytesWritten = 4_000_000
        encoding.bitrate = 3_200_000
        var snapshot = idle()
        snapshot.failure = nil
        snapshot.broadcast = DaemonSnapshot.Broadcast(
            session: ObjectIdentifier(session), startedAt: 7_000_000_000, state: .started, elapsedSeconds: 10,
            types: [("audioMic", mic), ("video", video)], encoding: encoding, outputs: outputs, encodes: encodes, audio: audio,
            offsets: offsets)
        return snapshot
    }

    static func idle() -> DaemonSnapshot {
        DaemonSnapshot(
            uptimeSeconds: 12.5, failure: "the microphone went away", memoryBudgetBytes: 512 << 20,
            memory: .init(residentBytes: 100 << 20, privateDirtyBytes: 60 << 20), eventClients: 2)
    }

    static func metricsText(_ snapshot: DaemonSnapshot) -> String {
        String(decoding: DaemonMetrics().render(DaemonReadModel.metricsFigures(snapshot)), as: UTF8.self)
    }

    static func outputs(_ status: JSONValue) -> [JSONValue] {
        guard case .array(let outputs)? = status["outputs"] else { return [] }
        return outputs
    }

    static func keys(_ value: JSONValue?) -> [String] {
        guard case .object(let fields)? = value else { return [] }
        return fields.map(\.0)
    }

    /// No broadcast yet: the short document, with the last failure and the snapshot's memory figures.
    @Test func idleStatusAndMetrics() {
        let snapshot = Self.idle()
        #expect(
            DaemonReadModel.status(snapshot).serialized()
                == #"{"state":"idle","uptime_seconds":12.5,"outputs":[],"memory":{"resident_bytes":104857600,"replay_buffers_bytes":0,"private_dirty_bytes":62914560,"budget_bytes":536870912},"error":"the microphone went away"}"#
        )
        let metrics = Self.metricsText(snapshot)
        #expect(metrics.contains("broadcast_running 0.0\n"), "\(metrics)")
        #expect(metrics.contains("broadcast_event_clients 2.0\n"), "\(metrics)")
        // The footprint is the snapshot's, not read again at render time.
        #expect(metrics.contains("broadcast_resident_bytes 104857600.0\n"), "\(metrics)")
        #expect(metrics.contains("broadcast_private_dirty_bytes 62914560.0\n"), "\(metrics)")
        #expect(DaemonReadModel.statusLine(snapshot) == "idle")
        #expect(DaemonReadModel.events(snapshot).session == nil)
    }

    /// A running broadcast's document: its keys in their order, the derived figures (media time
    /// of the furthest type, frames per second over the broadcast's time), each type's state.
    @Test func runningStatusKeysAndFigures() {
        let snapshot = Self.running(outputs: [Self.output("rec", target: "/tmp/rec.mkv", live: false, state: .recording)])
        let status = DaemonReadModel.status(snapshot)
        #expect(
            Self.keys(status) == [
                "state", "uptime_seconds", "media_seconds", "fps", "bitrate", "video_frames_encoded", "bytes_written", "failed_outputs",
                "undecodable_frames", "audio_drift_ppm", "types", "scene", "scenes", "layers", "outputs", "marks", "encodes", "audio",
                "offsets_ms", "memory", "error",
            ])
        #expect(status["media_seconds"]?.numberValue == 10)
        #expect(status["fps"]?.numberValue == 30)
        #expect(Self.keys(status["types"]) == ["audioMic", "video"])
        #expect(status["types"]?["video"]?["source_state"]?.stringValue == "capturing")
        #expect(
            Self.outputs(status).first?.serialized()
                == #"{"name":"rec","kind":"recording","target":"/tmp/rec.mkv","state":"recording","paused":false,"bitrate":0,"bytes":0,"backlog_ms":0,"target_bitrate":null,"max_bitrate":null,"reconnects":0,"drops":{},"error":null,"marks":[]}"#
        )
        #expect(DaemonReadModel.statusLine(snapshot) == "started: 00:00:10.00 of media; rec recording")
        // Finished with an error: its sources say failed.
        var failed = snapshot
        failed.broadcast?.state = .finished
        failed.failure = "capture broke"
        #expect(DaemonReadModel.status(failed)["types"]?["video"]?["source_state"]?.stringValue == "failed")
    }

    /// An adaptive live output at 1.1 of its 3.0 Mb/s (what `broadcast status` and the page show as
    /// "adapting: 1.1 of 3.0 Mb/s"): its target and maximum in the status, its target gauge in
    /// /metrics, a `bitrate` event; a recording beside it has neither.
    @Test func adaptiveOutputInStatusMetricsAndEvents() {
        let live = Self.output(
            "live", target: "srt://example.net:9000", live: true, state: .live, bitrate: 1_150_000, targetBitrate: 1_100_000,
            maximumBitrate: 3_000_000)
        let rec = Self.output("rec", target: "/tmp/rec.mkv", live: false, state: .recording)
        let snapshot = Self.running(outputs: [live, rec])
        let outputs = Self.outputs(DaemonReadModel.status(snapshot))
        #expect(outputs.count == 2)
        #expect(outputs.first?["kind"]?.stringValue == "live")
        #expect(outputs.first?["target_bitrate"]?.numberValue == 1_100_000)
        #expect(outputs.first?["max_bitrate"]?.numberValue == 3_000_000)
        #expect(outputs.first?["backlog_ms"]?.numberValue == 120)
        #expect(outputs.last?["target_bitrate"] == .null && outputs.last?["max_bitrate"] == .null)

        let metrics = Self.metricsText(snapshot)
        #expect(metrics.contains("broadcast_output_target_bitrate_bits_per_second{output=\"live\"} 1100000.0\n"), "\(metrics)")
        #expect(!metrics.contains("broadcast_output_target_bitrate_bits_per_second{output=\"rec\"}"), "\(metrics)")
        #expect(metrics.contains("broadcast_output_bitrate_bits_per_second{output=\"live\"} 1150000.0\n"), "\(metrics)")
        #expect(metrics.contains("broadcast_output_up{output=\"live\"} 1.0\n"), "\(metrics)")

        // From its maximum to 1.1 Mb/s since the last look: one bitrate event.
        var before = snapshot
        before.broadcast?.outputs[0].statistics.targetBitrate = 3_000_000
        let events = DaemonReadModel.events(snapshot).changes(since: DaemonReadModel.events(before))
        #expect(events.map(\.0) == ["bitrate"])
        #expect(
            JSONValue.object(events.first?.1 ?? []).serialized() == #"{"output":"live","target":1100000,"max":3000000}"#)
    }

    /// A muted microphone at -6 dB, 200 ms late, beside desktop audio as captured.
    @Test func mutedMicrophone() {
        let snapshot = Self.running(
            outputs: [], audio: [("mic", AudioLevel(volumeDecibels: -6, muted: true)), ("app", AudioLevel())],
            offsets: [("video", 0), ("mic", 200_000_000), ("app", 0)])
        let status = DaemonReadModel.status(snapshot)
        #expect(status["audio"]?.serialized() == #"{"mic":{"muted":true,"volume_db":-6},"app":{"muted":false,"volume_db":0}}"#)
        #expect(status["offsets_ms"]?.serialized() == #"{"video":0,"mic":200,"app":0}"#)
        let state = DaemonReadModel.events(snapshot)
        #expect(state.audio.map(\.0) == ["mic", "app"] && state.audio.map(\.1) == [true, false])
        // Muted since the last look: an audio event, and none for what did not change.
        var before = snapshot
        before.broadcast?.audio[0].level.muted = false
        before.broadcast?.offsets[1].nanoseconds = 200_000_000
        let events = state.changes(since: DaemonReadModel.events(before))
        #expect(events.map(\.0) == ["audio"])
        #expect(JSONValue.object(events.first?.1 ?? []).serialized() == #"{"source":"mic","state":"muted"}"#)
    }

    /// Two encodes: the broadcast's feeding the recording and the stream, and a smaller one of its
    /// own for a low-rate output; each with what it makes, in the status and in /metrics.
    @Test func twoEncodesAndTheOutputsTheyFeed() {
        let main = DaemonSnapshot.Encode(
            settings: VideoEncoderSettings(width: 1280, height: 720, bitrate: 3_000_000), outputs: ["rec", "live"],
            bitrate: 2_950_000, frames: 300)
        let low = DaemonSnapshot.Encode(
            settings: VideoEncoderSettings(width: 640, height: 360, bitrate: 800_000, rateControl: .crf(23), preset: "faster"),
            outputs: ["low"], bitrate: 790_000, frames: 299)
        let snapshot = Self.running(outputs: [], encodes: [main, low])
        #expect(
            DaemonReadModel.status(snapshot)["encodes"]?.serialized()
                == #"[{"size":"1280x720","fps":30,"rate_control":"cbr","video_bitrate":3000000,"bitrate":2950000,"preset":"veryfast","frames":300,"outputs":["rec","live"]},{"size":"640x360","fps":30,"rate_control":"crf 23","video_bitrate":800000,"bitrate":790000,"preset":"faster","frames":299,"outputs":["low"]}]"#
        )
        let metrics = Self.metricsText(snapshot)
        #expect(metrics.contains(#"broadcast_encode_frames{encode="0",size="1280x720",outputs="rec,live"} 300.0"#), "\(metrics)")
        #expect(metrics.contains(#"broadcast_encode_bitrate_bits_per_second{encode="1",size="640x360",outputs="low"} 790000.0"#), "\(metrics)")
    }

    /// A replay buffer's bytes are what the memory figures count as replay buffers, in both documents.
    @Test func replayBuffersInMemoryFigures() {
        let replay = ReplayStatistics(
            bufferedSeconds: 29.9996, bufferedBytes: 40_000_000, limitSeconds: 30, maxBytes: 64 << 20, savesDone: 1, savesFailed: 0,
            savesPending: 0, lastPath: "/tmp/replay-1.mkv", droppedForMemory: 0)
        let snapshot = Self.running(outputs: [Self.output("replay", target: "/tmp/replay.mkv", live: false, state: .recording, replay: replay)])
        let status = DaemonReadModel.status(snapshot)
        #expect(status["memory"]?["replay_buffers_bytes"]?.numberValue == 40_000_000)
        let output = Self.outputs(status).first
        #expect(output?["kind"]?.stringValue == "replay")
        #expect(output?["buffered_seconds"]?.numberValue == 30)
        #expect(output?["last_saved_path"]?.stringValue == "/tmp/replay-1.mkv")
        #expect(output?["marks"] == nil)
        let metrics = Self.metricsText(snapshot)
        #expect(metrics.contains("broadcast_replay_buffers_bytes 40000000.0\n"), "\(metrics)")
        #expect(metrics.contains("broadcast_replay_buffered_bytes{output=\"replay\"} 40000000.0\n"), "\(metrics)")
    }
}
