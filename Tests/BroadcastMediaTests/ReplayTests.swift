import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Foundation
import Testing

/// The replay buffer's bounds and selection, with fake packets (no FFmpeg).
@Suite("ReplayBuffer")
struct ReplayBufferTests {
    typealias Buffer = ReplayBuffer<Int>
    static let ms: Int64 = 1_000_000

    /// 30 fps video with a keyframe every `gop` frames and 50 audio packets a second (20 ms), in
    /// time order, from `from` to `to` seconds; each video packet `videoBytes` big.
    static func feed(_ buffer: inout Buffer, from: Double, to: Double, gop: Int = 60, videoBytes: Int = 1000, shift: Int64 = 0, onEach: (Buffer) -> Void = { _ in }) {
        var events: [(Int64, Bool)] = []
        var f = Int((from * 30).rounded())
        while Double(f) / 30 < to { events.append((Int64(f) * 1_000_000_000 / 30, true)); f += 1 }
        var a = Int((from * 50).rounded())
        while Double(a) / 50 < to { events.append((Int64(a) * 20 * ms, false)); a += 1 }
        for (t, video) in events.sorted(by: { $0.0 < $1.0 || ($0.0 == $1.0 && $0.1) }) {
            let frame = Int((Double(t) * 30 / 1e9).rounded())
            let key = video && frame % gop == 0
            let duration = video ? 1_000_000_000 / 30 : 20 * ms
            buffer.append(
                .init(
                    packet: frame, isVideo: video, isStart: key, pts: t + shift, dts: t + shift, end: t + shift + duration,
                    shift: shift, payloadBytes: video ? videoBytes : 100))
            onEach(buffer)
        }
    }

    @Test func keepsTheLastSecondsFromAKeyframe() {
        var buffer = Buffer(settings: ReplaySettings(seconds: 5))
        Self.feed(&buffer, from: 0, to: 20)
        // Keyframes every 2 s: 5 s plus the rest of the GOP they start in is 6 s from the keyframe at 14.
        #expect(buffer.bufferedNanoseconds >= 5_000 * Self.ms)
        #expect(buffer.bufferedNanoseconds <= 7_000 * Self.ms)
        let all = buffer.selection(cut: nil, nanoseconds: nil)!
        #expect(all.entries.first!.isStart && all.entries.first!.isVideo)
        #expect(all.base == 14_000 * Self.ms)
        #expect(!all.isShorter)
        // No audio before the start point.
        #expect(all.entries.allSatisfy { $0.pts >= all.base })
    }

    @Test func aCutEndsTheSelectionAndTheSecondsTakeTheTail() {
        var buffer = Buffer(settings: ReplaySettings(seconds: 10))
        Self.feed(&buffer, from: 0, to: 30)
        let cut = 25_000 * Self.ms
        let tail = buffer.selection(cut: cut, nanoseconds: 3_000 * Self.ms)!
        #expect(tail.entries.allSatisfy { $0.pts < cut })
        // The last 3 s before 25 s start in the GOP of 22 s.
        #expect(tail.base == 22_000 * Self.ms)
        #expect(abs(tail.durationNanoseconds - 3_000 * Self.ms) < 50 * Self.ms)
        let nothing = buffer.selection(cut: 0, nanoseconds: nil)
        #expect(nothing == nil)
    }

    @Test func theByteBoundDropsTheOldestGOPFirst() {
        // 60 frames of 10 000 bytes a GOP: ~620 kB; 1.5 MB holds two GOPs, never three.
        let limit: Int64 = 1_500_000
        var buffer = Buffer(settings: ReplaySettings(seconds: 30, maxBytes: limit))
        var most: Int64 = 0
        Self.feed(&buffer, from: 0, to: 20, videoBytes: 10_000) { most = max(most, $0.bytes) }
        #expect(most <= limit)
        #expect(buffer.gopsDroppedForMemory > 0)
        let saved = buffer.selection(cut: nil, nanoseconds: nil)!
        #expect(saved.isShorter)
        #expect(saved.durationNanoseconds >= 2_000 * Self.ms && saved.durationNanoseconds < 4_100 * Self.ms)
        #expect(saved.entries.first!.isStart)
    }

    @Test func aGOPLargerThanTheBoundEmptiesTheBuffer() {
        var buffer = Buffer(settings: ReplaySettings(seconds: 30, maxBytes: 100_000))
        Self.feed(&buffer, from: 0, to: 3, videoBytes: 10_000)
        #expect(buffer.overflows > 0)
        #expect(buffer.bytes <= 100_000)
    }

