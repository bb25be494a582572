@testable import BroadcastOutputs
import Testing

@Suite struct BitrateWindowTests {
    @Test("bits per second over the window; nothing until it is over; a restart leaves the paused time out")
    func window() {
        let t0 = MonotonicInstant.now()
        var window = BitrateWindow(length: .seconds(2), now: t0)
        #expect(window.add(100_000, now: t0 + .seconds(1)) == nil)
        // 250 000 bytes in 2 s: 1 Mbit/s.
        #expect(window.add(150_000, now: t0 + .seconds(2)) == 1_000_000)
        window.restart(at: t0 + .seconds(10))
        #expect(window.add(500_000, now: t0 + .seconds(11)) == nil)
        #expect(window.add(0, now: t0 + .seconds(12)) == 2_000_000)
    }
}
