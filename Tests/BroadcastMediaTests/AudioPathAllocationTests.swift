import AllocationCounting
import BroadcastKit
import BroadcastMedia
import Logging
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The encode path's audio allocates nothing per buffer once running: what `EncodingHandler` does
/// with each audio buffer (resample onto its timestamps, mix the microphone with the application
/// audio, encode to AAC), counted by `AllocationCounter` on the calling thread in an exit test (a
/// process of its own), after a warm-up, over `window` periods of both inputs.
///
/// The inputs are chosen to take every branch of the steady state: the microphone is s16 at
/// 48 kHz with a clock 500 ppm fast (so the resampler steers it back onto its timestamps all the
/// time), the application audio f32 at 44.1 kHz (a rate conversion), 10 ms periods each.
@Suite struct AudioPathAllocationTests {
    static let micFormat = AudioFormat(sampleFormat: .s16, sampleRate: 48_000, channels: 2)
    static let appFormat = AudioFormat(sampleFormat: .f32, sampleRate: 44_100, channels: 2)

    /// The two inputs' periods, made once: every buffer lends the same samples (their values do
    /// not matter here), only the timestamps move on.
    final class Inputs {
        let mic: UnsafeMutableBufferPointer<Int16>
        let app: UnsafeMutableBufferPointer<Float>
        let micPlanes: [Plane]
        let appPlanes: [Plane]
        let micPeriod = 480
        let appPeriod = 441
        let micRate = 48_000.0 * (1 + 500 / 1e6)
        var micFrames: Int64 = 0
        var appFrames: Int64 = 0

        init() {
            mic = .allocate(capacity: micPeriod * 2)
            app = .allocate(capacity: appPeriod * 2)
            for i in 0..<micPeriod * 2 { mic[i] = Int16(truncatingIfNeeded: (i * 337) % 20_000 - 10_000) }
            for i in 0..<appPeriod * 2 { app[i] = Float((i * 211) % 2_000 - 1_000) / 2_000 }
            micPlanes = [Plane(base: UnsafeRawPointer(mic.baseAddress!), count: mic.count * 2, bytesPerRow: mic.count * 2)]
            appPlanes = [Plane(base: UnsafeRawPointer(app.baseAddress!), count: app.count * 4, bytesPerRow: app.count * 4)]
        }

        deinit {
            mic.deallocate()
            app.deallocate()
        }

        /// The next microphone period, stamped with the true time of its first sample.
        func nextMic() -> SampleBuffer {
            let pts = Int64((Double(micFrames) / micRate * 48_000).rounded())
            micFrames += Int64(micPeriod)
            return SampleBuffer(
                format: .audio(AudioPathAllocationTests.micFormat),
                presentationTime: MediaTime(value: pts, timescale: 48_000),
                duration: MediaTime(value: Int64(micPeriod), timescale: 48_000),
                planes: micPlanes, frameCount: micPeriod)
        }

        func nextApp() -> SampleBuffer {
            defer { appFrames += Int64(appPeriod) }
            return SampleBuffer(
                format: .audio(AudioPathAllocationTests.appFormat),
                presentationTime: MediaTime(value: appFrames, timescale: 44_100),
                duration: MediaTime(value: Int64(appPeriod), timescale: 44_100),
                planes: appPlanes, frameCount: appPeriod)
        }
    }

    /// The path under test, as `EncodingHandler.processSampleBuffer` runs it for one audio buffer.
    final class Path {
        let mic: Resampler
        let app: Resampler
        let mixer: AudioMixer
        let encoder: AudioEncoder?
        /// `--audio-tracks separate/both`: each source's own track (a one-input mixer), at a gain.
        let tracks: [SampleBufferType: AudioMixer]
        /// `--mic-denoise`: the microphone through the noise suppressor before the mix.
        let denoiser: NoiseSuppressor?
        private(set) var packets = 0
        /// The microphone's sync offset in samples (`--mic-offset`), added after the resampler.
        let micLead: Int64

        init(encoding: Bool, tracks: Bool = false, denoise: Bool = false, micLead: Int64 = 0) throws {
            denoiser = denoise ? try NoiseSuppressor(sampleRate: 48_000, channelCount: 2) : nil
            self.micLead = micLead
            self.tracks = tracks ? [.audioMic: AudioMixer(channelCount: 2, sampleRate: 48_000, expectedInputs: 1),
                                    .audioApp: AudioMixer(channelCount: 2, sampleRate: 48_000, expectedInputs: 1)] : [:]
            mic = try Resampler(input: AudioPathAllocationTests.micFormat, outputRate: 48_000, outputChannels: 2)
            app = try Resampler(input: AudioPathAllocationTests.appFormat, outputRate: 48_000, outputChannels: 2)
            mixer = AudioMixer(channelCount: 2, sampleRate: 48_000)
            encoder = encoding ? try AudioEncoder(globalHeader: false, logger: Logger(label: "test")) : nil
        }

        func process(_ buffer: borrowing SampleBuffer, from type: SampleBufferType) throws {
            let resampler = type == .audioMic ? mic : app
            let position = buffer.presentationTime.rescaled(to: 48_000).value
            var converted = try resampler.resample(buffer, at: position)
            let lead = type == .audioMic ? micLead : 0
            converted.startSample += lead
            if type == .audioMic, let denoiser {
                try denoiser.denoise(converted) { try deliver($0, from: type, lead: lead) }
            } else {
                try deliver(converted, from: type, lead: lead)
            }
        }

