import ArgumentParser
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
        let (status, body) = try ControlClient(socketPath: socket).send(method: method, path: path)
        let text = String(decoding: body, as: UTF8.self)
        if status >= 400 {
            FileStandardError.write("broadcast: the daemon refused: \(text)")
            throw ExitCode.failure
        }
        print(text, terminator: text.hasSuffix("\n") ? "" : "\n")
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show a running daemon's status (JSON), or follow it live with --watch.",
        discussion: """
            --watch follows the daemon's events (GET /v1/events): on a terminal a compact view \
            redrawn at each change; otherwise, or with --json, one JSON line per event \
            ({"id":..,"event":..,"time":.., ...}). A dropped or broken stream is resumed from \
            the last event seen (Last-Event-ID); it ends when the daemon stops.
            """
    )
    @OptionGroup var control: ControlOptions
    @Flag(help: "Follow the daemon's state as it changes.")
    var watch = false
    @Flag(help: "With --watch: one JSON line per event, even on a terminal.")
    var json = false

    func run() throws {
        guard watch else { return try control.call("GET", "/v1/status") }
        let client = ControlClient(socketPath: control.socket)
        let redraw = !json && isatty(1) != 0
        var view = WatchView()
        var lastID: UInt64?
        var reconnects = 0
        func handle(_ event: ControlClient.Event) -> Bool {
            if let id = event.id { lastID = id }
            if event.type == "dropped" { return false }
            let data = JSONValue.parse(event.data) ?? .object([])
            if redraw {
                view.apply(event.type, data)
                print("\u{1B}[H\u{1B}[2J" + view.render(), terminator: "")
            } else {
                var fields: [(String, JSONValue)] = [("id", event.id.map { .number(Double($0)) } ?? .null), ("event", .string(event.type))]
                if case .object(let members) = data { fields += members }
                print(JSONValue.object(fields).serialized())
            }
            fflush(nil)
            return true
        }
        while true {
            let status: Int
            do {
                status = try client.events(lastEventID: lastID, handle)
            } catch {
                // Gone after we followed it: the daemon stopped. Before: it is not there.
                if lastID != nil { return }
                throw error
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

/// `status --watch`'s compact view: the broadcast's state, each output's, the devices and the
/// last file finished, from the first `state` event and the changes after it.
struct WatchView {
    var broadcast = "idle"
    var outputs: [(name: String, state: String)] = []
    var devices: [String: String] = [:]
    var lastFile: String?
    var lastEvent = ""
    var time = ""

    mutating func apply(_ type: String, _ data: JSONValue) {
        time = data["time"]?.stringValue ?? time
        switch type {
        case "state":
            let status = data["status"] ?? .object([])
            broadcast = status["state"]?.stringValue ?? broadcast
            if case .array(let items)? = status["outputs"] {
                outputs = items.compactMap { item in
                    guard let name = item["name"]?.stringValue else { return nil }
                    let paused = item["paused"] == .bool(true)
                    return (name, paused ? "paused" : item["state"]?.stringValue ?? "?")
                }
            }
            if case .object(let types)? = status["types"] {
                for (type, fields) in types { devices[type] = fields["source_state"]?.stringValue ?? "capturing" }
            }
            lastEvent = "connected"
        case "broadcast":
            let state = data["state"]?.stringValue ?? "?"
            broadcast = state == "resumed" ? "started" : state
            lastEvent = "broadcast \(state)"
        case "output":
            let name = data["name"]?.stringValue ?? "?"
            let state = data["state"]?.stringValue ?? "?"
            if let i = outputs.firstIndex(where: { $0.name == name }) { outputs[i].state = state } else { outputs.append((name, state)) }
            lastEvent = "\(name) \(state)"
        case "device":
            let type = data["type"]?.stringValue ?? "?"
            let state = data["state"]?.stringValue ?? "?"
            devices[type] = state == "lost" ? "device-lost" : "capturing"
            lastEvent = "\(type) device \(state)"
        case "file":
            lastFile = data["path"]?.stringValue
            lastEvent = "\(data["output"]?.stringValue ?? "?") finished a file"
        case "reload":
            let result = data["result"]?.stringValue ?? "?"
            lastEvent = "config reload (\(data["trigger"]?.stringValue ?? "?")): \(result)"
                + (result == "refused" ? ": \(data["message"]?.stringValue ?? "")" : "")
        default:
            lastEvent = type
        }
    }

    func render() -> String {
        var lines = ["broadcast  \(broadcast)"]
        let width = outputs.map(\.name.count).max() ?? 0
        for output in outputs {
            lines.append("  \(output.name)\(String(repeating: " ", count: width - output.name.count))  \(output.state)")
        }
        if !devices.isEmpty {
            lines.append("devices    " + devices.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        }
        if let lastFile { lines.append("last file  \(lastFile)") }
        lines.append("\(time)  \(lastEvent)")
        return lines.joined(separator: "\n") + "\n"
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
    func run() throws { try control.call("POST", output.map { "/v1/outputs/\(pathSegment($0))/pause" } ?? "/v1/broadcast/pause") }
}

struct Resume: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Resume a paused broadcast, or one paused output.")
    @OptionGroup var control: ControlOptions
    @Option(help: ArgumentHelp("Resume only this output.", valueName: "name"))
    var output: String?
    func run() throws { try control.call("POST", output.map { "/v1/outputs/\(pathSegment($0))/resume" } ?? "/v1/broadcast/resume") }
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
            reload (restart needed). A config with an error is \
            refused with its file:line and key (exit 1) and the broadcast goes on as it was.
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

/// `text` as one URL path segment: everything but RFC 3986's unreserved characters %-escaped, so a
/// name typed with a space or a '%' reaches the daemon as that name (and is answered as one).
func pathSegment(_ text: String) -> String {
    var segment = ""
    for byte in text.utf8 {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
            segment.unicodeScalars.append(Unicode.Scalar(byte))
        default:
            let hex = String(byte, radix: 16, uppercase: true)
            segment += byte < 16 ? "%0\(hex)" : "%\(hex)"
        }
    }
    return segment
}
