import Synchronization
import Testing

@testable import BroadcastDaemon

/// `broadcast ui --open`'s login codes (issue 35 item 2), on a clock the test moves: a code is
/// good once, and only before its lifetime is over.
@Suite struct LoginCodesTests {
    final class Clock: Sendable {
        let now = Mutex(ContinuousClock.now)
        func advance(_ duration: Duration) { now.withLock { $0 += duration } }
    }

    @Test func aCodeWorksOnce() throws {
        let clock = Clock()
        let codes = LoginCodes(lifetime: .seconds(60), now: { clock.now.withLock { $0 } })
        let code = try codes.mint()
        let other = try codes.mint()
        #expect(code != other && code.count == 32)
        #expect(codes.redeem(code))
        #expect(!codes.redeem(code), "a second use")
        #expect(codes.redeem(other), "another code is its own")
        #expect(!codes.redeem(""))
        #expect(!codes.redeem(String(code.reversed())))
    }

    @Test func anExpiredCodeIsRefused() throws {
        let clock = Clock()
        let codes = LoginCodes(lifetime: .seconds(60), now: { clock.now.withLock { $0 } })
        let late = try codes.mint()
        let onTime = try codes.mint()
        clock.advance(.seconds(59))
        #expect(codes.redeem(onTime))
        clock.advance(.seconds(1))
        #expect(!codes.redeem(late), "at its lifetime's end")
        #expect(!codes.redeem(late), "nor afterwards")
    }
}
