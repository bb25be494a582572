import BroadcastKit
import BroadcastComposition
import BroadcastMedia
import BroadcastOutputs
import BroadcastService
import Metrics
import Prometheus
import Synchronization

/// What /metrics exports, read from the broadcast's counters (not from the status JSON).
struct MetricsFigures {
    struct SampleType {
        var type: String
        var delivered: Int
        var deviceLost: Bool
        var deviceLosses: Int
        var dropped: [(reason: String, count: Int)]
    }

    struct OutputFigures {
        /// Which output of that name (`Output.serial`): one removed and added again by a reload
        /// counts from zero again.
        var serial: UInt64 = 0
        var name: String
        var kind: String
        var state: String
        var paused: Bool
        var bytes: Int
        var bitrate: Int
        var backlogMilliseconds: Int
        var reconnects: Int
        var drops: [(reason: String, count: Int)]
        var replay: ReplayStatistics?
        /// WHIP outputs: what the viewer's RTCP says.
        var webRTC: WebRTCFigures? = nil
        /// Adaptive outputs: the video bitrate asked of their encode now.
        var targetBitrate: Int? = nil
    }

    /// One video encode: its size, the outputs it feeds, what it makes.
    struct EncodeFigures {
        var size: String
        var outputs: String
        var bitrate: Int
        var frames: Int
    }

    /// A WHIP output's RTCP figures (nil: no receiver report yet).
    struct WebRTCFigures {
        var roundTripSeconds: Double?
        var packetsLost: Int?
        var fractionLost: Double?
        var keyframeRequests: Int
    }

    var uptimeSeconds: Double
    /// Which broadcast the figures are of (its start on the monotonic clock; 0: none has run): a
    /// new one counts from zero again.
    var broadcast: Int64 = 0
    /// idle, started, paused, finished.
    var state = "idle"
    var mediaSeconds = 0.0
    var videoFramesEncoded = 0
    var audioFramesEncoded = 0
    var bytesWritten = 0
    var bitrate = 0
    var failedOutputs = 0
    var types: [SampleType] = []
    /// Per ALSA device: its clock's drift against the monotonic clock.
    var audioDrift: [(device: String, ppm: Double)] = []
    var outputs: [OutputFigures] = []
    var encodes: [EncodeFigures] = []
    /// Clients following /v1/events.
    var eventClients = 0
    /// The memory budget (`--memory-budget`, `[limits] memory`) the footprint is held to.
    var memoryBudgetBytes: Int64 = 0
    /// The process's resident memory and its footprint (private dirty bytes) when the snapshot was taken.
    var residentBytes: Int64 = 0
    var privateDirtyBytes: Int64 = 0
    /// The composite's scenes and which is shown (empty: no scenes).
    var scenes: [(name: String, current: Bool)] = []
    /// The layers of the scene shown.
    var layers: [LayeredVideoSource.LayerStatus] = []
}

/// Prometheus metrics through swift-metrics: the process's MetricsSystem is bootstrapped with a
/// Prometheus factory over one registry, so anything recorded with swift-metrics (ours or a
/// library's) is exported at /metrics. The broadcast's figures are read at each scrape from its
/// atomics (`MetricsFigures`): nothing on the data path records metrics.
///
/// Totals are Prometheus counters (`_total`): each scrape adds what a figure grew by since the
/// last one, and a new broadcast or a new output of the same name (its figures start from zero
/// again) adds its own from zero, so a counter only ever grows over the daemon's life. Per output
/// and per sample type, labels (`output="live"`, `type="video"`, `reason="..."`); the series of an
/// output or type that is gone are removed at the next scrape.
public final class DaemonMetrics: Sendable {
    private let registry: PrometheusCollectorRegistry
    /// The broadcast's own series are made here, bootstrapped or not.
    private let factory: PrometheusMetricsFactory
    /// What the last scrape saw (scrapes run one at a time: the handler's read queue is
    /// concurrent, so this lock orders them).
    private let lastScrape = Mutex(Scrape())

    /// Call once, before any metric is made.
    public static func bootstrap() -> DaemonMetrics {
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        return DaemonMetrics(registry: registry)
    }

