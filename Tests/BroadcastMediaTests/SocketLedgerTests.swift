@testable import BroadcastOutputs
import Testing

/// The RTMP output's socket told in time: how long ago the oldest byte the kernel still holds was
/// written, and the path's rate while the socket held bytes (the path, not the stream, set the
/// pace).
@Suite struct SocketLedgerTests {
    static let ms: Int64 = 1_000_000

    @Test func anEmptySocketHoldsNothingLate() {
        var ledger = SocketLedger()
        ledger.wrote(upTo: 1000, startedAt: 0)
        let read = ledger.read(now: 50 * Self.ms, written: 1000, held: 0, writingSince: nil)
        #expect(read.age == 0)
        #expect(read.pathBitsPerSecond == nil)
    }

    @Test func theOldestHeldByteSaysHowLateTheSocketIs() {
        var ledger = SocketLedger()
        ledger.wrote(upTo: 1000, startedAt: 0)
        ledger.wrote(upTo: 2000, startedAt: 100 * Self.ms)
        ledger.wrote(upTo: 3000, startedAt: 200 * Self.ms)
        // 1500 delivered: the first write is gone, the second is half in the socket.
        #expect(ledger.read(now: 300 * Self.ms, written: 3000, held: 1500, writingSince: nil).age == 200 * Self.ms)
        // Only the last write's tail is left.
        #expect(ledger.read(now: 400 * Self.ms, written: 3000, held: 10, writingSince: nil).age == 200 * Self.ms)
        // Bytes past every write it knows: the write going on.
        #expect(ledger.read(now: 500 * Self.ms, written: 3500, held: 400, writingSince: 450 * Self.ms).age == 50 * Self.ms)
    }

    @Test func theLedgerForgetsOnlyItsOldestWrites() {
        var ledger = SocketLedger(capacity: 4)
        for index in 1...10 { ledger.wrote(upTo: Int64(index) * 100, startedAt: Int64(index) * 10 * Self.ms) }
        // Everything from the 7th write on is held: the ledger has writes 7-10; the 7th began at 70 ms.
        #expect(ledger.read(now: 200 * Self.ms, written: 1000, held: 400, writingSince: nil).age == 130 * Self.ms)
        // More held than the ledger knows of: at least as old as its oldest.
        #expect(ledger.read(now: 200 * Self.ms, written: 1000, held: 900, writingSince: nil).age == 130 * Self.ms)
    }

    @Test func thePathsRateShowsOnlyWhileTheSocketHoldsBytes() {
        var ledger = SocketLedger()
        // 12 500 bytes a 100 ms read taken by the path (1 Mbit/s) while 40 000 stay held.
        var written: Int64 = 100_000
        ledger.wrote(upTo: written, startedAt: 0)
        var rates: [Int?] = []
        for read in 1...5 {
            written += 12_500
            ledger.wrote(upTo: written, startedAt: Int64(read) * 100 * Self.ms - 50 * Self.ms)
            rates.append(ledger.read(now: Int64(read) * 100 * Self.ms, written: written, held: 40_000, writingSince: nil).pathBitsPerSecond)
        }
        // Three reads in a row are needed; from then on, the rate the path took.
        #expect(rates[0] == nil && rates[1] == nil)
        #expect(rates[2...].allSatisfy { $0 == 1_000_000 }, "\(rates)")
        // An empty socket: the stream, not the path, set the pace; the rate is unknown again.
        written += 5000
        #expect(ledger.read(now: 600 * Self.ms, written: written, held: 0, writingSince: nil).pathBitsPerSecond == nil)
        #expect(ledger.read(now: 700 * Self.ms, written: written + 100, held: 100, writingSince: nil).pathBitsPerSecond == nil)
    }
}
