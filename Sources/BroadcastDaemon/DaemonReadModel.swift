import BroadcastComposition
import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import BroadcastService

/// One look at the daemon's state, as plain values: what the status, /metrics, the events, the
/// systemd STATUS= line and the page's status ticks are made of. `BroadcastController.snapshot()`
/// takes it (the controller's lock for a moment, then the session's and outputs' atomics, once
/// each); `DaemonReadModel` turns it into each reader's form without looking at the controller
/// again, so they all say the same thing of the same moment.
struct DaemonSnapshot {
    /// Since the daemon started.
    var uptimeSeconds: Double
    /// Why the last broadcast ended with an error.
    var failure: String?
    /// The memory budget (`--memory-budget`, `[limits] memory`).
    var memoryBudgetBytes: Int64
    /// The process's footprint (nil: not read; the events do not need it).
    var memory: ProcessFootprint?
    /// Clients following /v1/events.
    var eventClients = 0
    /// The broadcast last started (running, paused or finished); nil before the first.
    var broadcast: Broadcast?

    /// What the process holds: its resident memory and its private dirty bytes (see `ProcessMemory`).
    struct ProcessFootprint: Equatable {
        var residentBytes: Int64
        var privateDirtyBytes: Int64
    }

    struct Broadcast {
        /// The session's identity: a new start is a new broadcast.
        var session: ObjectIdentifier
        /// Its start on the monotonic clock (which broadcast /metrics counts for).
        var startedAt: Int64
        var state: SessionLifecycle.State
        /// Since it started.
        var elapsedSeconds: Double
        /// Per sample-buffer type, by name (`SampleBufferType.rawValue`) in order.
        var types: [(type: String, statistics: SampleBufferStatistics)]
        var encoding: EncodingStatistics
        /// Per ALSA device that knows it: its clock's drift against the monotonic clock.
        var audioDrift: [(device: String, ppm: Double)] = []
        /// The composite picture's scenes and layers; nil without layers or once finished.
        var composite: Composite?
        var outputs: [Output] = []
        /// Each video encode and the outputs it feeds: the broadcast's first, then the outputs' own.
        var encodes: [Encode] = []
        /// The markers taken in this broadcast, in order.
        var marks: [TakenMark] = []
        /// Per audio source (mic, app) the broadcast has: its volume and mute.
        var audio: [(name: String, level: AudioLevel)] = []
        /// Per source a sync offset can be set for (video, mic, app): its offset in nanoseconds.
        var offsets: [(name: String, nanoseconds: Int64)] = []

        /// The media time the furthest type reached.
        var mediaNanoseconds: Int64 { types.map(\.statistics.mediaTimeNanoseconds).max() ?? 0 }
    }

    struct Composite {
        /// The scene asked for (the status) and the one the last frame showed (the events).
        var scene: String
        var shownScene: String
        var scenes: [String]
        /// The layers of the scene shown.
        var layers: [LayeredVideoSource.LayerStatus]
    }

    struct Output {
        /// Which output of that name (`Output.serial`).
        var serial: UInt64
        var statistics: OutputStatistics
        /// The output's state as its worker sets it (the events and STATUS=; the status and
        /// /metrics say `statistics.state`, read with the rest of its figures).
        var state: OutputState
        /// Paused as soon as asked (`POST /v1/outputs/{name}/pause`).
        var paused: Bool
        var isReplay: Bool
        var replay: ReplayStatistics?
        /// Files finished so far and the last one's path.
        var files: Int
        var lastFile: String?
        /// A recording's markers in the file it writes now; nil for outputs that show none.
        var fileMarks: [RecordingMark]?

        var kind: String { statistics.isLive ? "live" : isReplay ? "replay" : "recording" }
    }

    struct Encode {
        var settings: VideoEncoderSettings
        var outputs: [String]
        var bitrate: Int
        var frames: Int
    }
}

/// The daemon's read side: pure functions of a `DaemonSnapshot` (the controller keeps the commands
/// and takes the snapshot). The status document (`GET /v1/status`, the page's `status` ticks, the
/// answers of the POST routes), the figures /metrics renders, the state events are diffed from,
/// and the systemd STATUS= line.
enum DaemonReadModel {
    // MARK: Status

