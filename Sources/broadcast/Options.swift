import ArgumentParser
import BroadcastCapture
import BroadcastKit
import Logging

/// Where media comes from: shared by every command that captures.
struct SourceOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("Video source: 'test' (built-in pattern) or 'none'.", valueName: "source"))
    var video: String = "test"

    @Option(name: .customLong("audio-mic"), help: ArgumentHelp("Microphone audio (.audioMic): 'test' (built-in tone) or 'none'.", valueName: "source"))
    var audioMic: String = "test"

    @Option(name: .customLong("audio-app"), help: ArgumentHelp("Application audio (.audioApp): 'test' or 'none'.", valueName: "source"))
    var audioApp: String = "none"

    @Option(help: ArgumentHelp("Video size, WIDTHxHEIGHT (even numbers).", valueName: "WxH"))
    var size: String = "1280x720"

    @Option(help: ArgumentHelp("Frames per second: 30, 29.97 or 30000/1001.", valueName: "rate"))
    var fps: String = "30"

    @Flag(name: .customLong("no-realtime"), help: "Test sources run as fast as the pipeline takes them, not at clock speed (needs --duration).")
    var noRealtime = false

    @Option(name: .customLong("setup"), help: ArgumentHelp("A KEY=VALUE for the handler's setup info; repeatable.", valueName: "key=value"))
    var setup: [String] = []

    func videoSize() throws -> (width: Int, height: Int) { try Values.size(size) }
    func frameRate() throws -> (numerator: Int, denominator: Int) { try Values.frameRate(fps) }

    func setupInfo() throws -> SetupInfo {
        var info = SetupInfo()
        for pair in setup {
            let (k, v) = try Values.setupPair(pair)
            info[k] = v
        }
        return info
    }

    /// The capture sources these options name, one per buffer type.
    func makeSources() throws -> [(type: SampleBufferType, source: any CaptureSource)] {
        let (width, height) = try videoSize()
        let rate = try frameRate()
        var sources: [(type: SampleBufferType, source: any CaptureSource)] = []
        switch video {
        case "test":
            sources.append((.video, TestPatternSource(width: width, height: height, frameRate: rate, realtime: !noRealtime)))
        case let spec where spec.hasPrefix("test:stall-after="):
            // A capture that hangs after a while, as a wedged device does (for watchdog tests).
            let after = try Values.duration(String(spec.dropFirst("test:stall-after=".count)), option: "--video test:stall-after")
            sources.append((.video, TestPatternSource(width: width, height: height, frameRate: rate, realtime: !noRealtime, stallAfter: after)))
        case "none":
            break
        default:
            throw ValueError(
                "unsupported --video '\(video)': accepted are 'test' and 'none' (V4L2 devices are not supported yet)"
            )
        }
        for (type, value, option) in [(SampleBufferType.audioMic, audioMic, "--audio-mic"), (.audioApp, audioApp, "--audio-app")] {
            switch value {
            case "test":
                sources.append((type, ToneSource(realtime: !noRealtime)))
            case "none":
                break
            default:
                throw ValueError(
                    "unsupported \(option) '\(value)': accepted are 'test' and 'none' (ALSA devices are not supported yet)"
                )
            }
        }
        if sources.isEmpty {
            throw ValueError("nothing to capture: --video, --audio-mic and --audio-app are all 'none'")
        }
        return sources
    }
}

/// How long to run and how much to say.
struct RunOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Stop after this much media time: 10s, 500ms, 2m, 1h30m, 01:30 (default: until SIGINT/SIGTERM).", valueName: "duration"))
    var duration: String?

    @Flag(name: .shortAndLong, help: "Print no status line or progress.")
    var quiet = false

    @Option(name: .customLong("log-level"), help: ArgumentHelp("trace, debug, info, notice, warning, error or critical.", valueName: "level"))
    var logLevel: String = "info"

    func mediaDuration() throws -> MediaTime? {
        try duration.map { try Values.duration($0, option: "--duration") }
    }

    func level() throws -> Logger.Level {
        guard let level = Logger.Level(rawValue: logLevel.lowercased()) else {
            throw ValueError(
                "invalid --log-level '\(logLevel)': accepted are \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))"
            )
        }
        return level
    }
}
