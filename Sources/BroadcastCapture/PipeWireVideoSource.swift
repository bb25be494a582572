import Atomics
public import BroadcastKit
internal import CPipeWireShim
public import Logging

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Captures a Wayland desktop through the ScreenCast portal (`--video portal`), or any PipeWire
/// video node (`--video pipewire:NODE`), with one `pw_stream`.
///
/// - The portal is asked at construction (so a refusal is an error at start, exit 2); its restore
///   token is stored after every Start (see `PortalTokenStore`).
/// - PipeWire's loop runs on this source's own thread: the thread iterates it (`pw_loop_iterate`)
///   until the next frame is due, then takes the newest buffer, copies it into one of a few
///   frames of its own (honouring the chunk's offset and stride and the crop region, converting
///   RGB-family orders to BGRx, drawing cursor metadata) and gives the buffer straight back.
///   Buffers flagged corrupted are skipped and counted. Only shared memory (MemFd/MemPtr) is
///   accepted: DMA-BUF would need a GPU context to map; producers fall back to SHM.
/// - Frames are due at the output rate on the session clock. PipeWire delivers only when the
///   screen changes, so when nothing new came the last frame is delivered again (by reference),
///   as `X11ScreenSource` does; a size change arrives as a new format and is scaled by the encoder.
/// - A lost stream (the portal closed the session, the node went away, PipeWire restarted) is a
///   source loss: a "no signal" slate at the frame rate, `health` says `.deviceLost`, and the
///   portal (with the stored token) or the node is tried again every two seconds.
public final class PipeWireVideoSource: CaptureSource, @unchecked Sendable {
    public let spec: PipeWireVideoSpec
    public let frameRate: (numerator: Int, denominator: Int)
    public var isRealtime: Bool { true }
    public var name: String { spec.description }

    private let logger: Logger
    private let tokens: PortalTokenStore
    private var thread: OSThread?
    private var handoff: PipeWireVideoConnection?
    private let running = ManagedAtomic<Bool>(false)
    private let captured = ManagedAtomic<Int>(0)
    /// New frames delivered with the compositor's damage as their changed regions.
    private let damaged = ManagedAtomic<Int>(0)
    private let repeated = ManagedAtomic<Int>(0)
    private let corrupt = ManagedAtomic<Int>(0)
    private let skipped = ManagedAtomic<Int>(0)
    private let busy = ManagedAtomic<Int>(0)
    private let gone = ManagedAtomic<Bool>(false)
    private let losses = ManagedAtomic<Int>(0)
    private let slateFrames = ManagedAtomic<Int>(0)
    private let blanks = ManagedAtomic<Int>(0)
    private let formats = ManagedAtomic<Int>(0)
    private var formatsBefore = 0

    /// New images taken from PipeWire.
    public var capturedCount: Int { captured.load(ordering: .relaxed) }
    /// Frames delivered again because nothing new came.
    public var repeatedCount: Int { repeated.load(ordering: .relaxed) }
    /// Buffers skipped because the producer flagged them corrupted.
    public var corruptedCount: Int { corrupt.load(ordering: .relaxed) }
    public var droppedCount: Int { skipped.load(ordering: .relaxed) }
    /// Size of the cast as the portal announced it (nil for a node or when not said).
    public let announcedSize: (width: Int, height: Int)?

    public var health: CaptureHealth {
        CaptureHealth(state: gone.load(ordering: .relaxed) ? .deviceLost : .capturing, deviceLosses: losses.load(ordering: .relaxed))
    }

    /// Asks the portal (or finds the node) and connects the stream now: any refusal throws here.
    public init(
        spec: PipeWireVideoSpec, frameRate: (numerator: Int, denominator: Int), tokens: PortalTokenStore = PortalTokenStore(),
        logger: Logger
    ) throws(BroadcastError) {
        precondition(frameRate.numerator > 0 && frameRate.denominator > 0, "frame rate must be positive")
        self.spec = spec
        self.frameRate = frameRate
        self.logger = logger
        self.tokens = tokens
        let connection = try PipeWireVideoConnection.open(spec: spec, tokens: tokens, logger: logger, startTimeout: 300)
        connection.leave()  // the capture thread takes it in `start`
        announcedSize = connection.announcedSize
        handoff = connection
    }

