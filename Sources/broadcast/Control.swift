import ArgumentParser
import BroadcastService

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
    static let configuration = CommandConfiguration(abstract: "Show a running daemon's status (JSON).")
    @OptionGroup var control: ControlOptions
    func run() throws { try control.call("GET", "/v1/status") }
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
