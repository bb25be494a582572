import BroadcastMedia
import Testing

@testable import BroadcastOutputs

/// The live output's decisions (LiveStreamStateMachine, SendQueue's drop policy), driven by events
/// and a clock moved by hand: no network, no threads, no waiting.
@Suite struct LiveStreamStateMachineTests {
    struct Packet: LivePacket, Equatable, CustomStringConvertible {
        var mediaType: MediaType
        var isKeyframe: Bool
        var dtsNanoseconds: Int64
        var dropPriority: DropPriority

        static func video(ms: Int64, _ priority: DropPriority) -> Packet {
            Packet(mediaType: .video, isKeyframe: priority == .keyframe, dtsNanoseconds: ms * 1_000_000, dropPriority: priority)
        }
        static func audio(ms: Int64) -> Packet {
            Packet(mediaType: .audio, isKeyframe: true, dtsNanoseconds: ms * 1_000_000, dropPriority: .keyframe)
        }
        var milliseconds: Int64 { dtsNanoseconds / 1_000_000 }
        var description: String { "\(mediaType)@\(milliseconds)ms(\(dropPriority))" }
    }

    typealias Machine = LiveStreamStateMachine<Packet>

    /// The clock: an instant moved by hand.
    struct FakeClock {
        var now = MonotonicInstant(sinceOrigin: .seconds(1000))
        mutating func advance(_ d: Duration) { now = now + d }
    }

    static func machine(_ clock: FakeClock, settings: LiveStreamSettings = LiveStreamSettings(), jitter: @escaping () -> Double = { 0.5 }) -> Machine {
        Machine(settings: settings, hasVideo: true, now: clock.now, jitter: jitter)
    }

    /// Connects `m` at the clock's time (the first attempt is due at once).
    static func connect(_ m: inout Machine, _ clock: FakeClock) -> Machine.ConnectedAction {
        #expect(m.nextAction(now: clock.now) == .connect(deadline: clock.now + .seconds(10)))
        return m.connected(now: clock.now)
    }

    // MARK: Connect

