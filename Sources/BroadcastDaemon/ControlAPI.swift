import BroadcastKit
import BroadcastOutputs
import BroadcastService
import Metrics
import Prometheus
import Synchronization

/// The control API's routes, on top of `BroadcastController`.
enum ControlAPI {
    static func handle(
        _ request: ControlRequest, controller: BroadcastController, metrics: DaemonMetrics, reload: () -> ReloadOutcome
    ) -> ControlResponse {
        switch (request.method, request.path) {
        case ("GET", "/v1/status"), ("HEAD", "/v1/status"):
            return .json(200, controller.status())
        case ("GET", "/metrics"):
            return ControlResponse(status: 200, contentType: "text/plain; version=0.0.4", body: metrics.render(controller.metricsFigures()))
        case ("POST", let path) where path.hasPrefix("/v1/broadcast/"):
            let verb = path.dropFirst("/v1/broadcast/".count)
            do {
                switch verb {
                case "start": try controller.start()
                case "pause": try controller.pause()
                case "resume": try controller.resume()
                case "stop": controller.stop()
                default: return .error(404, "unknown action '\(verb)': use start, pause, resume or stop")
                }
            } catch let error as BroadcastError {
                return .error(error.code == .illegalTransition ? 409 : 400, error.message)
            } catch {
                return .error(400, "\(error)")
            }
            return .json(200, controller.status())
        case ("POST", "/v1/reload"):
            // Answered when the reload is done (a swapped device can take seconds): 200 with what
            // applies now, or 400 with the config's file:line error (nothing changed then).
            switch reload() {
            case .refused(let message):
                return .error(400, "config not reloaded: \(message)")
            case .nextStart:
                return .json(200, .object([("reloaded", .bool(true)), ("applies", .string("from the next start"))]))
            case .applied(let report):
                // 200 either way (the config is the daemon's now); `complete` false and each
                // change's `result` say what did not apply, and why.
                return .json(200, .object([("reloaded", .bool(true)), ("applies", .string(report.complete ? "now" : "partly"))] + report.fields))
            }
        case ("POST", "/v1/replay/save"):
            return ReplayAPI.save(name: nil, request: request, controller: controller)
        case ("POST", let path) where path.hasPrefix("/v1/outputs/") && path.hasSuffix("/save"):
            let parts = path.dropFirst("/v1/outputs/".count).split(separator: "/", omittingEmptySubsequences: false)
            guard parts.count == 2, !parts[0].isEmpty else { return .error(404, "unknown output action '\(path)': use /v1/outputs/{name}/save") }
            return ReplayAPI.save(name: String(parts[0]), request: request, controller: controller)
        case ("POST", let path) where path.hasPrefix("/v1/outputs/"):
            // /v1/outputs/{name}/pause or /v1/outputs/{name}/resume
            let parts = path.dropFirst("/v1/outputs/".count).split(separator: "/", omittingEmptySubsequences: false)
            guard parts.count == 2, !parts[0].isEmpty, parts[1] == "pause" || parts[1] == "resume" else {
                return .error(404, "unknown output action '\(path)': use /v1/outputs/{name}/pause or /v1/outputs/{name}/resume")
            }
            do {
                try controller.setOutput(named: String(parts[0]), paused: parts[1] == "pause")
            } catch let error as BroadcastError {
                return .error(error.code == .illegalTransition ? 409 : 404, error.message)
            } catch {
                return .error(400, "\(error)")
            }
            return .json(200, controller.status())
        case (_, "/v1/status"), (_, "/metrics"):
            return .error(405, "\(request.method) is not allowed on \(request.path): use GET")
        case (_, let path) where path.hasPrefix("/v1/broadcast/") || path.hasPrefix("/v1/outputs/") || path == "/v1/replay/save" || path == "/v1/reload":
            return .error(405, "\(request.method) is not allowed on \(path): use POST")
        default:
            return .error(404, "no such endpoint: \(request.path) (see /v1/status, /v1/broadcast/{start,pause,resume,stop}, /v1/outputs/{name}/{pause,resume,save}, /v1/replay/save, /v1/reload, /metrics)")
        }
    }
}

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
    }

    var uptimeSeconds: Double
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
    /// Clients following /v1/events.
    var eventClients = 0
    /// The memory budget (`--memory-budget`, `[limits] memory`) the footprint is held to.
    var memoryBudgetBytes: Int64 = 0
}

/// Prometheus metrics through swift-metrics: the process's MetricsSystem is bootstrapped with a
/// Prometheus factory over one registry, so anything recorded with swift-metrics (ours or a
/// library's) is exported at /metrics. The broadcast's figures are read at each scrape from its
/// atomics (`MetricsFigures`): nothing on the data path records metrics.
///
/// Totals are Prometheus counters (`_total`): each scrape adds what a figure grew by since the
/// last one, and a new broadcast (its figures start from zero again) adds its own from zero, so a
/// counter only ever grows over the daemon's life. Per output and per sample type, labels
/// (`output="live"`, `type="video"`, `reason="..."`).
public final class DaemonMetrics: Sendable {
    private let registry: PrometheusCollectorRegistry
    /// Last value seen per counter series (scrapes run one at a time: the handler's read queue is
    /// concurrent, so this lock orders them).
    private let lastSeen = Mutex<[String: Int]>([:])