    deinit { handoff?.close() }

    public func start(into sink: SourceSink) throws {
        guard let connection = handoff else {
            throw BroadcastError(.sourceFailed, "\(spec.description): the source was already started once")
        }
        handoff = nil
        running.store(true, ordering: .releasing)
        logger.info("capturing \(spec.description) at \(TestPatternSource.rateText(frameRate)) fps")
        thread = OSThread(name: "bc-pw-video") { [self] in
            produce(connection, into: sink)
        }
    }

    public func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        thread = nil
    }

    /// The compositor's damage (the bounding box of this buffer's regions and of any older ones
    /// taken with it) in the frame's own pixels: crop origin subtracted, clipped to the frame. Nil
    /// (everything) when the compositor gave none, or when the source blends a cursor of its own
    /// (its moves are in no damage).
    static func changedRegion(_ frame: CBroadcastPWVideoFrame, width: Int, height: Int, cursorDrawn: Bool) -> [PixelRegion]? {
        guard frame.damageRegions > 0, !cursorDrawn else { return nil }
        let originX = frame.hasCrop != 0 ? Int(frame.cropX) : 0
        let originY = frame.hasCrop != 0 ? Int(frame.cropY) : 0
        let damage = PixelRegion(
            x: Int(frame.damageX) - originX, y: Int(frame.damageY) - originY,
            width: Int(frame.damageWidth), height: Int(frame.damageHeight))
        // Damage wholly outside the frame (the crop): nothing in it changed.
        return damage.clipped(width: width, height: height).map { [$0] } ?? []
    }

    /// The output rate's frame slots on the session clock.
    private var slots: FrameSlots { FrameSlots(frameRate) }

    /// The capture thread's state from one frame slot to the next (that thread alone touches it).
    private struct CaptureLoop {
        var connection: PipeWireVideoConnection?
        var converter: PipeWireFrameConverter
        /// The next frame slot.
        var index: Int64 = 0
        /// The latest frame, offered again in every slot until a new one comes.
        var last: CapturedBuffer?
        var lastSize: (width: Int, height: Int)
        /// While the stream is lost: the no-signal frames.
        var slate: SlateGenerator?
        /// A buffer since the last new frame was skipped (corrupted, unusable, no frame free): the
        /// next new frame's damage, relative to that one, does not say what changed since ours.
        var frameLost = true
        var nextRetry: Int64 = 0
        var attempt: ReconnectAttempt?
        var closing: OSThread?
    }

    private func produce(_ first: PipeWireVideoConnection, into sink: SourceSink) {
        if !first.enter() { logger.error("\(spec.description): the stream's loop is still owned by the thread that opened it") }
        var loop = CaptureLoop(
            connection: first, converter: PipeWireFrameConverter(drawCursor: spec.cursor == .metadata),
            lastSize: (announcedSize?.width ?? 1280, announcedSize?.height ?? 720))
        defer { end(&loop) }
        while running.load(ordering: .acquiring) && !sink.isStopping {
            guard let current = loop.connection else {
                whileLost(&loop, sink)
                continue
            }
            let due = sink.startTime + slots.start(loop.index)
            if let why = waitForSlot(due, on: current, sink) {
                lose(&loop, current, why: why, at: due, sink)
                continue
            }
            let negotiated = Int(CBroadcastPWVideo_formatChanges(current.stream))
            if negotiated > formatsBefore {
                formats.wrappingIncrement(by: negotiated - formatsBefore, ordering: .relaxed)
                formatsBefore = negotiated
            }
            let fresh = takeFrame(&loop, from: current, due: due, sink)
            offerLatest(&loop, due: due, fresh: fresh, sink)
            loop.index += 1
            let now = slots.index(at: sink.clock.now() - sink.startTime)
            if now > loop.index + Int64(frameRate.numerator / frameRate.denominator) {
                skipped.wrappingIncrement(by: Int(now - loop.index), ordering: .relaxed)
                loop.index = now
            }
        }
    }

    /// The capture thread's end: the connection, a reconnection under way and the last frame let
    /// go, and what happened counted in the log.
    private func end(_ loop: inout CaptureLoop) {
        loop.closing?.join()
        loop.last?.backing?.release()
        loop.connection?.close()
        if let attempt = loop.attempt {
            attempt.thread?.join()
            attempt.thread = nil
            attempt.result?.close()
        }
        logger.info(
            "\(spec.description): \(capturedCount + repeatedCount) frames delivered, \(capturedCount) new from PipeWire, \(damaged.load(ordering: .relaxed)) of them with the compositor's damage, \(repeatedCount) repeated (screen unchanged; \(blanks.load(ordering: .relaxed)) of them black before the first), \(corruptedCount) corrupted buffers skipped, \(busy.load(ordering: .relaxed)) new frames held back (all frames with the session), \(droppedCount) slots skipped, \(slateFrames.load(ordering: .relaxed)) slate frames, \(losses.load(ordering: .relaxed)) losses, \(formats.load(ordering: .relaxed)) formats negotiated"
        )
    }

    /// Lost: slate at the frame rate, and a new attempt every two seconds, each on a thread of its
    /// own (portal round trips can take seconds), so the slate keeps its rate meanwhile. Takes the
    /// new connection when an attempt succeeded.
    private func whileLost(_ loop: inout CaptureLoop, _ sink: SourceSink) {
        if loop.slate == nil {
            loop.slate = SlateGenerator(width: loop.lastSize.width, height: loop.lastSize.height, frameDuration: slots.start(1), start: sink.clock.now())
        }
        let now = sink.clock.now()
        if let finished = loop.attempt, finished.isDone {
            finished.thread?.join()
            finished.thread = nil  // the thread's closure holds the attempt
            loop.attempt = nil
            if let reopened = finished.result {
                if !reopened.enter() { logger.error("\(spec.description): the new stream's loop is still owned by the thread that opened it") }
                loop.connection = reopened
                formatsBefore = 0
                // The screen again from the first slot the slate has not filled (the nearest
                // slot to its next frame: its frame length is the slot's, rounded), so the
                // output has no hole and no slot twice.
                let resume = loop.slate.map { $0.nextDue - sink.startTime + slots.start(1) / 2 } ?? (sink.clock.now() - sink.startTime)
                loop.index = slots.index(at: resume)
                loop.slate = nil
                gone.store(false, ordering: .relaxed)
                logger.notice("\(spec.description): back")
                return
            }
        }
        if loop.attempt == nil, now >= loop.nextRetry {
            loop.nextRetry = now + 2_000_000_000
            let next = ReconnectAttempt()
            let (spec, tokens, logger) = (self.spec, self.tokens, self.logger)
            next.thread = OSThread(name: "bc-pw-reopen") {
                let reopened = try? PipeWireVideoConnection.open(spec: spec, tokens: tokens, logger: logger, startTimeout: 5)
                reopened?.leave()  // the capture thread takes it
                next.finish(reopened)
            }
            loop.attempt = next
        }
        let slateNow = sink.clock.now()
        loop.slate!.deliverDue(into: sink, now: slateNow, counter: slateFrames, dropped: skipped)
        MonotonicClock.sleep(until: min(loop.nextRetry, loop.slate!.wakeTime(now: slateNow)))
    }

    /// Runs PipeWire's loop until the slot is due (events, format changes, buffers); why the
    /// stream is lost, or nil.
    private func waitForSlot(_ due: Int64, on current: PipeWireVideoConnection, _ sink: SourceSink) -> String? {
        var loopFailed = false
        while running.load(ordering: .relaxed) {
            let left = due - sink.clock.now()
            if left <= 0 { break }
            if CBroadcastPWVideo_iterate(current.stream, Int32(min((left + 999_999) / 1_000_000, 100))) < 0 {
                loopFailed = true
                break
            }
        }
        let portalAlive = current.portal?.poll() ?? true
        let state = CBroadcastPWVideo_state(current.stream)
        guard loopFailed || !portalAlive || state == Int32(CBroadcastPWVideoState_lost) else { return nil }
        return !portalAlive ? "the portal closed the screen-cast session" : String(cString: CBroadcastPWVideo_error(current.stream))
    }

    /// The stream is lost at slot `due`: closed on a thread of its own (ending the portal session is
    /// a D-Bus round trip through a portal whose backend may just have died, and the slate must not
    /// wait), and the slate starts from that slot (closing took time), so the output has no hole.
    private func lose(_ loop: inout CaptureLoop, _ current: PipeWireVideoConnection, why: String, at due: Int64, _ sink: SourceSink) {
        logger.warning("\(spec.description): lost (\(why)); sending a no-signal slate and retrying")
        current.leave()
        loop.closing?.join()
        loop.closing = OSThread(name: "bc-pw-close") { current.close() }
        loop.connection = nil
        loop.slate = SlateGenerator(width: loop.lastSize.width, height: loop.lastSize.height, frameDuration: slots.start(1), start: due)
        gone.store(true, ordering: .relaxed)
        losses.wrappingIncrement(ordering: .relaxed)
        loop.nextRetry = sink.clock.now() + 2_000_000_000
        loop.last?.backing?.release()
        loop.last = nil
        loop.frameLost = true
    }

    /// Takes the stream's newest buffer, if one came, converted into `loop.last` with what changed
    /// since the previous frame; true when there is a new frame.
    private func takeFrame(_ loop: inout CaptureLoop, from current: PipeWireVideoConnection, due: Int64, _ sink: SourceSink) -> Bool {
        var frame = CBroadcastPWVideoFrame()
        guard CBroadcastPWVideo_acquire(current.stream, &frame) == 1 else { return false }
        defer { CBroadcastPWVideo_release(current.stream) }
        if frame.corrupted != 0 {
            corrupt.wrappingIncrement(ordering: .relaxed)
            loop.frameLost = true
            return false
        }
        loop.converter.noteCursor(frame)
        guard frame.data != nil else { return false }
        switch loop.converter.convert(frame) {
        case .frame(let image, let format):
            loop.last?.backing?.release()
            let changed = loop.frameLost || format.width != loop.lastSize.width || format.height != loop.lastSize.height
                ? nil : Self.changedRegion(frame, width: format.width, height: format.height, cursorDrawn: spec.cursor == .metadata)
            loop.last = CapturedBuffer(
                format: .video(format), captureTime: due, duration: frameDuration,
                planes: [Plane(base: UnsafeRawPointer(image.memory), count: image.bytesPerRow * format.height, bytesPerRow: image.bytesPerRow)],
                changedRegions: changed, backing: image)
            if changed != nil { damaged.wrappingIncrement(ordering: .relaxed) }
            loop.frameLost = false
            loop.lastSize = (format.width, format.height)
            if logger.logLevel <= .debug {
                // The producer's time of the frame on the session clock, when it is on the
                // monotonic clock (within a minute of it): how late the tick was.
                let monotonic = MonotonicClock().now()
                let sessionNow = sink.clock.now()
                let pts = frame.pts > 0 && abs(frame.pts - monotonic) < 60_000_000_000
                    ? "\(frame.pts - monotonic + sessionNow - sink.startTime)" : "none"
                logger.debug("new frame: producer time \(pts) ns, tick \(due - sink.startTime) ns, damage regions \(frame.damageRegions)")
            }
            return true
        case .busy:
            busy.wrappingIncrement(ordering: .relaxed)
            loop.frameLost = true
        case .unusable(let why):
            logger.warning("\(spec.description): buffer skipped: \(why)")
            corrupt.wrappingIncrement(ordering: .relaxed)
            loop.frameLost = true
        }
        return false
    }

    /// Offers the latest frame for the slot `due` (black at the announced size before the first:
    /// the compositor sends its first frame only when something on screen changes, and the
    /// broadcast does not wait), or counts the slot skipped.
    private func offerLatest(_ loop: inout CaptureLoop, due: Int64, fresh: Bool, _ sink: SourceSink) {
        if loop.last == nil, let blank = loop.converter.blankFrame(width: loop.lastSize.width, height: loop.lastSize.height) {
            loop.last = CapturedBuffer(
                format: .video(blank.1), captureTime: due, duration: frameDuration,
                planes: [Plane(base: UnsafeRawPointer(blank.0.memory), count: blank.0.bytesPerRow * blank.1.height, bytesPerRow: blank.0.bytesPerRow)],
                backing: blank.0)
            blanks.wrappingIncrement(ordering: .relaxed)
            logger.info("\(spec.description): no frame yet (the compositor sends one when the screen changes); black until then")
        }
        guard var buffer = loop.last, let image = buffer.backing as? PipeWireFrame else {
            skipped.wrappingIncrement(ordering: .relaxed)
            return
        }
        (fresh ? captured : repeated).wrappingIncrement(ordering: .relaxed)
        buffer.captureTime = due
        // What changed since the previous frame offered: the compositor's damage for a new frame
        // (nil, everything, when it is not known), nothing for a repeat.
        buffer.changedRegions = fresh ? buffer.changedRegions : []
        image.retain()
        sink.offer(buffer)
    }

    private var frameDuration: MediaTime { MediaTime(value: Int64(frameRate.denominator), timescale: Int32(frameRate.numerator)) }
}

