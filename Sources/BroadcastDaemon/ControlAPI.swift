import BroadcastKit
import BroadcastComposition
import BroadcastMedia
import BroadcastOutputs
import BroadcastService
import Synchronization

/// The control API's routes, on top of `BroadcastController`.
enum ControlAPI {
    /// `key`'s number in a JSON object `body`, as text for the option's parser; nil when absent.
    static func jsonNumberText(_ body: [UInt8], key: String) -> String? {
        guard !body.isEmpty, let json = JSONValue.parse(String(decoding: body, as: UTF8.self)) else { return nil }
        return json[key]?.numberValue.map { "\($0)" } ?? json[key]?.stringValue
    }

    static func handle(
        _ request: ControlRequest, controller: BroadcastController, metrics: DaemonMetrics, reload: () -> ReloadOutcome
    ) -> ControlResponse {
        if let page = ControlPage.answer(request, preview: controller.page.preview, runsVideo: { controller.runsVideo }) { return page }
        switch (request.method, request.path) {
        case ("GET", "/v1/status"), ("HEAD", "/v1/status"):
            return .json(200, controller.status())
        case ("GET", "/metrics"), ("HEAD", "/metrics"):
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
        case ("POST", "/v1/marker"):
            return MarkerAPI.mark(request: request, controller: controller)
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
        case ("POST", let path) where path.hasPrefix("/v1/scene/"):
            return DaemonScenes.select(String(path.dropFirst("/v1/scene/".count)), controller: controller)
        case ("POST", "/v1/video/offset"):
            return Self.setOffset("video", request, controller: controller)
        case ("POST", let path) where path.hasPrefix("/v1/audio/") && path.hasSuffix("/offset"):
            // /v1/audio/{mic|app}/offset?value=200ms
            let parts = path.dropFirst("/v1/audio/".count).split(separator: "/", omittingEmptySubsequences: false)
            guard parts.count == 2 else { return .error(400, "unknown audio action '\(path)': use /v1/audio/{mic|app}/offset?value=200ms") }
            return Self.setOffset(String(parts[0]), request, controller: controller)
        case ("POST", let path) where path.hasPrefix("/v1/audio/"):
            // /v1/audio/{mic|app}/{mute|unmute}, /v1/audio/{mic|app}/volume?db=-6 (or {"volume_db": -6})
            let parts = path.dropFirst("/v1/audio/".count).split(separator: "/", omittingEmptySubsequences: false)
            guard parts.count == 2, ["mute", "unmute", "volume"].contains(parts[1]) else {
                return .error(400, "unknown audio action '\(path)': use /v1/audio/{mic|app}/{mute|unmute|volume|offset}")
            }
            return Self.applying(controller) {
                if parts[1] == "volume" {
                    guard let text = Self.signedQueryValue(request, "db") ?? Self.jsonNumberText(request.body, key: "volume_db") else {
                        return .error(400, "POST /v1/audio/\(parts[0])/volume needs the volume: ?db=-6 or {\"volume_db\": -6} (-60 to +20 dB)")
                    }
                    let decibels: Double
                    do {
                        decibels = try Options.micVolume.parse(text)
                    } catch {
                        return .error(400, "invalid volume '\(text)': expected decibels from -60 to +20, such as -6")
                    }
                    try controller.setAudio(String(parts[0]), volume: decibels)
                } else {
                    try controller.setAudio(String(parts[0]), muted: parts[1] == "mute")
                }
                return nil
            }
        case (_, "/v1/status"), (_, "/metrics"):
            return .error(405, "\(request.method) is not allowed on \(request.path): use GET")
        case (_, let path) where path.hasPrefix("/v1/broadcast/") || path.hasPrefix("/v1/outputs/") || path.hasPrefix("/v1/audio/") || path.hasPrefix("/v1/scene/") || path == "/v1/replay/save" || path == "/v1/reload" || path == "/v1/marker" || path == "/v1/video/offset":
            return .error(405, "\(request.method) is not allowed on \(path): use POST")
        default:
            return .error(404, "no such endpoint: \(request.path) (see / for the page, /v1/status, /v1/events, /v1/preview.jpg, /v1/broadcast/{start,pause,resume,stop}, /v1/outputs/{name}/{pause,resume,save}, /v1/replay/save, /v1/marker, /v1/audio/{mic,app}/{mute,unmute,volume,offset}, /v1/video/offset, /v1/scene/{name}, /v1/reload, /metrics)")
        }
    }

    /// `POST /v1/audio/{mic|app}/offset?value=200ms`, `POST /v1/video/offset?value=-0.1s` (or the
    /// value as the body): the source's sync offset from its next buffer; 400 with the range for a
    /// bad value.
    static func setOffset(_ source: String, _ request: ControlRequest, controller: BroadcastController) -> ControlResponse {
        // An unescaped '+' in a query is a space: "?value=+200ms" means +200ms. Without a query,
        // the body (plain text: "200ms") is the value.
        let body = String(decoding: request.body, as: UTF8.self).filter { !$0.isWhitespace }
        guard let value = signedQueryValue(request, "value") ?? (body.isEmpty ? nil : body) else {
            return .error(400, "missing ?value=: the \(source) offset from -2s to +2s, such as ?value=200ms, ?value=-0.15s or ?value=0")
        }
        return applying(controller) {
            try controller.setOffset(source, value)
            return nil
        }
    }

    /// A query value that may be signed: an unescaped '+' arrives as a space ("?db=+6" is +6).
    static func signedQueryValue(_ request: ControlRequest, _ key: String) -> String? {
        request.query[key].map { $0.hasPrefix(" ") ? "+" + $0.dropFirst() : $0 }
    }

    /// Runs a change of the running broadcast's sources: its own answer when it gives one, else the
    /// status; a refusal is 409 when no broadcast runs, 400 otherwise.
    static func applying(_ controller: BroadcastController, _ change: () throws -> ControlResponse?) -> ControlResponse {
        do {
            if let answer = try change() { return answer }
        } catch let error as BroadcastError {
            return .error(error.code == .illegalTransition ? 409 : 400, error.message)
        } catch {
            return .error(400, "\(error)")
        }
        return .json(200, controller.status())
    }
}
