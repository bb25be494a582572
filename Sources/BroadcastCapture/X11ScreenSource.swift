import Atomics
public import BroadcastKit
internal import CXCB
public import Logging

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Captures an X11 screen, a region of it, or one window (followed as it moves), through XCB.
///
/// - Pixels come from MIT-SHM GetImage straight into shared-memory segments that are handed to the
///   session as the frame's plane (`.bgr0`): no copy beyond the one the X server makes. Without
///   MIT-SHM (a remote display, `shm=off`) plain GetImage is used and the reply itself is the plane.
/// - Frames are due at the output rate on the session clock. A new image is taken only when the
///   DAMAGE extension reported a change inside the captured area (or the pointer moved or changed
///   shape there); otherwise the last frame is delivered again, by reference. So the encoder sees a
///   constant rate while a static screen costs the X server nothing (see docs/DESIGN.md, "Screen
///   capture").
/// - The pointer is drawn in from XFixes' cursor image unless `cursor=off`.
public final class X11ScreenSource: CaptureSource, @unchecked Sendable {
    public let spec: X11CaptureSpec
    public let frameRate: (numerator: Int, denominator: Int)
    public var isRealtime: Bool { true }
    public var name: String { spec.description }

    private let logger: Logger
    private var thread: OSThread?
    private let running = ManagedAtomic<Bool>(false)
    private let captured = ManagedAtomic<Int>(0)
    private let repeated = ManagedAtomic<Int>(0)
    private let missed = ManagedAtomic<Int>(0)
    private let skipped = ManagedAtomic<Int>(0)

    /// Images taken from the X server.
    public var capturedCount: Int { captured.load(ordering: .relaxed) }
    /// Frames delivered again because nothing changed on screen.
    public var repeatedCount: Int { repeated.load(ordering: .relaxed) }
    /// Frame times where a changed screen could not be grabbed in time, so the last frame was repeated.
    public var lateCount: Int { missed.load(ordering: .relaxed) }
    /// Frame times that passed without any delivery (the source stalled more than a second).
    public var droppedCount: Int { skipped.load(ordering: .relaxed) }

    public init(spec: X11CaptureSpec, frameRate: (numerator: Int, denominator: Int), logger: Logger) {
        precondition(frameRate.numerator > 0 && frameRate.denominator > 0, "frame rate must be positive")
        self.spec = spec
        self.frameRate = frameRate
        self.logger = logger
    }

    /// The size of what would be captured now, for choosing an encoder size; throws the error
    /// `start` would throw (no display, region outside the screen, no such window).
    public func currentSize() throws(BroadcastError) -> (width: Int, height: Int) {
        let connection = try X11Connection(display: spec.display)
        let area = try X11Capture.resolveArea(spec, connection)
        return (area.rectangle.width, area.rectangle.height)
    }

    public func start(into sink: SourceSink) throws {
        let connection = try X11Connection(display: spec.display)
        let capture = try X11Capture(spec: spec, connection: connection, logger: logger)
        logger.info(
            "capturing \(capture.what) (\(capture.area.width)x\(capture.area.height)) at \(TestPatternSource.rateText(frameRate)) fps",
            metadata: [
                "shm": "\(capture.usesSharedMemory)", "damage": "\(capture.hasDamage)", "cursor": "\(capture.drawsCursor)",
            ]
        )
        running.store(true, ordering: .releasing)
        thread = OSThread(name: "bc-x11") { [self] in
            produce(capture, into: sink)
        }
    }