        func deliver(_ converted: PlanarAudio, from type: SampleBufferType, lead: Int64) throws {
            let gain: Float = tracks.isEmpty ? 1 : 0.5
            mixer.append(converted, from: type, gain: gain, lead: lead)
            while let mixed = mixer.mixed() {
                if let encoder { packets += try encoder.encode(mixed).count }
            }
            if let track = tracks[type] {
                track.append(converted, from: type, gain: gain, lead: lead)
                while track.mixed() != nil {}
            }
        }
    }

    /// Runs `warmUp` then `window` periods of both inputs through the path, counting the window.
    /// Prints "own ffmpeg packets" for the parent to read.
    static func count(
        encoding: Bool, tracks: Bool = false, denoise: Bool = false, micLead: Int64 = 0, warmUp: Int = 300, window: Int = 1000
    ) throws {
        AllocationCounter.prepare(countingCaptureThreads: false)
        defer { AllocationCounter.finish() }
        let inputs = Inputs()
        let path = try Path(encoding: encoding, tracks: tracks, denoise: denoise, micLead: micLead)
        var packetsBefore = 0
        for step in 0..<(warmUp + window) {
            if step == warmUp {
                packetsBefore = path.packets
                AllocationCounter.startCounting()
            }
            try path.process(inputs.nextMic(), from: .audioMic)
            try path.process(inputs.nextApp(), from: .audioApp)
        }
        let counts = AllocationCounter.stopCounting()
        print("\(counts.own) \(counts.ffmpeg) \(path.packets - packetsBefore)")
    }

    /// The child's "own ffmpeg packets".
    static func parse(_ output: [UInt8]) -> (own: Int, ffmpeg: Int, packets: Int)? {
        let numbers = String(decoding: output, as: UTF8.self).split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        guard numbers.count == 3 else { return nil }
        return (numbers[0], numbers[1], numbers[2])
    }

    @Test("resampling and mixing two inputs allocate nothing per buffer")
    func resampleAndMixAllocateNothing() async throws {
        let result = try #require(
            await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
                try AudioPathAllocationTests.count(encoding: false)
            })
        let counts = try #require(Self.parse(result.standardOutputContent))
        // Before: 60 000, 30 a buffer (the stages' `[[Float]]`, the mixer's lanes copied on write).
        #expect(counts.own == 0, "allocations in 2000 buffers after the warm-up")
        #expect(counts.ffmpeg == 0, "allocations inside libswresample in 2000 buffers after the warm-up")
    }

    @Test("a volume and a track per source (--audio-tracks both) allocate nothing per buffer")
    func gainAndSourceTracksAllocateNothing() async throws {
        let result = try #require(
            await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
                try AudioPathAllocationTests.count(encoding: false, tracks: true)
            })
        let counts = try #require(Self.parse(result.standardOutputContent))
        #expect(counts.own == 0, "allocations in 2000 buffers after the warm-up")
        #expect(counts.ffmpeg == 0, "allocations inside libswresample in 2000 buffers after the warm-up")
    }

    @Test("noise suppression on the microphone (--mic-denoise) allocates nothing per buffer")
    func denoisingAllocatesNothing() async throws {
        let result = try #require(
            await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
                try AudioPathAllocationTests.count(encoding: false, denoise: true)
            })
        let counts = try #require(Self.parse(result.standardOutputContent))
        #expect(counts.own == 0, "allocations in 2000 buffers after the warm-up")
        #expect(counts.ffmpeg == 0, "allocations inside the libraries in 2000 buffers after the warm-up")
    }

    @Test("a sync offset (the microphone 300 ms late, past the lag limit) allocates nothing per buffer")
    func syncOffsetAllocatesNothing() async throws {
        let result = try #require(
            await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
                try AudioPathAllocationTests.count(encoding: false, tracks: true, micLead: 14_400)
            })
        let counts = try #require(Self.parse(result.standardOutputContent))
        #expect(counts.own == 0, "allocations in 2000 buffers after the warm-up")
        #expect(counts.ffmpeg == 0, "allocations inside libswresample in 2000 buffers after the warm-up")
    }

    @Test("encoding the mix allocates only per AAC packet")
    func encodingAllocatesOnlyPerPacket() async throws {
        let result = try #require(
            await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
                try AudioPathAllocationTests.count(encoding: true)
            })
        let counts = try #require(Self.parse(result.standardOutputContent))
        // 10 s of audio at 48 kHz in frames of 1024.
        #expect(counts.packets > 450)
        // Ours: the packet's `EncodedPacket` and the array `encode` returns it in (before: 66 938
        // for 469 packets, 33 a buffer: the planar arrays of every stage).
        #expect(counts.own <= 2 * counts.packets, "allocations outside FFmpeg for \(counts.packets) packets")
        // libavcodec's own, measured with FFmpeg 5.1 (before: 14, with a new frame each): the
        // AVPackets `receive` asks for (the packet, and the one EAGAIN comes back into), the
        // payload and its reference, the reference avcodec_send_frame takes to the frame's buffer.
        #expect(counts.ffmpeg <= 7 * counts.packets, "allocations inside FFmpeg for \(counts.packets) packets")
    }
}