    @Test func lessBufferedThanAskedIsSaid() {
        var buffer = Buffer(settings: ReplaySettings(seconds: 30))
        Self.feed(&buffer, from: 0, to: 3)
        let saved = buffer.selection(cut: nil, nanoseconds: nil)!
        #expect(saved.isShorter)
        #expect(abs(saved.durationNanoseconds - 3_000 * Self.ms) < 50 * Self.ms)
    }

    @Test func aPauseShiftJoinsWithoutAGap() {
        var buffer = Buffer(settings: ReplaySettings(seconds: 30))
        Self.feed(&buffer, from: 0, to: 4)
        // Paused from 4 s to 10 s of the encoder's time: the shift takes the 6 s out.
        Self.feed(&buffer, from: 10, to: 14, shift: 0)
        var shifted = Buffer(settings: ReplaySettings(seconds: 30))
        Self.feed(&shifted, from: 0, to: 4)
        Self.feed(&shifted, from: 4, to: 8, shift: 6_000 * Self.ms)
        let s = shifted.selection(cut: nil, nanoseconds: nil)!
        #expect(abs(s.durationNanoseconds - 8_000 * Self.ms) < 50 * Self.ms)
        let unshifted = buffer.selection(cut: nil, nanoseconds: nil)!
        #expect(unshifted.durationNanoseconds > 13_000 * Self.ms)
    }
}

/// Replay outputs through EncodingHandler with real encoders and files; ffprobe/ffmpeg judge.
@Suite("Replay through EncodingHandler", .serialized)
struct ReplayTests {
    let media = TestMedia()
    static let frame = 1.0 / 30
    static let second: Int64 = 1_000_000_000

    func handler(_ directory: TemporaryDirectory, replay: ReplaySettings, recording: Bool = true, keyframeSeconds: Double = 2) -> EncodingHandler {
        var video = VideoEncoderSettings(width: media.width, height: media.height, bitrate: 800_000)
        video.keyframeIntervalSeconds = keyframeSeconds
        let configuration = EncodingConfiguration(
            video: video,
            audio: AudioEncoderSettings(),
            recordings: recording ? [directory.file("rec.mp4")] : [],
            outputs: [OutputConfiguration(name: "replay", destination: .file(directory.file("replay-%H%M%S.mp4")), replay: replay)]
        )
        return EncodingHandler(configuration: configuration, logger: quietLogger(), realtime: false)
    }

