import ArgumentParser
import BroadcastDaemon
import BroadcastKit

#if canImport(Glibc)
import Glibc
#endif

@main
struct Broadcast: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "broadcast",
        abstract: "Capture video and audio on Linux, encode per quality, record and stream.",
        discussion: """
            broadcast runs a capture session: sources (V4L2 video devices, ALSA PCMs, X11 \
            screens, the Wayland desktop through the ScreenCast portal and PipeWire, PipeWire \
            audio, and the built-in test pattern and tone; layers and scenes composed over the \
            first video) deliver timestamped sample buffers on one clock to a handler, called \
            serially like ReplayKit's RPBroadcastSampleHandler. The built-in handler encodes \
            H.264 + AAC with FFmpeg's libraries and writes every output (recordings, a replay \
            buffer, RTMP/RTMPS, SRT and WHIP streams): outputs that ask the same quality share one \
            encode, and live outputs can follow their network (--adaptive). The daemon is run by \
            systemd and controlled through its socket (status, pause, mark, scene, ...) or its \
            page (broadcast ui).

            Start with:
              broadcast record demo.mp4 --duration 10s
              broadcast devices
            """,
        subcommands: [Record.self, Stream.self, Devices.self, DaemonCommand.self, Status.self, Start.self, Pause.self, Resume.self, Mute.self, Unmute.self, Offset.self, Stop.self, Reload.self, Replay.self, Scene.self, Mark.self, UI.self]
    )

    /// Parses and runs; bad input exits 2 with one line that names the value and what is accepted.
    static func main() async {
        Signals.install()
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch let error as ValueError {
            fail(error.description)
        } catch let error as OptionError {
            fail(error.description)
        } catch let error as ConfigError {
            fail(error.description)
        } catch let error as BroadcastError where error.code == .invalidArgument {
            fail(error.message)
        } catch {
            let code = exitCode(for: error)
            if code == .validationFailure {
                fail(message(for: error))
            }
            exit(withError: error)
        }
    }

    static func fail(_ message: String) -> Never {
        var line = message
        while line.hasSuffix("\n") { line.removeLast() }
        FileStandardError.write("broadcast: error: \(line)\n")
        Glibc.exit(2)
    }
}

/// Unbuffered writes to standard error (status line, error lines).
enum FileStandardError {
    static func write(_ text: String) {
        var text = text
        text.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let n = Glibc.write(2, bytes.baseAddress! + offset, bytes.count - offset)
                if n <= 0 { break }
                offset += n
            }
        }
    }
}
