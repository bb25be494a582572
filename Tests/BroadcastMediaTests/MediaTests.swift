import BroadcastKit
import BroadcastMedia
import Foundation
import Logging
import Synchronization
import Testing

@Suite("Encoder settings and errors")
struct EncoderSettingsTests {
    @Test func presetsAndEncoderNames() {
        #expect(VideoEncoderSettings.knownPresets.contains("veryfast"))
        #expect(!VideoEncoderSettings.knownPresets.contains("warp"))
        #expect(VideoEncoderSettings.encoderExists("libx264"))
        #expect(!VideoEncoderSettings.encoderExists("no_such_encoder"))
        #expect(!VideoEncoderSettings.encoderExists("aac"), "an audio encoder is not a video encoder")
    }

    @Test func settingsProblems() {
        #expect(VideoEncoderSettings(width: 320, height: 240).problem() == nil)
        #expect(VideoEncoderSettings(width: 321, height: 240).problem() != nil)
        #expect(VideoEncoderSettings(width: 320, height: 240, preset: "warp").problem()?.contains("warp") == true)
        #expect(VideoEncoderSettings(width: 320, height: 240, bitrate: 0).problem() != nil)
        #expect(VideoEncoderSettings(width: 320, height: 240, bitrate: 0, rateControl: .crf(23)).problem() == nil)
        #expect(VideoEncoderSettings(encoder: "nope", width: 320, height: 240).problem()?.contains("nope") == true)
    }

    @Test("a hardware encoder that cannot open falls back to libx264")
    func hardwareFallback() throws {
        let settings = VideoEncoderSettings(encoder: "h264_nvenc", width: 320, height: 240)  // no NVIDIA device here
        let encoder = try VideoEncoder(settings: settings, globalHeader: true, logger: quietLogger())
        #expect(encoder.settings.encoder == "libx264")
        #expect(encoder.stream.parameters.codecName == "h264")
        #expect(encoder.stream.parameters.hasExtradata)
    }

    @Test("FFmpegError names the code, its text and what we were doing")
    func errorDescription() throws {
        let muxer = try Muxer(url: "/nonexistent-dir/out.mkv", logger: quietLogger())
        let error = try #require(throws: FFmpegError.self) { try muxer.writeHeader() }
        #expect(error.code == FFmpegError.posix(ENOENT))
        #expect(error.reason == FFmpegError.text(of: FFmpegError.posix(ENOENT)))
        #expect(error.description.contains("/nonexistent-dir/out.mkv"), "\(error)")
        #expect(error.description.contains(error.reason))
    }

    @Test("forcing a keyframe makes the next frame one")
    func forcedKeyframe() throws {
        let encoder = try VideoEncoder(
            settings: VideoEncoderSettings(width: 320, height: 240, keyframeIntervalSeconds: 10),
            globalHeader: false,
            logger: quietLogger()
        )
        let media = TestMedia()
        var keyframes: [Int64] = []
        for index in 0..<30 {
            if index == 17 { encoder.forceKeyframe() }
            let planes = media.videoPlanes(frame: index)
            let packets = try planes[0].withUnsafeBytes { y in
                try planes[1].withUnsafeBytes { u in
                    try planes[2].withUnsafeBytes { v in
                        let buffer = SampleBuffer(
                            format: .video(VideoFormat(pixelFormat: .yuv420p, width: 320, height: 240)),
                            presentationTime: MediaTime(value: Int64(index), timescale: 30),
                            duration: MediaTime(value: 1, timescale: 30),
                            planes: [
                                Plane(base: y.baseAddress!, count: y.count, bytesPerRow: 320),
                                Plane(base: u.baseAddress!, count: u.count, bytesPerRow: 160),
                                Plane(base: v.baseAddress!, count: v.count, bytesPerRow: 160),
                            ]
                        )
                        return try encoder.encode(buffer)
                    }
                }
            }
            keyframes += packets.filter(\.isKeyframe).map(\.pts)
        }
        keyframes += try encoder.flush().filter(\.isKeyframe).map(\.pts)
        #expect(keyframes == [0, 17 * 3000], "keyframes at \(keyframes) (90 kHz)")
    }
}

@Suite("AudioMixer")
struct AudioMixerTests {
    func chunk(_ value: Float, _ count: Int) -> [[Float]] { [Array(repeating: value, count: count)] }