    @Test func connectsAndStartsOnAKeyframe() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        #expect(m.outputState == .connecting)
        #expect(m.nextAction(now: clock.now) == .connect(deadline: clock.now + .seconds(10)))
        // While the connect is under way: a stream starts on a video keyframe; what comes before is offline.
        #expect(m.packet(.video(ms: 0, .reference)) == Drops(.offline, 1))
        #expect(m.packet(.audio(ms: 10)) == Drops(.offline, 1))
        #expect(m.packet(.video(ms: 40, .keyframe)) == .none)
        #expect(m.packet(.audio(ms: 30)) == .none)
        #expect(m.packet(.video(ms: 80, .disposable)) == .none)
        clock.advance(.milliseconds(300))
        let connected = m.connected(now: clock.now)
        #expect(connected == .init(isReconnect: false, requestKeyframe: false, dropped: 0))
        #expect(m.outputState == .live)
        // Sends in order, one write at a time, each with the timeout as its deadline.
        for expected in [Packet.video(ms: 40, .keyframe), .audio(ms: 30), .video(ms: 80, .disposable)] {
            #expect(m.nextAction(now: clock.now) == .send(expected, deadline: clock.now + .seconds(10)))
            #expect(m.writingDTS == expected.dtsNanoseconds)
            clock.advance(.milliseconds(5))
            #expect(m.written(now: clock.now) == false)
        }
        #expect(m.nextAction(now: clock.now) == .wait(until: nil))
    }

    /// A connection that opens with nothing queued (or a queue not starting on a keyframe) asks the
    /// encoder for a keyframe; a reconnect says so.
    @Test func aNewConnectionWithoutAKeyframeAsksForOne() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        #expect(Self.connect(&m, clock) == .init(isReconnect: false, requestKeyframe: true, dropped: 0))
        #expect(m.packet(.video(ms: 0, .reference)) == Drops(.offline, 1), "waits for the keyframe it asked for")
        #expect(m.packet(.video(ms: 40, .keyframe)) == .none)
        #expect(m.nextAction(now: clock.now) == .send(.video(ms: 40, .keyframe), deadline: clock.now + .seconds(10)))
        clock.advance(.seconds(5))
        guard case .reconnect(let delay, _, _, _, _) = m.writeFailed(isNetworkFailure: true, now: clock.now) else {
            Issue.record("no reconnect")
            return
        }
        #expect(m.outputState == .reconnecting)
        #expect(m.packet(.audio(ms: 60)) == Drops(.offline, 1), "after a loss the stream restarts on a keyframe")
        #expect(m.packet(.video(ms: 80, .keyframe)) == .none)
        clock.advance(delay)
        #expect(Self.connect(&m, clock) == .init(isReconnect: true, requestKeyframe: false, dropped: 0))
    }

    /// A queued start older than the drop threshold is not sent: the connection starts from a fresh keyframe.
    @Test func aStaleQueueIsDroppedOnConnect() {
        let clock = FakeClock()
        var m = Self.machine(clock)
        #expect(m.nextAction(now: clock.now) == .connect(deadline: clock.now + .seconds(10)))
        #expect(m.packet(.video(ms: 0, .keyframe)) == .none)
        for i in 1...30 { #expect(m.packet(.audio(ms: Int64(i) * 25)) == .none) }
        #expect(m.connected(now: clock.now) == .init(isReconnect: false, requestKeyframe: true, dropped: 31))
        #expect(m.queue.isEmpty)
    }

    // MARK: Refusals and giving up

    /// nginx-rtmp's deny: the header write fails (not a network error) three times in a row.
    @Test func refusedThreeTimesFails() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        for attempt in 1...2 {
            #expect(m.nextAction(now: clock.now) == .connect(deadline: clock.now + .seconds(10)))
            guard case .reconnect(let delay, let next, _, _, _) = m.connectFailed(isNetworkFailure: false, now: clock.now) else {
                Issue.record("attempt \(attempt) gave up")
                return
            }
            #expect(next == attempt + 1)
            #expect(m.outputState == .reconnecting)
            #expect(m.refusals == attempt)
            clock.advance(delay)
        }
        #expect(m.nextAction(now: clock.now) == .connect(deadline: clock.now + .seconds(10)))
        #expect(
            m.connectFailed(isNetworkFailure: false, now: clock.now)
                == .fail(.refused(times: 3), closeDeadline: clock.now + .seconds(1), timedOut: false, dropped: 0))
        #expect(m.outputState == .failed)
        #expect(m.nextAction(now: clock.now + .seconds(60)) == .stop)
    }

    /// A publish accepted and dropped within 3 s counts as refused; one that lived longer, or a
    /// network failure, starts the count again.
    @Test func aPublishDroppedAtOnceCountsAsRefused() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        func liveThenLost(after: Duration, network: Bool) -> Machine.LossAction {
            _ = Self.connect(&m, clock)
            _ = m.packet(.video(ms: 0, .keyframe))
            _ = m.nextAction(now: clock.now)
            clock.advance(after)
            let action = m.writeFailed(isNetworkFailure: network, now: clock.now)
            if case .reconnect(let delay, _, _, _, _) = action { clock.advance(delay) }
            return action
        }
        _ = liveThenLost(after: .seconds(1), network: false)
        _ = liveThenLost(after: .seconds(2), network: false)
        #expect(m.refusals == 2)
        _ = liveThenLost(after: .seconds(4), network: false)
        #expect(m.refusals == 0, "a publish that lived 4 s was not refused")
        _ = liveThenLost(after: .seconds(1), network: false)
        _ = liveThenLost(after: .seconds(1), network: true)
        #expect(m.refusals == 0, "a network failure is not a refusal")
        _ = liveThenLost(after: .seconds(1), network: false)
        _ = liveThenLost(after: .seconds(1), network: false)
        guard case .fail(.refused(times: 3), _, _, _) = liveThenLost(after: .milliseconds(2999), network: false) else {
            Issue.record("not given up after 3 refusals: \(m.state)")
            return
        }
    }

    /// Connection refused (nothing listening) is retried for ever by default, and up to
    /// `maxAttempts` when set.
    @Test func networkFailuresRetryUntilMaxAttempts() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        for _ in 0..<20 {
            #expect(m.nextAction(now: clock.now) == .connect(deadline: clock.now + .seconds(10)))
            guard case .reconnect(let delay, _, _, _, _) = m.connectFailed(isNetworkFailure: true, now: clock.now) else {
                Issue.record("gave up on a network failure")
                return
            }
            clock.advance(delay)
        }
        var settings = LiveStreamSettings()
        settings.reconnect.maxAttempts = 2
        var limited = Self.machine(clock, settings: settings)
        _ = limited.nextAction(now: clock.now)
        guard case .reconnect(let delay, _, _, _, _) = limited.connectFailed(isNetworkFailure: true, now: clock.now) else {
            Issue.record("gave up after 1 of 2 attempts")
            return
        }
        clock.advance(delay)
        _ = limited.nextAction(now: clock.now)
        #expect(
            limited.connectFailed(isNetworkFailure: true, now: clock.now)
                == .fail(.gaveUp(attempts: 2), closeDeadline: clock.now + .seconds(1), timedOut: false, dropped: 0))
    }

    // MARK: Reconnect backoff

    /// About 1 s after a break, then x1.5 per failed attempt up to 2.5 s, each jittered to 0.5–1.5
    /// times; no attempt before its time.
    @Test(arguments: [0.0, 0.25, 0.5, 0.999_999])
    func reconnectBacksOffWithJitter(unit: Double) {
        var clock = FakeClock()
        var m = Self.machine(clock, jitter: { unit })
        _ = Self.connect(&m, clock)
        _ = m.packet(.video(ms: 0, .keyframe))
        _ = m.nextAction(now: clock.now)
        clock.advance(.seconds(10))
        var action = m.writeFailed(isNetworkFailure: true, now: clock.now)
        for (failures, base) in [(0, 1.0), (1, 1.5), (2, 2.25), (3, 2.5), (4, 2.5), (5, 2.5)] {
            guard case .reconnect(let delay, let attempt, _, _, _) = action else {
                Issue.record("gave up after \(failures) failures")
                return
            }
            #expect(attempt == failures + 1)
            let expected = base * (0.5 + unit)
            #expect(abs(delay.inSeconds - expected) < 1e-9, "after \(failures) failures: \(delay), expected \(expected) s")
            #expect(delay.inSeconds >= 0.5 * base && delay.inSeconds < 1.5 * base)
            // Not before its time.
            let due = clock.now + delay
            #expect(m.nextAction(now: due - .milliseconds(1)) == .wait(until: due))
            clock.now = due
            #expect(m.nextAction(now: clock.now) == .connect(deadline: clock.now + .seconds(10)))
            action = m.connectFailed(isNetworkFailure: true, now: clock.now)
        }
    }

    /// With the random jitter: every delay within 0.5–1.5 times its base, and spread over that range.
    @Test func randomJitterStaysInBounds() {
        var generator = SplitMix(seed: 17)
        var clock = FakeClock()
        var m = Self.machine(clock, jitter: { Double.random(in: 0..<1, using: &generator) })
        var low = 2.0
        var high = 0.0
        var capped = 0
        for attempt in 0..<500 {
            _ = m.nextAction(now: clock.now)
            let action = m.connectFailed(isNetworkFailure: true, now: clock.now)
            guard case .reconnect(let delay, _, _, _, _) = action else {
                Issue.record("network failure \(attempt + 1) gave \(action), not a reconnect")
                return
            }
            let ratio = delay.inSeconds / 2.5  // capped from the third failure on
            if m.failures >= 3 {
                #expect(ratio >= 0.5 && ratio < 1.5)
                low = min(low, ratio)
                high = max(high, ratio)
                capped += 1
            }
            clock.advance(delay)
        }
        #expect(capped >= 490, "capped delays judged: \(capped) of 500 failures")
        #expect(low < 0.6 && high > 1.4, "jitter does not spread: \(low)...\(high)")
    }

    // MARK: Drops by backlog

    /// Past 700 ms of media waiting, the disposable frames in the queue go (and nothing before);
    /// reference frames, keyframes and audio stay.
    @Test func dropsDisposableFramesPast700Milliseconds() {
        var queue = SendQueue<Packet>(threshold: 0.7, referenceThreshold: 0.9)
        for i in 0..<18 {
            var drops = Drops()
            queue.add(.video(ms: Int64(i) * 40, i == 0 ? .keyframe : i % 2 == 1 ? .disposable : .reference)) { drops.add($0) }
            queue.add(.audio(ms: Int64(i) * 40 + 20)) { drops.add($0) }
            #expect(drops == .none, "dropped at \(i * 40) ms of backlog")
        }
        // Frame 18 at 720 ms: the backlog passes 700 ms.
        var drops = Drops()
        queue.add(.video(ms: 720, .reference)) { drops.add($0) }
        #expect(drops == Drops(.backlog, 9), "\(drops)")
        #expect(!queue.waiting.contains { $0.dropPriority == .disposable })
        #expect(queue.waiting.filter { $0.mediaType == .audio }.count == 18)
        #expect(queue.waiting.first == .video(ms: 0, .keyframe))
        #expect(queue.waiting.last == .video(ms: 720, .reference))
        // Then past 900 ms the reference frames go too, though disposable frames were just dropped
        // (before: that drop held the reference check off until the front moved past it, so a
        // stream with B-frames on a slow path was never thinned further and its backlog grew).
        for i in 19..<23 {
            var drops = Drops()
            queue.add(.video(ms: Int64(i) * 40, i % 2 == 1 ? .disposable : .reference)) { drops.add($0) }
            queue.add(.audio(ms: Int64(i) * 40 + 20)) { drops.add($0) }
            #expect(drops == .none, "dropped at \(i * 40) ms of backlog")
        }
        drops = Drops()
        queue.add(.video(ms: 920, .disposable)) { drops.add($0) }
        var expected = Drops(.backlogReference, 13)  // the reference frames 2, 4, ... 22 and the disposable 19, 21
        expected.add(.awaitingKeyframe, 1)
        #expect(drops == expected, "\(drops)")
        #expect(queue.waiting.filter { $0.mediaType == .video } == [.video(ms: 0, .keyframe)])
        #expect(queue.waiting.filter { $0.mediaType == .audio }.count == 22)
    }

    /// Past 900 ms, every video frame but keyframes goes; then video is dropped until the next
    /// keyframe, where the stream resumes. Audio never goes. (x264's zerolatency: no disposable frames.)
    @Test func dropsReferenceFramesPast900MillisecondsAndResumesOnAKeyframe() {
        var queue = SendQueue<Packet>(threshold: 0.7, referenceThreshold: 0.9)
        var all = Drops()
        func add(_ p: Packet) -> Drops {
            var drops = Drops()
            queue.add(p) { drops.add($0) }
            all.add(drops)
            return drops
        }
        for i in 0..<23 {
            #expect(add(.video(ms: Int64(i) * 40, i == 0 ? .keyframe : .reference)) == .none, "dropped at \(i * 40) ms")
            #expect(add(.audio(ms: Int64(i) * 40 + 20)) == .none)
        }
        // Frame 23 at 920 ms: past 900 ms the queued reference frames go, and frame 23 waits for a keyframe.
        var expected = Drops(.backlogReference, 22)
        expected.add(.awaitingKeyframe, 1)
        #expect(add(.video(ms: 920, .reference)) == expected)
        for i in 24..<30 {
            #expect(add(.video(ms: Int64(i) * 40, .reference)) == Drops(.awaitingKeyframe, 1), "frame \(i) before the keyframe")
            #expect(add(.audio(ms: Int64(i) * 40 + 20)) == .none)
        }
        // The stream resumes on the keyframe, and what follows it is sent again.
        #expect(add(.video(ms: 1200, .keyframe)) == .none)
        #expect(add(.video(ms: 1240, .reference)) == .none)
        #expect(add(.video(ms: 1280, .disposable)) == .none)
        let video = queue.waiting.filter { $0.mediaType == .video }
        #expect(video == [.video(ms: 0, .keyframe), .video(ms: 1200, .keyframe), .video(ms: 1240, .reference), .video(ms: 1280, .disposable)])
        #expect(queue.waiting.filter { $0.mediaType == .audio }.count == 29, "no audio dropped")
        #expect(all.backlog == 0)
    }

    /// Through the state machine on a slow network (a write takes time by the packet's size: more
    /// than a second's worth of media per second, less once video is thinned; 25 fps with audio
    /// every 20 ms, a keyframe every 2 s): video is thinned by backlog, disposable frames
    /// only past 700 ms and reference frames only past 900 ms; audio and keyframes all go out.
    @Test func slowNetworkDropsVideoNeverAudioOrKeyframes() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        _ = Self.connect(&m, clock)
        var fed: [Packet] = []
        var sent: [Packet] = []
        var all = Drops()
        var writeDoneAt: MonotonicInstant?
        let start = clock.now
        for tick in 0..<2000 {  // 20 s in 10 ms steps
            let ms = Int64(tick) * 10
            var arriving: [Packet] = []
            if ms % 40 == 0 {
                let frame = ms / 40
                arriving.append(.video(ms: ms, frame % 50 == 0 ? .keyframe : frame % 2 == 1 ? .disposable : .reference))
            }
            if ms % 20 == 10 { arriving.append(.audio(ms: ms)) }
            for p in arriving {
                let backlog = m.queue.first.map { p.dtsNanoseconds - $0.dtsNanoseconds } ?? 0
                let drops = m.packet(p)
                if drops.backlog > 0 { #expect(backlog > 700_000_000, "disposable frames dropped at \(backlog / 1_000_000) ms") }
                if drops.backlogReference > 0 { #expect(backlog > 900_000_000, "reference frames dropped at \(backlog / 1_000_000) ms") }
                all.add(drops)
                fed.append(p)
            }
            if let done = writeDoneAt, clock.now >= done {
                _ = m.written(now: clock.now)
                writeDoneAt = nil
            }
            if writeDoneAt == nil, case .send(let p, _) = m.nextAction(now: clock.now) {
                sent.append(p)
                writeDoneAt = clock.now + Self.writeTime(p)
            }
            clock.now = start + .milliseconds(ms + 10)
        }
        #expect(all.backlog > 0 && all.backlogReference > 0, "\(all)")
        let delivered = sent + m.queue.waiting
        let audioDelivered = delivered.filter { $0.mediaType == .audio }
        let audioFed = fed.filter { $0.mediaType == .audio }
        #expect(audioDelivered == audioFed, "audio was dropped: \(audioDelivered.count) of \(audioFed.count) delivered")
        let keyframes = delivered.filter { $0.mediaType == .video && $0.isKeyframe }.count
        #expect(keyframes == fed.filter { $0.mediaType == .video && $0.isKeyframe }.count, "a keyframe was dropped")
        #expect(all.total + delivered.count == fed.count)
        // The backlog stays bounded: the newest packet is never more than a few seconds behind.
        #expect(m.queue.backlog < 3_000_000_000, "backlog \(m.queue.backlog / 1_000_000) ms")
    }

    static func writeTime(_ p: Packet) -> Duration {
        switch (p.mediaType, p.dropPriority) {
        case (.audio, _): .milliseconds(2)
        case (.video, .keyframe): .milliseconds(100)
        case (.video, .reference): .milliseconds(80)
        case (.video, .disposable): .milliseconds(30)
        }
    }

    /// Not connected, nothing is sent, so nothing is thinned: the queue keeps what came since the keyframe.
    @Test func noBacklogDropsWhileNotConnected() {
        let clock = FakeClock()
        var m = Self.machine(clock)
        _ = m.nextAction(now: clock.now)
        for i in 0..<60 {
            #expect(m.packet(.video(ms: Int64(i) * 40, i == 0 ? .keyframe : .disposable)) == .none)
        }
        #expect(m.queue.count == 60)
    }

    // MARK: Stall, timeout, pause

    /// A write that blocks: after 100 ms packets are taken in while it blocks, after 1 s the output
    /// is stalled (once), live again when the write returns; past the timeout it is interrupted and
    /// the loss says it timed out.
    @Test func aBlockedWriteStallsThenTimesOut() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        _ = Self.connect(&m, clock)
        _ = m.packet(.video(ms: 0, .keyframe))
        _ = m.packet(.video(ms: 40, .reference))
        _ = m.nextAction(now: clock.now)
        let started = clock.now
        #expect(m.blocked(now: started + .milliseconds(99)) == .carryOn)
        #expect(m.blocked(now: started + .milliseconds(100)) == .takePackets)
        #expect(m.outputState == .live)
        #expect(m.blocked(now: started + .milliseconds(999)) == .takePackets)
        #expect(m.blocked(now: started + .seconds(1)) == .takePacketsStalled(blockedFor: .seconds(1)))
        #expect(m.outputState == .stalled)
        #expect(m.blocked(now: started + .milliseconds(1100)) == .takePackets, "stalled is reported once")
        clock.now = started + .seconds(2)
        #expect(m.written(now: clock.now) == true, "the write ended a stall")
        #expect(m.outputState == .live)

        _ = m.nextAction(now: clock.now)
        let second = clock.now
        #expect(m.blocked(now: second + .seconds(1)) == .takePacketsStalled(blockedFor: .seconds(1)))
        #expect(m.blocked(now: second + .seconds(10)) == .takePackets, "the deadline is not passed at 10 s")
        #expect(m.blocked(now: second + .seconds(10) + .nanoseconds(1)) == .interrupt)
        clock.now = second + .seconds(10) + .milliseconds(100)
        guard case .reconnect(_, _, let closeDeadline, let timedOut, _) = m.writeFailed(isNetworkFailure: true, now: clock.now) else {
            Issue.record("no reconnect")
            return
        }
        #expect(timedOut)
        #expect(closeDeadline == clock.now + .seconds(1))
        // Closing what is left of the connection is bounded too.
        #expect(m.blocked(now: closeDeadline) == .carryOn)
        #expect(m.blocked(now: closeDeadline + .nanoseconds(1)) == .interrupt)
        m.closed()
        #expect(m.blocked(now: closeDeadline + .seconds(5)) == .carryOn)
    }

    /// Paused: everything is dropped as paused, no connect is attempted; after the resume the
    /// stream restarts on a keyframe.
    @Test func pauseDropsAndResumesOnAKeyframe() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        _ = Self.connect(&m, clock)
        _ = m.packet(.video(ms: 0, .keyframe))
        _ = m.packet(.video(ms: 40, .reference))
        #expect(m.paused(true) == Drops(.paused, 2))
        #expect(m.outputState == .paused)
        #expect(m.packet(.video(ms: 80, .keyframe)) == Drops(.paused, 1))
        #expect(m.nextAction(now: clock.now) == .wait(until: nil))
        #expect(m.paused(false) == .none)
        #expect(m.outputState == .live)
        #expect(m.packet(.video(ms: 120, .reference)) == Drops(.offline, 1))
        #expect(m.packet(.video(ms: 160, .keyframe)) == .none)
        #expect(m.nextAction(now: clock.now) == .send(.video(ms: 160, .keyframe), deadline: clock.now + .seconds(10)))

        // Not connected and paused: no attempt, even when one is due.
        var n = Self.machine(clock)
        _ = n.paused(true)
        clock.advance(.seconds(30))
        #expect(n.nextAction(now: clock.now) == .wait(until: nil))
        _ = n.paused(false)
        #expect(n.nextAction(now: clock.now) == .connect(deadline: clock.now + .seconds(10)))
    }

    // MARK: Finish

    /// Finishing: what is queued is sent until the finish deadline, then the output closes (the
    /// trailer has 2 s) and counts the rest as offline; a write blocked at the deadline is interrupted.
    @Test func finishSendsWhatIsQueuedUntilTheDeadline() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        _ = Self.connect(&m, clock)
        for i in 0..<10 { _ = m.packet(.video(ms: Int64(i) * 40, i == 0 ? .keyframe : .reference)) }
        let deadline = clock.now + .seconds(5)
        m.finishRequested(by: deadline)
        m.finishRequested(by: deadline + .seconds(60))  // the first request stands
        for i in 0..<3 {
            guard case .send(let p, _) = m.nextAction(now: clock.now) else {
                Issue.record("not sending before the deadline")
                return
            }
            #expect(p.milliseconds == Int64(i) * 40)
            clock.now = deadline
            _ = m.written(now: clock.now)
        }
        // A write blocked past the deadline is interrupted.
        _ = m.nextAction(now: clock.now)
        #expect(m.blocked(now: deadline) == .carryOn)
        #expect(m.blocked(now: deadline + .nanoseconds(1)) == .interrupt)
        clock.now = deadline + .milliseconds(50)
        _ = m.written(now: clock.now)
        #expect(m.nextAction(now: clock.now) == .finish(closeConnection: true, closeDeadline: clock.now + .seconds(2), dropped: 6))
        #expect(m.outputState == .finished)
        #expect(m.nextAction(now: clock.now) == .stop)
    }

    @Test func finishWithNothingQueuedOrNoConnectionIsImmediate() {
        var clock = FakeClock()
        var m = Self.machine(clock)
        _ = Self.connect(&m, clock)
        m.finishRequested(by: clock.now + .seconds(5))
        #expect(m.nextAction(now: clock.now) == .finish(closeConnection: true, closeDeadline: clock.now + .seconds(2), dropped: 0))

        var offline = Self.machine(clock)
        _ = offline.nextAction(now: clock.now)
        _ = offline.packet(.video(ms: 0, .keyframe))
        _ = offline.connectFailed(isNetworkFailure: true, now: clock.now)
        offline.closed()
        offline.finishRequested(by: clock.now + .seconds(5))
        clock.advance(.milliseconds(10))
        #expect(offline.nextAction(now: clock.now) == .finish(closeConnection: false, closeDeadline: clock.now + .seconds(2), dropped: 0))
    }
}

/// FinalizeTests' seeded generator, for `Double.random(in:using:)`.
extension SplitMix: RandomNumberGenerator {}

@Suite struct FinishDeadlineTests {
    @Test("the finish deadline is none until set, then the instant set, to the nanosecond")
    func finishDeadlineIsTyped() {
        let deadline = FinishDeadline()
        #expect(deadline.instant == nil)
        let instant = MonotonicInstant(nanoseconds: 123_456_789_012)
        deadline.set(instant)
        #expect(deadline.instant == instant)
        deadline.set(instant + .seconds(2))
        #expect(deadline.instant == MonotonicInstant(nanoseconds: 125_456_789_012))
    }
}
