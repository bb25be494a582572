import BroadcastKit
import BroadcastService
import Metrics
import Prometheus

/// The control API's routes, on top of `BroadcastController`.
enum ControlAPI {
    static func handle(_ request: ControlRequest, controller: BroadcastController, metrics: DaemonMetrics) -> ControlResponse {
        switch (request.method, request.path) {
        case ("GET", "/v1/status"), ("HEAD", "/v1/status"):
            return .json(200, controller.status())
        case ("GET", "/metrics"):
            return ControlResponse(status: 200, contentType: "text/plain; version=0.0.4", body: metrics.render(controller.status()))
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
        case (_, let path) where path.hasPrefix("/v1/broadcast/") || path.hasPrefix("/v1/outputs/") || path == "/v1/replay/save":
            return .error(405, "\(request.method) is not allowed on \(path): use POST")
        default:
            return .error(404, "no such endpoint: \(request.path) (see /v1/status, /v1/broadcast/{start,pause,resume,stop}, /v1/outputs/{name}/{pause,resume,save}, /v1/replay/save, /metrics)")
        }
    }
}

/// Prometheus metrics through swift-metrics: the process's MetricsSystem is bootstrapped with a
/// Prometheus factory over one registry, so anything recorded with swift-metrics (ours or a
/// library's) is exported at /metrics. The broadcast's figures are refreshed from the status at
/// each scrape: nothing on the data path records metrics.
final class DaemonMetrics: Sendable {
    private let registry: PrometheusCollectorRegistry
    private let media = Metrics.Gauge(label: "broadcast_media_seconds")
    private let frames = Metrics.Gauge(label: "broadcast_video_frames_encoded")
    private let bytes = Metrics.Gauge(label: "broadcast_bytes_written")
    private let bitrate = Metrics.Gauge(label: "broadcast_bitrate_bits_per_second")
    private let uptime = Metrics.Gauge(label: "broadcast_uptime_seconds")
    private let failedOutputs = Metrics.Gauge(label: "broadcast_failed_outputs")
    private let running = Metrics.Gauge(label: "broadcast_running")
    private let paused = Metrics.Gauge(label: "broadcast_paused")

    /// Call once, before any metric is made.
    static func bootstrap() -> DaemonMetrics {
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        return DaemonMetrics(registry: registry)
    }

    private init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
    }

    func render(_ status: JSONValue) -> [UInt8] {
        guard case .object(let fields) = status else { return [] }
        func number(_ key: String) -> Double {
            if case .number(let x)? = fields.first(where: { $0.0 == key })?.1 { return x }
            return 0
        }
        var state = ""
        if case .string(let s)? = fields.first(where: { $0.0 == "state" })?.1 { state = s }
        media.record(number("media_seconds"))
        frames.record(number("video_frames_encoded"))
        bytes.record(number("bytes_written"))
        bitrate.record(number("bitrate"))
        uptime.record(number("uptime_seconds"))
        failedOutputs.record(number("failed_outputs"))
        running.record(state == "started" || state == "paused" ? 1.0 : 0.0)
        paused.record(state == "paused" ? 1.0 : 0.0)
        ReplayAPI.recordMetrics(fields)
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return buffer
    }
}
