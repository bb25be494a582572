import BroadcastKit
import Testing

@Suite struct MediaTimeTests {
    @Test func additionAcrossTimescalesIsExact() {
        let a = MediaTime(value: 1, timescale: 30)  // 33.3 ms
        let b = MediaTime(value: 1024, timescale: 48_000)  // 21.3 ms
        let sum = a + b
        #expect(sum == MediaTime(value: 1600 + 1024, timescale: 48_000))
        #expect(sum.timescale == 48_000)
        #expect((sum - b) == a)
    }

    @Test func equalInstantsAreEqualAndHashAlike() {
        let half = MediaTime(value: 1, timescale: 2)
        let ms = MediaTime(value: 500, timescale: 1000)
        #expect(half == ms)
        #expect(Set([half, ms]).count == 1)
        #expect(MediaTime(value: 1, timescale: 3) != MediaTime(value: 333, timescale: 1000))
    }

    @Test func comparisonOrdersSpecialValues() {
        let values: [MediaTime] = [.invalid, .positiveInfinity, .indefinite, MediaTime(value: 5, timescale: 1), .negativeInfinity, .zero]
        #expect(values.sorted() == [.negativeInfinity, .zero, MediaTime(value: 5, timescale: 1), .positiveInfinity, .indefinite, .invalid])
        #expect(MediaTime(value: -1, timescale: 1_000_000_000) < .zero)
    }

    @Test(arguments: [
        // value, from, to, rounding, expected
        (1, 3, 1000, MediaTime.Rounding.nearest, 333),
        (2, 3, 1000, .nearest, 667),
        (1, 2, 1, .nearest, 1),  // halfway: away from zero
        (-1, 2, 1, .nearest, -1),
        (1, 3, 1000, .up, 334),
        (-1, 3, 1000, .up, -333),
        (-1, 3, 1000, .down, -334),
        (1, 3, 1000, .down, 333),
        (-1, 3, 1000, .towardZero, -333),
        (-1, 3, 1000, .awayFromZero, -334),
        (1001, 30000, 90000, .nearest, 3003),
    ] as [(Int64, Int32, Int32, MediaTime.Rounding, Int64)])
    func rescaleRounds(value: Int64, from: Int32, to: Int32, rounding: MediaTime.Rounding, expected: Int64) {
        let t = MediaTime(value: value, timescale: from).rescaled(to: to, rounding: rounding)
        #expect(t.isNumeric)
        #expect(t.value == expected)
        #expect(t.timescale == to)
    }

    @Test func overflowSaturatesInsteadOfTrapping() {
        let huge = MediaTime(value: .max, timescale: 1)
        #expect(huge.rescaled(to: 1_000_000_000) == .positiveInfinity)
        #expect(MediaTime(value: .min, timescale: 1).rescaled(to: 1000) == .negativeInfinity)
        #expect(huge + MediaTime(value: 1, timescale: 1) == .positiveInfinity)
        #expect(MediaTime(value: .min, timescale: 1) - MediaTime(value: 1, timescale: 1) == .negativeInfinity)
        #expect(huge * 2 == .positiveInfinity)
        #expect(huge * -2 == .negativeInfinity)
        // Big values that fit only after reduction still come out exact.
        let big = MediaTime(value: Int64.max / 2, timescale: 1_000_000_000)
        #expect((big + big).value == Int64.max - 1)
    }

    @Test func specialValuesPropagate() {
        let one = MediaTime(value: 1, timescale: 1)
        #expect(MediaTime.invalid + one == .invalid)
        #expect((one - .invalid).isValid == false)
        #expect(MediaTime.indefinite + one == .indefinite)
        #expect(MediaTime.positiveInfinity + one == .positiveInfinity)
        #expect(one - .positiveInfinity == .negativeInfinity)
        #expect(MediaTime.positiveInfinity + .negativeInfinity == .invalid)
        #expect(MediaTime.positiveInfinity * 0 == .invalid)
        #expect(MediaTime.invalid.seconds.isNaN)
        #expect(MediaTime.indefinite.rescaled(to: 90_000) == .indefinite)
        #expect(MediaTime.invalid.nanoseconds == nil)
    }

    @Test func secondsConversions() {
        #expect(MediaTime(seconds: 1.5, timescale: 1000) == MediaTime(value: 1500, timescale: 1000))
        #expect(MediaTime(seconds: .nan, timescale: 1000) == .invalid)
        #expect(MediaTime(seconds: -.infinity, timescale: 1000) == .negativeInfinity)
        #expect(MediaTime(seconds: 1e300, timescale: 1000) == .positiveInfinity)
        #expect(MediaTime(value: 1001, timescale: 30000).nanoseconds == 33_366_667)
    }
}
