/// Which stream a sample buffer belongs to, as in ReplayKit's RPSampleBufferType.
public enum SampleBufferType: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    case video
    /// Audio the screen plays (a loopback or monitor device).
    case audioApp
    /// Audio from a microphone.
    case audioMic

    public var description: String { rawValue }
    public var isAudio: Bool { self != .video }
}

/// Pixel layouts a video sample buffer can carry (names follow V4L2/FFmpeg usage).
public enum PixelFormat: String, Sendable, Hashable, CaseIterable {
    /// Planar 4:2:0, Y then U then V (I420, V4L2 YU12, FFmpeg yuv420p).
    case yuv420p
    /// Semi-planar 4:2:0, Y then interleaved UV.
    case nv12
    /// Packed 4:2:2, Y0 U Y1 V.
    case yuyv422
    /// Packed 4:2:2, U Y0 V Y1.
    case uyvy422
    case rgb24
    case bgr24
    /// 32-bit B G R A.
    case bgra
    /// 32-bit B G R X: what X11 and V4L2 XRGB32 deliver.
    case bgr0
    case gray8
    /// Compressed JPEG frames (one plane, variable size).
    case mjpeg

    /// Number of planes the format is stored in.
    public var planeCount: Int {
        switch self {
        case .yuv420p: 3
        case .nv12: 2
        default: 1
        }
    }

    /// Bytes per row of `plane` for a frame `width` pixels wide, without padding; nil for compressed formats.
    public func minimumBytesPerRow(plane: Int, width: Int) -> Int? {
        switch self {
        case .yuv420p: plane == 0 ? width : (width + 1) / 2
        case .nv12: plane == 0 ? width : (width + 1) / 2 * 2
        case .yuyv422, .uyvy422: (width + 1) / 2 * 4
        case .rgb24, .bgr24: width * 3
        case .bgra, .bgr0: width * 4
        case .gray8: width
        case .mjpeg: nil
        }
    }

    /// Rows in `plane` for a frame `height` pixels tall.
    public func rows(plane: Int, height: Int) -> Int {
        switch self {
        case .yuv420p, .nv12: plane == 0 ? height : (height + 1) / 2
        default: height
        }
    }
}

/// Layout of the samples in an audio buffer.
public enum AudioSampleFormat: String, Sendable, Hashable, CaseIterable {
    /// Signed 16-bit, channels interleaved.
    case s16
    /// Signed 32-bit, channels interleaved.
    case s32
    /// 32-bit float, channels interleaved.
    case f32
    /// 32-bit float, one plane per channel.
    case f32Planar

    public var bytesPerSample: Int {
        switch self {
        case .s16: 2
        case .s32, .f32, .f32Planar: 4
        }
    }

    public var isPlanar: Bool { self == .f32Planar }
}

public struct VideoFormat: Sendable, Hashable, CustomStringConvertible {
    public var pixelFormat: PixelFormat
    public var width: Int
    public var height: Int
    /// What the values mean, when the source knows (a YUV device, the test pattern); nil for RGB
    /// and for sources that cannot say. See ``VideoColour``.
    public var colour: VideoColour?

    public init(pixelFormat: PixelFormat, width: Int, height: Int, colour: VideoColour? = nil) {
        self.pixelFormat = pixelFormat
        self.width = width
        self.height = height
        self.colour = colour
    }

    public var description: String { "\(pixelFormat.rawValue) \(width)x\(height)" }
}

public struct AudioFormat: Sendable, Hashable, CustomStringConvertible {
    public var sampleFormat: AudioSampleFormat
    public var sampleRate: Int
    /// Channel count; 1 is mono, 2 stereo (FL FR), more follow FFmpeg's default layout for that count.
    public var channels: Int

    public init(sampleFormat: AudioSampleFormat, sampleRate: Int, channels: Int) {
        self.sampleFormat = sampleFormat
        self.sampleRate = sampleRate
        self.channels = channels
    }

    /// Bytes one frame (one sample of every channel) takes in an interleaved buffer.
    public var bytesPerFrame: Int { sampleFormat.bytesPerSample * channels }

    public var description: String { "\(sampleFormat.rawValue) \(sampleRate) Hz \(channels) ch" }
}

public enum MediaFormat: Sendable, Hashable, CustomStringConvertible {
    case video(VideoFormat)
    case audio(AudioFormat)

