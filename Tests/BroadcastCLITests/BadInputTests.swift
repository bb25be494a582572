import Foundation
import Testing

/// Bad input: one clear line naming the value and what is accepted, exit code 2, no file left behind.
@Suite struct BadInputTests {
    @Test(arguments: [
        (["record", "out.xyz"], ".xyz"),
        (["record", "out"], "(none)"),
        (["record", "/nonexistent-dir/out.mp4"], "/nonexistent-dir"),
        (["record", "out.mp4", "--size", "12x"], "12x"),
        (["record", "out.mp4", "--audio-period", "1s"], "--audio-period '1s': must be from 2ms to 200ms"),
        (["record", "out.mp4", "--audio-period", "soon"], "--audio-period 'soon'"),
        (["record", "out.mp4", "--audio-mic", "test:period=300ms"], "--audio-mic 'test:period=300ms': the period must be from 2ms to 200ms"),
        (["record", "out.mp4", "--audio-mic", "test:period=soon"], "--audio-mic test:period 'soon'"),
        (["record", "out.mp4", "--size", "641x480"], "641x480"),
        (["record", "out.mp4", "--fps", "abc"], "abc"),
        (["record", "out.mp4", "--fps", "0"], "--fps '0'"),
        (["record", "out.mp4", "--video-bitrate", "fast"], "fast"),
        (["record", "out.mp4", "--audio-bitrate", "3k"], "3k"),
        (["record", "out.mp4", "--duration", "ten"], "ten"),
        (["record", "out.mp4", "--duration", "0s"], "0s"),
        (["record", "out.mp4", "--keyframe-interval", "2x"], "2x"),
        (["record", "out.mp4", "--encoder", "h265_magic"], "h265_magic"),
        // Offered until it was found never to encode (no upload to VAAPI surfaces): refused now.
        (["record", "out.mp4", "--encoder", "h264_vaapi"], "h264_vaapi"),
        (["record", "out.mp4", "--preset", "warpspeed"], "warpspeed"),
        (["record", "out.mp4", "--video", "/dev/nothing"], "/dev/nothing"),
        (["record", "out.mp4", "--log-level", "loud"], "loud"),
        (["record", "out.mp4", "--no-realtime"], "--duration"),
        (["record", "out.mp4", "--video", "none", "--audio-mic", "none"], "nothing to capture"),
        // Noise suppression is for a microphone: none to denoise, or asked for the application audio.
        (["record", "out.mp4", "--audio-mic", "none", "--audio-app", "test", "--mic-denoise"], "--mic-denoise needs a microphone: --audio-mic is 'none'"),
        (["record", "out.mp4", "--app-denoise"], "--app-denoise: noise suppression is for the microphone only (--mic-denoise)"),
        (["record", "out.mp4", "--rate-control", "abr"], "abr"),
        (["record", "out.mp4", "--frame-rate-mode", "sometimes"], "sometimes"),
        (["record", "out.mp4", "--memory-budget", "lots"], "--memory-budget 'lots'"),
        (["record", "out.mp4", "--memory-budget", "8M"], "--memory-budget '8M': expected a size from 16M to 1T"),
        // A budget 1080p60 cannot fit: the figures, what it needs vs the budget.
        (["record", "out.mp4", "--size", "1920x1080", "--fps", "60", "--memory-budget", "48M"],
         "memory budget 48 MiB is too small for 1920x1080 at 60 fps: it needs at least 8"),
        (["stream", "rtmp://127.0.0.1:1/live/x", "--size", "1920x1080", "--fps", "60", "--memory-budget", "48M"],
         "memory budget 48 MiB is too small for 1920x1080 at 60 fps: it needs at least 8"),
        // A 4K picture does not fit the default budget (x264 alone holds ~180 MiB).
        (["record", "out.mp4", "--size", "3840x2160"],
         "memory budget 160 MiB is too small for 3840x2160 at 30 fps: it needs at least 2"),
        // x264 without zerolatency holds its B-frames and lookahead.
        (["record", "out.mp4", "--size", "1920x1080", "--fps", "60", "--tune", "none", "--memory-budget", "128M"],
         "memory budget 128 MiB is too small for 1920x1080 at 60 fps: it needs at least 1"),
        // A live output needs a frame every tick: vfr is for files.
        (["stream", "rtmp://127.0.0.1:1/live/x", "--frame-rate-mode", "vfr"], "--frame-rate-mode vfr"),
    ] as [([String], String)])
    func rejectedWithOneLineAndExitCode2(arguments: [String], mentions: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let child = try Child(broadcastBinary, arguments, directory: dir.url)
        let r = child.wait(timeout: 30)
        #expect(r.status == 2, "exit \(r.status) for \(arguments); stderr: \(r.stderr)")
        let lines = r.stderr.split(separator: "\n")
        #expect(lines.count == 1, "expected one line, got: \(r.stderr)")
        #expect(r.stderr.contains(mentions), "the message should name \(mentions): \(r.stderr)")
        #expect(r.stderr.contains("accepted") || r.stderr.contains("expected") || r.stderr.contains("use one of")
            || r.stderr.contains("must") || r.stderr.contains("does not exist") || r.stderr.contains("needs")
            || r.stderr.contains("nothing"), "the message should say what is accepted: \(r.stderr)")
        #expect(dir.contents.isEmpty, "files left behind: \(dir.contents)")
    }

    @Test func helpTeaches() throws {
        let r = try broadcast(["record", "--help"])
        #expect(r.status == 0)
        for needle in ["--duration", "--no-realtime", "SIGUSR1", ".mkv", "Examples"] {
            #expect(r.stdout.contains(needle), "record --help should mention \(needle)")
        }
    }

    /// Help is wrapped at 80 columns (what ArgumentParser uses when stdout is not a terminal) by
    /// the parser, not by hand: no line runs past it unless it is one unbreakable word, and the
    /// discussions' tables and examples keep their rows whole.
    @Test(arguments: [[], ["record"], ["stream"], ["devices"], ["daemon"], ["status"], ["replay", "save"]])
    func helpFitsEightyColumns(command: [String]) throws {
        let r = try broadcast(command + ["--help"])
        #expect(r.status == 0)
        let lines = r.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        for line in lines where line.count > 80 {
            #expect(!line.trimmingCharacters(in: .whitespaces).contains(" "), "too wide for 80 columns: \(line)")
        }
        // Prose (unindented) wraps greedily at 79 columns: a line ends early only where the next word
        // would not fit.
        for (line, next) in zip(lines, lines.dropFirst()) {
            guard let first = line.first, first != " ", let nextFirst = next.first, nextFirst != " " else { continue }
            let word = next.split(separator: " ").first ?? ""
            #expect(line.count + 1 + word.count >= 80, "a hand-made line break: '\(line)' / '\(next)'")
        }
        let rows = [
            "stream": ["  rtmps://HOST[:PORT]/APP/KEY    FLV over RTMP in TLS", "  broadcast stream rtmp://127.0.0.1/live/demo --record demo.mp4"],
            "record": ["  .mp4 .mov  fragmented while recording (a crash leaves a playable", "  broadcast record out.mp4 --duration 10s"],
            "daemon": ["  curl --unix-socket $S http://localhost/metrics       (Prometheus)"],
            "replay": ["  broadcast replay save --socket /run/broadcast/control.sock"],
        ]
        for row in rows[command.first ?? "", default: []] {
            #expect(r.stdout.contains(row + "\n"), "\(command) --help lost the row: \(row)")
        }
    }
}
