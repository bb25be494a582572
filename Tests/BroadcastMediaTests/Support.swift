import BroadcastKit
import BroadcastOutputs
import ChildProcesses
import Foundation
import Logging

/// Synthetic media with markers whose times the tests can find again in the encoded file: a
/// white video frame at every whole second and a 50 ms 1 kHz beep at every whole second.
struct TestMedia {
    var width = 320
    var height = 240
    var framesPerSecond = 30
    var sampleRate = 48_000
    var audioBufferFrames = 960

    /// A yuv420p frame: a dark background with a moving grey block; white at each whole second.
    func videoPlanes(frame index: Int) -> [[UInt8]] {
        let white = index % framesPerSecond == 0
        var y = [UInt8](repeating: white ? 235 : 40, count: width * height)
        if !white {
            let x0 = (index * 4) % (width - 32)
            for row in 40..<72 { for col in x0..<(x0 + 32) { y[row * width + col] = 160 } }
        }
        let chroma = [UInt8](repeating: 128, count: (width / 2) * (height / 2))
        return [y, chroma, chroma]
    }

    /// Interleaved s16 stereo; a beep where the sample index is within 50 ms after a whole second.
    func audioSamples(startingAt start: Int, count: Int, amplitude: Double = 0.5) -> [Int16] {
        var samples = [Int16](repeating: 0, count: count * 2)
        for i in 0..<count {
            let n = start + i
            if n % sampleRate < sampleRate / 20 {
                let value = Int16(
                    amplitude * 32767 * sin(2 * Double.pi * 1000 * Double(n % sampleRate) / Double(sampleRate)))
                samples[2 * i] = value
                samples[2 * i + 1] = value
            }
        }
        return samples
    }

    /// Calls `handler` with `seconds` of media in presentation-time order, as a session would.
    /// `stopAfter`: return without finishing after that many seconds (a killed recording).
    func feed(
        _ handler: any BroadcastSampleHandler,
        seconds: Double,
        video: Bool = true,
        audio: [SampleBufferType] = [.audioMic]
    ) throws {
        let videoFrames = video ? Int(seconds * Double(framesPerSecond)) : 0
        let audioBuffers = audio.isEmpty ? 0 : Int((seconds * Double(sampleRate)).rounded(.up)) / audioBufferFrames
        var nextVideo = 0
        var nextAudio = 0
        while nextVideo < videoFrames || nextAudio < audioBuffers {
            let videoTime = nextVideo < videoFrames ? Double(nextVideo) / Double(framesPerSecond) : .infinity
            let audioTime =
                nextAudio < audioBuffers ? Double(nextAudio * audioBufferFrames) / Double(sampleRate) : .infinity
            if videoTime <= audioTime {
                try deliverVideo(nextVideo, to: handler)
                nextVideo += 1
            } else {
                for type in audio { try deliverAudio(nextAudio, type: type, to: handler) }
                nextAudio += 1
            }
        }
    }

    func deliverVideo(_ index: Int, to handler: any BroadcastSampleHandler) throws {
        let planes = videoPlanes(frame: index)
        try planes[0].withUnsafeBytes { y in
            try planes[1].withUnsafeBytes { u in
                try planes[2].withUnsafeBytes { v in
                    let buffer = SampleBuffer(
                        format: .video(VideoFormat(pixelFormat: .yuv420p, width: width, height: height)),
                        presentationTime: MediaTime(value: Int64(index), timeScale: framesPerSecond),
                        duration: MediaTime(value: 1, timescale: Int32(framesPerSecond)),
                        planes: [
                            Plane(base: y.baseAddress!, count: y.count, bytesPerRow: width),
                            Plane(base: u.baseAddress!, count: u.count, bytesPerRow: width / 2),
                            Plane(base: v.baseAddress!, count: v.count, bytesPerRow: width / 2),
                        ]
                    )
                    try handler.processSampleBuffer(buffer, of: .video)
                }
            }
        }
    }

    func deliverAudio(_ index: Int, type: SampleBufferType, to handler: any BroadcastSampleHandler) throws {
        let start = index * audioBufferFrames
        let samples = audioSamples(startingAt: start, count: audioBufferFrames)
        try samples.withUnsafeBytes { bytes in
            let buffer = SampleBuffer(
                format: .audio(AudioFormat(sampleFormat: .s16, sampleRate: sampleRate, channels: 2)),
                presentationTime: MediaTime(value: Int64(start), timescale: Int32(sampleRate)),
                duration: MediaTime(value: Int64(audioBufferFrames), timescale: Int32(sampleRate)),
                planes: [Plane(base: bytes.baseAddress!, count: bytes.count, bytesPerRow: bytes.count)],
                frameCount: audioBufferFrames
            )
            try handler.processSampleBuffer(buffer, of: type)
        }
    }
}

extension MediaTime {
    init(value: Int64, timeScale: Int) { self.init(value: value, timescale: Int32(timeScale)) }
}

/// A fresh directory under the system temp directory, removed by `remove()`.
struct TemporaryDirectory {
    let path: String

