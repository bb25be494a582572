import Atomics
public import BroadcastKit

/// The built-in video source: colour bars, a block moving across, a burnt-in running clock, and
/// one full-white frame at every whole second of media time (the frame at n.000 s), so A/V sync can
/// be measured from any output against the tone source's beeps.
///
/// Realtime (default): frames are due on the monotonic clock, like a device; if the session falls
/// behind, frames are dropped and counted. Non-realtime: frames are made as fast as they are taken.
public final class TestPatternSource: CaptureSource, @unchecked Sendable {
    public let width: Int
    public let height: Int
    /// Frames per second as a fraction (30/1, 30000/1001).
    public let frameRate: (numerator: Int, denominator: Int)
    public let isRealtime: Bool
    public var name: String { "test pattern \(width)x\(height)@\(Self.rateText(frameRate))" }

    private let format: VideoFormat
    private var thread: OSThread?
    private let running = ManagedAtomic<Bool>(false)
    /// Frames not made because every pooled frame was still with the session (realtime only).
    let droppedFrames = ManagedAtomic<Int>(0)
    public var droppedCount: Int { droppedFrames.load(ordering: .relaxed) }

    /// Media time after which the source hangs without producing (a wedged device), for tests.
    public let stallAfterNanoseconds: Int64?
    /// Media time (nanoseconds) during which the pattern acts as a lost device: no frames, `health`
    /// `.deviceLost`, then back (tests of a layer that goes away and returns). Set before `start`.
    public var lostDuring: Range<Int64>?
    private let lost = ManagedAtomic<Bool>(false)
    private let losses = ManagedAtomic<Int>(0)
    public var health: CaptureHealth {
        CaptureHealth(state: lost.load(ordering: .relaxed) ? .deviceLost : .capturing, deviceLosses: losses.load(ordering: .relaxed))
    }
    /// What the frame pool may take (the memory budget's share); set before `start`. The pool
    /// holds up to a second of frames within this, and never fewer than 4.
    public var poolBytes = 16 << 20

    public init(
        width: Int,
        height: Int,
        frameRate: (numerator: Int, denominator: Int),
        realtime: Bool = true,
        stallAfter: MediaTime? = nil,
        bt601: Bool? = nil
    ) {
        precondition(width >= 16 && height >= 16 && width % 2 == 0 && height % 2 == 0, "test pattern size must be even and at least 16x16")
        precondition(frameRate.numerator > 0 && frameRate.denominator > 0, "frame rate must be positive")
        self.width = width
        self.height = height
        self.frameRate = frameRate
        self.isRealtime = realtime
        self.stallAfterNanoseconds = stallAfter?.nanoseconds
        // Painted in BT.709 from 720 lines, BT.601 below (what the encoder would tag an RGB
        // picture of that size), unless asked; the buffers say which.
        self.format = VideoFormat(
            pixelFormat: .yuv420p, width: width, height: height,
            colour: bt601 ?? (height < 720) ? .bt601 : .bt709)
    }

    /// What the pattern's YUV is: limited-range BT.601 or BT.709.
    public var colour: VideoColour { format.colour ?? .bt709 }

    static func rateText(_ r: (numerator: Int, denominator: Int)) -> String {
        r.denominator == 1 ? "\(r.numerator)" : "\(r.numerator)/\(r.denominator)"
    }

    /// Capture time of frame `index`, in nanoseconds after the start.
    func frameTime(_ index: Int64) -> Int64 {
        index * 1_000_000_000 * Int64(frameRate.denominator) / Int64(frameRate.numerator)
    }

    /// True for the first frame at or after each whole second of media time: frame i starts at
    /// t(i) = i·den/num s, and is the flash frame of second n when t(i-1) < n ≤ t(i).
    public func isFlashFrame(_ index: Int64) -> Bool {
        if index == 0 { return true }
        let num = Int64(frameRate.numerator)
        let den = Int64(frameRate.denominator)
        // floor(t(i)) > floor(t(i-1)) exactly when a whole second lies in (t(i-1), t(i)].
        return index * den / num > (index - 1) * den / num
    }