/// A reconnection tried on a thread of its own; the capture thread polls `isDone` (no lock: the
/// result is written before the flag is released and read after it is acquired).
final class ReconnectAttempt: @unchecked Sendable {
    var thread: OSThread?
    private(set) var result: PipeWireVideoConnection?
    private let done = ManagedAtomic<Bool>(false)

    var isDone: Bool { done.load(ordering: .acquiring) }

    func finish(_ connection: PipeWireVideoConnection?) {
        result = connection
        done.store(true, ordering: .releasing)
    }
}

/// One attempt: the portal session (if any) and the stream on its PipeWire remote.
///
/// The stream's loop is owned by one thread at a time (see `CBroadcastPW_loopEnter`): the one that
/// opened it, until it calls `leave()`; then the capture thread, from its `enter()`. Only the owner
/// calls in; `close()` may come from any thread when none owns it.
final class PipeWireVideoConnection: @unchecked Sendable {
    let portal: ScreenCastPortal?
    let stream: OpaquePointer
    let announcedSize: (width: Int, height: Int)?

    private init(portal: ScreenCastPortal?, stream: OpaquePointer, announcedSize: (width: Int, height: Int)?) {
        self.portal = portal
        self.stream = stream
        self.announcedSize = announcedSize
    }

    private var closed = false

