import BroadcastOutputs
import BroadcastService
import Synchronization

/// The page for people at `GET /` of the control API (issue 27): one HTML document, its style
/// sheet and its script, shipped inside the binary (no CDN, nothing fetched at run time). The
/// script follows `/v1/events` with `fetch` (so it can send `Authorization: Bearer` over TCP),
/// draws the status, each output's bitrate over the last minute, the audio meters (`levels`
/// events) and the preview (`/v1/preview.jpg`, twice a second while the tab is visible), and
/// offers the actions the API has. The page, style and script are the only routes answered on
/// TCP without the token: they hold nothing of the daemon's; everything they read needs it.
enum ControlPage {
    /// Served without a token on the TCP listener.
    static let publicPaths: Set<String> = ["/", "/page.js", "/page.css", "/favicon.ico"]

    /// Only the page's own script and style; images from itself and the blobs the script makes of
    /// the preview; requests to itself; no frames, forms or base changes.
    static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; "
        + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    /// Page routes; nil for anything else (the API's routes).
    /// `runsVideo`: whether a broadcast with video runs now (else the preview is 503).
    static func answer(_ request: ControlRequest, preview: PreviewFrames, runsVideo: () -> Bool) -> ControlResponse? {
        if request.path == "/v1/preview.jpg" { return previewAnswer(request, preview: preview, runsVideo: runsVideo) }
        return fileAnswer(request)
    }

    /// The page's own files; nil for any other path.
    static func fileAnswer(_ request: ControlRequest) -> ControlResponse? {
        let read = request.method == "GET" || request.method == "HEAD"
        switch request.path {
        case "/favicon.ico":
            // Asked by every browser: nothing, rather than a 404 in its console.
            return read ? ControlResponse(status: 204, contentType: "image/x-icon", body: []) : .error(405, "use GET")
        case "/", "/page.js", "/page.css":
            guard read else { return .error(405, "\(request.method) is not allowed on \(request.path): use GET") }
            let (type, text) =
                switch request.path {
                case "/page.js": ("text/javascript; charset=utf-8", script)
                case "/page.css": ("text/css; charset=utf-8", style)
                default: ("text/html; charset=utf-8", html)
                }
            var response = ControlResponse(status: 200, contentType: type, body: Array(text.utf8))
            response.headers = [
                "Content-Security-Policy": contentSecurityPolicy,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-cache",
            ]
            return response
        default:
            return nil
        }
    }

    static func previewAnswer(_ request: ControlRequest, preview: PreviewFrames, runsVideo: () -> Bool) -> ControlResponse {
        let read = request.method == "GET" || request.method == "HEAD"
        guard read else { return .error(405, "\(request.method) is not allowed on /v1/preview.jpg: use GET") }
        var width = 640
        if let text = request.query["width"] {
            guard let asked = Int(text), asked >= 16, asked <= 16384 else {
                return .error(400, "invalid width '\(text)': expected pixels from 16 to 16384")
            }
            width = asked
        }
        let noFrame = ControlResponse.error(503, "no video frame to preview: the broadcast is not running or has no video")
        // Asked before and after: a broadcast that stops while the request waits for a frame
        // answers with no picture either.
        guard runsVideo() else { return noFrame }
        let answer = preview.jpeg(width: width)
        guard runsVideo() else { return noFrame }
        switch answer {
        case .jpeg(let bytes):
            var response = ControlResponse(status: 200, contentType: "image/jpeg", body: bytes)
            response.headers = ["Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"]
            return response
        case .noFrame:
            return noFrame
        case .failed(let message):
            return .error(500, "preview: \(message)")
        }
    }
}

/// What the page's event stream gets besides the daemon's events: the audio meters' `levels`
/// (each period, 10 a second) and the whole status once a second (`status`), both transient
/// (no id, not in the history) and only to clients of `/v1/events?levels=1` (the page), while
/// there are any. Runs on the meters' thread (`bc-levels`), never on the session's.
final class PageFeed: Sendable {
    let preview = PreviewFrames()
    let levels: LevelMeters
    private let statusSource: StatusSource

    private final class StatusSource: Sendable {
        let read = Mutex<(@Sendable () -> JSONValue?)?>(nil)
        let ticks = Mutex(0)
        /// The running broadcast's audio track titles, by the meters' track index.
        let titles = Mutex<(@Sendable () -> [String])?>(nil)
    }

    init(events: ControlEvents) {
        let source = StatusSource()
        statusSource = source
        // Room for four output tracks (the mix and a track per source; `EncodingHandler.audioTrackTap`
        // gives each by its index, `audioTrackTitles` names them).
        levels = LevelMeters(trackCount: 4) { levels in
            guard events.transientClientCount > 0 else { return }
            if !levels.isEmpty {
                let titles = source.titles.withLock { $0 }?() ?? []
                events.publishTransient("levels", PageFeed.fields(levels, trackTitles: titles))
            }
            let due = source.ticks.withLock { ticks in
                ticks += 1
                return ticks % 10 == 0
            }
            if due, let status = source.read.withLock({ $0 })?() {
                events.publishTransient("status", [("status", status)])
            }
        }
    }

    /// Starts the meters' thread; `status` is read once a second while anyone follows the events.
    func start(status: @escaping @Sendable () -> JSONValue?) {
        statusSource.read.withLock { $0 = status }
        levels.start()
    }

    func stop() { levels.stop() }

    /// Where the meters' track titles come from, for the broadcast that starts now.
    func setTrackTitles(_ titles: @escaping @Sendable () -> [String]) {
        statusSource.titles.withLock { $0 = titles }
    }

    /// `{"meters": [{"name": "audioMic", "title": "Microphone", "peak_dbfs": -6.0, "rms_dbfs": -9.1},
    /// {"name": "track1", "title": "Mix", ...}, ...]}`: a source's meter by its kind, a track's by
    /// the title its files give it.
    static func fields(_ levels: [LevelMeters.Level], trackTitles: [String] = []) -> [(String, JSONValue)] {
        func rounded(_ v: Double) -> JSONValue { .number((v * 10).rounded() / 10) }
        func title(_ name: String) -> String {
            switch name {
            case "audioMic": return "Microphone"
            case "audioApp": return "Desktop audio"
            default:
                guard name.hasPrefix("track"), let n = Int(name.dropFirst(5)), n >= 1, n <= trackTitles.count else { return name }
                return trackTitles[n - 1] + " (track \(n))"
            }
        }
        return [
            ("meters", .array(levels.map {
                .object([("name", .string($0.name)), ("title", .string(title($0.name))), ("peak_dbfs", rounded($0.peak)), ("rms_dbfs", rounded($0.rms))])
            }))
        ]
    }
}