    public func start(into sink: SourceSink) throws {
        let lumaSize = width * height
        let chromaWidth = width / 2
        let chromaSize = chromaWidth * (height / 2)
        // Room for up to a second of frames while the encoder catches up, within `poolBytes`.
        let frameBytes = lumaSize + 2 * chromaSize
        let framesPerSecond = (frameRate.numerator + frameRate.denominator - 1) / frameRate.denominator
        let pool = BufferPool(
            count: max(4, min(framesPerSecond, poolBytes / frameBytes)),
            byteCount: lumaSize + 2 * chromaSize,
            planeLayout: [
                (0, lumaSize, width),
                (lumaSize, chromaSize, chromaWidth),
                (lumaSize + chromaSize, chromaSize, chromaWidth),
            ]
        )
        let painter = TestPatternPainter(width: width, height: height, bt709: colour.matrix == .bt709)
        running.store(true, ordering: .releasing)
        thread = OSThread(name: "bc-test-video") { [self] in
            produce(into: sink, pool: pool, painter: painter)
        }
    }

    private func produce(into sink: SourceSink, pool: BufferPool, painter: TestPatternPainter) {
        let duration = MediaTime(value: Int64(frameRate.denominator), timescale: Int32(frameRate.numerator))
        var index: Int64 = 0
        // What each pool buffer holds beyond the bars, so repainting it restores only that.
        var painted: [ObjectIdentifier: TestPatternPainter.Regions] = [:]
        while running.load(ordering: .acquiring) && !sink.isStopping {
            let captureTime = sink.startTime + frameTime(index)
            if let stall = stallAfterNanoseconds, frameTime(index) >= stall {
                // Hang like a wedged device: produce nothing more, but still stop when asked.
                MonotonicClock.sleep(until: MonotonicClock().now() + 50_000_000)
                continue
            }
            if isRealtime { MonotonicClock.sleep(until: captureTime) }
            if let lostDuring, lostDuring.contains(frameTime(index)) {
                if !lost.exchange(true, ordering: .relaxed) { losses.wrappingIncrement(ordering: .relaxed) }
                index += 1
                continue
            }
            lost.store(false, ordering: .relaxed)
            guard
                let buffer = pool.acquire(
                    wait: !isRealtime,
                    shouldStop: { [running] in !running.load(ordering: .acquiring) || sink.isStopping }
                )
            else {
                if !isRealtime { break }
                droppedFrames.wrappingIncrement(ordering: .relaxed)
                index += 1
                continue
            }
            painted[ObjectIdentifier(buffer)] = painter.paint(
                into: buffer.memory,
                over: painted[ObjectIdentifier(buffer)],
                frameIndex: index,
                mediaTimeNanoseconds: frameTime(index),
                flash: isFlashFrame(index)
            )
            let captured = CapturedBuffer(
                format: .video(format),
                captureTime: captureTime,
                duration: duration,
                planes: buffer.planes,
                backing: buffer
            )
            if isRealtime { sink.offer(captured) } else if !sink.push(captured) { break }
            index += 1
        }
    }

    public func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        thread = nil
    }
}

/// Draws the test pattern into a yuv420p frame. The static part (bars) is drawn once and copied;
/// a frame that already holds the pattern (a pool buffer coming round again) gets back only the
/// bars under what was drawn over them last time, not a whole frame's copy (1.4 MB at 720p, 3 MB
/// at 1080p, 30 times a second: most of this source's cost).
struct TestPatternPainter: Sendable {
    let width: Int
    let height: Int
    private let background: [UInt8]

    /// A rectangle with even corners (so it covers whole 4:2:0 chroma samples).
    struct Rect: Sendable, Equatable {
        var x: Int, y: Int, w: Int, h: Int
    }

    /// What a painted frame holds beyond the bars (plain values: painting allocates nothing).
    struct Regions: Sendable, Equatable {
        /// The whole frame is the white flash.
        var flash = false
        var block: Rect?
        var clock: Rect?
    }

