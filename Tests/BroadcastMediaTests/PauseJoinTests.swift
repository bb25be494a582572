import Testing

@testable import BroadcastOutputs

/// The arithmetic a file output uses across its own pauses (RecordingWorker, the replay buffer).
@Suite struct PauseJoinTests {
    static let ms: Int64 = 1_000_000
    static let video = 0
    static let audio = 1

    /// The case CI met: after the resume an audio packet that began 22.7 ms (an AAC frame and a bit)
    /// before the keyframe the file goes on at comes after it; moved back with it, it lands before
    /// the last audio written before the pause, and MP4 refuses the file ("non monotonically
    /// increasing dts": 235456 after 235520).
    @Test func audioBegunBeforeTheResumingKeyframeIsLeftOut() {
        var join = PauseJoin(streamCount: 2)
        // 0-5 s written: video frames of 33 ms, AAC frames of 21.3 ms.
        var lastAudioWritten: Int64 = .min
        for i in 0..<150 { #expect(admitted(&join, stream: Self.video, dts: Int64(i) * 33 * Self.ms, end: Int64(i + 1) * 33 * Self.ms)) }
        for i in 0..<234 {
            let dts = Int64(i) * 21_333_333
            #expect(admitted(&join, stream: Self.audio, dts: dts, end: dts + 21_333_333))
            lastAudioWritten = dts
        }
        let endBefore = join.lastEnd!
        // Resumed at a keyframe at 9 s.
        let keyframe: Int64 = 9_000 * Self.ms
        join.resume(at: keyframe)
        #expect(keyframe - join.shift == endBefore, "no gap: the keyframe follows what was written")
        #expect(admitted(&join, stream: Self.video, dts: keyframe, end: keyframe + 33 * Self.ms))
        // Audio that began 22.7 ms before the keyframe: back in its stream once shifted.
        let early = keyframe - 22_700_000
        #expect(early - join.shift <= lastAudioWritten)
        #expect(!admitted(&join, stream: Self.audio, dts: early, end: early + 21_333_333))
        // The next one is after everything written in its stream.
        let next = early + 21_333_333
        #expect(admitted(&join, stream: Self.audio, dts: next, end: next + 21_333_333))
        #expect(next - join.shift > lastAudioWritten)
    }

    /// Any interleaving of two streams with jitter and any pauses: what is admitted goes strictly
    /// forward in each stream, and every resume joins without a gap. (Fails without the per-stream
    /// check: some seeds admit audio that goes back.)
    @Test(arguments: 1...40) func everyStreamGoesForward(seed: UInt64) {
        var random = SplitMix(seed: seed)
        var join = PauseJoin(streamCount: 2)
        var last: [Int64] = [.min, .min]
        var next: [Int64] = [0, 0]
        let step: [Int64] = [33 * Self.ms, 21_333_333]
        var paused = false
        var awaitingStart = false
        var refused = 0
        for _ in 0..<3000 {
            // The stream whose packet comes next: mostly the earlier one, sometimes the other
            // (the encoders' outputs cross by up to 50 ms: AAC comes out a frame or two late).
            let earlier = next[0] <= next[1] ? 0 : 1
            let stream = (random.next() % 5 == 0 && abs(next[0] - next[1]) < 50 * Self.ms) ? 1 - earlier : earlier
            let dts = next[stream]
            next[stream] += step[stream]
            if random.next() % 200 == 0 { paused.toggle(); if !paused { awaitingStart = true } }
            if paused { continue }
            let isStart = stream == 0 && random.next() % 10 == 0
            if awaitingStart {
                guard isStart else { continue }
                awaitingStart = false
                let endBefore = join.lastEnd
                join.resume(at: dts)
                if let endBefore { #expect(dts - join.shift <= endBefore) }
            }
            if admitted(&join, stream: stream, dts: dts, end: dts + step[stream]) {
                #expect(dts - join.shift > last[stream], "seed \(seed): stream \(stream) went back")
                last[stream] = dts - join.shift
            } else {
                refused += 1
            }
        }
        #expect(refused < 100, "seed \(seed): \(refused) packets left out")
    }

    @Test func aRestartBeginsAtZeroAndForgetsTheOldFile() {
        var join = PauseJoin(streamCount: 2)
        #expect(admitted(&join, stream: Self.video, dts: 5_000 * Self.ms, end: 5_033 * Self.ms))
        join.restart(at: 6_000 * Self.ms)
        #expect(join.shift == 6_000 * Self.ms && join.lastEnd == nil)
        #expect(admitted(&join, stream: Self.video, dts: 6_000 * Self.ms, end: 6_033 * Self.ms))
        #expect(!admitted(&join, stream: 7, dts: 6_100 * Self.ms, end: 6_133 * Self.ms), "no such stream")
    }
}

/// `join.admit`, outside `#expect` (which cannot call a mutating method).
private func admitted(_ join: inout PauseJoin, stream: Int, dts: Int64, end: Int64) -> Bool {
    join.admit(stream: stream, dts: dts, end: end)
}
