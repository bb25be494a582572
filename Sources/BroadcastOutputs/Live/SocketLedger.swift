/// What a TCP output's socket holds, told in time: which bytes were written when, so that the
/// bytes the kernel still holds (SIOCOUTQ) say how long ago the oldest of them was written (the
/// path's backlog beyond the output's queue), and how fast the path took bytes lately.
///
/// Why time and not bytes: a keyframe of 100 KB sits in the socket for 130 ms on a 6 Mbit/s path
/// and for 700 ms on a 1.2 Mbit/s one; only its age says which. The rate the socket accepted is no
/// measure of the path either: when the path narrows, the socket's buffer (up to half a second of
/// media) first fills at the old rate. What the path took is what was written less what the socket
/// still holds.
///
/// Fixed storage (a ring of the last `capacity` writes, the last four reads): no allocation once
/// made. Output thread only.
struct SocketLedger {
    /// The writes: cumulative bytes written at each write's end, and when the write began (ns).
    private var writes: [(end: Int64, time: Int64)]
    private var newest = -1
    private var count = 0
    /// The last reads: time (ns) and bytes delivered (written less held); how many of the newest
    /// found the socket holding bytes, one after another.
    private var reads: [(time: Int64, delivered: Int64)]
    private var readCount = 0

    init(capacity: Int = 512) {
        writes = Array(repeating: (0, 0), count: capacity)
        reads = Array(repeating: (0, 0), count: 4)
    }

    /// A write that began at `time` (ns) left `end` bytes written in all (this connection and
    /// those before: the same count `read` is given).
    mutating func wrote(upTo end: Int64, startedAt time: Int64) {
        newest = (newest + 1) % writes.count
        writes[newest] = (end, time)
        count = min(count + 1, writes.count)
    }

    /// A read of the socket at `now` (ns): `written` bytes in all, `held` of them still in the
    /// socket. Returns how long ago the oldest byte it holds was written (ns; 0 when it holds
    /// none; `writingSince` when it is part of a write still going on) and what the path took
    /// over the last reads (bits per second), known only when the socket held bytes at the last
    /// three or four: the path, not the stream, set the pace.
    mutating func read(now: Int64, written: Int64, held: Int64, writingSince: Int64?) -> (age: Int64, pathBitsPerSecond: Int?) {
        let delivered = written - held
        reads.removeFirst()
        reads.append((now, delivered))
        // The path's rate shows only while the socket held bytes at every read: otherwise the
        // path took all there was and could have taken more.
        readCount = held > 0 ? min(readCount + 1, reads.count) : 0
        var rate: Int?
        if readCount >= 3, case let first = reads[reads.count - readCount], now > first.time {
            rate = max(0, Int(Double(delivered - first.delivered) * 8e9 / Double(now - first.time)))
        }
        guard held > 0 else { return (0, rate) }
        // The oldest write whose end lies past what was delivered holds the socket's oldest byte.
        var oldest: Int64?
        var index = newest
        for _ in 0..<count {
            guard writes[index].end > delivered else { break }
            oldest = writes[index].time
            index = (index - 1 + writes.count) % writes.count
        }
        // None of the writes the ledger has: part of the one going on (or bytes written outside
        // `send`, such as the header's: counted as new).
        if oldest == nil { oldest = writingSince }
        return (max(0, now - (oldest ?? now)), rate)
    }

    /// The connection closed: nothing is held any more.
    mutating func reset() {
        newest = -1
        count = 0
        readCount = 0
    }
}
