import Atomics
import BroadcastKit
@testable import BroadcastOutputs
import Foundation
import Testing

/// `AudioSourceControl` set from two threads at once (a mute from the control API and a reload's
/// new level): the level it reports and the gain the handler applies always agree, and a mute is
/// never lost to a volume change made at the same moment (issue 35 item 12: it kept volume, mute
/// and gain in three atomics written one after the other).
@Suite struct AudioLevelRaceTests {
    /// Runs `first` on this thread and `second` on another, `rounds` times, the two started together
    /// each round; after each round (both done) `check` runs alone.
    static func race(rounds: Int, _ first: @escaping @Sendable (Int) -> Void, _ second: @escaping @Sendable (Int) -> Void, check: (Int) -> Void) {
        let go = ManagedAtomic<Int>(-1)
        let done = ManagedAtomic<Int>(-1)
        let thread = Thread {
            for round in 0..<rounds {
                while go.load(ordering: .acquiring) < round { sched_yield() }
                second(round)
                done.store(round, ordering: .releasing)
            }
        }
        thread.start()
        for round in 0..<rounds {
            go.store(round, ordering: .releasing)
            first(round)
            while done.load(ordering: .acquiring) < round { sched_yield() }
            check(round)
        }
    }

    @Test func twoLevelsSetAtOnceLeaveTheGainOfTheLevelReported() {
        let control = AudioSourceControl()
        let loudMuted = AudioLevel(volumeDecibels: 6, muted: true)
        let quiet = AudioLevel(volumeDecibels: -12, muted: false)
        var disagreements: [String] = []
        Self.race(
            rounds: 5_000, { _ in control.set(loudMuted, of: .audioMic) }, { _ in control.set(quiet, of: .audioMic) },
            check: { round in
                let level = control.level(of: .audioMic)
                let gain = control.gain(of: .audioMic)
                if level != loudMuted && level != quiet || gain != level.gain {
                    disagreements.append("round \(round): level \(level), gain \(gain)")
                }
            })
        let count = disagreements.count
        #expect(count == 0, "\(count) rounds: \(disagreements.prefix(3))")
    }

    @Test func aMuteAndAVolumeAtOnceAreBothKept() {
        let control = AudioSourceControl()
        var lost: [String] = []
        Self.race(
            rounds: 5_000, { round in control.setMuted(round % 2 == 0, of: .audioApp) },
            { round in
                // What a reload of the volume alone does (the daemon's applyAudioLevels).
                control.update(.audioApp) { $0.volumeDecibels = Double(round % 40) - 20 }
            },
            check: { round in
                let level = control.level(of: .audioApp)
                let expected = AudioLevel(volumeDecibels: Double(round % 40) - 20, muted: round % 2 == 0)
                if level != expected || control.gain(of: .audioApp) != expected.gain {
                    lost.append("round \(round): \(level), gain \(control.gain(of: .audioApp)); expected \(expected)")
                }
            })
        let count = lost.count
        #expect(count == 0, "\(count) rounds: \(lost.prefix(3))")
    }
}
