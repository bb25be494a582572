import BroadcastOutputs
import BroadcastService

/// What the last look at the broadcast published from.
struct PublishedState {
    var snapshot = EventSnapshot(session: nil)
}

/// The parts of the daemon's state that `/v1/events` reports changes of.
struct EventSnapshot {
    struct Output: Equatable {
        var name: String
        /// connecting, live, reconnecting, stalled, recording, paused, failed, finished.
        var state: String
        /// Files finished so far and the last one's path.
        var files: Int
        var lastFile: String?
        /// Adaptive outputs: the video bitrate asked of their encode, and its maximum.
        var targetBitrate: Int? = nil
        var maximumBitrate: Int? = nil
    }

    /// The running session's identity (a new start is a new broadcast); nil: none ever ran.
    var session: ObjectIdentifier?
    var broadcast = "idle"
    var outputs: [Output] = []
    /// Per sample-buffer type, whether its device is lost.
    var devices: [(String, Bool)] = []
    /// The scene the composite shows (nil: a picture without scenes).
    var scene: String?
    /// The layers of that scene: their source's state and what the frames show of them.
    var layers: [Layer] = []
    struct Layer: Equatable {
        var index: Int
        var name: String
        /// capturing, device-lost or failed.
        var state: String
        /// picture, slate or hidden.
        var shown: String
    }
    /// Per audio source (mic, app), whether it is muted.
    var audio: [(String, Bool)] = []
    /// Per source (video, mic, app), its sync offset in nanoseconds.
    var offsets: [(String, Int64)] = []
    /// What was dropped so far, per output and per sample-buffer type of the session.
    var drops: [Drops] = []
    /// The markers taken in this broadcast, in order.
    var marks: [TakenMark] = []

    struct Drops: Equatable {
        /// "output" (an output's drops, every reason but a pause) or "type" (the session's, of one buffer type:
        /// its queue full, lost at the source, out of order; not what a pause leaves out).
        var scope: String
        var name: String
        var count: Int
    }

    /// The threshold band `count` is in: 0 for none, then one band per power of two (1, 2-3, 4-7,
    /// ...). A `drops` event says a count entered a higher band: the first drop at once, a steady
    /// loss ever less often (a drop a second: 1, 2, 4, ... s, then every 17 min after 9 h), a
    /// burst as one event, and at most 63 per count in all.
    static func dropBand(_ count: Int) -> Int { count <= 0 ? 0 : Int.bitWidth - count.leadingZeroBitCount }

    /// The events that lead from `before` to this state.
    func changes(since before: EventSnapshot) -> [(String, [(String, JSONValue)])] {
        var events: [(String, [(String, JSONValue)])] = []
        let sameSession = session == before.session
        if session != nil && (!sameSession || broadcast != before.broadcast) {
            let was = sameSession ? before.broadcast : "idle"
            let change: String? =
                switch (was, broadcast) {
                case (_, "started") where was == "paused": "resumed"
                case (_, "started"): "started"
                case (_, "paused"): "paused"
                case (_, "finished"): "finished"
                default: nil
                }
            if let change { events.append(("broadcast", [("state", .string(change))])) }
        }
        let previous = sameSession ? Dictionary(before.outputs.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a }) : [:]
        for output in outputs {
            let old = previous[output.name]
            if output.state != old?.state {
                events.append(("output", [("name", .string(output.name)), ("state", .string(output.state))]))
            }
            // An adaptive output's bitrate moved (its controller changes it at most once a second).
            if let target = output.targetBitrate, let maximum = output.maximumBitrate, target != (old?.targetBitrate ?? maximum) {
                events.append(("bitrate", [
                    ("output", .string(output.name)), ("target", .number(Double(target))), ("max", .number(Double(maximum))),
                ]))
            }
            if output.files != (old?.files ?? 0), let path = output.lastFile {
                events.append(("file", [
                    ("output", .string(output.name)), ("path", .string(path)), ("count", .number(Double(output.files))),
                ]))
            }
        }
        // Each marker taken since (a `marker` event: its number, title, media time and recordings).
        for mark in marks.dropFirst(sameSession ? before.marks.count : 0) {
            events.append(("marker", BroadcastController.markerFields(mark)))
        }
        let previousDevices = sameSession ? Dictionary(before.devices, uniquingKeysWith: { a, _ in a }) : [:]
        for (type, lost) in devices where lost != (previousDevices[type] ?? false) {
            events.append(("device", [("type", .string(type)), ("state", .string(lost ? "lost" : "back"))]))
        }
        if let scene, sameSession, before.scene != nil, scene != before.scene {
            events.append(("scene", [("name", .string(scene)), ("was", .string(before.scene!))]))
        }
        // A layer's own change within a scene (a switch is the scene event's).
        if sameSession, scene == before.scene {
            let previousLayers = Dictionary(before.layers.map { ("\($0.index) \($0.name)", $0) }, uniquingKeysWith: { a, _ in a })
            for layer in layers {
                guard let old = previousLayers["\(layer.index) \(layer.name)"], old != layer else { continue }
                events.append(("layer", [
                    ("index", .number(Double(layer.index))), ("name", .string(layer.name)), ("state", .string(layer.state)),
                    ("shown", .string(layer.shown)),
                ]))
            }
        }
        let previousAudio = sameSession ? Dictionary(before.audio, uniquingKeysWith: { a, _ in a }) : [:]
        for (source, muted) in audio where muted != (previousAudio[source] ?? false) {
            events.append(("audio", [("source", .string(source)), ("state", .string(muted ? "muted" : "unmuted"))]))
        }
        let previousOffsets = sameSession ? Dictionary(before.offsets, uniquingKeysWith: { a, _ in a }) : [:]
        for (source, offset) in offsets where offset != (previousOffsets[source] ?? 0) {
            events.append(("offset", [("source", .string(source)), ("offset_ms", .number(Double(offset) / 1e6))]))
        }
        let previousDrops = sameSession ? Dictionary(before.drops.map { ("\($0.scope) \($0.name)", $0.count) }, uniquingKeysWith: { a, _ in a }) : [:]
        for drop in drops where Self.dropBand(drop.count) > Self.dropBand(previousDrops["\(drop.scope) \(drop.name)"] ?? 0) {
            events.append(("drops", [(drop.scope, .string(drop.name)), ("dropped", .number(Double(drop.count)))]))
        }
        return events
    }
}

/// Media time as HH:MM:SS.cc (the daemon's STATUS= line, the command line's status line).
public enum MediaClockText {
    public static func format(_ nanoseconds: Int64) -> String {
        let cs = max(0, nanoseconds) / 10_000_000
        func two(_ v: Int64) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return "\(two(cs / 360_000)):\(two(cs / 6000 % 60)):\(two(cs / 100 % 60)).\(two(cs % 100))"
    }
}
