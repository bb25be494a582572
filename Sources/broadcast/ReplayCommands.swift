import ArgumentParser
import BroadcastKit
import BroadcastOutputs
import BroadcastService
import Logging

/// --replay for record and stream: a replay buffer beside the other outputs, saved by SIGUSR2.
struct ReplayOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Also keep a replay buffer of the last DURATION (30s, 5m) plus the rest of the keyframe interval it starts in; SIGUSR2 saves it to a file.", valueName: "duration"))
    var replay: String?

    @Option(name: .customLong("replay-max-memory"), help: ArgumentHelp("The most the replay buffer may hold (200M, 1G; default 256M); the oldest keyframe interval goes first.", valueName: "size"))
    var replayMaxMemory: String?

    @Option(name: .customLong("replay-path"), help: ArgumentHelp("Where saves go, a strftime(3) template (default: replay-%Y-%m-%d_%H-%M-%S with the recording's directory and extension, else .mp4 here).", valueName: "template"))
    var replayPath: String?

    /// The replay output these options ask for, nil without --replay. `beside` is the recording's
    /// path, whose directory and extension a save takes by default.
    func output(beside recording: String?) throws -> OutputConfiguration? {
        guard let replay else {
            if replayMaxMemory != nil || replayPath != nil {
                throw ValueError("--replay-max-memory and --replay-path need --replay DURATION")
            }
            return nil
        }
        let length = try Values.duration(replay, option: "--replay")
        guard let nanoseconds = length.nanoseconds, nanoseconds <= 86_400_000_000_000 else {
            throw ValueError("invalid --replay '\(replay)': at most 24h")
        }
        var settings = ReplaySettings(seconds: Double(nanoseconds) / 1e9)
        if let text = replayMaxMemory {
            settings.maxBytes = try Values.replayMaxMemory(text, option: "--replay-max-memory")
        }
        let template = replayPath ?? Self.defaultTemplate(beside: recording)
        do {
            _ = try Recording.container(for: template)
        } catch {
            throw ValueError("invalid --replay-path '\(template)': \(error.message)")
        }
        return OutputConfiguration(name: "replay", destination: .file(template), replay: settings)
    }

    static func defaultTemplate(beside recording: String?) -> String {
        let name = "replay-%Y-%m-%d_%H-%M-%S"
        guard let recording, let container = try? Recording.container(for: recording), container != .flv, container != .ts else {
            return "\(name).mp4"
        }
        guard let slash = recording.lastIndex(of: "/") else { return "\(name).\(container.rawValue)" }
        return "\(recording[...slash])\(name).\(container.rawValue)"
    }
}

/// SIGUSR2 in record and stream: every replay output saves what it holds.
func saveReplays(_ outputs: [Output], logger: Logger) {
    let replays = outputs.filter(\.isReplay)
    guard !replays.isEmpty else {
        logger.notice("SIGUSR2 ignored: no replay buffer (--replay)")
        return
    }
    for output in replays {
        _ = output.saveReplay()
        logger.notice("SIGUSR2: saving the replay buffer of \(output.name)")
    }
}

struct Replay: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Save a running daemon's replay buffer.",
        subcommands: [ReplaySaveCommand.self]
    )
}

struct ReplaySaveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "save",
        abstract: "Save the last seconds a daemon's replay output holds to a file; prints its path.",
        discussion: """
            The file holds everything up to the moment of the request (the daemon waits for what \
            was captured before it), starts on a keyframe with audio cut to the same instant, \
            and is complete when this returns. Exit status 1 when nothing could be saved \
            (nothing buffered yet, a write error).

            As the command of a desktop keyboard shortcut:
              broadcast replay save --socket /run/broadcast/control.sock
            """
    )
    @OptionGroup var control: ControlOptions
    @Option(help: ArgumentHelp("The replay output (a name from the config's [[output]]); needed when there are several.", valueName: "name"))
    var name: String?
    @Option(help: ArgumentHelp("Save only the last N seconds (default: the whole buffer).", valueName: "n"))
    var seconds: String?

    func run() throws {
        var query = ""
        if let seconds {
            let value = try Values.duration(seconds, option: "--seconds")
            query = "?seconds=\(Double(value.nanoseconds ?? 0) / 1e9)"
        }
        let path = name.map { "/v1/outputs/\($0.percentEncoded())/save" } ?? "/v1/replay/save"
        let (status, body) = try ControlClient(socketPath: control.socket).send(method: "POST", path: path + query)
        let text = String(decoding: body, as: UTF8.self)
        guard status < 300 else {
            FileStandardError.write("broadcast: replay not saved: \(Self.errorText(text))\n")
            throw ExitCode.failure
        }
        print(text, terminator: text.hasSuffix("\n") ? "" : "\n")
    }

    /// The "error" field of the daemon's JSON answer, or the answer as it came.
    static func errorText(_ json: String) -> String {
        guard let range = json.firstRange(of: "\"error\":\"") else { return json }
        var out = ""
        var escaped = false
        for c in json[range.upperBound...] {
            if escaped {
                out.append(c == "n" ? "\n" : c)
                escaped = false
            } else if c == "\\" {
                escaped = true
            } else if c == "\"" {
                break
            } else {
                out.append(c)
            }
        }
        return out
    }
}
