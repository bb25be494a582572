import Atomics

/// A buffer as a capture thread hands it to the session: media plus the capture timestamp on the
/// session's clock. The session turns it into a `SampleBuffer` with a media time.
public struct CapturedBuffer: Sendable {
    public var format: MediaFormat
    /// When the first sample was captured, in nanoseconds on the session clock.
    public var captureTime: Int64
    public var duration: MediaTime
    public var planes: [Plane]
    public var frameCount: Int
    /// Video: what changed since the source's previous video buffer (see
    /// ``SampleBuffer/changedRegions``): nil = everything, empty = a repeat. The session passes it
    /// on, and makes it nil when a buffer between the two was dropped.
    public var changedRegions: [PixelRegion]?
    /// Released by the session after the handler call (or when the buffer is dropped).
    public var backing: (any SampleBufferBacking)?
    /// Buffers of this source were lost between the previous one handed over and this one (the
    /// session's queue was full, or the source dropped some itself and said so with
    /// ``SourceSink/noteLoss()``). Set by the sink; the session passes it on as
    /// ``SampleBuffer/followsLoss``.
    public var followsLoss = false

    public init(
        format: MediaFormat,
        captureTime: Int64,
        duration: MediaTime,
        planes: [Plane],
        frameCount: Int = 0,
        changedRegions: [PixelRegion]? = nil,
        backing: (any SampleBufferBacking)? = nil
    ) {
        self.format = format
        self.captureTime = captureTime
        self.duration = duration
        self.planes = planes
        self.frameCount = frameCount
        self.changedRegions = changedRegions
        self.backing = backing
    }
}

/// Something that captures media on a thread of its own: the test pattern, a V4L2 device, an ALSA PCM.
public protocol CaptureSource: AnyObject, Sendable {
    /// A name for messages: "test pattern", "/dev/video0", "hw:1,0".
    var name: String { get }
    /// True for sources paced by the clock (devices, the live test pattern); false for sources that
    /// produce as fast as the session consumes (the test pattern with --no-realtime).
    var isRealtime: Bool { get }
    /// Starts capturing; every buffer goes to `sink`. Throws when the source cannot start.
    func start(into sink: SourceSink) throws
    /// Stops capturing and waits for the source's thread to end. Afterwards the source pushes nothing.
    func stop()
    /// Frames or periods the source itself could not deliver (its buffers were all still in use,
    /// the device overran). Read from any thread.
    var droppedCount: Int { get }
    /// Whether the source is getting media from its device. Read from any thread.
    var health: CaptureHealth { get }
}

extension CaptureSource {
    public var droppedCount: Int { 0 }
    public var health: CaptureHealth { CaptureHealth() }
}

/// Whether a source is capturing, for the handler (`sourceHealthChanged`), status lines and metrics.
public struct CaptureHealth: Sendable, Hashable {
    public enum State: String, Sendable, Hashable {
        /// Media comes from the device.
        case capturing
        /// The device is gone (unplugged, driver unbound): the source fills in (a "no signal"
        /// slate, silence) and tries to get it back.
        case deviceLost
    }

    public var state: State
    /// Times the device went away since the source started.
    public var deviceLosses: Int

    public init(state: State = .capturing, deviceLosses: Int = 0) {
        self.state = state
        self.deviceLosses = deviceLosses
    }
}

/// Where one source delivers its buffers: a lock-free ring the session drains.
public final class SourceSink: @unchecked Sendable {
    public let type: SampleBufferType
    public let clock: any BroadcastClock
    /// Clock reading when broadcastStarted returned: media time zero. Non-realtime sources count from here.
    public let startTime: Int64
    let ring: SPSCRing<CapturedBuffer>
    private let sessionWakeup: Wakeup
    private let spaceWakeup: Wakeup
    private let stopping = ManagedAtomic<Bool>(false)
    private let ended = ManagedAtomic<Bool>(false)
    /// Buffers the source could not hand over because the session had not taken the earlier ones.
    let droppedFull = ManagedAtomic<Int>(0)
    /// Source thread only: a buffer was dropped since the last one handed over, so the next one's
    /// changed regions (relative to the dropped one) are not enough, and it follows a loss.
    private var lostSinceLastHandOver = false

    public var droppedCount: Int { droppedFull.load(ordering: .relaxed) }

    private let onFailure: @Sendable (BroadcastError) -> Void

    init(
        type: SampleBufferType,
        clock: any BroadcastClock,
        startTime: Int64,
        capacity: Int,
        sessionWakeup: Wakeup,
        spaceWakeup: Wakeup,
        onFailure: @escaping @Sendable (BroadcastError) -> Void
    ) {
        self.onFailure = onFailure
        self.type = type
        self.clock = clock
        self.startTime = startTime
        self.ring = SPSCRing(capacity: capacity)
        self.sessionWakeup = sessionWakeup
        self.spaceWakeup = spaceWakeup
    }

    /// True once the session is finishing: the source should stop producing.
    public var isStopping: Bool { stopping.load(ordering: .acquiring) }

    /// Hands `buffer` over without waiting (for realtime sources). When the session is behind and
    /// the ring is full the buffer is released, counted as dropped, and false returned.
    @discardableResult
    public func offer(_ buffer: CapturedBuffer) -> Bool {
        var buffer = buffer
        if lostSinceLastHandOver {
            buffer.changedRegions = nil
            buffer.followsLoss = true
        }
        if ring.push(buffer) {
            lostSinceLastHandOver = false
            sessionWakeup.wake()
            return true
        }
        lostSinceLastHandOver = true
        droppedFull.wrappingIncrement(ordering: .relaxed)
        buffer.backing?.release()
        return false
    }

    /// Hands `buffer` over, waiting for room (for non-realtime sources). Returns false, releasing
    /// the buffer, when the session stops meanwhile.
    @discardableResult
    public func push(_ buffer: CapturedBuffer) -> Bool {
        var buffer = buffer
        if lostSinceLastHandOver {
            buffer.changedRegions = nil
            buffer.followsLoss = true
        }
        while !isStopping {
            if ring.push(buffer) {
                lostSinceLastHandOver = false
                sessionWakeup.wake()
                return true
            }
            spaceWakeup.prepareToSleep()
            if ring.count < ring.capacity || isStopping {
                spaceWakeup.cancelSleep()
                continue
            }
            spaceWakeup.sleep(timeout: .milliseconds(100))
        }
        lostSinceLastHandOver = true
        buffer.backing?.release()
        return false
    }

    /// The source dropped a buffer itself (no free buffer, a device overrun): the next one handed
    /// over follows a loss. Source thread only, like `offer`.
    public func noteLoss() {
        lostSinceLastHandOver = true
    }

    /// The source has nothing more to deliver (end of a file, a device gone for good).
    public func endOfStream() {
        ended.store(true, ordering: .releasing)
        sessionWakeup.wake()
    }

    /// The source cannot go on: the session finishes with `error`.
    public func fail(_ error: BroadcastError) {
        onFailure(error)
    }

    var hasEnded: Bool { ended.load(ordering: .acquiring) }

    /// Tests only: called on the session thread between its look at `ended` and its look at the
    /// ring (set by a test source in `start(into:)`, before the session looks), so a test can end
    /// the stream exactly there. nil otherwise: one load per look.
    var betweenEndAndRingForTesting: (() -> Void)?

    // Session side.
    func tookBuffer() { spaceWakeup.wake() }
    func requestStop() {
        stopping.store(true, ordering: .releasing)
        spaceWakeup.wake()
    }
}
