import Atomics
import BroadcastKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct WakeupTests {
    /// Ping-pong through an SPSC ring, one element at a time: the producer pushes, wakes, and waits
    /// until the consumer has taken it; the consumer takes, then goes to sleep on an empty ring.
    /// Every round races the producer's publish + wake against the consumer's prepare + check, the
    /// Dekker pattern. A wake-up that is lost leaves the consumer asleep with an element in the ring
    /// until its timeout: that sleep is counted (by the test, from the ring, and by the Wakeup's own
    /// `late` counter). The timeout is long (nothing else would end such a sleep; the producer
    /// never pushes twice), so under load an honest round never looks lost.
    @Test("no wake-up is lost when publish and sleep race (Dekker)")
    func noLostWakeupsUnderStress() {
        let wakeup = Wakeup()
        let ring = SPSCRing<Int>(capacity: 4)
        let consumed = ManagedAtomic<Int>(0)
        let lost = ManagedAtomic<Int>(0)
        let stop = ManagedAtomic<Bool>(false)
        let rounds = 100_000
        let timeout: Int64 = 400_000_000

        // A short random pause on both sides sweeps their relative timing across the race window.
        @Sendable func jitter(_ state: inout UInt64, _ spin: ManagedAtomic<Int>) {
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            for _ in 0..<Int(state % 256) { _ = spin.load(ordering: .relaxed) }
        }
        let spin = ManagedAtomic<Int>(0)

        let consumer = OSThread(name: "test-consumer") {
            var taken = 0
            var random: UInt64 = 0x9E37_79B9_7F4A_7C15
            while !stop.load(ordering: .acquiring) {
                if ring.pop() != nil {
                    taken += 1
                    consumed.store(taken, ordering: .releasing)
                    jitter(&random, spin)
                    continue
                }
                wakeup.prepareToSleep()
                if !ring.isEmpty || stop.load(ordering: .acquiring) {
                    wakeup.cancelSleep()
                    continue
                }
                if !wakeup.sleep(timeoutNanoseconds: timeout), !ring.isEmpty {
                    // Timed out with an element waiting: its wake-up never came.
                    lost.wrappingIncrement(ordering: .relaxed)
                }
            }
        }

        var pushed = 0
        var random: UInt64 = 0xD1B5_4A32_D192_ED03
        let deadline = MonotonicClock().now() + 20_000_000_000
        // A lost wake-up costs a whole timeout: give up after a few, the answer is known. The
        // deadline only bounds the run on a very busy machine; it decides nothing.
        while pushed < rounds, lost.load(ordering: .relaxed) < 3, MonotonicClock().now() < deadline {
            jitter(&random, spin)
            #expect(ring.push(pushed))
            wakeup.wake()
            pushed += 1
            while consumed.load(ordering: .acquiring) < pushed {
                // Spin briefly (the race wants both threads hot), then yield (2 shared cores).
                for _ in 0..<64 where consumed.load(ordering: .acquiring) < pushed {}
                if consumed.load(ordering: .acquiring) < pushed { sched_yield() }
            }
        }
        stop.store(true, ordering: .releasing)
        wakeup.wake()
        consumer.join()

        let s = wakeup.statistics
        #expect(lost.load(ordering: .relaxed) == 0, "lost wake-ups: \(lost.load(ordering: .relaxed)) in \(pushed) rounds; \(s)")
        #expect(s.late == 0, "sleeps ended by the timeout although woken: \(s)")
        #expect(s.signalled > 0, "the consumer never slept: the race was not exercised (\(s))")
    }

    /// The store-buffer litmus test on the hand-off itself, without sleeping: in each round the
    /// producer publishes and calls `wake()` while the consumer calls `prepareToSleep()` and checks
    /// the ring, both let go at the same moment (with random offsets that sweep the race window).
    /// A round where the consumer saw nothing *and* the producer wrote no byte is a lost wake-up (the
    /// consumer would sleep with an element waiting). Without the fences x86 lets each side's load
    /// pass its own store, and such rounds can appear. (Measured here, the unfenced hand-off did not
    /// show it in either test: Swift's reference counting puts atomic read-modify-writes, full barriers
    /// on x86, between the two in practice. The fences make it hold by the memory model, not by luck.)
    @Test("Dekker litmus: the consumer sees the data or the producer sees the sleeper")
    func dekkerLitmus() {
        let wakeup = Wakeup()
        let ring = SPSCRing<Int>(capacity: 4)
        let go = ManagedAtomic<Int>(0)
        let done = ManagedAtomic<Int>(0)
        let spin = ManagedAtomic<Int>(0)
        let rounds = 100_000
        let producer = OSThread(name: "test-producer") {
            var random: UInt64 = 0x9E37_79B9_7F4A_7C15
            for round in 1...rounds {
                while go.load(ordering: .acquiring) < round {}
                random ^= random << 13
                random ^= random >> 7
                random ^= random << 17
                for _ in 0..<Int(random % 32) { _ = spin.load(ordering: .relaxed) }
                ring.push(round)
                wakeup.wake()
                done.store(round, ordering: .releasing)
            }
        }
        var random: UInt64 = 0xD1B5_4A32_D192_ED03
        var lost = 0
        var played = 0
        // The deadline bounds the run on a very busy machine; below `minimumRounds` played the test
        // exercised too little to say anything, and fails rather than pass on nothing.
        let minimumRounds = 1_000
        let deadline = MonotonicClock().now() + 30_000_000_000
        for round in 1...rounds {
            if MonotonicClock().now() > deadline { break }
            let writesBefore = wakeup.statistics.writes
            go.store(round, ordering: .releasing)
            random ^= random << 13
            random ^= random >> 7
            random ^= random << 17
            for _ in 0..<Int(random % 64) { _ = spin.load(ordering: .relaxed) }
            wakeup.prepareToSleep()
            let sawNothing = ring.isEmpty
            while done.load(ordering: .acquiring) < round {}
            if sawNothing, wakeup.statistics.writes == writesBefore { lost += 1 }
            _ = ring.pop()
            wakeup.cancelSleep()
            wakeup.drain()
            played = round
        }
        go.store(Int.max, ordering: .releasing)  // lets a producer left behind by the deadline run out
        producer.join()
        #expect(lost == 0, "lost wake-ups in \(played) rounds: \(lost)")
        #expect(played >= minimumRounds, "only \(played) rounds played before the deadline")
    }

    @Test("a Duration timeout: the same sleep, a wake-up ends it, a zero or negative one returns at once")
    func durationTimeout() {
        let wakeup = Wakeup()
        wakeup.prepareToSleep()
        #expect(wakeup.sleep(timeout: .zero) == false)
        wakeup.prepareToSleep()
        #expect(wakeup.sleep(timeout: .milliseconds(-5)) == false)
        wakeup.prepareToSleep()
        wakeup.wake()
        #expect(wakeup.sleep(timeout: .seconds(10)) == true)
        #expect(wakeup.statistics.timedOut == 2)
        #expect(wakeup.statistics.signalled == 1)
    }

    @Test("a sleep without a wake-up times out and says so")
    func timeoutIsCounted() {
        let wakeup = Wakeup()
        wakeup.prepareToSleep()
        #expect(wakeup.sleep(timeoutNanoseconds: 1_000_000) == false)
        wakeup.prepareToSleep()
        wakeup.wake()
        #expect(wakeup.sleep(timeoutNanoseconds: 10_000_000_000) == true)
        let s = wakeup.statistics
        #expect(s.timedOut == 1)
        #expect(s.signalled == 1)
        #expect(s.late == 0)
        #expect(s.writes == 1)
    }

    @Test("a wake with nobody about to sleep writes nothing")
    func wakeWithoutSleeperIsFree() {
        let wakeup = Wakeup()
        for _ in 0..<100 { wakeup.wake() }
        #expect(wakeup.statistics.writes == 0)
        // Many wakers of one sleep: one byte.
        wakeup.prepareToSleep()
        for _ in 0..<10 { wakeup.wake() }
        #expect(wakeup.statistics.writes == 1)
        wakeup.sleep(timeoutNanoseconds: 0)
    }
}
