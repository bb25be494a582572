import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import ChildProcesses
import Foundation
import Testing

/// Finalizing a fragmented MP4/MOV (the streaming rewrite in MP4Defragmenter): the regular file
/// holds exactly the fragmented file's packets, with its index in front.
@Suite(.serialized) struct FinalizeTests {
    let media = TestMedia()

    /// A complete fragmented recording, as `Recording` writes while recording: recorded through a
    /// FIFO (written as a stream, so never finalized) and caught by `cat`.
    func fragmentedRecording(in directory: TemporaryDirectory, ext: String, tune: String?, seconds: Double) throws -> String {
        let fifo = directory.file("pipe.\(ext)")
        #expect(mkfifo(fifo, 0o644) == 0)
        let caught = directory.file("fragmented.\(ext)")
        let reader = try ChildProcess("/bin/sh", ["-c", "cat \"$0\" > \"$1\"", fifo, caught])
        let handler = EncodingHandler(
            configuration: EncodingConfiguration(
                video: VideoEncoderSettings(width: media.width, height: media.height, bitrate: 800_000, tune: tune),
                audio: AudioEncoderSettings(),
                recordings: [fifo]),
            logger: quietLogger())
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: seconds)
        handler.broadcastFinished()
        reader.waitUntilExit()
        #expect(handler.failures.isEmpty, "\(handler.failures)")
        unlink(fifo)
        return caught
    }

    /// Every packet (stream, pts, dts, size, keyframe flag) in file order per stream. (Durations are left out: the fragmented demuxer reports them its own way.)
    func packets(_ path: String) throws -> [String] {
        let r = try run([
            "ffprobe", "-v", "error", "-show_entries", "packet=stream_index,pts,dts,size,flags", "-of", "csv=p=0", path,
        ])
        #expect(r.status == 0, "\(r.standardError)")
        let lines = r.standardOutput.split(separator: "\n").map(String.init)
        // ffprobe lists packets in file order; the two files interleave the streams differently.
        return lines.filter { $0.hasPrefix("0,") } + lines.filter { $0.hasPrefix("1,") }
    }

    func topLevelBoxes(_ path: String) throws -> [String] {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        var boxes: [String] = []
        var offset = 0
        while offset + 8 <= data.count {
            let size = Int(data[offset]) << 24 | Int(data[offset + 1]) << 16 | Int(data[offset + 2]) << 8 | Int(data[offset + 3])
            boxes.append(String(decoding: data[(offset + 4)..<(offset + 8)], as: UTF8.self))
            guard size >= 8 else { break }
            offset += size
        }
        return boxes
    }

    @Test(arguments: [("mp4", "zerolatency"), ("mp4", "film"), ("mov", "zerolatency")] as [(String, String)])
    func finalizedFileHoldsExactlyTheFragmentedPackets(ext: String, tune: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fragmented = try fragmentedRecording(in: directory, ext: ext, tune: tune, seconds: 7)
        #expect(try topLevelBoxes(fragmented).contains("moof"))
        let copy = directory.file("final.\(ext)")
        try FileManager.default.copyItem(atPath: fragmented, toPath: copy)
        try Recording.finalize(path: copy, container: ext == "mp4" ? .mp4 : .mov, logger: quietLogger())

        #expect(try topLevelBoxes(copy) == ["ftyp", "moov", "mdat"])
        let before = try packets(fragmented)
        let after = try packets(copy)
        #expect(before.count > 7 * 30 && before == after, "\(before.count) packets before, \(after.count) after")
        if before != after {
            for (a, b) in zip(before, after) where a != b {
                Issue.record("first difference: \(a) became \(b)")
                break
            }
        }
        let decode = try run(["ffmpeg", "-nostdin", "-v", "error", "-i", copy, "-f", "null", "-"])
        #expect(decode.status == 0 && decode.standardError.isEmpty, "\(decode.standardError)")
        #expect(directory.contents().sorted() == ["final.\(ext)", "fragmented.\(ext)"], "\(directory.contents())")
    }

    /// Damaged files (bytes of the index boxes overwritten, cut at any point) never crash the
    /// finalize: it succeeds, or fails with an error and leaves the file as it was. Deterministic
    /// (a fixed-seed generator), so a failure can be replayed.
    @Test func damagedRecordingsNeverCrashTheFinalize() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fragmented = try fragmentedRecording(in: directory, ext: "mp4", tune: "film", seconds: 3)
        let original = [UInt8](try Data(contentsOf: URL(fileURLWithPath: fragmented)))
        // Where the index lives: everything but the media payload (damaging samples tests the decoder, not us).
        var indexRanges: [Range<Int>] = []
        var offset = 0
        while offset + 8 <= original.count {
            let size = Int(original[offset]) << 24 | Int(original[offset + 1]) << 16 | Int(original[offset + 2]) << 8 | Int(original[offset + 3])
            let type = String(decoding: original[(offset + 4)..<(offset + 8)], as: UTF8.self)
            guard size >= 8 else { break }
            indexRanges.append(offset..<(offset + (type == "mdat" ? 8 : min(size, original.count - offset))))
            offset += size
        }
        var random = SplitMix(seed: 12)
        let copy = directory.file("damaged.mp4")
        for round in 0..<150 {
            var bytes = original
            if round % 5 == 4 {
                bytes = Array(bytes.prefix(Int(random.next() % UInt64(bytes.count))))
            } else {
                for _ in 0..<(1 + Int(random.next() % 4)) {
                    let range = indexRanges[Int(random.next() % UInt64(indexRanges.count))]
                    let at = range.lowerBound + Int(random.next() % UInt64(range.count))
                    bytes[at] = [0x00, 0xFF, 0x7F, 0x80, UInt8(truncatingIfNeeded: random.next())][Int(random.next() % 5)]
                }
            }
            try Data(bytes).write(to: URL(fileURLWithPath: copy))
            do {
                try Recording.finalize(path: copy, container: .mp4, logger: quietLogger())
            } catch {
                let after = [UInt8](try Data(contentsOf: URL(fileURLWithPath: copy)))
                #expect(after == bytes, "round \(round): a failed finalize changed the file")
            }
            #expect(directory.contents().sorted() == ["damaged.mp4", "fragmented.mp4"], "round \(round): \(directory.contents())")
        }
    }

    /// A recording cut short (a crash in the middle of a fragment) is finalized with every complete
    /// fragment; the torn one is left out.
    @Test func truncatedRecordingKeepsItsCompleteFragments() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fragmented = try fragmentedRecording(in: directory, ext: "mp4", tune: "zerolatency", seconds: 7)
        let data = try Data(contentsOf: URL(fileURLWithPath: fragmented))
        let copy = directory.file("torn.mp4")
        try data.prefix(data.count * 2 / 3).write(to: URL(fileURLWithPath: copy))
        try Recording.finalize(path: copy, container: .mp4, logger: quietLogger())
        #expect(try topLevelBoxes(copy) == ["ftyp", "moov", "mdat"])
        let after = try packets(copy)
        let video = after.filter { $0.hasPrefix("0,") }.count
        // Keyframes every 2 s: what was written up to the last whole fragment, about 2 to 4 s.
        #expect(video >= 2 * 30 && video < 5 * 30, "\(video) video packets")
        let decode = try run(["ffmpeg", "-nostdin", "-v", "error", "-i", copy, "-f", "null", "-"])
        #expect(decode.status == 0 && decode.standardError.isEmpty, "\(decode.standardError)")
    }
}

/// A small deterministic generator (SplitMix64).
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
