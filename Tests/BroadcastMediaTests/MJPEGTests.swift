import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Foundation
import Testing

/// MJPEG capture as a webcam delivers it: real JPEGs (made by ffmpeg's mjpeg encoder) in
/// `.mjpeg` sample buffers, decoded and converted by the video encoder.
@Suite("MJPEG frames")
struct MJPEGTests {
    /// A JPEG ffmpeg encodes from `filter` (one frame), in full-range `pixelFormat`.
    static func jpeg(_ filter: String, pixelFormat: String, in directory: TemporaryDirectory) throws -> [UInt8] {
        let path = directory.file("\(pixelFormat)-\(UUID().uuidString).jpg")
        let result = try run([
            "ffmpeg", "-nostdin", "-v", "error", "-y", "-filter_complex", filter, "-frames:v", "1",
            "-c:v", "mjpeg", "-pix_fmt", pixelFormat, "-q:v", "2", "-f", "image2", path,
        ])
        guard result.status == 0 else { throw ProbeError(message: "ffmpeg could not make a JPEG: \(result.standardError)") }
        return [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    /// Red on the left half, blue on the right.
    static func redBlue(width: Int, height: Int) -> String {
        "color=c=red:s=\(width / 2)x\(height):d=1[l];color=c=blue:s=\(width / 2)x\(height):d=1[r];[l][r]hstack"
    }

    static func withMJPEGBuffer<R>(
        _ bytes: [UInt8], width: Int, height: Int, frame: Int, _ body: (borrowing SampleBuffer) throws -> R
    ) rethrows -> R {
        try bytes.withUnsafeBytes { raw in
            // A capture buffer is as long as the driver says it filled (bytesused), nothing more.
            let buffer = SampleBuffer(
                format: .video(VideoFormat(pixelFormat: .mjpeg, width: width, height: height)),
                presentationTime: MediaTime(value: Int64(frame), timescale: 30),
                duration: MediaTime(value: 1, timescale: 30),
                planes: [Plane(base: raw.baseAddress!, count: raw.count, bytesPerRow: raw.count)]
            )
            return try body(buffer)
        }
    }

    /// Every yuv420p frame of a file, as ffmpeg decodes it (no conversion: the stream is yuv420p).
    /// `pixelFormat` yuvj420p for a full-range stream (libavcodec decodes it as yuvj420p, and
    /// asking for yuv420p would squeeze it into video range).
    static func decodedFrames(_ path: String, width: Int, height: Int, pixelFormat: String = "yuv420p") throws -> [[UInt8]] {
        let raw = path + ".yuv"
        let result = try run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", path, "-f", "rawvideo", "-pix_fmt", pixelFormat, raw])
        guard result.status == 0 else { throw ProbeError(message: "ffmpeg could not decode \(path): \(result.standardError)") }
        let data = [UInt8](try Data(contentsOf: URL(fileURLWithPath: raw)))
        let frameSize = width * height * 3 / 2
        #expect(data.count % frameSize == 0, "\(data.count) bytes is not a whole number of \(width)x\(height) frames")
        return stride(from: 0, to: data.count - frameSize + 1, by: frameSize).map { Array(data[$0..<$0 + frameSize]) }
    }

    /// Y, U and V at pixel (x, y) of a yuv420p frame.
    static func yuv(_ frame: [UInt8], width: Int, height: Int, x: Int, y: Int) -> [Int] {
        let lumaSize = width * height
        let chromaWidth = width / 2
        let chroma = (y / 2) * chromaWidth + x / 2
        return [Int(frame[y * width + x]), Int(frame[lumaSize + chroma]), Int(frame[lumaSize + lumaSize / 4 + chroma])]
    }

    @Test(
        "JPEGs are decoded, converted from full to video range, and encoded",
        arguments: [("yuvj420p", 320, 240), ("yuvj422p", 320, 240), ("yuvj422p", 160, 120)]
    )
    func decodedAndEncoded(pixelFormat: String, outputWidth: Int, outputHeight: Int) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (width, height) = (320, 240)
        let jpeg = try Self.jpeg(Self.redBlue(width: width, height: height), pixelFormat: pixelFormat, in: directory)
        let file = directory.file("mjpeg.mkv")
        let handler = EncodingHandler(
            configuration: EncodingConfiguration(
                video: VideoEncoderSettings(width: outputWidth, height: outputHeight, bitrate: 500_000),
                audio: nil,
                recordings: [file]
            ),
            logger: quietLogger()
        )
        try handler.broadcastStarted(setupInfo: SetupInfo())
        let frameCount = 20
        for frame in 0..<frameCount {
            try Self.withMJPEGBuffer(jpeg, width: width, height: height, frame: frame) { buffer in
                try handler.processSampleBuffer(buffer, of: .video)
            }
        }
        handler.broadcastFinished()

        let probe = try ProbedFile(file)
        #expect(probe.video?.codec == "h264")
        #expect(probe.video?.width == outputWidth && probe.video?.height == outputHeight)
        let frames = try Self.decodedFrames(file, width: outputWidth, height: outputHeight)
        #expect(frames.count == frameCount)
        // BT.601 video range: red is Y 81 U 90 V 240, blue Y 41 U 240 V 110. Left as the JPEG has
        // it (full range), they would be Y 76 U 85 V 255 and Y 29 U 255 V 107.
        for index in [0, frameCount / 2, frameCount - 1] where index < frames.count {
            let red = Self.yuv(frames[index], width: outputWidth, height: outputHeight, x: outputWidth / 4, y: outputHeight / 2)
            let blue = Self.yuv(frames[index], width: outputWidth, height: outputHeight, x: outputWidth * 3 / 4, y: outputHeight / 2)
            for (got, want) in zip(red, [81, 90, 240]) { #expect(abs(got - want) <= 4, "frame \(index) red: YUV \(red)") }
            for (got, want) in zip(blue, [41, 240, 110]) { #expect(abs(got - want) <= 4, "frame \(index) blue: YUV \(blue)") }
        }
    }

    @Test("a truncated or broken JPEG is dropped and counted, and the frames around it are encoded")
    func damagedFramesAreDropped() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (width, height) = (320, 240)
        // A busy picture, so half the file cuts the scan data (a JPEG of solid colours is tiny).
        let good = try Self.jpeg("testsrc2=s=\(width)x\(height):d=1", pixelFormat: "yuvj422p", in: directory)
        #expect(good.count > 4000, "\(good.count) bytes")
        let damaged: [[UInt8]] = [
            Array(good.prefix(good.count / 2)),  // cut in the middle of the scan, as a webcam does
            Array(good.prefix(300)),  // cut in the headers
            [UInt8](repeating: 0, count: 1000),  // not a JPEG at all
        ]
        let encoder = try VideoEncoder(
            settings: VideoEncoderSettings(width: width, height: height),
            globalHeader: false,
            logger: quietLogger()
        )
        var packets = 0
        let sequence = [good, damaged[0], good, damaged[1], good, damaged[2], good]
        for (index, bytes) in sequence.enumerated() {
            packets += try Self.withMJPEGBuffer(bytes, width: width, height: height, frame: index) { buffer in
                try encoder.encode(buffer).count
            }
        }
        packets += try encoder.flush().count
        #expect(encoder.undecodableFrames == 3)
        #expect(encoder.framesEncoded == 4)
        #expect(packets == 4)
        #expect(encoder.droppedFrames == 0)
    }

    @Test("the handler's statistics count damaged JPEGs (the status line and the daemon's status show them)")
    func damagedFramesAreCountedByTheHandler() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (width, height) = (320, 240)
        let good = try Self.jpeg("testsrc2=s=\(width)x\(height):d=1", pixelFormat: "yuvj420p", in: directory)
        let handler = EncodingHandler(
            configuration: EncodingConfiguration(
                video: VideoEncoderSettings(width: width, height: height, bitrate: 500_000),
                audio: nil,
                recordings: [directory.file("damaged.mkv")]
            ),
            logger: quietLogger()
        )
        try handler.broadcastStarted(setupInfo: SetupInfo())
        let sequence = [good, Array(good.prefix(good.count / 2)), good, Array(good.prefix(200)), good]
        for (index, bytes) in sequence.enumerated() {
            try Self.withMJPEGBuffer(bytes, width: width, height: height, frame: index) { buffer in
                try handler.processSampleBuffer(buffer, of: .video)
            }
        }
        #expect(handler.statistics().undecodableFrames == 2)
        handler.broadcastFinished()
        #expect(handler.statistics().videoFramesEncoded == 3)
        #expect(handler.statistics().undecodableFrames == 2)
    }
}

/// An MJPEG camera's pictures pass through with their own colour: full-range BT.601, kept full
/// range and tagged so, at an HD size that would otherwise be tagged BT.709.
@Suite("MJPEG colour") struct MJPEGColourTests {
    @Test func jpegColourIsKeptAndTagged() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (width, height) = (1280, 720)
        let jpeg = try MJPEGTests.jpeg(MJPEGTests.redBlue(width: width, height: height), pixelFormat: "yuvj422p", in: directory)
        let file = directory.file("mjpeg.mkv")
        var video = VideoEncoderSettings(width: width, height: height, bitrate: 2_000_000)
        video.colour = .jpeg
        let handler = EncodingHandler(
            configuration: EncodingConfiguration(video: video, audio: nil, recordings: [file]), logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        for frame in 0..<10 {
            try MJPEGTests.withMJPEGBuffer(jpeg, width: width, height: height, frame: frame) { buffer in
                try handler.processSampleBuffer(buffer, of: .video)
            }
        }
        handler.broadcastFinished()

        let probe = try run([
            "ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
            "stream=color_space,color_primaries,color_transfer,color_range", "-of", "default=nw=1", file,
        ])
        #expect(probe.standardOutput.contains("color_space=smpte170m"), "\(probe.standardOutput)")
        #expect(probe.standardOutput.contains("color_range=pc"), "\(probe.standardOutput)")
        #expect(probe.standardOutput.contains("color_primaries=bt709"), "\(probe.standardOutput)")
        #expect(probe.standardOutput.contains("color_transfer=iec61966-2-1"), "\(probe.standardOutput)")
        // Full range kept: red is Y 76 U 85 V 255, blue Y 29 U 255 V 107 (the JPEG's own values);
        // compressed to video range they would be Y 81 U 90 V 240 and Y 41 U 240 V 110.
        let frames = try MJPEGTests.decodedFrames(file, width: width, height: height, pixelFormat: "yuvj420p")
        let last = try #require(frames.last)
        let red = MJPEGTests.yuv(last, width: width, height: height, x: width / 4, y: height / 2)
        let blue = MJPEGTests.yuv(last, width: width, height: height, x: width * 3 / 4, y: height / 2)
        for (got, want) in zip(red, [76, 85, 255]) { #expect(abs(got - want) <= 3, "red: YUV \(red)") }
        for (got, want) in zip(blue, [29, 255, 107]) { #expect(abs(got - want) <= 3, "blue: YUV \(blue)") }
    }
}