    @Test("one input passes through unchanged, but for what is past full scale (a gain of +20 dB: clipped)")
    func passThrough() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000, expectedInputs: 1)
        mixer.append([[0.5, -0.25, 1.5, -1.25]], at: 10, from: .audioMic)
        let out = mixer.mix()
        #expect(out == AudioChunk(startSample: 10, channels: [[0.5, -0.25, 1, -1]]))
        #expect(mixer.mix() == nil)
    }

    @Test("two inputs are summed and clipped over the range both cover")
    func sumAndClip() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000)
        mixer.append(chunk(0.25, 100), at: 0, from: .audioMic)
        mixer.append(chunk(0.5, 60), at: 0, from: .audioApp)
        let first = mixer.mix()
        #expect(first?.startSample == 0)
        #expect(first?.channels[0] == Array(repeating: 0.75, count: 60))
        mixer.append(chunk(0.9, 40), at: 60, from: .audioApp)
        let second = mixer.mix()
        #expect(second?.startSample == 60)
        #expect(second?.channels[0] == Array(repeating: 1, count: 40), "0.25 + 0.9 clips to 1")
    }

    @Test("an input lagging more than 200 ms counts as silence; its late samples are dropped")
    func lagIsSilence() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000)
        mixer.append(chunk(0.1, 50), at: 0, from: .audioApp)
        mixer.append(chunk(0.2, 50), at: 0, from: .audioMic)
        #expect(mixer.mix()?.frameCount == 50)
        mixer.append(chunk(0.1, 300), at: 50, from: .audioApp)
        // The mic is 300 ms behind: the first 100 ms of the gap are mixed with the mic silent.
        let lagging = mixer.mix()
        #expect(lagging?.startSample == 50)
        #expect(lagging?.channels[0] == Array(repeating: 0.1, count: 100))
        // The mic's late samples for time already mixed are dropped; the rest is mixed.
        mixer.append(chunk(0.2, 300), at: 50, from: .audioMic)
        let caughtUp = mixer.mix()
        #expect(caughtUp?.startSample == 150)
        #expect(caughtUp.map { $0.channels[0].allSatisfy { abs($0 - 0.3) < 1e-6 } } == true)
        #expect(caughtUp?.frameCount == 200)
    }

    @Test("timestamp jitter is absorbed; a real gap becomes silence")
    func jitterAndGaps() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000, expectedInputs: 1)
        mixer.append(chunk(0.5, 100), at: 0, from: .audioMic)
        _ = mixer.mix()
        mixer.append(chunk(0.5, 100), at: 103, from: .audioMic)  // 3 ms late: jitter
        #expect(mixer.mix()?.startSample == 100)
        mixer.append(chunk(0.5, 100), at: 250, from: .audioMic)  // 50 ms gap
        let out = mixer.mix()
        #expect(out?.startSample == 200)
        #expect(out?.channels[0].prefix(50).allSatisfy { $0 == 0 } == true)
        #expect(out?.frameCount == 150)
    }

    @Test("an input delayed by its sync offset is not taken for one the others lag behind")
    func leadIsNotLag() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000)
        // The microphone 300 ms late (beyond the 200 ms lag limit): its samples sit 300 ms ahead.
        for step in 0..<4 {
            mixer.append(chunk(0.1, 100), at: Int64(step * 100), from: .audioApp)
            mixer.append(chunk(0.2, 100), at: Int64(300 + step * 100), from: .audioMic, lead: 300)
        }
        // Mixed up to where capture has got to (400), the application's samples all there, the
        // microphone silent for its first 300 ms.
        let out = mixer.mix()
        #expect(out?.startSample == 0)
        #expect(out?.frameCount == 400)
        #expect(out.map { $0.channels[0].prefix(300).allSatisfy { abs($0 - 0.1) < 1e-6 } } == true)
        #expect(out.map { $0.channels[0].suffix(100).allSatisfy { abs($0 - 0.3) < 1e-6 } } == true)
    }

    @Test("a changed lead continues exactly: a gap of silence, an overlap dropped, no jitter snap")
    func changedLead() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000, expectedInputs: 1)
        mixer.append(chunk(0.5, 100), at: 0, from: .audioMic)
        #expect(mixer.mix()?.frameCount == 100)
        // 5 ms later (within the jitter tolerance, applied all the same): 5 samples of silence;
        // the mix waits where capture has got to (200).
        mixer.append(chunk(0.5, 100), at: 105, from: .audioMic, lead: 5)
        let grown = mixer.mix()
        #expect(grown?.startSample == 100)
        #expect(grown?.frameCount == 100)
        #expect(grown.map { Array($0.channels[0].prefix(6)) } == [0, 0, 0, 0, 0, 0.5])
        // Back to 0: the 5 samples the new position overlaps are dropped, the run goes on.
        mixer.append(chunk(0.25, 100), at: 200, from: .audioMic, lead: 0)
        let shrunk = mixer.mix()
        #expect(shrunk?.startSample == 200)
        #expect(shrunk?.frameCount == 100)
        #expect(shrunk.map { Array($0.channels[0][4...6]) } == [0.5, 0.25, 0.25])
        #expect(mixer.mix(final: true) == nil)
    }

    @Test("a lead made much shorter does not make the other input look late while its overlap is dropped")
    func shrunkLeadKeepsTheOtherInput() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000)
        var out: [Int64: Float] = [:]
        func drain() {
            while let chunk = mixer.mix() {
                for (i, v) in chunk.channels[0].enumerated() { out[chunk.startSample + Int64(i)] = v }
            }
        }
        // The microphone 500 ms late, then 100 ms: the next 400 ms it captures overlap what its
        // lane holds and are dropped; meanwhile the application must go on being mixed.
        for step in 0..<12 {
            let lead: Int64 = step < 6 ? 500 : 100
            mixer.append(chunk(0.1, 100), at: Int64(step * 100), from: .audioApp)
            mixer.append(chunk(0.2, 100), at: Int64(step * 100) + lead, from: .audioMic, lead: lead)
            drain()
        }
        let mixed = out.keys.sorted()
        #expect(mixed.first == 0 && mixed.count == Int(mixed.last! + 1), "one run from 0: \(mixed.first ?? -1)...\(mixed.last ?? -1), \(mixed.count) samples")
        // The application alone is 0.1, with the microphone 0.3; 0 or 0.2 is the application missing.
        let appSilent = mixed.filter { abs(out[$0]! - 0.1) > 1e-6 && abs(out[$0]! - 0.3) > 1e-6 }
        #expect(appSilent.isEmpty, "the application missing from the mix at \(appSilent.first ?? -1)...\(appSilent.last ?? -1)")
        #expect(mixed.count >= 1100, "mixed \(mixed.count) samples of 1200")
    }

    @Test("the final mix ends where it is told: cut, or filled with silence")
    func finalEnd() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000, expectedInputs: 1)
        mixer.append(chunk(0.5, 100), at: 50, from: .audioMic, lead: 50)
        // A delayed start is silence from where capture began.
        let first = mixer.mix()
        #expect(first?.startSample == 0)
        #expect(first.map { $0.channels[0].prefix(50).allSatisfy { $0 == 0 } && $0.channels[0].suffix(50).allSatisfy { $0 == 0.5 } } == true)
        #expect(mixer.mixed(final: true, until: 120).map(AudioChunk.init) == AudioChunk(startSample: 100, channels: [Array(repeating: 0.5, count: 20)]))
        let padded = AudioMixer(channelCount: 1, sampleRate: 1000, expectedInputs: 1)
        padded.append(chunk(0.5, 100), at: 0, from: .audioMic, lead: -20)
        #expect(padded.mix()?.frameCount == 100)
        #expect(padded.mixed(final: true, until: 120).map(AudioChunk.init) == AudioChunk(startSample: 100, channels: [Array(repeating: 0, count: 20)]))
    }

    @Test("at the start the mixer waits for a second input before mixing")
    func startupGrace() {
        let mixer = AudioMixer(channelCount: 1, sampleRate: 1000)
        mixer.append(chunk(0.1, 20), at: 0, from: .audioMic)
        #expect(mixer.mix() == nil)
        mixer.append(chunk(0.2, 20), at: 0, from: .audioApp)
        let out = mixer.mix()
        #expect(out?.startSample == 0)
        #expect(out.map { $0.channels[0].allSatisfy { abs($0 - 0.3) < 1e-6 } } == true)
    }
}

