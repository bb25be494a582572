import Foundation
import Testing

/// Audio and video of a Wayland desktop stay together: a player (ffplay, on the headless sway
/// through SDL's Wayland backend, its sound through pipewire-pulse into the default sink) shows a
/// white flash with a beep every two seconds; broadcast records `--video portal --audio-app desktop`,
/// and each flash in the recording must sit within 1.5 frame intervals of its beep.
///
/// The player's own A/V sync is part of what is measured (it is what a person sees and hears); its
/// start-up is not: the first flash, while ffplay settles its clocks, is left out. The measurement
/// itself is checked first on the stimulus and on a copy with the audio moved by a known amount, so
/// a broken analysis cannot pass the test.
@Suite("A/V sync of a Wayland desktop")
struct DesktopAVSyncTests {
    static let frameRate = 30.0
    static let period = 2.0

    /// The flash/beep stimulus: black with a white 0.1 s flash every `period` s, a 1 kHz beep of the
    /// same 0.1 s at the same moments (made by FFmpeg's lavfi, independent of broadcast).
    static func stimulus(_ path: String, seconds: Int, audioDelay: Double = 0) throws {
        let flash = "lt(mod(t\\,\(period))\\,0.1)"
        var arguments = [
            "-nostdin", "-v", "error", "-y",
            "-f", "lavfi", "-i", "color=c=black:s=640x360:r=30:d=\(seconds),drawbox=x=0:y=0:w=iw:h=ih:color=white:t=fill:enable='\(flash)'",
        ]
        if audioDelay != 0 { arguments += ["-itsoffset", String(audioDelay)] }
        arguments += [
            "-f", "lavfi", "-i", "aevalsrc='if(\(flash)\\,0.5*sin(2*PI*1000*t)\\,0)':s=48000:d=\(seconds)",
            "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p", "-c:a", "aac", path,
        ]
        let r = try run("/usr/bin/ffmpeg", arguments)
        guard r.status == 0 else { throw ProbeError(message: "making the stimulus: \(r.stderr)") }
    }

    /// The first frame time of each flash, paired with the nearest beep start: video − audio (s).
    static func offsets(_ path: String) throws -> (offsets: [(flash: Double, offset: Double)], flashes: [Double], beeps: [Double]) {
        let white = try whiteFrameTimes(path)
        var onsets: [Double] = []
        for t in white where onsets.last.map({ t - $0 > period / 2 }) ?? true { onsets.append(t) }
        let beeps = try beepStartTimes(path)
        let pairs: [(Double, Double)] = onsets.compactMap { flash in
            guard let beep = beeps.min(by: { abs($0 - flash) < abs($1 - flash) }), abs(beep - flash) < period / 2 else { return nil }
            return (flash, flash - beep)
        }
        return (pairs, onsets, beeps)
    }

    static func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        return sorted.isEmpty ? .nan : sorted[sorted.count / 2]
    }

    /// The analysis finds no offset in the stimulus and finds the one put into a copy of it.
    @Test func theMeasurementSeesAKnownOffset() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        try Self.stimulus(dir.path("in-sync.mkv"), seconds: 7)
        try Self.stimulus(dir.path("audio-late.mkv"), seconds: 7, audioDelay: 0.2)
        let inSync = try Self.offsets(dir.path("in-sync.mkv")).offsets.map(\.offset)
        let late = try Self.offsets(dir.path("audio-late.mkv")).offsets.map(\.offset)
        #expect(inSync.count >= 3 && late.count >= 3, "pairs: \(inSync) \(late)")
        #expect(abs(Self.median(inSync)) < 0.015, "in sync: \(inSync)")
        #expect(abs(Self.median(late) + 0.2) < 0.015, "audio 200 ms late: \(late)")
    }

    @Test func flashAndBeepStayWithinOneAndAHalfFrames() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let stimulus = dir.path("flash-beep.mkv")
        try Self.stimulus(stimulus, seconds: 13)
        let desktop = try DesktopSession(.init(size: "640x360", background: "#000000"))
        defer { desktop.stop() }
        let file = dir.path("desk.mkv")
        let recording = try desktop.start(broadcastBinary, [
            "record", file, "--video", "portal", "--audio-app", "desktop", "--audio-mic", "none", "--fps", "30", "-q",
        ])
        try desktop.waitForCastConsumers()
        var environment = desktop.environment
        environment["SDL_VIDEODRIVER"] = "wayland"
        environment["SDL_AUDIODRIVER"] = "pulseaudio"
        let player = try Child("/usr/bin/ffplay", ["-hide_banner", "-loglevel", "warning", "-autoexit", "-fs", stimulus], environment: environment)
            .wait(timeout: 90)
        #expect(player.status == 0, "ffplay: \(player.stderr)")
        Thread.sleep(forTimeInterval: 0.5)
        recording.signal(SIGINT)
        let result = recording.wait(timeout: 60)
        #expect(result.status == 0, "broadcast: \(result.stderr)")

        let measured = try Self.offsets(file)
        let settled = measured.offsets.dropFirst()
        let summary = "flashes \(measured.flashes.map { String(format: "%.3f", $0) }), beeps \(measured.beeps.map { String(format: "%.3f", $0) }), video − audio \(measured.offsets.map { String(format: "%+.0f ms", 1000 * $0.offset) })"
        print("A/V sync of the desktop: \(summary)")
        #expect(settled.count >= 4, "too few flash/beep pairs: \(summary)")
        let limit = 1.5 / Self.frameRate
        #expect(abs(Self.median(settled.map(\.offset))) <= limit, "median offset over 1.5 frame intervals: \(summary)")
    }
}