    /// Makes the calling thread the stream's owner (after the previous owner's `leave()`). False
    /// when another thread still has it: then every iteration fails, and the source treats the
    /// stream as lost (a slate and a new stream) rather than touch it from two threads.
    func enter() -> Bool { CBroadcastPWVideo_enter(stream) == 0 }

    /// Gives the stream up, for another thread to `enter()`.
    func leave() { CBroadcastPWVideo_leave(stream) }

    func close() {
        guard !closed else { return }
        closed = true
        CBroadcastPWVideo_close(stream)
        portal?.close()
    }

    static func open(spec: PipeWireVideoSpec, tokens: PortalTokenStore, logger: Logger, startTimeout: Int) throws(BroadcastError) -> PipeWireVideoConnection {
        var errorText = [CChar](repeating: 0, count: 512)
        switch spec.target {
        case .portal(let kind):
            let portal = try ScreenCastPortal()
            let cast: ScreenCastPortal.Cast
            do {
                cast = try portal.start(kind: kind, cursor: spec.cursor, restoreToken: tokens.load(kind), timeoutSeconds: startTimeout)
            } catch {
                portal.close()
                throw error
            }
            if let token = cast.restoreToken {
                do {
                    try tokens.save(token, for: kind)
                } catch {
                    logger.warning("\(error.message); the portal will ask again next time")
                }
            }
            let fd: Int32
            do { fd = try portal.openPipeWireRemote() } catch {
                portal.close()
                throw error
            }
            guard let stream = CBroadcastPWVideo_open(fd, nil, cast.nodeID, spec.cursor == .metadata ? 1 : 0, "broadcast", &errorText, errorText.count) else {
                portal.close()
                throw BroadcastError(.sourceFailed, "\(spec.description): \(Self.text(errorText))")
            }
            let connection = PipeWireVideoConnection(
                portal: portal, stream: stream, announcedSize: cast.width.flatMap { w in cast.height.map { (w, $0) } })
            try connection.waitConnected(spec)
            logger.info("\(spec.description): PipeWire node \(cast.nodeID)\(cast.width.map { ", \($0)x\(cast.height ?? 0)" } ?? "")")
            return connection
        case .node(let node):
            let nodes = PipeWireNodes.list(classPrefix: "")
            guard let nodes else {
                throw BroadcastError(.sourceFailed, "\(spec.description): PipeWire is not reachable (is pipewire running, and XDG_RUNTIME_DIR set?)")
            }
            let video = nodes.filter { $0.mediaClass.hasPrefix("Video/") || $0.mediaClass.hasPrefix("Stream/Output/Video") }
            guard let match = video.first(where: { $0.name == node || String($0.serial) == node }) else {
                let known = video.map { "\($0.name) (serial \($0.serial))" }
                throw BroadcastError(
                    .sourceFailed,
                    "no PipeWire video node named '\(node)'; known: \(known.isEmpty ? "none" : known.joined(separator: ", ")) (see 'broadcast devices')"
                )
            }
            guard let stream = CBroadcastPWVideo_open(-1, String(match.serial), match.id, 0, "broadcast", &errorText, errorText.count) else {
                throw BroadcastError(.sourceFailed, "\(spec.description): \(Self.text(errorText))")
            }
            let connection = PipeWireVideoConnection(portal: nil, stream: stream, announcedSize: nil)
            try connection.waitConnected(spec)
            return connection
        }
    }