    // 75% colour bars in BT.601 limited range: white, yellow, cyan, green, magenta, red, blue, black.
    private static let bars601: [(y: UInt8, u: UInt8, v: UInt8)] = [
        (180, 128, 128), (162, 44, 142), (131, 156, 44), (112, 72, 58),
        (84, 184, 198), (65, 100, 212), (35, 212, 114), (16, 128, 128),
    ]
    // The same bars in BT.709 (SMPTE RP 219 values): an encoder tags pictures of 720 lines or more
    // BT.709 (BroadcastMedia's ColourDescription rule), so a pattern of that size is painted in it.
    private static let bars709: [(y: UInt8, u: UInt8, v: UInt8)] = [
        (180, 128, 128), (168, 44, 136), (145, 147, 44), (133, 63, 52),
        (63, 193, 204), (51, 109, 212), (28, 212, 120), (16, 128, 128),
    ]

    init(width: Int, height: Int, bt709: Bool? = nil) {
        self.width = width
        self.height = height
        let lumaSize = width * height
        let chromaSize = (width / 2) * (height / 2)
        var image = [UInt8](repeating: 0, count: lumaSize + 2 * chromaSize)
        let bars = bt709 ?? (height >= 720) ? Self.bars709 : Self.bars601
        let barCount = bars.count
        for y in 0..<height {
            for x in 0..<width {
                image[y * width + x] = bars[x * barCount / width].y
            }
        }
        for y in 0..<(height / 2) {
            for x in 0..<(width / 2) {
                let bar = bars[(2 * x) * barCount / width]
                image[lumaSize + y * (width / 2) + x] = bar.u
                image[lumaSize + chromaSize + y * (width / 2) + x] = bar.v
            }
        }
        background = image
    }

    /// Paints frame `frameIndex` into `memory`, which holds `previous` (a frame this painter
    /// painted) or anything (nil); returns what the frame now holds, for the next time round.
    @discardableResult
    func paint(
        into memory: UnsafeMutableRawPointer, over previous: Regions? = nil, frameIndex: Int64, mediaTimeNanoseconds: Int64,
        flash: Bool
    ) -> Regions {
        let luma = memory.assumingMemoryBound(to: UInt8.self)
        let lumaSize = width * height
        let chromaSize = (width / 2) * (height / 2)
        if flash {
            luma.update(repeating: 255, count: lumaSize)
            (luma + lumaSize).update(repeating: 128, count: 2 * chromaSize)
            return Regions(flash: true)
        }
        if let previous, !previous.flash {
            if let block = previous.block { restore(luma, block) }
            if let clock = previous.clock { restore(luma, clock) }
        } else {
            background.withUnsafeBufferPointer { luma.update(from: $0.baseAddress!, count: $0.count) }
        }
        var drawn = Regions()

        // A block crossing the frame once every four seconds of frames, in the lower third.
        let side = max(8, height / 8) & ~1
        let span = max(1, width - side)
        let travel = Int(frameIndex % 120)
        let x0 = (travel * span / 120) & ~1
        let y0 = (height * 2 / 3) & ~1
        fillRect(luma, x: x0, y: y0, w: side, h: side, value: 235, u: 128, v: 128)
        drawn.block = Rect(x: x0, y: y0, w: side, h: side)

        // Running clock: "HH:MM:SS.mmm" plus the frame number, in the upper left, as ASCII in a
        // value on the stack: a String this long would be a heap allocation every frame.
        let ms = mediaTimeNanoseconds / 1_000_000
        var text = ClockText()
        text.put(ms / 3_600_000, digits: 2)
        text.put(UInt8(ascii: ":"))
        text.put(ms / 60_000 % 60, digits: 2)
        text.put(UInt8(ascii: ":"))
        text.put(ms / 1000 % 60, digits: 2)
        text.put(UInt8(ascii: "."))
        text.put(ms % 1000, digits: 3)
        text.put(UInt8(ascii: " "))
        text.put(UInt8(ascii: "#"))
        text.put(max(0, frameIndex), digits: 1)
        let scale = max(2, height / 120)
        let textHeight = 7 * scale + 2 * scale
        let box = Rect(x: 0, y: 0, w: min(width, (text.count * 6 + 2) * scale) & ~1, h: min(height, textHeight) & ~1)
        fillRect(luma, x: box.x, y: box.y, w: box.w, h: box.h, value: 16, u: 128, v: 128)
        drawn.clock = box
        var cursor = scale
        var i = 0
        while i < text.count {
            // Glyphs stay inside the box: they are not drawn past its bottom or right edge.
            drawGlyph(luma, text[i], x: cursor, y: scale, scale: scale, within: box)
            cursor += 6 * scale
            i += 1
        }
        return drawn
    }

