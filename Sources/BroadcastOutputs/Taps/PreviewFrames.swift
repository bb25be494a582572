import Atomics
public import BroadcastKit
import BroadcastMedia
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The latest video frame as a JPEG (`GET /v1/preview.jpg`), made off the session thread and
/// cached, so any number of clients cost at most a few encodes a second.
///
/// The session thread is asked for a frame through one atomic word: `idle` → `wanted` (a client's
/// request) → `filled` (the session copied the next video frame it delivered into the preview's
/// own memory; otherwise it only loads the word) → `idle` once encoded, each step a release that
/// the other side acquires. The copy is the session's only work; scaling and JPEG encoding happen
/// on the requesting thread. Requests take a lock among themselves (never the session), but never
/// wait under it: a JPEG younger than `minimumInterval` is answered from the cache, so frames are
/// asked of the session at most 1/`minimumInterval` times a second.
public final class PreviewFrames: @unchecked Sendable {
    public static let minimumInterval: Duration = .milliseconds(300)
    /// How long a request waits for the session's next frame (none while paused: the last JPEG is answered).
    public static let frameWait: Duration = .seconds(1)

    private enum Slot: Int {
        case idle, wanted, filled
    }

    private let slot = ManagedAtomic<Int>(Slot.idle.rawValue)
    // The copied frame: written by the session thread only while the slot is `wanted`, read by a
    // request only while it is `filled`.
    private var memory: UnsafeMutableRawPointer?
    private var memoryBytes = 0
    private var planes: [Plane] = []
    private var format: VideoFormat?
    private var time = MediaTime(value: 0, timescale: 1_000_000_000)

    private struct Cache {
        var encoder: JPEGEncoder?
        var frameAt: ContinuousClock.Instant?
        var jpegs: [Int: [UInt8]] = [:]
        var frameWidth = 0
        var encodes = 0
        /// When the session was asked for the frame that has not come yet (nil: none asked).
        var askedAt: ContinuousClock.Instant?
        /// Asks made, and how many of them ended without a frame (each request waits for its ask's end).
        var asks = 0
        var unanswered = 0
        /// Requests waiting for the current ask.
        var waiting = 0
        /// When the last ask ended without a frame (nil: it had one).
        var missedAt: ContinuousClock.Instant?
    }

    private let cache = Mutex(Cache())
    private let now: @Sendable () -> ContinuousClock.Instant