    public func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        thread = nil
    }

    /// The output rate's frame slots on the session clock.
    private var slots: FrameSlots { FrameSlots(frameRate) }

    private func produce(_ capture: X11Capture, into sink: SourceSink) {
        let duration = MediaTime(value: Int64(frameRate.denominator), timescale: Int32(frameRate.numerator))
        let frameInterval = slots.start(1)
        var index: Int64 = 0
        var last: CapturedBuffer?
        var windowGoneReported = false
        defer {
            // The source's own reference to the last frame; the session releases its copies.
            last?.backing?.release()
            let delivered = captured.load(ordering: .relaxed) + repeated.load(ordering: .relaxed)
            logger.info(
                "\(capture.what): \(delivered) frames delivered, \(capturedCount) captured, \(repeatedCount) repeated (screen unchanged or capture late: \(lateCount)), \(droppedCount) skipped"
            )
        }
        while running.load(ordering: .acquiring) && !sink.isStopping {
            let due = sink.startTime + slots.start(index)
            MonotonicClock.sleep(until: due)

            var state = capture.poll()
            var fresh = false
            // Behind by more than a frame (a slow grab, a busy machine): repeat the last frame for
            // this slot rather than grab again, so the output keeps its rate and capture catches up.
            let late = last != nil && sink.clock.now() - due > frameInterval
            if late { missed.wrappingIncrement(ordering: .relaxed) }
            if state == .ok, !late, last == nil || capture.needsCapture {
                switch capture.grab() {
                case .frame(let frame, let format, let changed):
                    // The new image becomes the source's last frame (its claim is the source's reference).
                    last?.backing?.release()
                    last = CapturedBuffer(
                        format: .video(format),
                        captureTime: due,
                        duration: duration,
                        planes: frame.planes(for: format),
                        changedRegions: changed,
                        backing: frame
                    )
                    fresh = true
                case .busy:
                    break
                case .failed(let failure):
                    state = failure
                }
            }
            switch state {
            case .ok:
                break
            case .windowGone where spec.windowGone == .keep:
                if !windowGoneReported {
                    windowGoneReported = true
                    logger.warning("\(capture.what) is gone; repeating its last frame (window-gone=keep)")
                }
            case .windowGone:
                sink.fail(BroadcastError(.sourceFailed, "\(capture.what) is gone (its client closed it or exited)"))
                return
            case .connectionLost:
                sink.fail(BroadcastError(.sourceFailed, "lost the connection to X display \(capture.connection.displayName)"))
                return
            case .failed(let message):
                sink.fail(BroadcastError(.sourceFailed, "\(capture.what): \(message)"))
                return
            }
            if var buffer = last, let frame = buffer.backing as? X11Frame {
                (fresh ? captured : repeated).wrappingIncrement(ordering: .relaxed)
                buffer.captureTime = due
                // A repeat: the same image again, nothing changed since the previous delivery.
                if !fresh { buffer.changedRegions = [] }
                frame.retain()  // the session's reference, released after the handler call
                sink.offer(buffer)
            } else {
                skipped.wrappingIncrement(ordering: .relaxed)
            }
            index += 1
            // More than a second behind (the machine stalled): skip the slots that passed.
            let current = slots.index(at: sink.clock.now() - sink.startTime)
            if current > index + Int64(frameRate.numerator / frameRate.denominator) {
                skipped.wrappingIncrement(by: Int(current - index), ordering: .relaxed)
                index = current
            }
        }
    }
}

/// The memory of one captured image: a MIT-SHM segment from a small pool, or a GetImage reply.
///
/// Counted references instead of one in-use flag: the same image goes to the session several times
/// when the screen does not change, and the source keeps one reference as its last frame. A
/// segment goes back to the pool when the count reaches zero; its memory is unmapped when the last
/// Swift reference goes (a buffer may come back after the source stopped).
final class X11Frame: SampleBufferBacking, @unchecked Sendable {
    let memory: UnsafeMutableRawPointer
    let byteCount: Int
    /// The XCB segment id; 0 for a reply.
    let segment: UInt32
    private let allocation: UnsafeMutableRawPointer
    private let references = ManagedAtomic<Int>(0)
    private let isShared: Bool

    /// The one BGRA plane, made once per format: a shared-memory segment comes round again and
    /// again, and a new array for every frame would be an allocation per frame. Source thread only
    /// (buffers already handed on keep the array they were given).
    private var cachedPlanes: (format: VideoFormat, planes: [Plane])?

    func planes(for format: VideoFormat) -> [Plane] {
        if let cachedPlanes, cachedPlanes.format == format { return cachedPlanes.planes }
        let planes = [Plane(base: UnsafeRawPointer(memory), count: format.height * format.width * 4, bytesPerRow: format.width * 4)]
        cachedPlanes = (format, planes)
        return planes
    }

    init(sharedMemory address: UnsafeMutableRawPointer, byteCount: Int, segment: UInt32) {
        self.memory = address
        self.allocation = address
        self.byteCount = byteCount
        self.segment = segment
        self.isShared = true
    }

    /// Takes ownership of a malloc'd reply whose image data starts at `data`.
    init(reply: UnsafeMutableRawPointer, data: UnsafeMutableRawPointer, byteCount: Int) {
        self.memory = data
        self.allocation = reply
        self.byteCount = byteCount
        self.segment = 0
        self.isShared = false
    }

