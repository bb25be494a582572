import AllocationCounting
import BroadcastKit
import BroadcastMedia
@testable import BroadcastOutputs
import ChildProcesses
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The control page's taps on the session thread (`MonitoredHandler`: `LevelMeters.offer`,
/// `PreviewFrames.offer`) and what is made of them off it: levels in dBFS, JPEG previews.
@Suite struct PageTapsTests {
    /// `frames` of a stereo sine of `amplitude` (full scale 1) as interleaved f32 or s16.
    static func sine(amplitude: Double, frames: Int, format: AudioSampleFormat) -> [UInt8] {
        var bytes: [UInt8] = []
        for i in 0..<frames {
            let v = amplitude * sin(2 * Double.pi * 1000 * Double(i) / 48_000)
            for _ in 0..<2 {
                switch format {
                case .s16: withUnsafeBytes(of: Int16((v * 32767).rounded())) { bytes += $0 }
                default: withUnsafeBytes(of: Float(v)) { bytes += $0 }
                }
            }
        }
        return bytes
    }

    static func audio(_ bytes: [UInt8], format: AudioSampleFormat, frames: Int, _ body: (borrowing SampleBuffer) -> Void) {
        bytes.withUnsafeBytes { raw in
            let buffer = SampleBuffer(
                format: .audio(AudioFormat(sampleFormat: format, sampleRate: 48_000, channels: 2)),
                presentationTime: MediaTime(value: 0, timescale: 48_000), duration: MediaTime(value: Int64(frames), timescale: 48_000),
                planes: [Plane(base: raw.baseAddress!, count: raw.count, bytesPerRow: raw.count)], frameCount: frames)
            body(buffer)
        }
    }

    @Test("a half-scale sine measures -6 dBFS peak and -9 dBFS RMS, in s16 and f32; silence the floor")
    func levelsOfASine() throws {
        let published = Mutex<[[LevelMeters.Level]]>([])
        let meters = LevelMeters { levels in if !levels.isEmpty { published.withLock { $0.append(levels) } } }
        meters.start()
        defer { meters.stop() }
        Self.audio(Self.sine(amplitude: 0.5, frames: 4800, format: .s16), format: .s16, frames: 4800) { meters.offer($0, of: .audioMic) }
        Self.audio(Self.sine(amplitude: 0.5, frames: 4800, format: .f32), format: .f32, frames: 4800) { meters.offer($0, of: .audioApp) }
        let deadline = Date().addingTimeInterval(30)
        while published.withLock({ $0.flatMap { $0 }.count }) < 2 && Date() < deadline { usleep(20_000) }
        let levels = published.withLock { $0.flatMap { $0 } }
        for name in ["audioMic", "audioApp"] {
            let level = try #require(levels.first { $0.name == name }, "no level for \(name): \(levels)")
            #expect(abs(level.peak - -6.02) < 0.1, "\(name) peak \(level.peak)")
            #expect(abs(level.rms - -9.03) < 0.1, "\(name) rms \(level.rms)")
        }
        var meter = LevelMeters.Meter()
        meter.add(0)
        #expect(meter.decibels.peak == LevelMeters.floor && meter.decibels.rms == LevelMeters.floor)
        #expect(meters.chunksLeftOut == 0)
    }

    /// Counted in a process of its own: 2000 audio buffers of two sources, 1000 video frames (no
    /// preview asked) and 1000 mixed track periods through the taps, after a warm-up; the meters'
    /// measuring is counted too (drained on the counting thread, as the meters' thread does).
    static func countTaps() {
        AllocationCounter.prepare(countingCaptureThreads: false)
        defer { AllocationCounter.finish() }
        let meters = LevelMeters { _ in }
        let preview = PreviewFrames()
        let s16 = sine(amplitude: 0.25, frames: 480, format: .s16)
        let f32 = sine(amplitude: 0.25, frames: 480, format: .f32)
        let pixels = [UInt8](repeating: 128, count: 64 * 64 * 3 / 2)
        let chunk = AudioChunk(startSample: 0, channels: [[Float]](repeating: [Float](repeating: 0.25, count: 480), count: 2))
        var scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { scratch.deallocate() }
        let rings = meters.rings
        chunk.withPlanarAudio { track in pixels.withUnsafeBytes { raw in s16.withUnsafeBytes { s16 in f32.withUnsafeBytes { f32 in
            let planes = [
                Plane(base: raw.baseAddress!, count: 64 * 64, bytesPerRow: 64),
                Plane(base: raw.baseAddress! + 64 * 64, count: 32 * 32, bytesPerRow: 32),
                Plane(base: raw.baseAddress! + 64 * 64 + 32 * 32, count: 32 * 32, bytesPerRow: 32),
            ]
            // Made once: the buffers the session would lend (their planes arrays are the caller's).
            let s16Planes = [Plane(base: s16.baseAddress!, count: s16.count, bytesPerRow: s16.count)]
            let f32Planes = [Plane(base: f32.baseAddress!, count: f32.count, bytesPerRow: f32.count)]
            func buffer(_ format: AudioSampleFormat, _ planes: [Plane]) -> SampleBuffer {
                SampleBuffer(
                    format: .audio(AudioFormat(sampleFormat: format, sampleRate: 48_000, channels: 2)),
                    presentationTime: MediaTime(value: 0, timescale: 48_000), duration: MediaTime(value: 480, timescale: 48_000),
                    planes: planes, frameCount: 480)
            }
            for step in 0..<1100 {
                if step == 100 { AllocationCounter.startCounting() }
                meters.offer(buffer(.s16, s16Planes), of: .audioMic)
                meters.offer(buffer(.f32, f32Planes), of: .audioApp)
                meters.offer(track: 0, track)
                let frame = SampleBuffer(
                    format: .video(VideoFormat(pixelFormat: .yuv420p, width: 64, height: 64)),
                    presentationTime: MediaTime(value: Int64(step), timescale: 30), duration: MediaTime(value: 1, timescale: 30), planes: planes)
                preview.offer(frame)
                if step % 10 == 0 {
                    for ring in rings { _ = LevelMeters.measure(ring, scratch: &scratch) }
                }
            }
        } } } }
        let counts = AllocationCounter.stopCounting()
        print("\(counts.own) \(counts.ffmpeg)")
    }

