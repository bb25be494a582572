import BroadcastOutputs
import Testing

/// The adaptive bitrate's rules on a simulated path (a mock clock, no network): down fast when the
/// backlog grows, never below the minimum, up in steps while the backlog stays empty.
@Suite struct AdaptiveBitrateTests {
    static let second: Int64 = 1_000_000_000
    static let frame: Int64 = second / 30

    /// A path taking `capacity` b/s fed at the controller's target: the backlog it builds (ns of
    /// media), frame by frame for `seconds`; returns the targets seen, one per frame, and adds each
    /// frame's backlog (seconds of media) to `backlogs`.
    static func simulate(
        _ controller: inout AdaptiveBitrateController, from start: Int64, seconds: Double, capacity: (Int64) -> Int, backlog: inout Double,
        backlogs: inout [Double]
    ) -> [Int] {
        var targets: [Int] = []
        var now = start
        // What the socket took, frame by frame, over the last second (what the output measures:
        // it still holds the time before a dip for a second).
        var window: [Double] = []
        while Double(now - start) < seconds * Double(second) {
            now += frame
            // Bits made this frame at the target; bits the path takes this frame.
            let made = Double(controller.target) / 30
            let taken = Double(capacity(now)) / 30
            // Backlog in bits, reported as media time at the target's rate.
            backlog = max(0, backlog + made - taken)
            let backlogNanoseconds = Int64(backlog / Double(controller.target) * 1e9)
            window.append(min(made + backlog, taken))
            if window.count > 30 { window.removeFirst() }
            let sent = Int(window.reduce(0, +) * 30 / Double(window.count))
            _ = controller.observe(now: now, backlog: backlogNanoseconds, sentBitsPerSecond: sent)
            targets.append(controller.target)
            backlogs.append(Double(backlogNanoseconds) / 1e9)
        }
        return targets
    }

    @Test func aDipLowersTheTargetWithinASecondAndItComesBackAfter() {
        var controller = AdaptiveBitrateController(minimum: 750_000, maximum: 3_000_000)
        var backlog = 0.0
        let dipStart = 5 * Self.second, dipEnd = 25 * Self.second
        let capacity: (Int64) -> Int = { now in now >= dipStart && now < dipEnd ? 1_200_000 : 10_000_000 }
        var backlogs: [Double] = []
        let targets = Self.simulate(&controller, from: 0, seconds: 45, capacity: capacity, backlog: &backlog, backlogs: &backlogs)
        // Before the dip: the maximum.
        #expect(targets[Int(4.5 * 30)] == 3_000_000)
        // Within about a second of the dip: below what the path takes.
        let afterOneSecond = targets[Int(6.2 * 30)]
        #expect(afterOneSecond <= 1_200_000, "1.2 s into the dip the target is \(afterOneSecond)")
        // During the dip: never below the minimum, and from 3 s in the backlog stays under the drop
        // policy's first threshold (0.7 s): nothing is dropped, the picture moves.
        let during = targets[(8 * 30)..<(25 * 30)]
        #expect(during.allSatisfy { $0 >= 750_000 })
        let worst = backlogs[(8 * 30)..<(25 * 30)].max() ?? 0
        #expect(worst < 0.7, "the backlog reached \(worst) s during the dip")
        let average = Double(during.reduce(0, +)) / Double(during.count)
        #expect(average > 0.7 * 1_200_000, "the dip's average target \(Int(average)) leaves the path idle")
        // Within 15 s after the dip: at least 80 %.
        let back = targets[(40 * 30)...]
        #expect(back.allSatisfy { $0 >= 2_400_000 }, "15 s after the dip: \(back.min() ?? 0)")
    }

    @Test func aPathNarrowerThanTheMinimumStaysAtTheMinimum() {
        var controller = AdaptiveBitrateController(minimum: 500_000, maximum: 2_000_000)
        var backlog = 0.0
        var backlogs: [Double] = []
        let targets = Self.simulate(&controller, from: 0, seconds: 20, capacity: { _ in 200_000 }, backlog: &backlog, backlogs: &backlogs)
        #expect(targets.last == 500_000)
        #expect(targets.allSatisfy { $0 >= 500_000 })
    }

    @Test func aCalmPathNeverMovesIt() {
        var controller = AdaptiveBitrateController(minimum: 500_000, maximum: 2_000_000)
        var backlog = 0.0
        var backlogs: [Double] = []
        let targets = Self.simulate(&controller, from: 0, seconds: 20, capacity: { _ in 5_000_000 }, backlog: &backlog, backlogs: &backlogs)
        #expect(targets.allSatisfy { $0 == 2_000_000 })
    }