    static func status(_ s: DaemonSnapshot) -> JSONValue {
        let memory = memoryFields(s)
        guard let b = s.broadcast else {
            return .object([
                ("state", .string("idle")),
                ("uptime_seconds", .number(s.uptimeSeconds)),
                ("outputs", .array([])),
                ("memory", memory),
                ("error", s.failure.map(JSONValue.string) ?? .null),
            ])
        }
        let encoding = b.encoding
        var types: [(String, JSONValue)] = []
        for (type, t) in b.types {
            let dropped: [(String, JSONValue)] = [
                ("queue_full", .number(Double(t.droppedQueueFull))),
                ("source", .number(Double(t.droppedBySource))),
                ("paused", .number(Double(t.droppedPaused))),
                ("out_of_order", .number(Double(t.droppedOutOfOrder))),
            ]
            let fields: [(String, JSONValue)] = [
                ("source_state", .string(sourceState(t.sourceHealth.state, session: b.state, failed: s.failure != nil))),
                ("device_losses", .number(Double(t.sourceHealth.deviceLosses))),
                ("delivered", .number(Double(t.delivered))),
                ("dropped", .object(dropped)),
                ("media_seconds", .number(Double(t.mediaTimeNanoseconds) / 1e9)),
            ]
            types.append((type, .object(fields)))
        }
        let outputs: [JSONValue] = b.outputs.map { output -> JSONValue in
            let o = output.statistics
            let drops: [(String, JSONValue)] = o.drops.sorted { $0.key.rawValue < $1.key.rawValue }.map {
                ("\($0.key)", .number(Double($0.value)))
            }
            let fields: [(String, JSONValue)] = [
                ("name", .string(o.name)),
                ("kind", .string(output.kind)),
                ("target", .string(o.target)),
                ("state", .string("\(o.state)")),
                ("paused", .bool(output.paused)),
                ("bitrate", .number(Double(o.bitrate))),
                ("bytes", .number(Double(o.bytesSent))),
                ("backlog_ms", .number(Double(o.backlogMilliseconds))),
                ("target_bitrate", o.targetBitrate.map { .number(Double($0)) } ?? .null),
                ("max_bitrate", o.maximumBitrate.map { .number(Double($0)) } ?? .null),
                ("reconnects", .number(Double(o.reconnects))),
                ("drops", .object(drops)),
                ("error", o.lastError.map(JSONValue.string) ?? .null),
            ] + replayFields(output.replay) + webRTCFields(o) + fileMarkerFields(output.fileMarks)
            return .object(fields)
        }
        let elapsed = b.elapsedSeconds
        let fps = elapsed > 0 ? (Double(encoding.videoFramesEncoded) / elapsed * 10).rounded() / 10 : 0
        let fields: [(String, JSONValue)] = [
            ("state", .string(b.state.description)),
            ("uptime_seconds", .number(s.uptimeSeconds)),
            ("media_seconds", .number(Double(b.mediaNanoseconds) / 1e9)),
            ("fps", .number(fps)),
            ("bitrate", .number(Double(encoding.bitrate))),
            ("video_frames_encoded", .number(Double(encoding.videoFramesEncoded))),
            ("bytes_written", .number(Double(encoding.bytesWritten))),
            ("failed_outputs", .number(Double(encoding.failedOutputs))),
            ("undecodable_frames", .number(Double(encoding.undecodableFrames))),
            ("audio_drift_ppm", b.audioDrift.first.map { .number($0.ppm) } ?? .null),
            ("types", .object(types)),
            ("scene", b.composite.map { .string($0.scene) } ?? .null),
            ("scenes", .array((b.composite?.scenes ?? []).map { .string($0) })),
            ("layers", .array((b.composite?.layers ?? []).map { layer in
                .object([
                    ("index", .number(Double(layer.index))), ("name", .string(layer.name)),
                    ("source_state", .string(layer.sourceState)), ("shown", .string(layer.shown)),
                    ("device_losses", .number(Double(layer.deviceLosses))), ("dropped", .number(Double(layer.dropped))),
                ])
            })),
            ("outputs", .array(outputs)),
            ("marks", .array(b.marks.map { .object(BroadcastController.markerFields($0)) })),
            ("encodes", .array(b.encodes.map(encodeFields))),
            ("audio", .object(b.audio.map { source in
                (source.name, .object([("muted", .bool(source.level.muted)), ("volume_db", .number(source.level.volumeDecibels))]))
            })),
            // Each source's sync offset in milliseconds (positive: delayed).
            ("offsets_ms", .object(b.offsets.map { name, offset in (name, JSONValue.number(Double(offset) / 1e6)) })),
            ("memory", memory),
            ("error", s.failure.map(JSONValue.string) ?? .null),
        ]
        return .object(fields)
    }