/// Collects log records; other suites may make FFmpeg log from their threads meanwhile.
final class RecordedLog: Sendable {
    private let storage = Mutex<[(Logger.Level, String)]>([])
    var records: [(Logger.Level, String)] { storage.withLock { $0 } }
    func append(_ record: (Logger.Level, String)) { storage.withLock { $0.append(record) } }
}

struct RecordingLogHandler: LogHandler {
    let log: RecordedLog
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .warning

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        log.append((event.level, event.message.description))
    }
}

@Suite("FFmpeg log", .serialized)
struct FFmpegLogTests {
    @Test("av_log lines reach the installed Logger with mapped levels")
    func routedToSwiftLog() throws {
        let recorded = RecordedLog()
        let logger = Logger(label: "ffmpeg") { _ in RecordingLogHandler(log: recorded) }
        FFmpegLog.install(logger)
        defer { FFmpegLog.install(quietLogger()) }
        // libavformat logs an error when it cannot pick a container.
        #expect(throws: FFmpegError.self) { try Muxer(url: "/tmp/x.no-such-container", logger: logger) }
        #expect(
            recorded.records.contains { $0.0 == .error && $0.1.contains("no-such-container") }, "\(recorded.records)")
        #expect(FFmpegLog.loggerLevel(avLevel: 24) == .warning)
        #expect(FFmpegLog.loggerLevel(avLevel: 0) == .critical)
        #expect(FFmpegLog.loggerLevel(avLevel: 48) == .debug)
        #expect(FFmpegLog.loggerLevel(avLevel: 32) == .debug, "FFmpeg INFO (x264 statistics) is debug detail")
    }
}