    /// `now`: the clock requests are timed by (tests move one of their own).
    public init(now: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }) {
        self.now = now
    }

    deinit { memory?.deallocate() }

    /// JPEGs encoded so far.
    public var encodes: Int { cache.withLock { $0.encodes } }
    /// Times the session was asked for a frame, and requests waiting for the current ask.
    public var asks: (made: Int, waiting: Int) { cache.withLock { ($0.asks, $0.waiting) } }

    // MARK: Session thread

    /// A video frame the session delivers: copied only when a request is waiting for one.
    public func offer(_ buffer: borrowing SampleBuffer) {
        // Acquired: the request's reads of the copy (its last encode) come before these writes.
        guard slot.load(ordering: .acquiring) == Slot.wanted.rawValue, let format = buffer.videoFormat else { return }
        var total = 0
        for plane in buffer.planes { total += plane.count }
        if total > memoryBytes {
            // Only when the picture grows: at most once per format.
            memory?.deallocate()
            memory = UnsafeMutableRawPointer.allocate(byteCount: total, alignment: 64)
            memoryBytes = total
            planes.reserveCapacity(4)
        }
        planes.removeAll(keepingCapacity: true)
        var offset = 0
        for plane in buffer.planes {
            memory!.advanced(by: offset).copyMemory(from: plane.base, byteCount: plane.count)
            planes.append(Plane(base: UnsafeRawPointer(memory!.advanced(by: offset)), count: plane.count, bytesPerRow: plane.bytesPerRow))
            offset += plane.count
        }
        self.format = format
        time = buffer.presentationTime
        slot.store(Slot.filled.rawValue, ordering: .releasing)
    }

    // MARK: Requests

    public enum Answer: Equatable, Sendable {
        case jpeg([UInt8])
        /// No frame has come (no broadcast, no video, or nothing delivered yet).
        case noFrame
        case failed(String)
    }

    /// The latest frame as a JPEG at most `width` pixels wide (the frame's width when larger).
    ///
    /// A request waits for the session's frame without holding the cache's lock: every request
    /// that comes meanwhile joins the same ask, and the first to see the frame encodes it for all.
    /// When none came within `frameWait` (paused, ended), every request of that ask gets the last
    /// picture then, at once, and for another `frameWait` so does every request (without waiting,
    /// leaving an ask open, so that the next request after a resume gets the new frame).
    public func jpeg(width: Int) -> Answer {
        var round: Int?
        while true {
            let answer: Answer? = cache.withLock { cache in
                let now = self.now()
                if let at = cache.frameAt, now - at < Self.minimumInterval {
                    let width = min(width, cache.frameWidth)
                    if let jpeg = cache.jpegs[width] { return .jpeg(jpeg) }
                    // Another width of the same frame: encoded from the copy the preview still holds.
                    return encode(&cache, width: width)
                }
                let missedLately = cache.missedAt.map { now - $0 < Self.frameWait } ?? false
                if slot.load(ordering: .acquiring) == Slot.filled.rawValue {
                    // The frame asked for (the session is done with the copy: it writes only while
                    // `wanted`), unless the ask is so old that the frame may be too: then another.
                    if let asked = cache.askedAt, now - asked <= Self.frameWait * 2 || round != nil {
                        cache.askedAt = nil
                        cache.missedAt = nil
                        cache.waiting = 0
                        cache.jpegs = [:]
                        cache.frameAt = now
                        cache.frameWidth = format?.width ?? 0
                        let answer = encode(&cache, width: min(width, cache.frameWidth))
                        slot.store(Slot.idle.rawValue, ordering: .releasing)
                        return answer
                    }
                    cache.askedAt = nil
                }
                if let joined = round, cache.unanswered > joined {
                    // The ask this request joined ended without a frame.
                    return lastPicture(cache, width: width)
                }
                guard let asked = cache.askedAt else {
                    // Released: what this thread read of the copy before comes before the session's next writes.
                    cache.askedAt = now
                    cache.asks += 1
                    slot.store(Slot.wanted.rawValue, ordering: .releasing)
                    // An ask ended without a frame a moment ago (paused): the last picture at once,
                    // the ask left open for the next request.
                    if missedLately { return lastPicture(cache, width: width) }
                    cache.waiting = 1
                    round = cache.unanswered
                    return nil
                }
                if round == nil {
                    if missedLately { return lastPicture(cache, width: width) }
                    round = cache.unanswered
                    cache.waiting += 1
                }
                guard now - asked >= Self.frameWait else { return nil }
                // No frame came. The ask is taken back unless the session filled it meanwhile.
                guard slot.compareExchange(expected: Slot.wanted.rawValue, desired: Slot.idle.rawValue, ordering: .acquiringAndReleasing).exchanged
                else { return nil }
                cache.askedAt = nil
                cache.missedAt = now
                cache.waiting = 0
                cache.unanswered += 1
                return lastPicture(cache, width: width)
            }
            if let answer { return answer }
            usleep(5000)
        }
    }

    /// Paused or ended: the last picture, if any.
    private func lastPicture(_ cache: Cache, width: Int) -> Answer {
        if let jpeg = cache.jpegs[min(width, cache.frameWidth)] ?? cache.jpegs.values.first { return .jpeg(jpeg) }
        return .noFrame
    }

    /// Forgets the pictures made so far (a new broadcast starts: the last one's are not its own).
    /// Only while no session offers frames.
    public func forget() {
        cache.withLock { cache in
            cache.jpegs = [:]
            cache.frameAt = nil
            cache.frameWidth = 0
            cache.askedAt = nil
            cache.missedAt = nil
            // Requests still waiting (for the last broadcast's frame) are answered: no picture.
            cache.unanswered += 1
            cache.waiting = 0
            slot.store(Slot.idle.rawValue, ordering: .releasing)
        }
    }

    /// Encodes the copied frame (the slot is `filled`: the session does not touch it).
    private func encode(_ cache: inout Cache, width: Int) -> Answer {
        guard let format else { return .noFrame }
        do {
            if cache.encoder == nil { cache.encoder = try JPEGEncoder() }
            let frame = SampleBuffer(format: .video(format), presentationTime: time, duration: MediaTime(value: 0, timescale: 1_000_000_000), planes: planes)
            let jpeg = try cache.encoder!.encode(frame, width: width)
            cache.jpegs[width] = jpeg
            cache.encodes += 1
            return .jpeg(jpeg)
        } catch {
            return .failed("\(error)")
        }
    }
}
