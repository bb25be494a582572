import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Foundation
import Testing

@Suite("Recording through EncodingHandler", .serialized)
struct RecordingTests {
    let media = TestMedia()

    func configuration(_ recordings: [String], video: Bool = true, audio: Bool = true) -> EncodingConfiguration {
        EncodingConfiguration(
            video: video ? VideoEncoderSettings(width: media.width, height: media.height, bitrate: 800_000) : nil,
            audio: audio ? AudioEncoderSettings() : nil,
            recordings: recordings
        )
    }

    @Test("10 s at 30 fps to .mp4 .mkv .mov .ts .flv from one encode")
    func everyContainerFromOneEncode() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let files = Recording.supportedExtensions.map { directory.file("ten-seconds.\($0)") }
        let handler = EncodingHandler(configuration: configuration(files), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: 10)
        handler.broadcastFinished()
        #expect(handler.failures.isEmpty, "\(handler.failures)")

        let statistics = handler.statistics()
        #expect(statistics.videoFramesEncoded == 300)
        #expect(statistics.keyframesEncoded >= 5)
        #expect(statistics.audioFramesEncoded >= 10 * 48_000 / 1024)
        #expect(statistics.bytesWritten > 0)
        #expect(statistics.bitrate > 0)

        let frameDuration = 1.0 / 30
        for file in files {
            let probe = try ProbedFile(file)
            #expect(probe.video?.codec == "h264", "\(file)")
            #expect(probe.audio?.codec == "aac", "\(file)")
            #expect(probe.video?.width == media.width && probe.video?.height == media.height, "\(file)")
            let frames = probe.video?.frames ?? 0
            #expect(abs(frames - 300) <= 1, "\(file): \(frames) frames")
            let duration = probe.duration ?? 0
            #expect(abs(duration - 10) <= frameDuration, "\(file): duration \(duration)")
            let errors = try decodeErrors(file)
            #expect(errors.isEmpty, "\(file): \(errors)")
        }
        #expect(directory.contents().sorted() == files.map { URL(fileURLWithPath: $0).lastPathComponent }.sorted())
    }

    @Test("a cleanly stopped MP4 and MOV are regular files with the index first", arguments: ["mp4", "mov"])
    func finalizedWithFaststart(ext: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("faststart.\(ext)")
        let handler = EncodingHandler(configuration: configuration([file]), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: 3)

        // While recording: fragmented.
        let recordingBoxes = try topLevelBoxes(file)
        #expect(recordingBoxes.contains("moof"), "\(recordingBoxes)")

        handler.broadcastFinished()
        #expect(handler.failures.isEmpty, "\(handler.failures)")
        let boxes = try topLevelBoxes(file)
        let moov = try #require(boxes.firstIndex(of: "moov"), "\(boxes)")
        let mdat = try #require(boxes.firstIndex(of: "mdat"), "\(boxes)")
        #expect(moov < mdat, "\(boxes)")
        #expect(!boxes.contains("moof") && !boxes.contains("mfra"), "\(boxes)")
        #expect(directory.contents() == ["faststart.\(ext)"], "temporary files left: \(directory.contents())")
        let probe = try ProbedFile(file)
        #expect(abs((probe.video?.frames ?? 0) - 90) <= 1)
        #expect(try decodeErrors(file).isEmpty)
    }

    @Test(
        "a recording cut off without a clean stop plays up to about 2 s before the cut",
        arguments: ["mp4", "mkv", "ts", "flv"])
    func interruptedRecordingPlays(ext: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("killed.\(ext)")
        let handler = EncodingHandler(configuration: configuration([file]), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: 6)
        // What is on disk now is what a SIGKILL would leave: copy it before finishing.
        let copy = directory.file("copy.\(ext)")
        try FileManager.default.copyItem(atPath: file, toPath: copy)
        handler.broadcastFinished()

        let probe = try ProbedFile(copy)
        let frames = probe.video?.frames ?? 0
        #expect(frames >= (6 - 2) * 30 - 1, "\(ext): only \(frames) frames decodable after an interruption at 6 s")
        #expect(probe.audio?.codec == "aac")
    }

    @Test("audio and video line up: white frames and beeps within one frame", arguments: ["mp4", "mkv", "ts", "flv"])
    func audioVideoSync(ext: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("sync.\(ext)")
        let handler = EncodingHandler(configuration: configuration([file]), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: 5)
        handler.broadcastFinished()

        let (white, sounds) = try markers(file)
        // silencedetect also reports the end of the file as the end of a silence: keep beeps only.
        let beeps = sounds.filter { $0 < 4.5 + (white.first ?? 0) }
        // Whole seconds 1...4 have a silence before their beep; 0 starts with one.
        #expect(white.count == 5, "white frames at \(white)")
        #expect(beeps.count >= 4, "beeps at \(beeps)")
        for beep in beeps {
            let nearest = white.min { abs($0 - beep) < abs($1 - beep) } ?? .infinity
            #expect(abs(nearest - beep) <= 1.0 / 30, "\(ext): beep at \(beep), white frame at \(nearest)")
        }
    }

    @Test("video only and audio only", arguments: [(true, false), (false, true)])
    func singleStream(video: Bool, audio: Bool) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let files = [directory.file("single.mp4"), directory.file("single.mkv")]
        let handler = EncodingHandler(
            configuration: configuration(files, video: video, audio: audio), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        // Buffers of the absent type are ignored.
        try media.feed(handler, seconds: 2, video: true, audio: [.audioMic])
        handler.broadcastFinished()
        #expect(handler.failures.isEmpty, "\(handler.failures)")
        for file in files {
            let probe = try ProbedFile(file)
            #expect(probe.streams.count == 1, "\(file): \(probe.streams.map(\.codec))")
            #expect((probe.video != nil) == video && (probe.audio != nil) == audio, "\(file)")
            #expect(abs((probe.duration ?? 0) - 2) <= 1.0 / 30, "\(file): duration \(probe.duration ?? 0)")
            #expect(try decodeErrors(file).isEmpty, "\(file)")
        }
    }

    @Test("microphone and application audio are mixed into one track")
    func micAndAppMixed() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("mixed.mkv")
        let handler = EncodingHandler(configuration: configuration([file]), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: 3, audio: [.audioMic, .audioApp])
        handler.broadcastFinished()
        let probe = try ProbedFile(file)
        #expect(probe.streams.filter { $0.type == "audio" }.count == 1)
        #expect(abs((probe.audio?.duration ?? probe.duration ?? 0) - 3) <= 0.05)
        // Both inputs beep at the same instants: the mix still has its beeps there.
        let beeps = try soundStarts(file).filter { $0 < 2.5 }
        #expect(beeps.count == 2, "\(beeps)")
        for beep in beeps { #expect(abs(beep - beep.rounded()) <= 1.0 / 30, "\(beep)") }
    }

    @Test("other pixel formats and sizes are converted")
    func convertsPixelFormats() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.file("bgra.mkv")
        let handler = EncodingHandler(
            configuration: EncodingConfiguration(
                video: VideoEncoderSettings(width: 160, height: 120, bitrate: 300_000),
                audio: nil,
                recordings: [file]
            ),
            logger: quietLogger()
        )
        try handler.broadcastStarted(setupInfo: SetupInfo())
        let (width, height) = (200, 150)
        var pixels = [UInt8](repeating: 0, count: width * height * 4)
        for frame in 0..<30 {
            for i in stride(from: 0, to: pixels.count, by: 4) {
                pixels[i] = UInt8(frame * 8)
                pixels[i + 1] = 100
                pixels[i + 2] = 200
                pixels[i + 3] = 255
            }
            try pixels.withUnsafeBytes { bytes in
                let buffer = SampleBuffer(
                    format: .video(VideoFormat(pixelFormat: .bgra, width: width, height: height)),
                    presentationTime: MediaTime(value: Int64(frame), timescale: 30),
                    duration: MediaTime(value: 1, timescale: 30),
                    planes: [Plane(base: bytes.baseAddress!, count: bytes.count, bytesPerRow: width * 4)]
                )
                try handler.processSampleBuffer(buffer, of: .video)
            }
        }
        handler.broadcastFinished()
        let probe = try ProbedFile(file)
        #expect(probe.video?.width == 160 && probe.video?.height == 120)
        #expect(probe.video?.frames == 30)
    }

    @Test("an unsupported extension throws, naming it and the accepted ones, and leaves no file")
    func badExtension() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let good = directory.file("good.mkv")
        let bad = directory.file("clip.avi")
        let handler = EncodingHandler(configuration: configuration([good, bad]), logger: quietLogger())
        let error = try #require(throws: BroadcastError.self) { try handler.broadcastStarted(setupInfo: SetupInfo()) }
        #expect(error.code == .invalidArgument)
        #expect(
            error.message.contains(".avi") && error.message.contains(".mp4") && error.message.contains(".mkv"),
            "\(error)")
        #expect(directory.contents().isEmpty, "\(directory.contents())")
        #expect(throws: BroadcastError.self) { try Recording.validate(path: directory.file("noextension")) }
    }

    @Test("an unwritable path throws and leaves no file")
    func unwritablePath() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let good = directory.file("good.mp4")
        let missing = directory.file("no/such/dir/out.mp4")
        // A regular file where a directory should be: unwritable even for root.
        try Data().write(to: URL(fileURLWithPath: directory.file("plain")))
        let underFile = directory.file("plain/out.mkv")
        for path in [missing, underFile] {
            let handler = EncodingHandler(configuration: configuration([good, path]), logger: quietLogger())
            let error = try #require(throws: BroadcastError.self) {
                try handler.broadcastStarted(setupInfo: SetupInfo())
            }
            #expect(error.message.contains(path), "\(error)")
            #expect(directory.contents() == ["plain"], "\(directory.contents())")
        }
        #expect(throws: BroadcastError.self) { try Recording.validate(path: directory.path + "/") }
    }
}
