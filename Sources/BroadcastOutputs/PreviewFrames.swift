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
/// own memory; otherwise it only loads the word) → `idle` once encoded. The copy is the session's
/// only work; scaling and JPEG encoding happen on the requesting thread. Requests take a lock
/// among themselves (never the session): a JPEG younger than `minimumInterval` is answered from
/// the cache, so frames are asked of the session at most 1/`minimumInterval` times a second.
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
    }

    private let cache = Mutex(Cache())

    public init() {}

    deinit { memory?.deallocate() }

    /// JPEGs encoded so far.
    public var encodes: Int { cache.withLock { $0.encodes } }

    // MARK: Session thread

    /// A video frame the session delivers: copied only when a request is waiting for one.
    public func offer(_ buffer: borrowing SampleBuffer) {
        guard slot.load(ordering: .relaxed) == Slot.wanted.rawValue, let format = buffer.videoFormat else { return }
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
    public func jpeg(width: Int) -> Answer {
        cache.withLock { cache in
            let now = ContinuousClock.now
            if let at = cache.frameAt, now - at < Self.minimumInterval {
                let width = min(width, cache.frameWidth)
                if let jpeg = cache.jpegs[width] { return .jpeg(jpeg) }
                // Another width of the same frame: encoded from the copy the preview still holds.
                return encode(&cache, width: width)
            }
            slot.store(Slot.wanted.rawValue, ordering: .relaxed)
            let deadline = now + Self.frameWait
            while slot.load(ordering: .acquiring) != Slot.filled.rawValue {
                if ContinuousClock.now >= deadline {
                    if slot.compareExchange(expected: Slot.wanted.rawValue, desired: Slot.idle.rawValue, ordering: .relaxed).exchanged {
                        // Paused or ended: the last picture, if any.
                        if let jpeg = cache.jpegs[min(width, cache.frameWidth)] ?? cache.jpegs.values.first { return .jpeg(jpeg) }
                        return .noFrame
                    }
                    break
                }
                usleep(5000)
            }
            cache.jpegs = [:]
            cache.frameAt = ContinuousClock.now
            cache.frameWidth = format?.width ?? 0
            let answer = encode(&cache, width: min(width, cache.frameWidth))
            return answer
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
