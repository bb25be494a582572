import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Foundation
import Testing

/// `--audio-tracks`: the built-in handler's tracks per source, their titles per container, an
/// FLV output's single track, sync per track, and a mute applied from the source's next buffer.
@Suite("Audio tracks through EncodingHandler", .serialized)
struct AudioTracksTests {
    let media = TestMedia()

    func configuration(_ recordings: [String], mode: AudioTrackMode) -> EncodingConfiguration {
        var configuration = EncodingConfiguration(
            video: VideoEncoderSettings(width: media.width, height: media.height, bitrate: 800_000),
            audio: AudioEncoderSettings(),
            recordings: recordings
        )
        configuration.audioTracks = mode
        configuration.audioSources = [.audioMic, .audioApp]
        return configuration
    }

    /// The audio streams of a file: (title, handler name) per stream, in order.
    static func audioTitles(_ path: String) throws -> [String?] {
        let result = try run([
            "ffprobe", "-v", "error", "-select_streams", "a", "-show_entries", "stream=index:stream_tags=title,handler_name",
            "-of", "json", path,
        ])
        let json = try JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8)) as? [String: Any]
        return (json?["streams"] as? [[String: Any]] ?? []).map { stream in
            let tags = stream["tags"] as? [String: Any] ?? [:]
            return (tags["title"] ?? tags["handler_name"]) as? String
        }
    }

    @Test(
        "separate and both: a track per source, titled in MP4, MOV and MKV; TS carries the tracks; FLV the mix",
        arguments: [AudioTrackMode.separate, .both])
    func tracksPerContainer(mode: AudioTrackMode) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let files = ["mp4", "mov", "mkv", "ts", "flv"].map { directory.file("tracks.\($0)") }
        let handler = EncodingHandler(configuration: configuration(files, mode: mode), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: 4, audio: [.audioMic, .audioApp])
        handler.broadcastFinished()
        #expect(handler.failures.isEmpty, "\(handler.failures)")
        let expected: [String?] = mode == .both ? ["Mix", "Microphone", "Desktop audio"] : ["Microphone", "Desktop audio"]
        for file in files {
            let titles = try Self.audioTitles(file)
            switch URL(fileURLWithPath: file).pathExtension {
            case "flv":
                #expect(titles.count == 1, "\(file): \(titles)")
            case "ts":
                // MPEG-TS has no per-stream title in FFmpeg's muxer: the tracks, in the same order.
                #expect(titles.count == expected.count, "\(file): \(titles)")
            default:
                #expect(titles == expected, "\(file)")
            }
            let errors = try decodeErrors(file)
            #expect(errors.isEmpty, "\(file): \(errors)")
            // Every track keeps its beeps with the white frames (whole seconds 1...3 have a
            // silence before their beep; silencedetect also ends one at the end of the file).
            for track in 0..<titles.count {
                let (white, sounds) = try markers(file, audioTrack: track)
                let beeps = sounds.filter { $0 < 3.5 + (white.first ?? 0) }
                #expect(white.count == 4, "\(file): white frames \(white)")
                #expect(beeps.count == 3, "\(file) track \(track): beeps at \(sounds)")
                for beep in beeps {
                    let nearest = white.min { abs($0 - beep) < abs($1 - beep) } ?? .infinity
                    #expect(abs(nearest - beep) <= 1.0 / 30, "\(file) track \(track): beep at \(beep), white frame at \(nearest)")
                }
            }
        }
    }

    /// A replay save of a `separate` broadcast holds both tracks, titled, in sync; an FLV replay
    /// the mix (encoded for it).
    @Test func replaySavesCarryTheTracks() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var configuration = configuration([], mode: .separate)
        configuration.outputs = ["mkv", "flv"].map {
            OutputConfiguration(name: "replay-\($0)", destination: .file(directory.file("replay-%H%M%S.\($0)")), replay: ReplaySettings(seconds: 3))
        }
        let handler = EncodingHandler(configuration: configuration, logger: quietLogger(), realtime: false)
        try handler.broadcastStarted(setupInfo: SetupInfo())
        let saves = handler.replayOutputs.map { $0.saveReplay(upTo: 6_000_000_000)! }
        try media.feed(handler, seconds: 8, audio: [.audioMic, .audioApp])
        let results = saves.map { $0.wait(timeoutSeconds: 60) }
        handler.broadcastFinished()
        #expect(handler.failures.isEmpty, "\(handler.failures)")
        let paths = results.compactMap { $0?.path }
        #expect(paths.count == 2, "\(results)")
        for path in paths {
            let flv = path.hasSuffix(".flv")
            #expect(try Self.audioTitles(path) == (flv ? [nil] : ["Microphone", "Desktop audio"]), "\(path)")
            for track in 0..<(flv ? 1 : 2) {
                let (white, sounds) = try markers(path, audioTrack: track)
                #expect(white.count >= 3, "\(path): white frames \(white)")
                let beeps = sounds.filter { $0 < (white.last ?? 0) + 0.5 }
                #expect(beeps.count >= 2, "\(path) track \(track): beeps at \(sounds)")
                for beep in beeps {
                    let nearest = white.min { abs($0 - beep) < abs($1 - beep) } ?? .infinity
                    #expect(abs(nearest - beep) <= 1.0 / 30, "\(path) track \(track): beep at \(beep), white frame at \(nearest)")
                }
            }
        }
    }

    /// `mixed` (the default) stays one untitled track, as before.
    @Test func mixedIsOneTrack() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("mixed.mkv")
        let handler = EncodingHandler(configuration: configuration([file], mode: .mixed), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: 2, audio: [.audioMic, .audioApp])
        handler.broadcastFinished()
        #expect(try Self.audioTitles(file) == [nil])
    }

    /// A steady tone on the microphone, muted between two buffers: its own track and the mix are
    /// silent from the next buffer on (within one AAC frame of the encoder's transition), loud
    /// up to it; the application's track is untouched. A volume of -20 dB is a tenth.
    @Test("a mute applies from the source's next buffer, in its track and its part of the mix")
    func muteAppliesFromTheNextBuffer() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("mute.mp4")
        var configuration = configuration([file], mode: .both)
        configuration.video = nil
        configuration.audioLevels = [.audioApp: AudioLevel(volumeDecibels: -20)]
        let handler = EncodingHandler(configuration: configuration, logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        let period = 480
        let muteAt = 150  // buffers: 1.5 s
        let tone = (0..<period * 2).map { i in Int16(0.5 * 32767 * sin(2 * Double.pi * 375 * Double(i / 2) / 48_000)) }
        for index in 0..<300 {
            if index == muteAt { handler.audioControl.setMuted(true, of: .audioMic) }
            for type in [SampleBufferType.audioMic, .audioApp] {
                try tone.withUnsafeBytes { bytes in
                    let buffer = SampleBuffer(
                        format: .audio(AudioFormat(sampleFormat: .s16, sampleRate: 48_000, channels: 2)),
                        presentationTime: MediaTime(value: Int64(index * period), timescale: 48_000),
                        duration: MediaTime(value: Int64(period), timescale: 48_000),
                        planes: [Plane(base: bytes.baseAddress!, count: bytes.count, bytesPerRow: bytes.count)],
                        frameCount: period)
                    try handler.processSampleBuffer(buffer, of: type)
                }
            }
        }
        handler.broadcastFinished()
        #expect(handler.failures.isEmpty, "\(handler.failures)")
        #expect(handler.audioControl.level(of: .audioMic).muted)
        // Track 0 the mix, 1 the microphone, 2 the application audio.
        let mix = try decodedPeaks(file, track: 0, window: period)
        let mic = try decodedPeaks(file, track: 1, window: period)
        let app = try decodedPeaks(file, track: 2, window: period)
        // Windows of one period: the mute came before buffer `muteAt`, sample 72 000. The decoded
        // audio is 1024 samples (the AAC encoder's priming, one frame) later than its timestamps
        // in every track alike, so the mute shows at sample 73 024, inside window 152: measured,
        // window 152 peaks at 0.54 (it holds 64 samples before the mute), window 153 at 0.0.
        let priming = 1024
        let muted = (muteAt * period + priming) / period
        let before = muted, after = muted + 1
        #expect(mic[2..<before].allSatisfy { $0 > 0.4 }, "mic before the mute: \(mic[2..<before].min() ?? 0)")
        #expect(mic[after..<(mic.count - 2)].allSatisfy { $0 < 0.01 }, "mic after the mute: \(mic[after...].max() ?? 0)")
        // The application at -20 dB throughout (0.05 peaks).
        #expect(app[2..<(app.count - 2)].allSatisfy { $0 > 0.04 && $0 < 0.07 }, "app: \(app.min() ?? 0)...\(app.max() ?? 0)")
        // The mix: both before (0.55), the application alone after (0.05).
        #expect(mix[4..<before].allSatisfy { $0 > 0.5 }, "mix before: \(mix[4..<before].min() ?? 0)")
        #expect(mix[after..<(mix.count - 2)].allSatisfy { $0 < 0.07 }, "mix after: \(mix[after...].max() ?? 0)")
    }

    /// Peak amplitude of each `window` samples of one audio track, decoded to mono float.
    func decodedPeaks(_ path: String, track: Int, window: Int) throws -> [Float] {
        let out = path + ".track\(track).f32"
        let result = try run([
            "ffmpeg", "-nostdin", "-v", "error", "-y", "-i", path, "-map", "0:a:\(track)", "-af", "pan=mono|c0=c0", "-f", "f32le", out,
        ])
        #expect(result.status == 0, "\(result.standardError)")
        let data = try Data(contentsOf: URL(fileURLWithPath: out))
        let samples = data.withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
        return stride(from: 0, to: samples.count - window, by: window).map { start in
            samples[start..<(start + window)].map(abs).max() ?? 0
        }
    }
}