    public var description: String {
        switch self {
        case .video(let v): "video \(v)"
        case .audio(let a): "audio \(a)"
        }
    }
}

/// A rectangle of pixels in a video frame, from its top-left corner.
public struct PixelRegion: Sendable, Hashable, CustomStringConvertible {
    public var x: Int
    public var y: Int
    public var width: Int
    public var height: Int

    public init(x: Int, y: Int, width: Int, height: Int) {
        self.x = x
        self.y = y
        self.width = width
        self.height = height
    }

    public var isEmpty: Bool { width <= 0 || height <= 0 }

    /// The part inside `width` x `height` pixels from the origin; nil when nothing is.
    public func clipped(width frameWidth: Int, height frameHeight: Int) -> PixelRegion? {
        let left = max(x, 0)
        let top = max(y, 0)
        let right = min(x + width, frameWidth)
        let bottom = min(y + height, frameHeight)
        guard right > left, bottom > top else { return nil }
        return PixelRegion(x: left, y: top, width: right - left, height: bottom - top)
    }

    public var description: String { "\(width)x\(height)+\(x)+\(y)" }
}

/// One plane of sample data: where its bytes are and how long a row is.
///
/// Sources describe their memory with planes when they make a ``SampleBuffer``. A handler never
/// holds one: it reads a buffer's bytes through ``SampleBuffer/withPlane(_:_:)``, as a `RawSpan`
/// that cannot outlive the call.
public struct Plane: @unchecked Sendable {
    public let base: UnsafeRawPointer
    /// Bytes in the plane.
    public let count: Int
    /// Bytes from the start of one row to the next (for audio: the whole plane).
    public let bytesPerRow: Int

    public init(base: UnsafeRawPointer, count: Int, bytesPerRow: Int) {
        self.base = base
        self.count = count
        self.bytesPerRow = bytesPerRow
    }

    public var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }
}

/// Keeps a buffer's memory alive and takes it back once the handler is done with it
/// (a pooled test-pattern frame, a V4L2 mmap buffer that goes back to the driver).
public protocol SampleBufferBacking: AnyObject, Sendable {
    /// Called exactly once: on the session's thread after the handler call that saw the buffer
    /// returned, or when the session drops it; or on the source's own thread when the buffer never
    /// reached the session (``SourceSink/offer(_:)`` found the ring full, ``SourceSink/push(_:)``
    /// met the session's end). So it must be safe on either thread: the built-in backings store an
    /// atomic flag or count and wake their source, nothing more.
    func release()
}

/// Media delivered to a handler: a video frame or a run of audio frames, with its presentation time.
///
/// It is valid only during the `processSampleBuffer` call that hands it over, and the compiler holds
/// a handler to that: the buffer is `~Copyable` and borrowed, so it cannot be stored, and its bytes
/// are lent as a non-escapable `RawSpan` inside ``withPlane(_:_:)``, so no pointer to them can be
/// kept either. A handler that keeps media for later calls ``copy()``.
public struct SampleBuffer: ~Copyable {
    public let format: MediaFormat
    /// Media time on the session clock: zero at broadcastStarted, standing still while paused.
    public let presentationTime: MediaTime
    public let duration: MediaTime
    /// Video: one per plane of the pixel format. Audio: one for interleaved formats, one per channel for planar.
    /// Raw pointers, for this package's own encoders only; handlers use ``withPlane(_:_:)``.
    package let planes: [Plane]
    /// Audio frames (samples per channel); 0 for video.
    public let frameCount: Int
    /// Video: the regions of the picture that may differ from the previous video buffer of the
    /// same source, in pixels of this frame. `nil`: anything may have changed (the first frame, a
    /// source that does not know, a buffer dropped in between). Empty: nothing changed, the
    /// picture repeats the previous one. Regions may overlap and may cover more than what changed,
    /// never less. Always `nil` for audio. See <doc:WritingABroadcastHandler#Only-what-changed>.
    public let changedRegions: [PixelRegion]?
    /// Buffers of this type were lost between the previous one delivered and this one: the
    /// session's queue was full (the handler fell behind), or the source could not deliver them
    /// (no free buffer, a device overrun). For audio, a gap between the previous buffer's end and
    /// this one's presentation time is then samples that are missing, not a clock running slow:
    /// a handler that steers its audio onto the timestamps jumps it instead of stretching.
    /// False for the first buffer and whenever nothing was lost.
    public let followsLoss: Bool
    let owner: AnyObject?