    deinit {
        if isShared { _ = shmdt(allocation) } else { free(allocation) }
    }

    var isFree: Bool { references.load(ordering: .acquiring) == 0 }

    /// Claims a free frame for the capture thread (0 → 1); false when the session still has it.
    func claim() -> Bool {
        references.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged
    }

    func retain() { references.wrappingIncrement(ordering: .relaxed) }

    func release() { references.wrappingDecrement(ordering: .releasing) }
}

/// The capture thread's X state: the connection, what is captured where, the segment pool, damage
/// and cursor tracking. Used by one thread only.
final class X11Capture: @unchecked Sendable {
    enum State: Equatable {
        case ok
        case windowGone
        case connectionLost
        case failed(String)
    }

    enum Grab {
        /// The image, its format, and what changed since the previous image (nil: anything).
        case frame(X11Frame, VideoFormat, [PixelRegion]?)
        /// Every segment is still with the session.
        case busy
        case failed(State)
    }

    struct Area {
        var rectangle: X11Rectangle
        var window: UInt32?
        var windowTitle: String?
    }

    let connection: X11Connection
    let spec: X11CaptureSpec
    private let logger: Logger
    private(set) var area: X11Rectangle
    let window: UInt32?
    let what: String
    private(set) var usesSharedMemory: Bool
    private(set) var hasDamage = false
    private(set) var drawsCursor: Bool
    private var damage: UInt32 = 0
    private var damageNotifyCode: UInt8 = 0
    /// Something changed inside the area since the last grab (damage, the pointer, the window's place).
    private(set) var needsCapture = true
    /// Damage reported since the last grab, in root-window coordinates (inside the area).
    private var pendingDamage: [X11Rectangle] = []
    /// Too many rectangles to keep: the next image counts as changed everywhere.
    private var damageOverflow = false
    private static let damageLimit = 64
    /// The area and pointer rectangle of the last image taken; nil before the first.
    private var lastGrabArea: X11Rectangle?
    private var lastCursorDrawn: X11Rectangle?
    private var windowGone = false
    private var pool: [X11Frame] = []
    private static let poolLimit = 4
    private var cursor: UnsafeMutablePointer<xcb_xfixes_get_cursor_image_reply_t>?

    /// Where `spec` points on the screen now.
    static func resolveArea(_ spec: X11CaptureSpec, _ connection: X11Connection) throws(BroadcastError) -> Area {
        let screen = connection.screenRectangle
        let display = connection.displayName
        switch spec.target {
        case .screen:
            return Area(rectangle: screen)
        case .region(var region):
            if region.width == 0 { region.width = screen.width - region.x }
            if region.height == 0 { region.height = screen.height - region.y }
            guard region.width > 0, region.height > 0, region.x + region.width <= screen.width,
                region.y + region.height <= screen.height
            else {
                throw BroadcastError(
                    .sourceFailed,
                    "region \(region) is outside the screen of X display \(display) (\(screen.width)x\(screen.height))"
                )
            }
            return Area(rectangle: region)
        case .window(let id):
            guard let geometry = connection.geometry(of: id) else {
                throw BroadcastError(.sourceFailed, "X display \(display) has no window \(X11CaptureSpec.hex(id))")
            }
            guard let visible = geometry.rectangle.intersection(screen) else {
                throw BroadcastError(.sourceFailed, "window \(X11CaptureSpec.hex(id)) on X display \(display) is off the screen")
            }
            return Area(rectangle: visible, window: id, windowTitle: connection.title(of: id))
        case .windowTitled(let title):
            guard let id = connection.findWindow(titled: title) else {
                throw BroadcastError(.sourceFailed, "X display \(display) has no window titled \"\(title)\"")
            }
            guard let geometry = connection.geometry(of: id), let visible = geometry.rectangle.intersection(screen) else {
                throw BroadcastError(.sourceFailed, "window \"\(title)\" on X display \(display) is not on the screen")
            }
            return Area(rectangle: visible, window: id, windowTitle: connection.title(of: id))
        }
    }