    func keyframeFirst(_ path: String) throws -> Bool {
        let r = try run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "packet=flags", "-of", "csv=p=0", "-read_intervals", "%+#1", path])
        return r.standardOutput.hasPrefix("K")
    }

    /// 30 s buffer, 45 s fed, a save cut at 45 s: 30 s plus at most a keyframe interval, starting
    /// on a keyframe at zero, the white frames where whole seconds of the last 30 s before the cut
    /// fall, audio in sync, the recording beside it complete.
    @Test func thirtySecondsOfFortyFive() throws {
        let directory2 = try TemporaryDirectory()
        defer { directory2.remove() }
        let h2 = self.handler(directory2, replay: ReplaySettings(seconds: 30))
        try h2.broadcastStarted(setupInfo: SetupInfo())
        let cut = 45 * Self.second
        // Asked before anything came: the save waits for what precedes the cut, and stops there.
        let pending = h2.replayOutputs[0].saveReplay(upTo: cut)!
        try media.feed(h2, seconds: 48)
        let result = pending.wait(timeoutSeconds: 60)
        h2.broadcastFinished()
        #expect(h2.failures.isEmpty, "\(h2.failures)")
        guard let result, let path = result.path else {
            Issue.record("no file: \(String(describing: result))")
            return
        }
        #expect(!result.isShorter)
        let probe = try ProbedFile(path)
        let duration = probe.duration ?? 0
        #expect(duration >= 30 - Self.frame && duration <= 32 + Self.frame, "duration \(duration)")
        #expect(try keyframeFirst(path))
        #expect(try decodeErrors(path).isEmpty)
        #expect(try topLevelBoxes(path).prefix(2) == ["ftyp", "moov"], "faststart")
        // Audio is cut at the picture's first instant: it starts at zero (within one AAC frame), never before.
        let audio = try packetTimes(path, stream: "a:0")
        let firstAudio = audio.first ?? -1
        #expect(firstAudio >= 0 && firstAudio < 1024.0 / 48_000 + 0.001, "audio starts at \(firstAudio) s")
        // Its start in the broadcast: it ends at the cut (45 s).
        let base = 45 - duration
        let (white, sounds) = try markers(path)
        let expectedSeconds = Array(Int(base.rounded(.up))...44)
        #expect(white.count == expectedSeconds.count, "white frames at \(white), base \(base)")
        for (t, second) in zip(white, expectedSeconds) {
            #expect(abs(t + base - Double(second)) <= Self.frame + 0.001, "white frame at \(t) is not second \(second)")
        }
        let beeps = sounds.filter { $0 < duration - 0.5 }
        #expect(beeps.count >= white.count - 2, "beeps \(beeps)")
        for beep in beeps {
            let nearest = white.min { abs($0 - beep) < abs($1 - beep) } ?? .infinity
            #expect(abs(nearest - beep) <= Self.frame + 0.001, "beep at \(beep), white frame at \(nearest)")
        }
        // The recording beside it lost nothing.
        let recording = try ProbedFile(directory2.file("rec.mp4"))
        #expect(recording.video?.frames == 48 * 30)
    }

    @Test func theByteBoundHoldsAndWhatFitsIsSaved() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let limit: Int64 = 400_000
        let handler = handler(directory, replay: ReplaySettings(seconds: 30, maxBytes: limit), recording: false, keyframeSeconds: 1)
        let output = handler.replayOutputs[0]
        try handler.broadcastStarted(setupInfo: SetupInfo())
        var most: Int64 = 0
        for _ in 0..<1 {
            try media.feed(handler, seconds: 20)
            most = max(most, output.replayStatistics()!.bufferedBytes)
        }
        // (Cut a little before the end fed: the audio encoder holds its last frames until more comes.)
        let save = output.saveReplay(upTo: 19 * Self.second)!
        let outcome = save.wait(timeoutSeconds: 30)
        handler.broadcastFinished()
        #expect(most <= limit)
        #expect(output.replayStatistics()!.droppedForMemory > 0)
        guard let outcome, let path = outcome.path else {
            Issue.record("no file: \(String(describing: outcome))")
            return
        }
        #expect(outcome.isShorter)
        let duration = try ProbedFile(path).duration ?? 0
        #expect(duration > 1 && duration < 20, "\(duration)")
        #expect(try keyframeFirst(path))
    }

    @Test func lessThanAskedIsAShorterFileAndNothingIsAnError() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let handler = handler(directory, replay: ReplaySettings(seconds: 30), recording: false)
        let output = handler.replayOutputs[0]
        try handler.broadcastStarted(setupInfo: SetupInfo())
        let nothing = output.saveReplay(upTo: 0)!
        try media.feed(handler, seconds: 3)
        let short = output.saveReplay(upTo: 2_900_000_000)!
        let shortOutcome = short.wait(timeoutSeconds: 30)
        handler.broadcastFinished()
        let none = nothing.wait(timeoutSeconds: 30)
        #expect(none?.path == nil && none?.error?.contains("nothing buffered") == true, "\(String(describing: none))")
        #expect(shortOutcome?.isShorter == true)
        let duration = try ProbedFile(shortOutcome?.path ?? "/nonexistent").duration ?? 0
        #expect(abs(duration - 2.9) < 0.1, "\(duration)")
        #expect(output.replayStatistics()!.savesFailed == 1 && output.replayStatistics()!.savesDone == 1)
    }

    /// A save whose finalize fails (here: every name its temporary file could take is taken)
    /// keeps the complete, fragmented file, which plays, and says so; before, it was deleted while
    /// the message said it was kept. The next save, which finalizes, clears the output's error.
    @Test func aSaveWhoseFinalizeFailsIsKept() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var video = VideoEncoderSettings(width: media.width, height: media.height, bitrate: 800_000)
        video.keyframeIntervalSeconds = 1
        let configuration = EncodingConfiguration(
            video: video, audio: AudioEncoderSettings(), recordings: [],
            outputs: [OutputConfiguration(name: "replay", destination: .file(directory.file("save.mp4")), replay: ReplaySettings(seconds: 10))])
        let handler = EncodingHandler(configuration: configuration, logger: quietLogger(), realtime: false)
        let output = handler.replayOutputs[0]
        // Recording.createTemporary tries `.save.mp4.finalizing.mp4`, then `.save.mp4.N.finalizing.mp4` up to N = 1000.
        for n in 1...1000 {
            let name = n == 1 ? ".save.mp4.finalizing.mp4" : ".save.mp4.\(n).finalizing.mp4"
            #expect(FileManager.default.createFile(atPath: directory.file(name), contents: nil))
        }
        try handler.broadcastStarted(setupInfo: SetupInfo())
        try media.feed(handler, seconds: 4)
        let failed = output.saveReplay(upTo: 3 * Self.second)!.wait(timeoutSeconds: 60)
        let error = output.statistics().lastError
        let second = output.saveReplay(upTo: 3 * Self.second)!.wait(timeoutSeconds: 60)
        let errorAfter = output.statistics().lastError
        handler.broadcastFinished()
        let kept = directory.file("save.mp4")
        #expect(failed?.path == nil && failed?.error?.contains("kept") == true && failed?.error?.contains(kept) == true, "\(String(describing: failed))")
        #expect(error?.contains("kept") == true, "\(String(describing: error))")
        #expect(FileManager.default.fileExists(atPath: kept), "the complete save was deleted")
        #expect(try topLevelBoxes(kept).contains("moof"), "fragmented, as it was written")
        #expect(try decodeErrors(kept).isEmpty)
        let duration = try ProbedFile(kept).duration ?? 0
        #expect(abs(duration - 3) < 0.2, "\(duration) s")
        // The next save went to a new name, was finalized, and the output's error is gone.
        #expect(second?.path == directory.file("save-2.mp4") && second?.error == nil, "\(String(describing: second))")
        #expect(errorAfter == nil, "\(String(describing: errorAfter))")
        #expect(output.replayStatistics()!.savesFailed == 1 && output.replayStatistics()!.savesDone == 1)
    }

    /// An output-level pause keeps the buffer; a save during it has what came before, a save after
    /// the resume joins before and after without a gap. Two saves in a row, the second asked while
    /// the first is still being written: both complete.
    @Test func pausesAndSavesInARow() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let handler = handler(directory, replay: ReplaySettings(seconds: 60), recording: false, keyframeSeconds: 1)
        let output = handler.replayOutputs[0]
        try handler.broadcastStarted(setupInfo: SetupInfo())
        // One continuous run of the test media: 0-5 s buffered, 5-9 s paused, 9-14 s buffered.
        var saves: [(String, ReplaySave)] = []
        try media.feed(handler, seconds: 14) { (time: Int) in
            if time == 5 { output.pause() }
            if time == 7 { saves.append(("during", output.saveReplay(upTo: 7 * Self.second)!)) }
            if time == 9 { output.resume() }
            if time == 14 - 1 {
                saves.append(("across", output.saveReplay()!))
                saves.append(("again", output.saveReplay()!))
            }
        }
        let outcomes = saves.map { ($0.0, $0.1.wait(timeoutSeconds: 60)) }
        handler.broadcastFinished()
        var paths: Set<String> = []
        for (what, outcome) in outcomes {
            guard let path = outcome?.path else {
                Issue.record("\(what): no file: \(String(describing: outcome))")
                continue
            }
            paths.insert(path)
            #expect(try decodeErrors(path).isEmpty, "\(what)")
            #expect(try keyframeFirst(path), "\(what)")
            let times = try packetTimes(path, stream: "v:0")
            let gaps = zip(times, times.dropFirst()).map { $1 - $0 }
            #expect((gaps.max() ?? 1) < 2 * Self.frame, "\(what): a gap of \(gaps.max() ?? 0) s")
            let duration = try ProbedFile(path).duration ?? 0
            switch what {
            case "during": #expect(abs(duration - 5) < 0.2, "during the pause: \(duration) s")
            // 0-5 s and 9-13 s (up to a keyframe after the resume): 8-9 s, no gap.
            default: #expect(duration > 7.5 && duration < 9.2, "\(what): \(duration) s")
            }
        }
        #expect(paths.count == 3, "three distinct files: \(paths)")
    }
}