    static func text(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Runs the loop until the stream is linked (paused or streaming), at most five seconds.
    private func waitConnected(_ spec: PipeWireVideoSpec) throws(BroadcastError) {
        let deadline = MonotonicClock().now() + 5_000_000_000
        while MonotonicClock().now() < deadline {
            _ = CBroadcastPWVideo_iterate(stream, 50)
            let state = CBroadcastPWVideo_state(stream)
            if state == Int32(CBroadcastPWVideoState_paused) || state == Int32(CBroadcastPWVideoState_streaming) { return }
            if state == Int32(CBroadcastPWVideoState_lost) {
                let why = String(cString: CBroadcastPWVideo_error(stream))
                close()
                throw BroadcastError(.sourceFailed, "\(spec.description): the PipeWire stream failed: \(why)")
            }
        }
        close()
        throw BroadcastError(.sourceFailed, "\(spec.description): the PipeWire stream was not linked within 5 s")
    }
}

/// The frames the source fills from PipeWire buffers: counted references, like `X11Frame`, since the
/// same image goes to the session again while the screen does not change.
final class PipeWireFrame: SampleBufferBacking, @unchecked Sendable {
    let memory: UnsafeMutableRawPointer
    let byteCount: Int
    var bytesPerRow = 0
    private let references = ManagedAtomic<Int>(0)

