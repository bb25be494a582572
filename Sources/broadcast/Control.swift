import ArgumentParser
import Atomics
import BroadcastDaemon
import BroadcastKit
import BroadcastService

#if canImport(Glibc)
import Glibc
#endif

/// Options shared by the verbs that talk to a running daemon.
struct ControlOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The daemon's control socket.", valueName: "path"))
    var socket: String = "/run/broadcast/control.sock"

    /// Sends one request, prints the answer; a refusal (4xx/5xx) exits 1 with the daemon's message.
    func call(_ method: String, _ path: String) throws {
        let text = try answer(ControlClient(socketPath: socket), method, path)
        print(text, terminator: text.hasSuffix("\n") ? "" : "\n")
    }
}

/// The daemon's answer to one request; a refusal (4xx/5xx) is the command's error (exit 1, the
/// daemon's message).
func answer(_ client: ControlClient, _ method: String, _ path: String) throws -> String {
    let (status, body) = try client.send(method: method, path: path)
    let text = String(decoding: body, as: UTF8.self)
    if status >= 400 { throw refused(text) }
    return text
}

/// Says the daemon's refusal; the command exits 1.
func refused(_ text: String) -> ExitCode {
    FileStandardError.write("broadcast: the daemon refused: \(text)")
    return ExitCode.failure
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show a running daemon's status, or follow it live with --watch.",
        discussion: """
            On a terminal: a summary to read (the broadcast's state, uptime, media time, fps and \
            bitrate; memory against the budget; each source's state and drops; each output's \
            kind, state, bitrate, backlog, drops, reconnects and target, stream keys masked; \
            replay buffers; the last error). When standard output is not a terminal, or with \
            --json, the status document as JSON (GET /v1/status), so scripts keep working.

            --watch: on a terminal the same summary, its figures refreshed every second and at \
            every event, the last events listed below it. Otherwise, or with --json, one JSON \
            line per event ({"id":..,"event":..,"time":.., ...}). A dropped or broken stream is \
            resumed from the last event seen (Last-Event-ID); it ends when the daemon stops.
            """
    )
    @OptionGroup var control: ControlOptions
    @Flag(help: "Follow the daemon's state as it changes.")
    var watch = false
    @Flag(help: "JSON even on a terminal: the status document, or with --watch one line per event.")
    var json = false

    func run() throws {
        let forPeople = !json && isatty(1) != 0
        guard watch else {
            guard forPeople else { return try control.call("GET", "/v1/status") }
            print(StatusSummary(width: terminalColumns()).render(try fetchStatus(ControlClient(socketPath: control.socket))), terminator: "")
            return
        }
        let client = ControlClient(socketPath: control.socket)
        let view: LiveStatusView? = forPeople ? try LiveStatusView(client: client) : nil
        defer { view?.end() }
        var lastID: UInt64?
        var reconnects = 0
        func handle(_ event: ControlClient.Event) -> Bool {
            if let id = event.id { lastID = id }
            if event.type == "dropped" { return false }
            let data = JSONValue.parse(event.data) ?? .object([])
            if let view {
                view.add(StatusSummary.describe(event.type, data))
            } else {
                var fields: [(String, JSONValue)] = [("id", event.id.map { .number(Double($0)) } ?? .null), ("event", .string(event.type))]
                if case .object(let members) = data { fields += members }
                print(JSONValue.object(fields).serialized())
                fflush(nil)
            }
            return true
        }
        // The last stream was cut short (not ended by the daemon): if the daemon is not there to
        // resume it, it went away without stopping (killed, crashed).
        var cut = false
        while true {
            let status: Int
            do {
                status = try client.events(lastEventID: lastID, handle)
                cut = false
            } catch {
                // Gone after we followed it: the daemon stopped. Before: it is not there.
                guard lastID != nil else { throw error }
                if error.code == ControlClient.streamCut {
                    cut = true
                    usleep(100_000)
                    continue
                }
                guard cut else { return }
                view?.end()
                FileStandardError.write("broadcast: the daemon went away without stopping (its event stream was cut off and \(control.socket) no longer answers): what is shown above is its last known state\n")
                throw ExitCode.failure
            }
            if status != 200 {
                FileStandardError.write("broadcast: the daemon refused the event stream (HTTP \(status))\n")
                throw ExitCode.failure
            }
            // The stream ended: the daemon stopped (no socket any more) or dropped us (resume).
            reconnects += 1
            usleep(reconnects < 3 ? 100_000 : 1_000_000)
        }
    }
}

