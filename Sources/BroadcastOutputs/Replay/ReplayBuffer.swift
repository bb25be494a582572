/// How long and how big a replay buffer may get.
public struct ReplaySettings: Sendable, Hashable {
    /// Media kept: the last this many seconds plus the rest of the GOP they start in.
    public var seconds: Double
    /// The most the buffered packets may take (payload plus a fixed cost per packet); past it the
    /// oldest GOP goes, even if that leaves less than `seconds`.
    public var maxBytes: Int64

    /// 256 MiB: 5 min of 1080p at 6 Mbit/s, about 13 min at the 720p default.
    public static let defaultMaxBytes: Int64 = 256 << 20

    public init(seconds: Double, maxBytes: Int64 = ReplaySettings.defaultMaxBytes) {
        self.seconds = seconds
        self.maxBytes = maxBytes
    }

    public var nanoseconds: Int64 { Int64((seconds * 1e9).rounded()) }
}

/// The packets of a replay buffer, oldest first, always starting on a start point (a video
/// keyframe; any packet when there is no video), bounded by time and by bytes. Pure: the replay
/// output's thread owns one; unit tests drive it with fake packets.
///
/// Times are nanoseconds of the encoder's media time. `shift` is what an output-level pause took
/// out (as in a recording): `time - shift` is continuous across such pauses.
public struct ReplayBuffer<Packet> {
    public struct Entry {
        public var packet: Packet
        public var isVideo: Bool
        /// A packet a saved file may start with.
        public var isStart: Bool
        public var pts: Int64
        public var dts: Int64
        /// pts + duration.
        public var end: Int64
        public var shift: Int64
        /// What it costs in memory: payload plus `perPacketOverhead`.
        public var bytes: Int

        public init(packet: Packet, isVideo: Bool, isStart: Bool, pts: Int64, dts: Int64, end: Int64, shift: Int64, payloadBytes: Int) {
            self.packet = packet
            self.isVideo = isVideo
            self.isStart = isStart
            self.pts = pts
            self.dts = dts
            self.end = end
            self.shift = shift
            self.bytes = payloadBytes + ReplayBuffer.perPacketOverhead
        }
    }

    /// What a buffered packet costs beside its payload: the AVPacket, its AVBufferRef and buffer
    /// header, the Swift object and this entry, plus the payload's padding (measured order: ~300).
    public static var perPacketOverhead: Int { 320 }

    /// What a save would write: the packets (audio before the start trimmed), the shift that
    /// makes the first one time zero, and what it covers.
    public struct Selection {
        public var entries: [Entry]
        /// Taken off (with each entry's own shift) so the file starts at zero.
        public var base: Int64
        /// Media covered, from the start point to the end of the last packet.
        public var durationNanoseconds: Int64
        /// Less was buffered than asked for.
        public var isShorter: Bool
    }

    public let limitNanoseconds: Int64
    public let maxBytes: Int64
    /// Oldest first. Dropping a GOP moves the rest down: a few thousand small entries every
    /// keyframe interval, cheaper than the bookkeeping of a ring.
    private var entries: [Entry] = []
    /// Indices (into `entries`) of the start points, oldest first; `starts[0]` is 0 when not empty.
    private var starts: [Int] = []
    public private(set) var bytes: Int64 = 0
    /// GOPs dropped for the byte bound (not for age).
    public private(set) var gopsDroppedForMemory = 0
    /// Times the byte bound was smaller than a single GOP, which was then dropped whole.
    public private(set) var overflows = 0
    /// Newest end (pts + duration) with the shift taken off.
    private var newestEnd: Int64 = .min
    /// While a save waits for its last packets: the end it will cut at (shift taken off). Age
    /// trimming measures from here instead of the newest packet, so the GOP the save needs stays.
    public var holdEnd: Int64?

    public init(settings: ReplaySettings) {
        limitNanoseconds = settings.nanoseconds
        maxBytes = settings.maxBytes
    }

    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }

    /// Media held, from the oldest start point to the newest end.
    public var bufferedNanoseconds: Int64 {
        guard let first = entries.first, newestEnd != .min else { return 0 }
        return max(0, newestEnd - (first.dts - first.shift))
    }

    /// Adds a packet at the new end; a packet before the first start point is not kept. Then
    /// drops the oldest GOPs past the time and byte bounds.
    public mutating func append(_ entry: Entry) {
        if isEmpty {
            guard entry.isStart else { return }
            newestEnd = .min
        }
        if entry.isStart { starts.append(entries.count) }
        entries.append(entry)
        bytes += Int64(entry.bytes)
        newestEnd = max(newestEnd, entry.end - entry.shift)
        trim()
    }

    private mutating func trim() {
        // Age: the second GOP alone still covers the limit, so the first is not needed.
        while starts.count >= 2 {
            let second = entries[starts[1]]
            guard second.dts - second.shift <= min(newestEnd, holdEnd ?? .max) - limitNanoseconds else { break }
            dropFirstGOP()
        }
        // Bytes: the oldest GOP goes first; a single GOP larger than the bound goes too.
        while bytes > maxBytes {
            if starts.count >= 2 {
                dropFirstGOP()
                gopsDroppedForMemory += 1
            } else {
                overflows += 1
                removeAll()
                break
            }
        }
    }

    private mutating func dropFirstGOP() {
        let next = starts[1]
        for i in 0..<next { bytes -= Int64(entries[i].bytes) }
        entries.removeSubrange(0..<next)
        starts.removeFirst()
        for i in starts.indices { starts[i] -= next }
    }

    public mutating func removeAll() {
        entries.removeAll()
        starts.removeAll()
        bytes = 0
        newestEnd = .min
    }

    /// What to save for a request cut at media time `cut` (nil: everything buffered) asking for
    /// the last `seconds` (nil: the whole buffer). nil when nothing before the cut is buffered.
    public func selection(cut: Int64?, nanoseconds wanted: Int64?) -> Selection? {
        let limit = cut ?? .max
        // The newest end of what is kept, in shifted time.
        var end: Int64 = .min
        var candidates: [Int] = []
        for i in entries.indices where entries[i].pts < limit {
            end = max(end, entries[i].end - entries[i].shift)
            if entries[i].isStart { candidates.append(i) }
        }
        guard let first = candidates.first else { return nil }
        let want = wanted ?? limitNanoseconds
        // The latest start point at or before end - want: the last `want` plus the rest of its GOP.
        var chosen = first
        for i in candidates {
            let e = entries[i]
            if e.dts - e.shift <= end - want { chosen = i } else { break }
        }
        let start = entries[chosen]
        let base = start.dts - start.shift
        let startPTS = start.pts - start.shift
        var selected: [Entry] = []
        selected.reserveCapacity(entries.count - chosen)
        for i in chosen..<entries.count {
            let e = entries[i]
            guard e.pts < limit else { continue }
            // Audio starts at the same instant as the picture.
            if !e.isVideo, e.pts - e.shift < startPTS { continue }
            selected.append(e)
        }
        let duration = max(0, end - base)
        // A few ms of slack: a frame's end rarely falls on the exact nanosecond asked for.
        let shorter = duration + 5_000_000 < want
        return Selection(entries: selected, base: base, durationNanoseconds: duration, isShorter: shorter)
    }
}