    init(spec: X11CaptureSpec, connection: X11Connection, logger: Logger) throws(BroadcastError) {
        self.connection = connection
        self.spec = spec
        self.logger = logger
        let display = connection.displayName
        guard connection.rootIsBGR0() else {
            throw BroadcastError(
                .sourceFailed,
                "X display \(display) has depth \(connection.rootDepth) pixels that are not 32-bit XRGB; only depth 24/32 TrueColor screens are supported"
            )
        }
        let resolved = try Self.resolveArea(spec, connection)
        area = resolved.rectangle
        window = resolved.window
        if let id = resolved.window {
            let title = resolved.windowTitle.map { " \"\($0)\"" } ?? ""
            what = "window \(X11CaptureSpec.hex(id))\(title) on X display \(display)"
            connection.watchStructure(of: id)
        } else if case .region = spec.target {
            what = "region \(area) of X display \(display)"
        } else {
            what = "X display \(display)"
        }
        let c = connection.connection

        usesSharedMemory = false
        drawsCursor = false
        if spec.usesSharedMemory {
            if connection.queryExtension("MIT-SHM").present,
                let reply = xcb_shm_query_version_reply(c, xcb_shm_query_version(c), nil)
            {
                free(reply)
                if let segment = makeSegment(byteCount: area.width * area.height * 4) {
                    pool.append(segment)
                    usesSharedMemory = true
                } else {
                    logger.notice(
                        "X display \(display) refused a MIT-SHM segment (a remote or containerised server?): using plain GetImage, one more copy per frame"
                    )
                }
            } else {
                logger.notice("X display \(display) has no MIT-SHM extension: using plain GetImage, one more copy per frame")
            }
        }

        let damageExtension = connection.queryExtension("DAMAGE")
        if damageExtension.present, let reply = xcb_damage_query_version_reply(c, xcb_damage_query_version(c, 1, 1), nil) {
            free(reply)
            damage = xcb_generate_id(c)
            damageNotifyCode = damageExtension.firstEvent &+ UInt8(XCB_DAMAGE_NOTIFY)
            // The root window's damage covers what is drawn in every window on the screen.
            xcb_damage_create(c, damage, connection.root, UInt8(XCB_DAMAGE_REPORT_LEVEL_DELTA_RECTANGLES.rawValue))
            hasDamage = true
        } else {
            logger.notice("X display \(display) has no DAMAGE extension: capturing every frame")
        }

        if spec.drawsCursor {
            if connection.queryExtension("XFIXES").present,
                let reply = xcb_xfixes_query_version_reply(c, xcb_xfixes_query_version(c, 4, 0), nil)
            {
                free(reply)
                drawsCursor = true
            } else {
                logger.notice("X display \(display) has no XFIXES extension: the pointer is not drawn in")
            }
        }
        xcb_flush(c)
        if connection.hasError {
            throw BroadcastError(.sourceFailed, "X display \(display) closed the connection while setting up capture")
        }
    }

    deinit {
        free(cursor)
    }

    // MARK: Events

    /// Reads what the server sent: damage inside the area, the window moving or going, the pointer.
    func poll() -> State {
        let c = connection.connection
        var cursorCookie: xcb_xfixes_get_cursor_image_cookie_t?
        if drawsCursor { cursorCookie = xcb_xfixes_get_cursor_image(c) }
        if !hasDamage { needsCapture = true }
        while let event = xcb_poll_for_event(c) {
            handle(event)
        }
        if connection.hasError { return .connectionLost }
        if windowGone { return .windowGone }
        if let cursorCookie, let reply = xcb_xfixes_get_cursor_image_reply(c, cursorCookie, nil) {
            if let old = cursor {
                let moved =
                    old.pointee.x != reply.pointee.x || old.pointee.y != reply.pointee.y
                    || old.pointee.cursor_serial != reply.pointee.cursor_serial
                if moved, cursorRectangle(old).intersects(area) || cursorRectangle(reply).intersects(area) {
                    needsCapture = true
                }
                free(old)
            }
            cursor = reply
        }
        return .ok
    }

    /// One event from the server (freed here): damage, the window going, moving or unmapped.
    private func handle(_ event: UnsafeMutablePointer<xcb_generic_event_t>) {
        defer { free(event) }
        let type = event.pointee.response_type & 0x7f
        if hasDamage, type == damageNotifyCode {
            noteDamage(event)
        } else if type == XCB_DESTROY_NOTIFY {
            let destroyed = UnsafeRawPointer(event).assumingMemoryBound(to: xcb_destroy_notify_event_t.self).pointee
            if destroyed.window == window { windowGone = true }
        } else if type == XCB_CONFIGURE_NOTIFY || type == XCB_UNMAP_NOTIFY {
            needsCapture = true
        }
    }