    init(byteCount: Int) {
        self.byteCount = byteCount
        memory = .allocate(byteCount: max(byteCount, 1), alignment: 64)
    }

    deinit { memory.deallocate() }

    var isFree: Bool { references.load(ordering: .acquiring) == 0 }
    func claim() -> Bool { references.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged }
    func retain() { references.wrappingIncrement(ordering: .relaxed) }
    func release() { references.wrappingDecrement(ordering: .releasing) }
}

/// Copies PipeWire buffers into frames of its own (crop, stride, pixel order, cursor). One thread.
struct PipeWireFrameConverter {
    enum Result {
        case frame(PipeWireFrame, VideoFormat)
        case busy
        case unusable(String)
    }

    let drawCursor: Bool
    private var pool: [PipeWireFrame] = []
    private static let poolLimit = 4
    /// The cursor as the last metadata said: position minus hotspot, and its bitmap as BGRA.
    private var cursorVisible = false
    private var cursorX = 0
    private var cursorY = 0
    private var cursorWidth = 0
    private var cursorHeight = 0
    private var cursorPixels: [UInt32] = []

    init(drawCursor: Bool) { self.drawCursor = drawCursor }

    mutating func noteCursor(_ f: CBroadcastPWVideoFrame) {
        guard drawCursor else { return }
        guard f.hasCursor != 0 else { return }
        cursorVisible = true
        if f.hasBitmap != 0, let bits = f.bitmapData, f.bitmapWidth <= 1024, f.bitmapHeight <= 1024 {
            let w = Int(f.bitmapWidth)
            let h = Int(f.bitmapHeight)
            let stride = f.bitmapStride > 0 ? Int(f.bitmapStride) : w * 4
            cursorWidth = w
            cursorHeight = h
            cursorPixels = [UInt32](repeating: 0, count: w * h)
            for y in 0..<h {
                let row = UnsafeRawPointer(bits + y * stride)
                for x in 0..<w {
                    let v = row.loadUnaligned(fromByteOffset: x * 4, as: UInt32.self)
                    cursorPixels[y * w + x] = Self.toBGRA(v, format: f.bitmapFormat)
                }
            }
        }
        cursorX = Int(f.cursorX) - Int(f.hotX)
        cursorY = Int(f.cursorY) - Int(f.hotY)
    }

