import Foundation
import Testing

/// `--mic-denoise` on the real microphone path: a noisy "voice" (pink noise throughout, a 440 Hz
/// tone switched on and off like syllables after the first 4 s) is played into the desktop
/// session's microphone (`test_mic`, PipeWire) while two broadcasts record it at once, one with
/// noise suppression and one without. In the files: the noise-only stretch falls at least 15 dB,
/// the voice's level stays within 3 dB.
@Suite("Microphone noise suppression", .serialized)
struct MicDenoiseTests {
    static let rate = 48_000
    static let window = rate / 10

    /// 8 s, mono 48 kHz: pink noise (amplitude 0.1, about -34 dBFS), and from 4 s a 440 Hz tone
    /// (ffmpeg's sine: 1/8 of full scale, -21 dBFS RMS), 300 ms on and 200 ms off.
    static func noisyVoice(_ path: String) throws {
        let r = try run("/usr/bin/ffmpeg", [
            "-nostdin", "-v", "error", "-y",
            "-f", "lavfi", "-i", "anoisesrc=color=pink:amplitude=0.1:sample_rate=48000:seed=38:duration=8",
            "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=8",
            "-filter_complex", "[1]volume='if(lt(t,4),0,if(lt(mod(t,0.5),0.3),1,0))':eval=frame[v];[0][v]amix=inputs=2:normalize=0",
            "-ac", "1", "-ar", "48000", path,
        ])
        guard r.status == 0 else { throw ProbeError(message: "ffmpeg noisy voice: \(r.stderr)") }
    }

    /// RMS in dBFS of each 100 ms window.
    static func windowLevels(_ samples: [Float]) -> [Double] {
        stride(from: 0, to: samples.count - window + 1, by: window).map { start in
            var sum = 0.0
            for i in start..<(start + window) { sum += Double(samples[i]) * Double(samples[i]) }
            return 10 * log10(max(sum / Double(window), 1e-20))
        }
    }

    struct Measure: CustomStringConvertible {
        /// Median level of the noise-only windows from 2 s to 0.3 s before the voice starts.
        var noiseFloor: Double
        /// Median level of the windows where the voice is on.
        var voice: Double
        var description: String { "noise floor \(String(format: "%.1f", noiseFloor)) dBFS, voice \(String(format: "%.1f", voice)) dBFS" }
    }

    static func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        return sorted.isEmpty ? -200 : sorted[sorted.count / 2]
    }

    /// Finds the voice by its tone (440 Hz louder than -30 dB in a window) and measures around it.
    static func measure(_ file: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> Measure {
        let samples = try PipeWireAudioTests.samples(file)
        let tone = PipeWireAudioTests.levels(samples, frequency: 440)
        let levels = windowLevels(samples)
        let start = try #require(tone.firstIndex { $0 > -30 }, "no voice in \(file): \(tone.map { Int($0) })", sourceLocation: sourceLocation)
        try #require(start >= 20, "the voice starts \(start) windows in: no noise-only stretch before it", sourceLocation: sourceLocation)
        let noise = Array(levels[(start - 20)..<(start - 3)])
        let loudest = tone[start...].max() ?? -200
        let on = tone.indices.filter { $0 >= start && tone[$0] > loudest - 6 }.map { levels[$0] }
        return Measure(noiseFloor: median(noise), voice: median(on))
    }

    /// Links from `node`'s ports to ports whose name contains `target`.
    static func linkCount(_ desktop: DesktopSession, from node: String, to target: String) -> Int {
        let listing = (try? desktop.run("/usr/bin/pw-link", ["-l"]))?.stdout ?? ""
        var owner = "", count = 0
        for line in listing.split(separator: "\n") {
            if !line.hasPrefix(" ") {
                owner = String(line)
            } else if owner.hasPrefix(node + ":"), line.contains("|->"), line.contains(target) {
                count += 1
            }
        }
        return count
    }

    /// The suppressor's own delay (338 samples, 7 ms, at 48 kHz) is taken off the timestamps: the
    /// test tone's beeps start where they start without it, within 2 ms (a tenth of a beep).
    @Test func beepsStayWhereTheyWere() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        var starts: [[Double]] = []
        for denoise in [false, true] {
            let file = dir.path("beeps-\(denoise).mkv")
            let r = try broadcast(
                ["record", file, "--video", "none", "--audio-mic", "test", "--audio-app", "none", "--duration", "5s", "--no-realtime", "-q"]
                    + (denoise ? ["--mic-denoise"] : []))
            #expect(r.status == 0, "exit \(r.status): \(r.stderr)")
            starts.append(try beepStartTimes(file))
        }
        #expect(starts[0].count >= 4 && starts[0].count == starts[1].count, "beeps at \(starts[0]) without, \(starts[1]) with --mic-denoise")
        for (plain, denoised) in zip(starts[0], starts[1]) {
            #expect(abs(plain - denoised) <= 0.002, "a beep at \(plain) s without --mic-denoise is at \(denoised) s with it")
        }
    }

    @Test func suppressesTheNoiseFloorAndKeepsTheVoice() throws {
        let desktop = try PipeWireAudioTests.audioOnlyDesktop()
        defer { desktop.stop() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        try Self.noisyVoice(dir.path("voice.wav"))
        let arguments = ["--video", "none", "--audio-mic", "default", "--audio-app", "none", "--duration", "60s", "-q"]
        let plainFile = dir.path("plain.mkv"), denoisedFile = dir.path("denoised.mkv")
        let plain = try desktop.start(broadcastBinary, ["record", plainFile] + arguments)
        try desktop.waitForBroadcastLink(from: "test_mic")
        let one = Self.linkCount(desktop, from: "test_mic", to: "broadcast")
        let denoised = try desktop.start(broadcastBinary, ["record", denoisedFile, "--mic-denoise"] + arguments)
        // A guard against hanging: both linked before the voice is played.
        let deadline = Date().addingTimeInterval(120)
        while Self.linkCount(desktop, from: "test_mic", to: "broadcast") < 2 * one, Date() < deadline { usleep(50_000) }
        let play = try desktop.run("/usr/bin/pw-play", ["--target", "test_mic_input", dir.path("voice.wav")])
        #expect(play.status == 0, "pw-play: \(play.stderr)")
        Thread.sleep(forTimeInterval: 1)
        plain.signal(SIGINT)
        denoised.signal(SIGINT)
        let p = plain.wait(timeout: 60), d = denoised.wait(timeout: 60)
        #expect(p.status == 0, "exit \(p.status): \(p.stderr.suffix(2000))")
        #expect(d.status == 0, "exit \(d.status): \(d.stderr.suffix(2000))")
        let without = try Self.measure(plainFile), with = try Self.measure(denoisedFile)
        // The noise is there to suppress (not silence from a cycle the graph lost).
        #expect(without.noiseFloor > -45, "without --mic-denoise: \(without)")
        #expect(without.noiseFloor - with.noiseFloor >= 15, "the noise floor falls \(without.noiseFloor - with.noiseFloor) dB: without \(without); with \(with)")
        #expect(abs(without.voice - with.voice) <= 3, "the voice's level changes \(with.voice - without.voice) dB: without \(without); with \(with)")
        print("mic-denoise: without \(without); with \(with)")
    }
}
