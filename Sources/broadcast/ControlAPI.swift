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
        case (_, "/v1/status"), (_, "/metrics"):
            return .error(405, "\(request.method) is not allowed on \(request.path): use GET")
        case (_, let path) where path.hasPrefix("/v1/broadcast/"):
            return .error(405, "\(request.method) is not allowed on \(path): use POST")
        default:
            return .error(404, "no such endpoint: \(request.path) (see /v1/status, /v1/broadcast/{start,pause,resume,stop}, /metrics)")
        }
    }
}

/// Prometheus metrics through swift-metrics, refreshed from the status at each scrape.
final class DaemonMetrics: Sendable {
    private let registry = PrometheusCollectorRegistry()
    private let media: Prometheus.Gauge
    private let frames: Prometheus.Gauge
    private let bytes: Prometheus.Gauge
    private let bitrate: Prometheus.Gauge
    private let uptime: Prometheus.Gauge
    private let failedOutputs: Prometheus.Gauge
    private let running: Prometheus.Gauge
    private let paused: Prometheus.Gauge

    init() {
        media = registry.makeGauge(name: "broadcast_media_seconds", help: "Media time delivered in the current broadcast.")
        frames = registry.makeGauge(name: "broadcast_video_frames_encoded", help: "Video frames encoded in the current broadcast.")
        bytes = registry.makeGauge(name: "broadcast_bytes_written", help: "Bytes written to all recordings.")
        bitrate = registry.makeGauge(name: "broadcast_bitrate_bits_per_second", help: "Encoded bitrate over the last second.")
        uptime = registry.makeGauge(name: "broadcast_uptime_seconds", help: "Seconds since the daemon started.")
        failedOutputs = registry.makeGauge(name: "broadcast_failed_outputs", help: "Outputs that failed while the others went on.")
        running = registry.makeGauge(name: "broadcast_running", help: "1 while a broadcast is running (started or paused).")
        paused = registry.makeGauge(name: "broadcast_paused", help: "1 while the broadcast is paused.")
    }

    func render(_ status: JSONValue) -> [UInt8] {
        guard case .object(let fields) = status else { return [] }
        func number(_ key: String) -> Double {
            if case .number(let x)? = fields.first(where: { $0.0 == key })?.1 { return x }
            return 0
        }
        var state = ""
        if case .string(let s)? = fields.first(where: { $0.0 == "state" })?.1 { state = s }
        media.set(number("media_seconds"))
        frames.set(number("video_frames_encoded"))
        bytes.set(number("bytes_written"))
        bitrate.set(number("bitrate"))
        uptime.set(number("uptime_seconds"))
        failedOutputs.set(number("failed_outputs"))
        running.set(state == "started" || state == "paused" ? 1.0 : 0.0)
        paused.set(state == "paused" ? 1.0 : 0.0)
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return buffer
    }
}