    @Test("the taps allocate nothing per buffer, nor does measuring the levels")
    func tapsAllocateNothing() async throws {
        let result = try #require(
            await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
                PageTapsTests.countTaps()
            })
        let numbers = String(decoding: result.standardOutputContent, as: UTF8.self).split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        #expect(numbers == [0, 0], "allocations (own, ffmpeg) in 1000 steps")
    }

    @Test("a preview is a JPEG of the asked width made from the frame the session offered next")
    func previewIsAJPEGOfTheNextFrame() throws {
        let preview = PreviewFrames()
        #expect(preview.jpeg(width: 640) == .noFrame)
        // A 320x180 frame, left half white, right half black (BT.601 limited range).
        let width = 320, height = 180
        var pixels = [UInt8](repeating: 128, count: width * height * 3 / 2)
        for y in 0..<height { for x in 0..<width { pixels[y * width + x] = x < width / 2 ? 235 : 16 } }
        let stop = StopFlag()
        let session = Thread { [pixels] in
            pixels.withUnsafeBytes { raw in
                let planes = [
                    Plane(base: raw.baseAddress!, count: width * height, bytesPerRow: width),
                    Plane(base: raw.baseAddress! + width * height, count: width * height / 4, bytesPerRow: width / 2),
                    Plane(base: raw.baseAddress! + width * height * 5 / 4, count: width * height / 4, bytesPerRow: width / 2),
                ]
                var n: Int64 = 0
                while !stop.flag.load(ordering: .relaxed) {
                    let frame = SampleBuffer(
                        format: .video(VideoFormat(pixelFormat: .yuv420p, width: width, height: height, colour: .bt601)),
                        presentationTime: MediaTime(value: n, timescale: 30), duration: MediaTime(value: 1, timescale: 30), planes: planes)
                    preview.offer(frame)
                    n += 1
                    usleep(10_000)
                }
            }
        }
        session.start()
        defer { stop.flag.store(true, ordering: .relaxed) }
        // Right after an ask that got no frame a request is answered at once (no picture yet) and
        // leaves an ask open: the session fills it, and a request then gets that frame.
        var answer = preview.jpeg(width: 160)
        for _ in 0..<600 where answer == .noFrame {
            usleep(10_000)
            answer = preview.jpeg(width: 160)
        }
        guard case .jpeg(let jpeg) = answer else { Issue.record("no JPEG"); return }
        #expect(jpeg.starts(with: [0xFF, 0xD8]) && jpeg.suffix(2) == [0xFF, 0xD9])
        // Asked again at once: the cached JPEG, no new encode.
        #expect(preview.jpeg(width: 160) == .jpeg(jpeg))
        #expect(preview.encodes == 1)
        // Later: a new frame, a new encode (the encoder takes a second picture).
        usleep(400_000)
        guard case .jpeg = preview.jpeg(width: 160) else { Issue.record("no second JPEG"); return }
        #expect(preview.encodes == 2)
        // Wider than the frame: the frame's width.
        guard case .jpeg(let full) = preview.jpeg(width: 4000) else { Issue.record("no full-size JPEG"); return }
        for (bytes, expected) in [(jpeg, (160, 90)), (full, (320, 180))] {
            // Decoded by ffmpeg to grey: the size asked, left half white, right half black (the
            // JPEG is full range: limited-range 235 and 16 come out near 255 and 0).
            let gray = try Self.decodeToGray(bytes)
            #expect(gray.width == expected.0 && gray.height == expected.1)
            let row = gray.height / 2
            #expect(gray.pixels[row * gray.width + gray.width / 4] > 240)
            #expect(gray.pixels[row * gray.width + gray.width * 3 / 4] < 15)
        }
    }

    /// Requests that come while one waits for the session's frame (none comes: paused) wait for
    /// the same ask, not one after the other under the cache's lock (K open tabs made each preview
    /// take about K seconds); when the ask ends they all get the last picture (issue 35 item 18).
    /// On a clock the test moves: the ask ends when the test says.
    @Test("requests waiting for a frame share one ask; when none comes they all get the last picture")
    func requestsWaitingForAFrameShareOneAsk() throws {
        let clock = Mutex(ContinuousClock.now)
        let preview = PreviewFrames(now: { clock.withLock { $0 } })
        let width = 64, height = 36
        let pixels = [UInt8](repeating: 128, count: width * height * 3 / 2)
        func offerFrame() {
            pixels.withUnsafeBytes { raw in
                let planes = [
                    Plane(base: raw.baseAddress!, count: width * height, bytesPerRow: width),
                    Plane(base: raw.baseAddress! + width * height, count: width * height / 4, bytesPerRow: width / 2),
                    Plane(base: raw.baseAddress! + width * height * 5 / 4, count: width * height / 4, bytesPerRow: width / 2),
                ]
                preview.offer(SampleBuffer(
                    format: .video(VideoFormat(pixelFormat: .yuv420p, width: width, height: height, colour: .bt601)),
                    presentationTime: MediaTime(value: 0, timescale: 30), duration: MediaTime(value: 1, timescale: 30), planes: planes))
            }
        }
        func waitUntilWaiting(_ count: Int) {
            while preview.asks.waiting < count { usleep(1000) }
        }

        // The first picture: one request, one ask, the frame the session offered.
        let first = PreviewRequests()
        first.start(1, preview)
        waitUntilWaiting(1)
        offerFrame()
        guard case .jpeg(let picture) = first.wait(for: 1)[0] else { Issue.record("no first picture"); return }
        #expect(preview.asks.made == 1)

        // Paused: no frame comes. Five requests after the cached picture is stale wait together.
        clock.withLock { $0 += .seconds(1) }
        let paused = PreviewRequests()
        paused.start(5, preview)
        waitUntilWaiting(5)
        #expect(preview.asks.made == 2, "one ask for all five")
        #expect(paused.answers.withLock { $0.isEmpty }, "answered before the ask ended")
        clock.withLock { $0 += PreviewFrames.frameWait }
        let answers = paused.wait(for: 5)
        #expect(answers == Array(repeating: .jpeg(picture), count: 5), "the last picture for each")
        #expect(preview.asks.made == 2 && preview.encodes == 1)
        // Right after: the last picture at once, an ask left open (nobody waits for it).
        #expect(preview.jpeg(width: 640) == .jpeg(picture))
        #expect(preview.asks.made == 3 && preview.asks.waiting == 0)
        // The session resumes: its next frame fills the open ask and is the next request's picture.
        offerFrame()
        guard case .jpeg = preview.jpeg(width: 640) else { Issue.record("no picture once frames come again"); return }
        #expect(preview.encodes == 2 && preview.asks.made == 3)

        // After a stop the preview forgets it, and answers no picture.
        clock.withLock { $0 += .seconds(1) }
        preview.forget()
        let stopped = PreviewRequests()
        stopped.start(1, preview)
        waitUntilWaiting(1)
        clock.withLock { $0 += PreviewFrames.frameWait }
        #expect(stopped.wait(for: 1) == [.noFrame])
    }

    /// A JPEG decoded by ffmpeg into 8-bit grey, with its size from ffprobe.
    static func decodeToGray(_ jpeg: [UInt8]) throws -> (width: Int, height: Int, pixels: [UInt8]) {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("preview-\(UUID().uuidString).jpg").path
        try Data(jpeg).write(to: URL(fileURLWithPath: path))
        defer { try? FileManager.default.removeItem(atPath: path) }
        func output(_ tool: String, _ arguments: [String]) throws -> Data {
            try ChildProcess.run(tool, arguments).stdout
        }
        let size = String(decoding: try output("/usr/bin/ffprobe", ["-v", "error", "-show_entries", "stream=width,height", "-of", "csv=p=0:s=x", path]), as: UTF8.self)
        let parts = size.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: "x").compactMap { Int($0) }
        let pixels = try output("/usr/bin/ffmpeg", ["-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "gray", "-"])
        return (parts.first ?? 0, parts.last ?? 0, Array(pixels))
    }
}

final class StopFlag: Sendable {
    let flag = Atomic<Bool>(false)
}

/// Preview requests on threads of their own; their answers once all are in.
final class PreviewRequests: @unchecked Sendable {
    let answers = Mutex<[PreviewFrames.Answer]>([])

    func start(_ count: Int, _ preview: PreviewFrames) {
        for _ in 0..<count {
            Thread { [self] in
                let answer = preview.jpeg(width: 640)
                answers.withLock { $0.append(answer) }
            }.start()
        }
    }

    func wait(for count: Int) -> [PreviewFrames.Answer] {
        while answers.withLock({ $0.count }) < count { usleep(1000) }
        return answers.withLock { $0 }
    }
}