    /// A 32-bit pixel in `format`'s byte order, as B,G,R,A bytes (a little-endian UInt32).
    static func toBGRA(_ v: UInt32, format: UInt32) -> UInt32 {
        switch Int(format) {
        case Int(CBroadcastPWVideoFormat_BGRx), Int(CBroadcastPWVideoFormat_BGRA): return v
        case Int(CBroadcastPWVideoFormat_RGBx), Int(CBroadcastPWVideoFormat_RGBA):
            return (v & 0xff00_ff00) | ((v & 0xff) << 16) | ((v >> 16) & 0xff)
        case Int(CBroadcastPWVideoFormat_xRGB), Int(CBroadcastPWVideoFormat_ARGB): return v.byteSwapped
        case Int(CBroadcastPWVideoFormat_xBGR), Int(CBroadcastPWVideoFormat_ABGR): return (v >> 8) | (v << 24)
        default: return v
        }
    }

    private mutating func acquire(byteCount: Int) -> PipeWireFrame? {
        for (i, frame) in pool.enumerated() where frame.isFree {
            if frame.byteCount >= byteCount {
                if frame.claim() { return frame }
            } else {
                pool.remove(at: i)  // too small since the size grew
                break
            }
        }
        guard pool.count < Self.poolLimit else { return nil }
        let frame = PipeWireFrame(byteCount: byteCount)
        pool.append(frame)
        return frame.claim() ? frame : nil
    }

    /// A black BGRx frame, for the time before the first frame.
    mutating func blankFrame(width: Int, height: Int) -> (PipeWireFrame, VideoFormat)? {
        let w = max(16, width & ~1)
        let h = max(16, height & ~1)
        guard let frame = acquire(byteCount: w * h * 4) else { return nil }
        frame.bytesPerRow = w * 4
        frame.memory.initializeMemory(as: UInt8.self, repeating: 0, count: w * h * 4)
        return (frame, VideoFormat(pixelFormat: .bgr0, width: w, height: h))
    }