    /// Without making the registry swift-metrics' factory (in-process tests, which cannot bootstrap
    /// the process's metrics system more than once): /metrics then has the broadcast's figures only.
    public convenience init() {
        self.init(registry: PrometheusCollectorRegistry())
    }

    private init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
        self.factory = PrometheusMetricsFactory(registry: registry)
    }

    /// One series: its name and labels.
    private struct Series: Hashable {
        var label: String
        var dimensions: [String]
        var pairs: [(String, String)] { stride(from: 0, to: dimensions.count, by: 2).map { (dimensions[$0], dimensions[$0 + 1]) } }
        init(_ label: String, _ dimensions: [(String, String)]) {
            self.label = label
            self.dimensions = dimensions.flatMap { [$0.0, $0.1] }
        }
    }

    /// Each counter's last total and whose it was; the gauges recorded.
    private struct Scrape {
        var counters: [Series: (of: String, total: Int)] = [:]
        var gauges: Set<Series> = []
    }

    private func gauge(_ label: String, _ value: Double, _ dimensions: [(String, String)] = [], into scrape: inout Scrape) {
        Metrics.Gauge(label: label, dimensions: dimensions, factory: factory).record(value)
        scrape.gauges.insert(Series(label, dimensions))
    }

    /// Adds to the counter what `total` grew by since the last scrape; all of it when the figure is
    /// another's now (`of`: a new broadcast, a new output of the same name), which starts from zero.
    private func counter(
        _ label: String, _ total: Int, _ dimensions: [(String, String)] = [], of owner: String, last: Scrape, into scrape: inout Scrape
    ) {
        let series = Series(label, dimensions)
        let before = last.counters[series].flatMap { $0.of == owner ? $0.total : nil } ?? 0
        let grown = total >= before ? total - before : total
        scrape.counters[series] = (owner, total)
        Metrics.Counter(label: label, dimensions: dimensions, factory: factory).increment(by: max(grown, 0))
    }

    func render(_ figures: MetricsFigures) -> [UInt8] {
        lastScrape.withLock { last in
            var now = Scrape()
            let broadcast = "\(figures.broadcast)"
            gauge("broadcast_uptime_seconds", figures.uptimeSeconds, into: &now)
            gauge("broadcast_running", figures.state == "started" || figures.state == "paused" ? 1 : 0, into: &now)
            gauge("broadcast_paused", figures.state == "paused" ? 1 : 0, into: &now)
            gauge("broadcast_media_seconds", figures.mediaSeconds, into: &now)
            gauge("broadcast_bitrate_bits_per_second", Double(figures.bitrate), into: &now)
            gauge("broadcast_failed_outputs", Double(figures.failedOutputs), into: &now)
            gauge("broadcast_event_clients", Double(figures.eventClients), into: &now)
            for scene in figures.scenes { gauge("broadcast_scene", scene.current ? 1 : 0, [("scene", scene.name)], into: &now) }
            for layer in figures.layers {
                let labels = [("layer", "\(layer.index)"), ("source", layer.name)]
                gauge("broadcast_layer_device_lost", layer.sourceState == "capturing" ? 0 : 1, labels, into: &now)
                gauge("broadcast_layer_shown", layer.shown == "picture" ? 1 : 0, labels, into: &now)
                counter("broadcast_layer_device_losses_total", layer.deviceLosses, labels, of: broadcast, last: last, into: &now)
                counter("broadcast_layer_dropped_total", layer.dropped, labels, of: broadcast, last: last, into: &now)
            }
            counter("broadcast_video_frames_encoded_total", figures.videoFramesEncoded, of: broadcast, last: last, into: &now)
            counter("broadcast_audio_frames_encoded_total", figures.audioFramesEncoded, of: broadcast, last: last, into: &now)
            counter("broadcast_bytes_written_total", figures.bytesWritten, of: broadcast, last: last, into: &now)
            for t in figures.types {
                let type = [("type", t.type)]
                counter("broadcast_buffers_delivered_total", t.delivered, type, of: broadcast, last: last, into: &now)
                counter("broadcast_device_losses_total", t.deviceLosses, type, of: broadcast, last: last, into: &now)
                gauge("broadcast_device_lost", t.deviceLost ? 1 : 0, type, into: &now)
                for (reason, count) in t.dropped {
                    counter("broadcast_buffers_dropped_total", count, type + [("reason", reason)], of: broadcast, last: last, into: &now)
                }
            }
            for (device, ppm) in figures.audioDrift {
                gauge("broadcast_audio_drift_ppm", ppm, [("device", device)], into: &now)
            }
            for o in figures.outputs {
                let output = [("output", o.name)]
                let owner = "\(broadcast)/\(o.serial)"
                counter("broadcast_output_bytes_total", o.bytes, output, of: owner, last: last, into: &now)
                counter("broadcast_output_reconnects_total", o.reconnects, output, of: owner, last: last, into: &now)
                gauge("broadcast_output_backlog_seconds", Double(o.backlogMilliseconds) / 1000, output, into: &now)
                gauge("broadcast_output_bitrate_bits_per_second", Double(o.bitrate), output, into: &now)
                gauge("broadcast_output_paused", o.paused ? 1 : 0, output, into: &now)
                if let target = o.targetBitrate { gauge("broadcast_output_target_bitrate_bits_per_second", Double(target), output, into: &now) }
                gauge("broadcast_output_up", ["live", "recording"].contains(o.state) && !o.paused ? 1 : 0, output, into: &now)
                for (reason, count) in o.drops {
                    counter("broadcast_output_dropped_packets_total", count, output + [("reason", reason)], of: owner, last: last, into: &now)
                }
                if let w = o.webRTC {
                    if let rtt = w.roundTripSeconds { gauge("broadcast_output_round_trip_seconds", rtt, output, into: &now) }
                    if let lost = w.packetsLost { gauge("broadcast_output_packets_lost", Double(lost), output, into: &now) }
                    if let fraction = w.fractionLost { gauge("broadcast_output_fraction_lost", fraction, output, into: &now) }
                    counter("broadcast_output_keyframe_requests_total", w.keyframeRequests, output, of: owner, last: last, into: &now)
                }
                if let r = o.replay {
                    gauge("broadcast_replay_buffered_seconds", r.bufferedSeconds, output, into: &now)
                    gauge("broadcast_replay_buffered_bytes", Double(r.bufferedBytes), output, into: &now)
                    gauge("broadcast_replay_saves_done", Double(r.savesDone), output, into: &now)
                    gauge("broadcast_replay_saves_failed", Double(r.savesFailed), output, into: &now)
                }
            }
            for (index, e) in figures.encodes.enumerated() {
                let encode = [("encode", "\(index)"), ("size", e.size), ("outputs", e.outputs)]
                gauge("broadcast_encode_bitrate_bits_per_second", Double(e.bitrate), encode, into: &now)
                gauge("broadcast_encode_frames", Double(e.frames), encode, into: &now)
            }
            // Memory: the process's footprint, and of it the replay buffers (room for more figures).
            let replayBuffers = figures.outputs.compactMap(\.replay).map(\.bufferedBytes).reduce(0, +)
            gauge("broadcast_resident_bytes", Double(figures.residentBytes), into: &now)
            gauge("broadcast_replay_buffers_bytes", Double(replayBuffers), into: &now)
            gauge("broadcast_private_dirty_bytes", Double(figures.privateDirtyBytes), into: &now)
            gauge("broadcast_memory_budget_bytes", Double(figures.memoryBudgetBytes), into: &now)
            // The series of outputs and types that are gone (a reload removed them, a new broadcast
            // has other sources) go with them.
            for series in last.counters.keys where now.counters[series] == nil {
                Metrics.Counter(label: series.label, dimensions: series.pairs, factory: factory).destroy()
            }
            for series in last.gauges.subtracting(now.gauges) {
                Metrics.Gauge(label: series.label, dimensions: series.pairs, factory: factory).destroy()
            }
            last = now
        }
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return buffer
    }
}