    init() throws {
        path = NSTemporaryDirectory() + "broadcast-media-tests-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    func file(_ name: String) -> String { path + "/" + name }
    func remove() { try? FileManager.default.removeItem(atPath: path) }
    func contents() -> [String] { (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [] }
}

struct ProcessResult {
    var status: Int32
    var standardOutput: String
    var standardError: String
}

/// Runs a command found on PATH and collects its output.
func run(_ arguments: [String]) throws -> ProcessResult {
    let finished = try ChildProcess.run("/usr/bin/env", arguments)
    return ProcessResult(status: finished.status, standardOutput: finished.output, standardError: finished.errors)
}

/// What ffprobe says about a file (frames counted by decoding).
struct ProbedFile {
    struct Stream {
        var type: String
        var codec: String
        var width: Int?
        var height: Int?
        var frames: Int?
        var duration: Double?
    }

    var formatName: String
    var duration: Double?
    var streams: [Stream]

    init(_ path: String) throws {
        let result = try run([
            "ffprobe", "-v", "error", "-count_frames",
            "-show_entries",
            "stream=codec_type,codec_name,width,height,nb_read_frames,duration:format=format_name,duration",
            "-of", "json", path,
        ])
        guard result.status == 0,
            let json = try JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8)) as? [String: Any]
        else {
            throw ProbeError(message: "ffprobe \(path) failed: \(result.standardError)")
        }
        let format = json["format"] as? [String: Any] ?? [:]
        formatName = format["format_name"] as? String ?? ""
        duration = (format["duration"] as? String).flatMap(Double.init)
        streams = (json["streams"] as? [[String: Any]] ?? []).map { s in
            Stream(
                type: s["codec_type"] as? String ?? "",
                codec: s["codec_name"] as? String ?? "",
                width: s["width"] as? Int,
                height: s["height"] as? Int,
                frames: (s["nb_read_frames"] as? String).flatMap(Int.init),
                duration: (s["duration"] as? String).flatMap(Double.init)
            )
        }
    }

    var video: Stream? { streams.first { $0.type == "video" } }
    var audio: Stream? { streams.first { $0.type == "audio" } }
}

struct ProbeError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

/// `ffmpeg -v error -i path -f null -`: what the decoders complain about (empty: clean).
func decodeErrors(_ path: String) throws -> String {
    let result = try run(["ffmpeg", "-nostdin", "-v", "error", "-i", path, "-f", "null", "-"])
    return result.status == 0 ? result.standardError : "exit \(result.status): \(result.standardError)"
}

/// Top-level box types of an ISO BMFF (MP4/MOV) file, in order.
func topLevelBoxes(_ path: String) throws -> [String] {
    let data = try Data(contentsOf: URL(fileURLWithPath: path))
    var boxes: [String] = []
    var offset = 0
    while offset + 8 <= data.count {
        var size = data[offset..<offset + 4].reduce(0) { $0 << 8 | Int($1) }
        let type = String(decoding: data[offset + 4..<offset + 8], as: UTF8.self)
        if size == 1, offset + 16 <= data.count {
            size = data[offset + 8..<offset + 16].reduce(0) { $0 << 8 | Int($1) }
        } else if size == 0 {
            size = data.count - offset
        }
        guard size >= 8 else { break }
        boxes.append(type)
        offset += size
    }
    return boxes
}

/// Times (seconds) at which white frames begin (luma average above 200 after a darker frame) and
/// at which sound begins after silence (silencedetect's silence_end), measured in one ffmpeg run so
/// both use the same timestamp offset.
func markers(_ path: String, audioTrack: Int = 0) throws -> (whiteFrames: [Double], soundStarts: [Double]) {
    let result = try run([
        "ffmpeg", "-nostdin", "-nostats", "-copyts", "-i", path,
        "-filter_complex",
        "[0:v:0]signalstats,metadata=mode=print:key=lavfi.signalstats.YAVG[v];[0:a:\(audioTrack)]silencedetect=noise=-30dB:d=0.1[a]",
        "-map", "[v]", "-f", "null", "-", "-map", "[a]", "-f", "null", "-",
    ])
    var starts: [Double] = []
    var sounds: [Double] = []
    var time: Double?
    var wasWhite = false
    for line in result.standardError.split(separator: "\n") {
        if let range = line.range(of: "pts_time:") {
            time = Double(line[range.upperBound...].split(separator: " ").first ?? "")
        } else if let range = line.range(of: "lavfi.signalstats.YAVG=") {
            let white = (Double(line[range.upperBound...]) ?? 0) > 200
            if white, !wasWhite, let time { starts.append(time) }
            wasWhite = white
        } else if let range = line.range(of: "silence_end: ") {
            if let t = Double(line[range.upperBound...].split(separator: " ").first ?? "") { sounds.append(t) }
        }
    }
    return (starts, sounds)
}

/// Times (seconds) at which sound begins after silence.
func soundStarts(_ path: String) throws -> [Double] {
    let result = try run([
        "ffmpeg", "-nostdin", "-nostats", "-i", path, "-map", "0:a:0",
        "-af", "silencedetect=noise=-30dB:d=0.1", "-f", "null", "-",
    ])
    return result.standardError.split(separator: "\n").compactMap { line in
        guard let range = line.range(of: "silence_end: ") else { return nil }
        return Double(line[range.upperBound...].split(separator: " ").first ?? "")
    }
}

/// A logger that keeps quiet below warnings, so test output stays readable.
func quietLogger() -> Logger {
    var logger = Logger(label: "broadcast.media.tests")
    logger.logLevel = .warning
    return logger
}