    public init(
        format: MediaFormat,
        presentationTime: MediaTime,
        duration: MediaTime,
        planes: [Plane],
        frameCount: Int = 0,
        changedRegions: [PixelRegion]? = nil,
        followsLoss: Bool = false,
        owner: AnyObject? = nil
    ) {
        self.format = format
        self.presentationTime = presentationTime
        self.duration = duration
        self.planes = planes
        self.frameCount = frameCount
        self.changedRegions = changedRegions
        self.followsLoss = followsLoss
        self.owner = owner
    }

    /// The same buffer stamped `presentationTime` (a source's sync offset applied): it shares the
    /// planes and their owner, valid as long as this one is.
    package func retimed(to presentationTime: MediaTime) -> SampleBuffer {
        SampleBuffer(
            format: format, presentationTime: presentationTime, duration: duration, planes: planes, frameCount: frameCount,
            changedRegions: changedRegions, followsLoss: followsLoss, owner: owner)
    }

    /// True when the buffer says its picture is the previous one again (``changedRegions`` empty).
    public var isRepeat: Bool { changedRegions?.isEmpty == true }

    public var videoFormat: VideoFormat? {
        if case .video(let v) = format { return v }
        return nil
    }

    public var audioFormat: AudioFormat? {
        if case .audio(let a) = format { return a }
        return nil
    }

    /// How many planes ``withPlane(_:_:)`` can lend: video, one per plane of the pixel format;
    /// audio, one for interleaved formats and one per channel for planar ones.
    public var planeCount: Int { planes.count }

    /// Lends the bytes of one plane for the length of `body`.
    ///
    /// `bytes` is a `RawSpan`: it cannot be stored or returned, so nothing of the buffer outlives
    /// the handler call (keep media with ``copy()``). For video, `bytesPerRow` is the distance from
    /// one row to the next (at least the row's width in bytes); for audio it is the whole plane.
    ///
    /// - Parameters:
    ///   - index: `0..<planeCount`.
    ///   - body: reads the plane's bytes; what it returns is returned.
    public func withPlane<Result, Failure: Error>(
        _ index: Int,
        _ body: (_ bytes: RawSpan, _ bytesPerRow: Int) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        precondition(planes.indices.contains(index), "plane \(index) of a buffer with \(planes.count)")
        let plane = planes[index]
        let bytes = unsafe RawSpan(_unsafeBytes: plane.bytes)
        return try body(bytes, plane.bytesPerRow)
    }

    /// A copy that owns its bytes and stays valid as long as it lives.
    public func copy() -> SampleBuffer {
        let storage = CopiedBytes(planes: planes)
        return SampleBuffer(
            format: format,
            presentationTime: presentationTime,
            duration: duration,
            planes: storage.planes,
            frameCount: frameCount,
            changedRegions: changedRegions,
            followsLoss: followsLoss,
            owner: storage
        )
    }
}

/// The bytes of a copied sample buffer, freed when the last copy goes away.
final class CopiedBytes: @unchecked Sendable {
    let memory: UnsafeMutableRawPointer
    let planes: [Plane]

    init(planes source: [Plane]) {
        let total = source.reduce(0) { $0 + $1.count }
        memory = UnsafeMutableRawPointer.allocate(byteCount: max(total, 1), alignment: 64)
        var offset = 0
        var planes: [Plane] = []
        planes.reserveCapacity(source.count)
        for plane in source {
            let destination = memory + offset
            destination.copyMemory(from: plane.base, byteCount: plane.count)
            planes.append(Plane(base: destination, count: plane.count, bytesPerRow: plane.bytesPerRow))
            offset += plane.count
        }
        self.planes = planes
    }

    deinit { memory.deallocate() }
}

/// String key/values handed to `broadcastStarted`, from the command line (`--setup key=value`) or the config.
public struct SetupInfo: Sendable, Hashable, ExpressibleByDictionaryLiteral {
    public var values: [String: String]

    public init(_ values: [String: String] = [:]) { self.values = values }
    public init(dictionaryLiteral elements: (String, String)...) {
        self.values = Dictionary(elements, uniquingKeysWith: { _, last in last })
    }

    public subscript(key: String) -> String? {
        get { values[key] }
        set { values[key] = newValue }
    }
}