    /// What a source is doing, as the status says it: only a running (or paused) broadcast's
    /// sources capture; once it has finished they are stopped, or failed when it ended with an
    /// error (a source that could not start, a capture that broke).
    static func sourceState(_ health: CaptureHealth.State, session: SessionLifecycle.State, failed: Bool) -> String {
        switch session {
        case .finished: failed ? "failed" : "stopped"
        case .idle: "starting"
        default: health == .deviceLost ? "device-lost" : "capturing"
        }
    }

    /// A replay output's fields in the status.
    static func replayFields(_ replay: ReplayStatistics?) -> [(String, JSONValue)] {
        guard let r = replay else { return [] }
        return [
            ("buffered_seconds", .number((r.bufferedSeconds * 1000).rounded() / 1000)),
            ("buffered_bytes", .number(Double(r.bufferedBytes))),
            ("replay_seconds", .number(r.limitSeconds)),
            ("max_memory", .number(Double(r.maxBytes))),
            ("saves_done", .number(Double(r.savesDone))),
            ("saves_failed", .number(Double(r.savesFailed))),
            ("saves_pending", .number(Double(r.savesPending))),
            ("last_saved_path", r.lastPath.map(JSONValue.string) ?? .null),
            ("gops_dropped_for_memory", .number(Double(r.droppedForMemory))),
        ]
    }

    /// A WHIP output's RTCP figures for the status: round-trip time, packets lost (cumulative) and
    /// the fraction lost in the viewer's last report, its keyframe requests. None for other outputs.
    static func webRTCFields(_ o: OutputStatistics) -> [(String, JSONValue)] {
        guard let requests = o.keyframeRequests else { return [] }
        return [
            (
                "webrtc",
                .object([
                    ("round_trip_ms", o.roundTripMilliseconds.map(JSONValue.number) ?? .null),
                    ("packets_lost", o.packetsLost.map { .number(Double($0)) } ?? .null),
                    ("fraction_lost", o.fractionLost.map(JSONValue.number) ?? .null),
                    ("keyframe_requests", .number(Double(requests))),
                ])
            )
        ]
    }

    /// A recording's markers in the file it writes now, in the file's time.
    static func fileMarkerFields(_ marks: [RecordingMark]?) -> [(String, JSONValue)] {
        guard let marks else { return [] }
        return [("marks", .array(marks.map { .object([("title", .string($0.title)), ("seconds", .number(Double($0.nanoseconds) / 1e9))]) }))]
    }

    /// One video encode in the status: its size, rate control, target and measured bitrate, frame
    /// rate, frames and the outputs it feeds.
    static func encodeFields(_ encode: DaemonSnapshot.Encode) -> JSONValue {
        let settings = encode.settings
        let control: String
        switch settings.rateControl {
        case .cbr: control = "cbr"
        case .vbr: control = "vbr"
        case .crf(let quality): control = "crf \(quality)"
        }
        return .object([
            ("size", .string("\(settings.width)x\(settings.height)")),
            ("fps", .number(settings.frameRate.framesPerSecond)),
            ("rate_control", .string(control)),
            ("video_bitrate", .number(Double(settings.bitrate))),
            ("bitrate", .number(Double(encode.bitrate))),
            ("preset", .string(settings.preset)),
            ("frames", .number(Double(encode.frames))),
            ("outputs", .array(encode.outputs.map { .string($0) })),
        ])
    }

    /// What the process holds: its resident memory and, of it, the replay buffers; the budget.
    static func memoryFields(_ s: DaemonSnapshot) -> JSONValue {
        let footprint = s.memory ?? .init(residentBytes: 0, privateDirtyBytes: 0)
        return .object([
            ("resident_bytes", .number(Double(footprint.residentBytes))), ("replay_buffers_bytes", .number(Double(replayBuffersBytes(s)))),
            ("private_dirty_bytes", .number(Double(footprint.privateDirtyBytes))), ("budget_bytes", .number(Double(s.memoryBudgetBytes))),
        ])
    }

    /// The replay buffers' bytes, of all replay outputs.
    static func replayBuffersBytes(_ s: DaemonSnapshot) -> Int64 {
        (s.broadcast?.outputs ?? []).compactMap(\.replay).map(\.bufferedBytes).reduce(0, +)
    }

    // MARK: Metrics