    /// Call once, before any metric is made.
    public static func bootstrap() -> DaemonMetrics {
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        return DaemonMetrics(registry: registry)
    }

    /// Without making the registry swift-metrics' factory (in-process tests, which cannot bootstrap
    /// the process's metrics system more than once): /metrics is then empty.
    public convenience init() {
        self.init(registry: PrometheusCollectorRegistry())
    }

    private init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
    }

    private func gauge(_ label: String, _ value: Double, _ dimensions: [(String, String)] = []) {
        Metrics.Gauge(label: label, dimensions: dimensions).record(value)
    }

    /// Adds to the counter what `total` grew by since the last scrape (all of it after a reset).
    private func counter(_ label: String, _ total: Int, _ dimensions: [(String, String)] = [], seen: inout [String: Int]) {
        let key = label + dimensions.map { "|\($0.0)=\($0.1)" }.joined()
        let last = seen[key] ?? 0
        let grown = total >= last ? total - last : total
        seen[key] = total
        let counter = Metrics.Counter(label: label, dimensions: dimensions)
        if grown > 0 { counter.increment(by: grown) } else { counter.increment(by: 0) }
    }

    func render(_ figures: MetricsFigures) -> [UInt8] {
        lastSeen.withLock { seen in
            gauge("broadcast_uptime_seconds", figures.uptimeSeconds)
            gauge("broadcast_running", figures.state == "started" || figures.state == "paused" ? 1 : 0)
            gauge("broadcast_paused", figures.state == "paused" ? 1 : 0)
            gauge("broadcast_media_seconds", figures.mediaSeconds)
            gauge("broadcast_bitrate_bits_per_second", Double(figures.bitrate))
            gauge("broadcast_failed_outputs", Double(figures.failedOutputs))
            gauge("broadcast_event_clients", Double(figures.eventClients))
            counter("broadcast_video_frames_encoded_total", figures.videoFramesEncoded, seen: &seen)
            counter("broadcast_audio_frames_encoded_total", figures.audioFramesEncoded, seen: &seen)
            counter("broadcast_bytes_written_total", figures.bytesWritten, seen: &seen)
            for t in figures.types {
                counter("broadcast_buffers_delivered_total", t.delivered, [("type", t.type)], seen: &seen)
                counter("broadcast_device_losses_total", t.deviceLosses, [("type", t.type)], seen: &seen)
                gauge("broadcast_device_lost", t.deviceLost ? 1 : 0, [("type", t.type)])
                for (reason, count) in t.dropped {
                    counter("broadcast_buffers_dropped_total", count, [("type", t.type), ("reason", reason)], seen: &seen)
                }
            }
            for (device, ppm) in figures.audioDrift {
                gauge("broadcast_audio_drift_ppm", ppm, [("device", device)])
            }
            for o in figures.outputs {
                let output = [("output", o.name)]
                counter("broadcast_output_bytes_total", o.bytes, output, seen: &seen)
                counter("broadcast_output_reconnects_total", o.reconnects, output, seen: &seen)
                gauge("broadcast_output_backlog_seconds", Double(o.backlogMilliseconds) / 1000, output)
                gauge("broadcast_output_bitrate_bits_per_second", Double(o.bitrate), output)
                gauge("broadcast_output_paused", o.paused ? 1 : 0, output)
                gauge("broadcast_output_up", ["live", "recording"].contains(o.state) && !o.paused ? 1 : 0, output)
                for (reason, count) in o.drops {
                    counter("broadcast_output_dropped_packets_total", count, output + [("reason", reason)], seen: &seen)
                }
                if let r = o.replay {
                    gauge("broadcast_replay_buffered_seconds", r.bufferedSeconds, output)
                    gauge("broadcast_replay_buffered_bytes", Double(r.bufferedBytes), output)
                    gauge("broadcast_replay_saves_done", Double(r.savesDone), output)
                    gauge("broadcast_replay_saves_failed", Double(r.savesFailed), output)
                }
            }
            // Memory: the process's footprint, and of it the replay buffers (room for more figures).
            let memory = BroadcastController.memoryFigures(figures.outputs.compactMap(\.replay))
            gauge("broadcast_resident_bytes", Double(memory.residentBytes))
            gauge("broadcast_replay_buffers_bytes", Double(memory.replayBuffersBytes))
            gauge("broadcast_private_dirty_bytes", Double(memory.privateDirtyBytes))
            gauge("broadcast_memory_budget_bytes", Double(figures.memoryBudgetBytes))
        }
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return buffer
    }
}