    /// A WebRTC (WHIP) path: packets leave at once (the backlog stays empty) and the viewer's
    /// receiver reports, one a second, say what the path did: `loss(now)` and `roundTrip(now)`.
    /// Returns the target at each frame for `seconds`.
    static func simulateReports(
        _ controller: inout AdaptiveBitrateController, seconds: Double, loss: (Int64) -> Double,
        roundTrip: (Int64) -> Int64? = { _ in 2_000_000 }
    ) -> [Int] {
        var targets: [Int] = []
        var now: Int64 = 0
        var lastReport: Int64 = 0
        while Double(now) < seconds * Double(second) {
            now += frame
            _ = controller.observe(now: now, backlog: 0, sentBitsPerSecond: controller.target)
            if now - lastReport >= second {
                lastReport = now
                _ = controller.observe(now: now, fractionLost: loss(now), roundTrip: roundTrip(now))
            }
            targets.append(controller.target)
        }
        return targets
    }

    @Test func lossOverATenthLowersTheTargetAndItComesBackAfter() {
        var controller = AdaptiveBitrateController(minimum: 750_000, maximum: 3_000_000)
        let targets = Self.simulateReports(&controller, seconds: 50) { now in now >= 5 * Self.second && now < 15 * Self.second ? 0.2 : 0 }
        #expect(targets[Int(4.9 * 30)] == 3_000_000)
        // The first lossy report (within a second of 5 s): 10 % down at once.
        #expect(targets[6 * 30] == 2_700_000, "\(targets[6 * 30])")
        // Each report of the ten seconds: down again, never below the minimum.
        let during = targets[(5 * 30)..<(16 * 30)]
        #expect(during.allSatisfy { $0 >= 750_000 })
        #expect(targets[15 * 30] < 1_200_000, "after 10 s of 20 % loss: \(targets[15 * 30])")
        // Clean again: up in steps, back to the maximum within 30 s.
        #expect(targets[(20 * 30)..<(45 * 30)].contains { $0 > targets[16 * 30] })
        #expect(targets[45 * 30] == 3_000_000, "30 s after the loss: \(targets[45 * 30])")
    }

    @Test func lossBetweenTwoAndTenPercentHoldsTheTarget() {
        var controller = AdaptiveBitrateController(minimum: 500_000, maximum: 2_000_000)
        // 30 % for 3 s lowers it; then 5 % for 20 s: it neither falls further nor rises.
        let targets = Self.simulateReports(&controller, seconds: 30) { now in now < 3 * Self.second ? 0.3 : 0.05 }
        let lowered = targets[4 * 30]
        #expect(lowered < 2_000_000)
        #expect(targets[(4 * 30)...].allSatisfy { $0 == lowered }, "\(Set(targets[(4 * 30)...]))")
    }

    @Test func totalLossStaysAtTheMinimum() {
        var controller = AdaptiveBitrateController(minimum: 500_000, maximum: 2_000_000)
        let targets = Self.simulateReports(&controller, seconds: 30) { _ in 1 }
        #expect(targets.allSatisfy { $0 >= 500_000 })
        #expect(targets.last == 500_000)
    }

    @Test func cleanReportsNeverMoveIt() {
        var controller = AdaptiveBitrateController(minimum: 500_000, maximum: 2_000_000)
        let targets = Self.simulateReports(&controller, seconds: 30) { _ in 0.01 }
        #expect(targets.allSatisfy { $0 == 2_000_000 })
    }

    /// A round trip grown far past its baseline (the path's queue filling) lowers the target even
    /// without loss; one grown a little holds it (until the baseline follows it, 10 to 20 s on).
    @Test func aGrowingRoundTripLowersOrHoldsTheTarget() {
        var controller = AdaptiveBitrateController(minimum: 500_000, maximum: 2_000_000)
        let targets = Self.simulateReports(&controller, seconds: 40, loss: { _ in 0 }) { now in
            switch now {
            case ..<(5 * Self.second): 20_000_000
            case ..<(8 * Self.second): 500_000_000
            case ..<(20 * Self.second): 170_000_000
            default: 20_000_000
            }
        }
        #expect(targets[Int(4.9 * 30)] == 2_000_000)
        #expect(targets[6 * 30] == 1_700_000, "\(targets[6 * 30])")
        let held = targets[9 * 30]
        #expect(held < 1_700_000)
        #expect(targets[(9 * 30)..<(20 * 30)].allSatisfy { $0 == held })
        #expect(targets.last! > held, "the round trip came back: \(targets.last!)")
    }
}