/// Presentation times of every packet of one stream, sorted.
func packetTimes(_ path: String, stream: String) throws -> [Double] {
    let r = try run(["ffprobe", "-v", "error", "-select_streams", stream, "-show_entries", "packet=pts_time", "-of", "csv=p=0", path])
    return r.standardOutput.split(separator: "\n").compactMap { Double($0.trimmingCharacters(in: CharacterSet(charactersIn: " ,"))) }.sorted()
}

extension TestMedia {
    /// `feed` with `atSecond(n)` called as media time reaches each whole second n.
    func feed(_ handler: any BroadcastSampleHandler, seconds: Double, atSecond: (Int) throws -> Void) throws {
        let videoFrames = Int(seconds * Double(framesPerSecond))
        let audioBuffers = Int((seconds * Double(sampleRate)).rounded(.up)) / audioBufferFrames
        var nextVideo = 0
        var nextAudio = 0
        var second = 0
        while nextVideo < videoFrames || nextAudio < audioBuffers {
            let videoTime = nextVideo < videoFrames ? Double(nextVideo) / Double(framesPerSecond) : .infinity
            let audioTime = nextAudio < audioBuffers ? Double(nextAudio * audioBufferFrames) / Double(sampleRate) : .infinity
            let now = min(videoTime, audioTime)
            while Double(second) <= now {
                try atSecond(second)
                second += 1
            }
            if videoTime <= audioTime {
                try deliverVideo(nextVideo, to: handler)
                nextVideo += 1
            } else {
                try deliverAudio(nextAudio, type: .audioMic, to: handler)
                nextAudio += 1
            }
        }
    }
}