    /// The figures /metrics exports (`DaemonMetrics.render`), from the same snapshot as the status.
    static func metricsFigures(_ s: DaemonSnapshot) -> MetricsFigures {
        var figures = MetricsFigures(uptimeSeconds: s.uptimeSeconds)
        figures.eventClients = s.eventClients
        figures.memoryBudgetBytes = s.memoryBudgetBytes
        figures.residentBytes = s.memory?.residentBytes ?? 0
        figures.privateDirtyBytes = s.memory?.privateDirtyBytes ?? 0
        guard let b = s.broadcast else { return figures }
        let encoding = b.encoding
        figures.broadcast = b.startedAt
        figures.state = b.state.description
        figures.mediaSeconds = Double(b.mediaNanoseconds) / 1e9
        figures.videoFramesEncoded = encoding.videoFramesEncoded
        figures.audioFramesEncoded = encoding.audioFramesEncoded
        figures.bytesWritten = Int(encoding.bytesWritten)
        figures.bitrate = encoding.bitrate
        figures.failedOutputs = encoding.failedOutputs
        figures.types = b.types.map { type, t in
            .init(
                type: type, delivered: t.delivered, deviceLost: t.sourceHealth.state == .deviceLost,
                deviceLosses: t.sourceHealth.deviceLosses,
                dropped: [("queue_full", t.droppedQueueFull), ("source", t.droppedBySource), ("paused", t.droppedPaused), ("out_of_order", t.droppedOutOfOrder)])
        }
        if let composite = b.composite {
            figures.scenes = composite.scenes.map { ($0, $0 == composite.scene) }
            figures.layers = composite.layers
        }
        figures.audioDrift = b.audioDrift
        figures.outputs = b.outputs.map { output in
            let o = output.statistics
            return .init(
                serial: output.serial, name: o.name, kind: output.kind, state: "\(o.state)",
                paused: output.paused, bytes: Int(o.bytesSent), bitrate: o.bitrate, backlogMilliseconds: o.backlogMilliseconds,
                reconnects: o.reconnects, drops: o.drops.sorted { $0.key.rawValue < $1.key.rawValue }.map { ("\($0.key)", $0.value) },
                replay: output.replay,
                webRTC: o.keyframeRequests.map {
                    .init(roundTripSeconds: o.roundTripMilliseconds.map { $0 / 1000 }, packetsLost: o.packetsLost, fractionLost: o.fractionLost, keyframeRequests: $0)
                },
                targetBitrate: o.targetBitrate)
        }
        figures.encodes = b.encodes.map { encode in
            .init(
                size: "\(encode.settings.width)x\(encode.settings.height)", outputs: encode.outputs.joined(separator: ","),
                bitrate: encode.bitrate, frames: encode.frames)
        }
        return figures
    }

    // MARK: Events

    /// The state events are made of (`EventSnapshot.changes(since:)` diffs two of them).
    static func events(_ s: DaemonSnapshot) -> EventSnapshot {
        guard let b = s.broadcast else { return EventSnapshot(session: nil) }
        return EventSnapshot(
            session: b.session,
            broadcast: b.state.description,
            outputs: b.outputs.map { output in
                // Paused as soon as asked; once resumed, "resuming" until its worker takes packets again.
                let state = output.paused ? "paused" : output.state == .paused ? "resuming" : "\(output.state)"
                return .init(
                    name: output.name, state: state, files: output.files, lastFile: output.lastFile,
                    targetBitrate: output.statistics.targetBitrate, maximumBitrate: output.statistics.maximumBitrate)
            },
            devices: b.types.map { ($0.type, $0.statistics.sourceHealth.state == .deviceLost) },
            scene: b.composite?.shownScene,
            layers: (b.composite?.layers ?? []).map { .init(index: $0.index, name: $0.name, state: $0.sourceState, shown: $0.shown) },
            audio: b.audio.map { ($0.name, $0.level.muted) },
            offsets: b.offsets.map { ($0.name, $0.nanoseconds) },
            // What a pause leaves out is asked for, not lost: no drops event for it.
            drops: b.outputs.map { output in
                .init(scope: "output", name: output.name, count: output.statistics.drops.filter { $0.key != .paused }.values.reduce(0, +))
            }
                + b.types.map {
                    .init(
                        scope: "type", name: $0.type,
                        count: $0.statistics.droppedQueueFull + $0.statistics.droppedBySource + $0.statistics.droppedOutOfOrder)
                },
            marks: b.marks
        )
    }

    // MARK: systemd

    /// The STATUS= line systemd shows: "started: 00:01:02.50 of media; live live, file recording".
    static func statusLine(_ s: DaemonSnapshot) -> String {
        guard let b = s.broadcast else { return "idle" }
        let outputs = b.outputs.map { "\($0.name) \($0.state)" }.joined(separator: ", ")
        return "\(b.state): \(MediaClockText.format(b.mediaNanoseconds)) of media; \(outputs)"
    }
}

extension DaemonSnapshot.Output {
    var name: String { statistics.name }
}