/// The daemon's status document, or the daemon's refusal as the command's error.
func fetchStatus(_ client: ControlClient) throws -> JSONValue {
    let text = try answer(client, "GET", "/v1/status")
    guard let document = JSONValue.parse(text) else { throw refused(text) }
    return document
}

/// The terminal's width (TIOCGWINSZ), else $COLUMNS, else 80.
func terminalColumns() -> Int {
    var size = winsize()
    if ioctl(1, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0 { return Int(size.ws_col) }
    return Int(getenv("COLUMNS").map { String(cString: $0) } ?? "") ?? 80
}

/// `status --watch` on a terminal: the summary redrawn every second with fresh figures and at
/// once when an event arrives, the last events below it. The event stream's thread hands each
/// event's line over through a single-producer ring and a wake-up (no lock); the view's own thread
/// fetches the status and draws.
final class LiveStatusView: Sendable {
    static let eventsShown = 6
    private let events = SPSCRing<String>(capacity: 256)
    private let wakeup: Wakeup
    private let stopping = ManagedAtomic<Bool>(false)
    private let thread: OSThread

    init(client: ControlClient) throws {
        wakeup = try Wakeup()
        // The first draw here, so a daemon that is not there is the command's error at once.
        let first = try fetchStatus(client)
        let summary = StatusSummary(width: terminalColumns())
        Self.draw(summary.render(first))
        let (events, wakeup, stopping) = (events, wakeup, stopping)
        thread = OSThread(name: "bc-status-view") {
            var recent: [String] = []
            var status = first
            while !stopping.load(ordering: .acquiring) {
                wakeup.prepareToSleep()
                if events.isEmpty { _ = wakeup.sleep(timeout: .seconds(1)) } else { wakeup.cancelSleep() }
                _ = wakeup.drain()
                while let line = events.pop() { recent.append(line) }
                if recent.count > Self.eventsShown { recent.removeFirst(recent.count - Self.eventsShown) }
                if stopping.load(ordering: .acquiring) { break }
                // A daemon that went away keeps its last figures on screen; the stream's end ends us.
                if let fresh = try? fetchStatus(client) { status = fresh }
                Self.draw(StatusSummary(width: terminalColumns()).render(status, events: recent))
            }
        }
    }

    /// Called on the event stream's thread.
    func add(_ line: String) {
        if events.push(line) { wakeup.wake() }
    }

    func end() {
        stopping.store(true, ordering: .releasing)
        wakeup.wake()
        thread.join()
    }

    private static func draw(_ text: String) {
        print("\u{1B}[H\u{1B}[2J" + text, terminator: "")
        fflush(nil)
    }
}

struct Pause: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Pause a running daemon's broadcast (media time stands still, files get no gap), or one output.",
        discussion: "With --output NAME only that output pauses (say the recording) while the others go on (say the stream)."
    )
    @OptionGroup var control: ControlOptions
    @Option(help: ArgumentHelp("Pause only this output (a name from the config's [[output]]).", valueName: "name"))
    var output: String?
    func run() throws { try control.call("POST", output.map { "/v1/outputs/\($0.percentEncoded())/pause" } ?? "/v1/broadcast/pause") }
}

struct Resume: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Resume a paused broadcast, or one paused output.")
    @OptionGroup var control: ControlOptions
    @Option(help: ArgumentHelp("Resume only this output.", valueName: "name"))
    var output: String?
    func run() throws { try control.call("POST", output.map { "/v1/outputs/\($0.percentEncoded())/resume" } ?? "/v1/broadcast/resume") }
}