    mutating func convert(_ f: CBroadcastPWVideoFrame) -> Result {
        guard let data = f.data else { return .unusable("no data") }
        let packed422 = f.format == UInt32(CBroadcastPWVideoFormat_YUY2) || f.format == UInt32(CBroadcastPWVideoFormat_UYVY)
        guard f.format != UInt32(CBroadcastPWVideoFormat_unknown) else { return .unusable("unsupported pixel format") }
        let bpp = packed422 ? 2 : 4
        var x = 0
        var y = 0
        var w = Int(f.width)
        var h = Int(f.height)
        if f.hasCrop != 0 {
            let cx = max(0, Int(f.cropX))
            let cy = max(0, Int(f.cropY))
            let cw = min(Int(f.cropWidth), w - cx)
            let ch = min(Int(f.cropHeight), h - cy)
            if cw > 0, ch > 0 { (x, y, w, h) = (cx, cy, cw, ch) }
        }
        if packed422 {
            x &= ~1
            w &= ~1
        }
        guard w > 0, h > 0 else { return .unusable("empty frame") }
        let stride = f.stride > 0 ? Int(f.stride) : Int(f.width) * bpp
        let needed = (y + h - 1) * stride + (x + w) * bpp
        guard Int(f.size) >= needed else { return .unusable("chunk of \(f.size) bytes is smaller than \(w)x\(h) at stride \(stride)") }
        let rowBytes = w * bpp
        guard let frame = acquire(byteCount: rowBytes * h) else { return .busy }
        frame.bytesPerRow = rowBytes
        let source = UnsafeRawPointer(data)
        let swizzle = !packed422 && f.format != UInt32(CBroadcastPWVideoFormat_BGRx) && f.format != UInt32(CBroadcastPWVideoFormat_BGRA)
        for row in 0..<h {
            let from = source + (y + row) * stride + x * bpp
            let to = frame.memory + row * rowBytes
            if swizzle {
                let src = from.bindMemory(to: UInt32.self, capacity: w)
                let dst = to.bindMemory(to: UInt32.self, capacity: w)
                for i in 0..<w { dst[i] = Self.toBGRA(src[i], format: f.format) }
            } else {
                to.copyMemory(from: from, byteCount: rowBytes)
            }
        }
        if drawCursor && cursorVisible && !packed422 { blendCursor(into: frame.memory, width: w, height: h, originX: x, originY: y) }
        let pixelFormat: PixelFormat =
            packed422 ? (f.format == UInt32(CBroadcastPWVideoFormat_YUY2) ? .yuyv422 : .uyvy422) : .bgr0
        return .frame(frame, VideoFormat(pixelFormat: pixelFormat, width: w, height: h))
    }

    /// Straight-alpha blend of the cursor bitmap at its place (frame coordinates minus the crop origin).
    private func blendCursor(into memory: UnsafeMutableRawPointer, width: Int, height: Int, originX: Int, originY: Int) {
        let left = cursorX - originX
        let top = cursorY - originY
        let pixels = memory.assumingMemoryBound(to: UInt32.self)
        for cy in 0..<cursorHeight {
            let py = top + cy
            if py < 0 || py >= height { continue }
            for cx in 0..<cursorWidth {
                let px = left + cx
                if px < 0 || px >= width { continue }
                let s = cursorPixels[cy * cursorWidth + cx]
                let alpha = s >> 24
                if alpha == 0 { continue }
                let d = py * width + px
                if alpha == 255 {
                    pixels[d] = s
                    continue
                }
                let dst = pixels[d]
                var out: UInt32 = 0
                for shift in stride(from: 0, through: 16, by: 8) {
                    let sc = (s >> UInt32(shift)) & 0xff
                    let dc = (dst >> UInt32(shift)) & 0xff
                    out |= ((sc * alpha + dc * (255 - alpha)) / 255) << UInt32(shift)
                }
                pixels[d] = out
            }
        }
    }
}

/// PipeWire nodes, for `broadcast devices` and for finding `pipewire:NODE`.
public enum PipeWireNodes {
    public struct Node: Sendable, Hashable {
        public var id: UInt32
        public var serial: UInt64
        public var name: String
        public var description: String
        public var mediaClass: String
    }

    /// Nodes whose media.class starts with `classPrefix`; nil when PipeWire is not reachable.
    public static func list(classPrefix: String) -> [Node]? {
        var capacity = 64
        while true {
            var raw = [CBroadcastPWNode](repeating: CBroadcastPWNode(), count: capacity)
            let count = Int(CBroadcastPW_listNodes(classPrefix, &raw, Int32(capacity)))
            if count < 0 { return nil }
            if count > capacity {
                capacity = count
                continue
            }
            return raw.prefix(count).map { n in
                var n = n
                return Node(
                    id: n.id, serial: n.serial,
                    name: withUnsafeBytes(of: &n.name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) },
                    description: withUnsafeBytes(of: &n.description) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) },
                    mediaClass: withUnsafeBytes(of: &n.mediaClass) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) })
            }
        }
    }

    /// PipeWire video nodes: sources (cameras, virtual sources) and video streams others offer.
    public static func video() -> [Node]? {
        list(classPrefix: "")?.filter { $0.mediaClass.hasPrefix("Video/") || $0.mediaClass.hasPrefix("Stream/Output/Video") }
    }

    /// The libpipewire version this program runs with.
    public static var libraryVersion: String { String(cString: CBroadcastPW_libraryVersion()) }
}