    /// Up to 40 ASCII characters, held inline (no heap).
    struct ClockText {
        private var storage: (UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0)
        private(set) var count = 0

        subscript(index: Int) -> UInt8 {
            withUnsafeBytes(of: storage) { $0[index] }
        }

        mutating func put(_ byte: UInt8) {
            let at = count
            guard at < 40 else { return }
            withUnsafeMutableBytes(of: &storage) { $0[at] = byte }
            count = at + 1
        }

        /// `value` in decimal, at least `digits` long (zero-padded).
        mutating func put(_ value: Int64, digits: Int) {
            var divisor: Int64 = 1
            var width = 1
            while width < digits || value / divisor >= 10 {
                divisor *= 10
                width += 1
            }
            while divisor > 0 {
                put(UInt8(ascii: "0") + UInt8(value / divisor % 10))
                divisor /= 10
            }
        }
    }

    /// Copies the bars back over `rect` (luma and both chroma planes).
    private func restore(_ luma: UnsafeMutablePointer<UInt8>, _ rect: Rect) {
        let x1 = min(width, rect.x + rect.w)
        let y1 = min(height, rect.y + rect.h)
        guard rect.x < x1, rect.y < y1 else { return }
        background.withUnsafeBufferPointer { bars in
            let source = bars.baseAddress!
            for row in rect.y..<y1 {
                (luma + row * width + rect.x).update(from: source + row * width + rect.x, count: x1 - rect.x)
            }
            let cw = width / 2
            let cb = width * height
            let cr = cb + cw * (height / 2)
            let count = (x1 - rect.x) / 2
            for row in (rect.y / 2)..<(y1 / 2) {
                let at = row * cw + rect.x / 2
                (luma + cb + at).update(from: source + cb + at, count: count)
                (luma + cr + at).update(from: source + cr + at, count: count)
            }
        }
    }

    private func fillRect(_ luma: UnsafeMutablePointer<UInt8>, x: Int, y: Int, w: Int, h: Int, value: UInt8, u: UInt8, v: UInt8) {
        let x1 = min(width, x + w)
        let y1 = min(height, y + h)
        guard x < x1, y < y1 else { return }
        for row in y..<y1 { (luma + row * width + x).update(repeating: value, count: x1 - x) }
        let cw = width / 2
        let cb = luma + width * height
        let cr = cb + cw * (height / 2)
        for row in (y / 2)..<(y1 / 2) {
            (cb + row * cw + x / 2).update(repeating: u, count: (x1 - x) / 2)
            (cr + row * cw + x / 2).update(repeating: v, count: (x1 - x) / 2)
        }
    }

    private func drawGlyph(_ luma: UnsafeMutablePointer<UInt8>, _ character: UInt8, x: Int, y: Int, scale: Int, within box: Rect) {
        guard let glyph = Self.glyphIndex(character) else { return }
        for r in 0..<7 {
            let bits = Self.font[glyph * 7 + r]
            for c in 0..<5 where bits & (0x10 >> c) != 0 {
                let px = x + c * scale
                let py = y + r * scale
                guard px + scale <= box.x + box.w, py + scale <= box.y + box.h else { continue }
                for dy in 0..<scale { (luma + (py + dy) * width + px).update(repeating: 235, count: scale) }
            }
        }
    }

    /// Where `character`'s rows start in `font` (divided by 7); nil for a space or anything not drawn.
    private static func glyphIndex(_ character: UInt8) -> Int? {
        switch character {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): Int(character - UInt8(ascii: "0"))
        case UInt8(ascii: ":"): 10
        case UInt8(ascii: "."): 11
        case UInt8(ascii: "#"): 12
        default: nil
        }
    }

    /// 5x7 glyphs, seven bytes each (one a row, high bit leftmost): 0-9, ':', '.', '#'.
    private static let font: [UInt8] = [
        0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E,  // 0
        0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E,  // 1
        0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F,  // 2
        0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E,  // 3
        0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02,  // 4
        0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E,  // 5
        0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E,  // 6
        0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08,  // 7
        0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E,  // 8
        0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C,  // 9
        0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00,  // :
        0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C,  // .
        0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A,  // #
    ]
}