    /// Keeps a DAMAGE notification's rectangle when it touches the area.
    private func noteDamage(_ event: UnsafeMutablePointer<xcb_generic_event_t>) {
        let notify = UnsafeRawPointer(event).assumingMemoryBound(to: xcb_damage_notify_event_t.self).pointee
        let damaged = X11Rectangle(
            x: Int(notify.area.x), y: Int(notify.area.y), width: Int(notify.area.width),
            height: Int(notify.area.height))
        guard let inside = damaged.intersection(area) else { return }
        needsCapture = true
        if pendingDamage.count < Self.damageLimit {
            pendingDamage.append(inside)
        } else {
            damageOverflow = true
        }
    }

    /// After an image was taken: reads the notifications that came before its reply. What they
    /// report was drawn before the image was taken, so it is in it: it counts as changed in this
    /// image. Drawing after the subtract leaves the server's damage region non-empty, and DAMAGE
    /// reports only growth of the region, so the same place drawn again would go unreported:
    /// such rectangles stay pending and the next frame is grabbed (and subtracted) again.
    private func drainAfterGrab() -> (damage: [X11Rectangle], overflow: Bool) {
        let before = pendingDamage
        pendingDamage = []
        let overflowBefore = damageOverflow
        damageOverflow = false
        let c = connection.connection
        while let event = xcb_poll_for_queued_event(c) {
            handle(event)
        }
        // Late rectangles (and a late overflow) stay for the next image as well.
        if damageOverflow { needsCapture = true }
        return (before + pendingDamage, overflowBefore || damageOverflow)
    }

    /// What changed in the image just taken, in its own pixels; nil when anything may have.
    private func changedRegions(damage: [X11Rectangle], overflow: Bool, cursor drawn: X11Rectangle?) -> [PixelRegion]? {
        defer {
            lastGrabArea = area
            lastCursorDrawn = drawn
        }
        guard hasDamage, !overflow, let previous = lastGrabArea, previous == area else { return nil }
        var rectangles = damage
        if let old = lastCursorDrawn { rectangles.append(old) }
        if let drawn { rectangles.append(drawn) }
        return rectangles.compactMap { rectangle in
            PixelRegion(x: rectangle.x - area.x, y: rectangle.y - area.y, width: rectangle.width, height: rectangle.height)
                .clipped(width: area.width, height: area.height)
        }
    }

    private func cursorRectangle(_ image: UnsafeMutablePointer<xcb_xfixes_get_cursor_image_reply_t>) -> X11Rectangle {
        X11Rectangle(
            x: Int(image.pointee.x) - Int(image.pointee.xhot), y: Int(image.pointee.y) - Int(image.pointee.yhot),
            width: Int(image.pointee.width), height: Int(image.pointee.height))
    }

    // MARK: Grabbing

    /// Takes an image of the area now.
    func grab() -> Grab {
        let c = connection.connection
        if let window {
            // Follow the window: it may have moved or changed size since the last frame.
            guard let geometry = connection.geometry(of: window) else {
                windowGone = true
                return .failed(.windowGone)
            }
            guard let visible = geometry.rectangle.intersection(connection.screenRectangle) else {
                return .busy  // off the screen: keep the last frame
            }
            area = visible
        }
        // Take the damage first: whatever is drawn from here on reports again, so nothing is missed.
        if hasDamage { xcb_damage_subtract(c, damage, 0, 0) }
        needsCapture = false
        let format = VideoFormat(pixelFormat: .bgr0, width: area.width, height: area.height)
        let byteCount = area.width * area.height * 4
        let frame: X11Frame
        if usesSharedMemory {
            guard let segment = acquireSegment(byteCount: byteCount) else {
                needsCapture = true
                return .busy
            }
            var error: UnsafeMutablePointer<xcb_generic_error_t>?
            let cookie = xcb_shm_get_image(
                c, connection.root, Int16(area.x), Int16(area.y), UInt16(area.width), UInt16(area.height), ~0,
                UInt8(XCB_IMAGE_FORMAT_Z_PIXMAP.rawValue), segment.segment, 0)
            guard let reply = xcb_shm_get_image_reply(c, cookie, &error) else {
                segment.release()
                return .failed(failure(error, "MIT-SHM GetImage of \(area)"))
            }
            free(reply)
            frame = segment
        } else {
            var error: UnsafeMutablePointer<xcb_generic_error_t>?
            let cookie = xcb_get_image(
                c, UInt8(XCB_IMAGE_FORMAT_Z_PIXMAP.rawValue), connection.root, Int16(area.x), Int16(area.y),
                UInt16(area.width), UInt16(area.height), ~0)
            guard let reply = xcb_get_image_reply(c, cookie, &error) else {
                return .failed(failure(error, "GetImage of \(area)"))
            }
            guard Int(xcb_get_image_data_length(reply)) >= byteCount, let data = xcb_get_image_data(reply) else {
                free(reply)
                return .failed(.failed("GetImage of \(area) returned less than \(byteCount) bytes"))
            }
            frame = X11Frame(reply: UnsafeMutableRawPointer(reply), data: UnsafeMutableRawPointer(data), byteCount: byteCount)
            _ = frame.claim()
        }
        var drawn: X11Rectangle?
        if drawsCursor, let cursor { drawn = drawCursor(cursor, into: frame.memory) }
        let (damage, overflow) = drainAfterGrab()
        return .frame(frame, format, changedRegions(damage: damage, overflow: overflow, cursor: drawn))
    }