/// `mic` or `app`, the audio sources `mute`/`unmute` name; anything else is exit 2.
struct AudioSourceArgument: ParsableArguments {
    @Argument(help: ArgumentHelp("mic (the microphone) or app (the application audio).", valueName: "source"))
    var source: String

    func validate() throws {
        guard source == "mic" || source == "app" else {
            throw ValidationError("invalid source '\(source)': accepted are mic and app")
        }
    }
}

struct Mute: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mute a running daemon's microphone or application audio (its track and its part of the mix).",
        discussion: "Applies from the source's next audio period; the audio stays on the timeline as silence. An 'audio' event says so."
    )
    @OptionGroup var control: ControlOptions
    @OptionGroup var audio: AudioSourceArgument
    func run() throws { try control.call("POST", "/v1/audio/\(audio.source)/mute") }
}

struct Unmute: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Unmute a muted audio source (mic or app) of a running daemon.")
    @OptionGroup var control: ControlOptions
    @OptionGroup var audio: AudioSourceArgument
    func run() throws { try control.call("POST", "/v1/audio/\(audio.source)/unmute") }
}

struct Offset: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Move a running daemon's microphone, application audio or picture in time (a sync offset).",
        discussion: """
            broadcast offset mic 200ms plays the microphone 200 ms later than captured (for a late \
            picture), broadcast offset video -0.1s shows the picture 100 ms earlier; -2s to +2s, 0 \
            undoes it. Applies from the source's next buffer: the audio track stays continuous (a \
            longer delay is filled with silence, a shorter one drops the samples it overlaps), video \
            frames that would go back in time are left out. Lasts until the broadcast stops; the \
            config's [audio] mic_offset, app_offset and [video] offset are the start's.
            """
    )
    @OptionGroup var control: ControlOptions
    @Argument(help: ArgumentHelp("mic, app or video.", valueName: "source"))
    var source: String
    @Argument(parsing: .allUnrecognized, help: ArgumentHelp("The offset: 200ms, -0.15s, 0 (from -2s to +2s).", valueName: "offset"))
    var value: [String] = []

    func validate() throws {
        guard ["mic", "app", "video"].contains(source) else {
            throw ValidationError("invalid source '\(source)': accepted are mic, app and video")
        }
        guard value.count == 1 else { throw ValidationError("expected one offset, such as 200ms, -0.15s or 0") }
        let spec = source == "video" ? Options.videoOffset : source == "app" ? Options.appOffset : Options.micOffset
        do {
            _ = try spec.parse(value[0])
        } catch {
            throw ValidationError(error.description.replacing("invalid \(spec.name.flag) ", with: "invalid \(source) offset ", maxReplacements: 1))
        }
    }

    func run() throws {
        let path = source == "video" ? "/v1/video/offset" : "/v1/audio/\(source)/offset"
        try control.call("POST", "\(path)?value=\(value[0].percentEncoded())")
    }
}

struct Stop: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Stop a running daemon's broadcast (files are finalized; the daemon stays up).")
    @OptionGroup var control: ControlOptions
    func run() throws { try control.call("POST", "/v1/broadcast/stop") }
}

struct Reload: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make a running daemon re-read its config, and say what it did.",
        discussion: """
            The same as SIGHUP (systemctl reload), but answered: outputs added, removed or changed \
            apply at once (an unchanged recording goes on in the same file), a changed device is \
            swapped alone, encoder settings wait for the next start; a new control token applies \
            at once (the old one is refused), a changed control socket or TCP address refuses the \
            reload (restart needed). The answer (JSON) says per output and source what happened \
            ("complete": false when something did not apply; an output whose new settings cannot \
            start goes on with its old ones, "kept"). A config with an error is refused with its \
            file:line and key (exit 1) and the broadcast goes on as it was.
            """
    )
    @OptionGroup var control: ControlOptions
    func run() throws { try control.call("POST", "/v1/reload") }
}

struct Start: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Start the broadcast of a running daemon again.")
    @OptionGroup var control: ControlOptions
    func run() throws { try control.call("POST", "/v1/broadcast/start") }
}
