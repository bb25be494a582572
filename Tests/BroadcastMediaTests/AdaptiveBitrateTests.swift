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

    /// What a stream through a path of `capacity` b/s gives at each wall second: frames that
    /// arrived whole, the latency of the oldest bit in flight, the target.
    struct PathRun {
        var arrivals: [Int] = []
        var latencies: [Double] = []
        var targets: [Int] = []
    }

    /// An RTMP output through a path taking `capacity(now)` b/s, as the output measures it: every
    /// frame (at the controller's target, and 128 kb/s of audio; a keyframe of 6 frames' bits every
    /// 2 s) queues behind what is not yet delivered; the backlog the controller sees is the age of
    /// the oldest bit not yet delivered (queue and socket), the path rate what was delivered over
    /// the last 0.3 s while bits waited.
    static func simulatePath(_ controller: inout AdaptiveBitrateController, seconds: Int, capacity: (Int64) -> Int) -> PathRun {
        let audio = 128_000
        var run = PathRun()
        // Frames not yet delivered whole: (bits left, made at).
        var inFlight: [(bits: Double, made: Int64)] = []
        var delivered: [Double] = []
        var arrivedThisSecond = 0
        var worstThisSecond = 0.0
        var now: Int64 = 0
        var index = 0
        while now < Int64(seconds) * second {
            now += frame
            index += 1
            let average = Double(controller.target) / 30
            let bits = (index % 60 == 0 ? 6 * average : average * 54 / 59) + Double(audio) / 30
            inFlight.append((bits, now))
            var budget = Double(capacity(now)) / 30
            var took = 0.0
            while budget > 0, !inFlight.isEmpty {
                let part = min(budget, inFlight[0].bits)
                inFlight[0].bits -= part
                budget -= part
                took += part
                if inFlight[0].bits <= 0 {
                    inFlight.removeFirst()
                    arrivedThisSecond += 1
                }
            }
            delivered.append(took)
            if delivered.count > 9 { delivered.removeFirst() }
            let latency = inFlight.first.map { now - $0.made } ?? 0
            worstThisSecond = max(worstThisSecond, Double(latency) / 1e9)
            let path = Int(delivered.reduce(0, +) * 30 / Double(delivered.count))
            // The path's rate is known only while bits wait (the socket held bytes).
            _ = controller.observe(
                now: now, backlog: latency, sentBitsPerSecond: path, pathBitsPerSecond: latency > 0 ? path : nil, audioBitsPerSecond: audio)
            if index % 30 == 0 {
                run.arrivals.append(arrivedThisSecond)
                run.latencies.append(worstThisSecond)
                run.targets.append(controller.target)
                arrivedThisSecond = 0
                worstThisSecond = 0
            }
        }
        return run
    }

    /// Issue 36's dip, as the RTMP output measures it (the path's rate, the socket's age): a 3 Mb/s
    /// stream through 20 s at 1.2 Mb/s. From 3 s into the dip every second delivers at least 25
    /// frames and the latency stays under a second; after it the target is back to 80 % within
    /// 16 s in this model (the path's width, measured exactly here, holds the probe to 3 % steps
    /// near it for a few seconds; `make bench-dip` measures the real stream: 1.8 to 11.3 s).
    @Test func aMeasuredPathRidesADipWithoutAFrozenSecond() {
        var controller = AdaptiveBitrateController(minimum: 750_000, maximum: 3_000_000)
        let run = Self.simulatePath(&controller, seconds: 60) { now in now >= 10 * Self.second && now < 30 * Self.second ? 1_200_000 : 6_000_000 }
        let dip = run.arrivals[13..<30]
        #expect(dip.allSatisfy { $0 >= 25 }, "frames per second from 3 s into the dip: \(Array(dip))")
        let worst = run.latencies.max() ?? 0
        #expect(worst < 1, "latency reached \(worst) s: \(run.latencies)")
        #expect(run.targets[10..<30].allSatisfy { $0 >= 750_000 })
        #expect(run.targets[45...].allSatisfy { $0 >= 2_400_000 }, "after the dip: \(run.targets[30...])")
        #expect(run.arrivals[46...].allSatisfy { $0 >= 29 }, "\(run.arrivals)")
    }

    /// The first decrease goes under the path's measured rate at once, by enough to drain the
    /// backlog, even though the socket's last second still says the fast path's rate (a single
    /// step of a quarter took half a second more of 3 Mb/s into a 1.2 Mb/s path).
    @Test func aDecreaseGoesUnderTheMeasuredPathAtOnce() {
        var controller = AdaptiveBitrateController(minimum: 300_000, maximum: 3_000_000)
        _ = controller.observe(now: Self.second, backlog: 0, sentBitsPerSecond: 3_100_000)
        let target = controller.observe(
            now: Self.second + Self.frame, backlog: 300_000_000, sentBitsPerSecond: 3_100_000, pathBitsPerSecond: 1_200_000,
            audioBitsPerSecond: 128_000)
        // Video under 1.2 Mb/s less the audio, less 0.3 s of 3.1 Mb/s over 2 s.
        #expect(target.map { $0 <= 1_072_000 - 465_000 } == true, "\(target.map(String.init) ?? "no decrease")")
    }

    /// A backlog while the path takes more than the stream makes is a burst (a keyframe through
    /// the socket), not a narrow path: the target stays.
    @Test func aBurstThroughAWidePathIsNotCongestion() {
        var controller = AdaptiveBitrateController(minimum: 750_000, maximum: 3_000_000)
        var now: Int64 = 0
        for backlog in [0, 120, 260, 300, 280, 100, 0] as [Int64] {
            now += Self.frame
            #expect(controller.observe(now: now, backlog: backlog * 1_000_000, sentBitsPerSecond: 3_000_000, pathBitsPerSecond: 6_000_000) == nil)
        }
        #expect(controller.target == 3_000_000)
    }

    /// Up in growing steps (3 %, 6 %, 9 % ... of the target, one per calm second), and a backlog
    /// whose floor rises (the path a little narrower than the stream) holds it before the
    /// backlog leaves calm.
    @Test func stepsUpGrowAndARisingFloorHoldsThem() {
        var controller = AdaptiveBitrateController(minimum: 1_000_000, maximum: 4_000_000)
        var now: Int64 = 0
        // One decrease to the minimum (no path rate: the socket's own).
        _ = controller.observe(now: now, backlog: 0, sentBitsPerSecond: 4_000_000)
        now += Self.frame
        _ = controller.observe(now: now, backlog: 600_000_000, sentBitsPerSecond: 1_000_000)
        #expect(controller.target == 1_000_000)
        var targets: [Int] = []
        for _ in 0..<(5 * 30) {
            now += Self.frame
            if let target = controller.observe(now: now, backlog: 0, sentBitsPerSecond: controller.target) { targets.append(target) }
        }
        #expect(targets.count >= 3, "\(targets)")
        let steps = zip([1_000_000] + targets, targets).map { Double($1) / Double($0) - 1 }
        #expect(steps.prefix(3).map { Int(($0 * 100).rounded()) } == [3, 6, 9], "\(targets)")
        // Another one: after a decrease the backlog creeps up, 20 ms every half second (the path
        // 4 % narrower than the stream), still under calm's 100 ms: no step in 2 s (without the
        // hold: one after a second of calm).
        var creeping = AdaptiveBitrateController(minimum: 1_000_000, maximum: 4_000_000)
        _ = creeping.observe(now: 0, backlog: 0, sentBitsPerSecond: 4_000_000)
        _ = creeping.observe(now: Self.frame, backlog: 600_000_000, sentBitsPerSecond: 1_000_000)
        let lowered = creeping.target
        for frame in 0..<60 {
            _ = creeping.observe(now: Int64(frame + 2) * Self.frame, backlog: Int64(frame / 15 + 1) * 20_000_000, sentBitsPerSecond: lowered)
        }
        #expect(creeping.target == lowered, "steps up while the backlog's floor rose: \(lowered) → \(creeping.target)")
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