    private func failure(_ error: UnsafeMutablePointer<xcb_generic_error_t>?, _ what: String) -> State {
        defer { free(error) }
        if connection.hasError { return .connectionLost }
        if window != nil, connection.geometry(of: window!) == nil { return .windowGone }
        return .failed("\(what) failed with X error \(error?.pointee.error_code ?? 0)")
    }

    /// A free segment at least `byteCount` big, claimed; nil when the session holds all of them.
    private func acquireSegment(byteCount: Int) -> X11Frame? {
        for (i, segment) in pool.enumerated() where segment.isFree {
            if segment.byteCount >= byteCount {
                if segment.claim() { return segment }
            } else if segment.claim() {
                // Too small since the window grew: give it back to the server and make a bigger one.
                xcb_shm_detach(connection.connection, segment.segment)
                pool.remove(at: i)
                break
            }
        }
        guard pool.count < Self.poolLimit, let segment = makeSegment(byteCount: byteCount) else { return nil }
        pool.append(segment)
        return segment.claim() ? segment : nil
    }

    /// A System V shared-memory segment the server has attached; marked for removal at once, so the
    /// kernel frees it when both sides detach (also when the process dies).
    private func makeSegment(byteCount: Int) -> X11Frame? {
        let c = connection.connection
        let id = shmget(IPC_PRIVATE, byteCount, IPC_CREAT | 0o600)
        guard id >= 0 else { return nil }
        guard let address = shmat(id, nil, 0), address != UnsafeMutableRawPointer(bitPattern: -1) else {
            shmctl(id, IPC_RMID, nil)
            return nil
        }
        let segment = xcb_generate_id(c)
        let error = xcb_request_check(c, xcb_shm_attach_checked(c, segment, UInt32(id), 0))
        shmctl(id, IPC_RMID, nil)
        if let error {
            free(error)
            shmdt(address)
            return nil
        }
        return X11Frame(sharedMemory: address, byteCount: byteCount, segment: segment)
    }

    /// Blends XFixes' cursor image (premultiplied ARGB) into the frame at the pointer's place.
    /// Returns the rectangle drawn over, in root coordinates; nil when the pointer is outside the area.
    @discardableResult
    private func drawCursor(
        _ image: UnsafeMutablePointer<xcb_xfixes_get_cursor_image_reply_t>, into memory: UnsafeMutableRawPointer
    ) -> X11Rectangle? {
        let rect = cursorRectangle(image)
        guard let visible = rect.intersection(area), let source = xcb_xfixes_get_cursor_image_cursor_image(image) else {
            return nil
        }
        let pixels = memory.assumingMemoryBound(to: UInt32.self)
        for y in visible.y..<(visible.y + visible.height) {
            for x in visible.x..<(visible.x + visible.width) {
                let s = source[(y - rect.y) * rect.width + (x - rect.x)]
                let alpha = s >> 24
                if alpha == 0 { continue }
                let d = (y - area.y) * area.width + (x - area.x)
                if alpha == 255 {
                    pixels[d] = s
                    continue
                }
                let dst = pixels[d]
                var out: UInt32 = 0
                for shift in stride(from: 0, through: 16, by: 8) {
                    let sc = (s >> UInt32(shift)) & 0xff
                    let dc = (dst >> UInt32(shift)) & 0xff
                    out |= min(255, sc + dc * (255 - alpha) / 255) << UInt32(shift)
                }
                pixels[d] = out
            }
        }
        return visible
    }
}
