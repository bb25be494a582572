import Atomics
public import BroadcastKit
internal import CV4L2
public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// What to ask a V4L2 device for.
public struct V4L2Options: Sendable {
    /// Capture size (ignored on DV-timings inputs such as HDMI, which take the size of their signal).
    public var width: Int
    public var height: Int
    public var frameRate: (numerator: Int, denominator: Int)
    /// The input to select (VIDIOC_S_INPUT); nil keeps the device's current one.
    public var input: Int?
    /// The pixel format; nil lets `V4L2PixelFormats.choose` pick (uncompressed when the device
    /// offers the size and rate that way, MJPEG when only it does).
    public var pixelFormat: FourCC?

    public init(width: Int, height: Int, frameRate: (numerator: Int, denominator: Int), input: Int? = nil, pixelFormat: FourCC? = nil) {
        self.width = width
        self.height = height
        self.frameRate = frameRate
        self.input = input
        self.pixelFormat = pixelFormat
    }
}

/// Video from a V4L2 capture device (webcam, HDMI grabber, vivid), mmap streaming on a thread of
/// its own, frames handed to the session without a copy.
///
/// - Each mmap'd buffer goes to the session as is; when the session releases it, the release only
///   marks it and wakes the capture thread, which gives it back to the driver (VIDIOC_QBUF): every
///   ioctl stays on the capture thread, and no lock is taken.
/// - A source change (V4L2_EVENT_SOURCE_CHANGE, e.g. new HDMI timings) renegotiates: stream off,
///   wait for the session to give every buffer back, take the new timings and format, stream on.
/// - When the device disappears (unplugged, driver unbound or unloaded) the source keeps the
///   session going with a "no signal" slate at the frame rate, tries to reopen the device twice a
///   second, and resumes capture when it is back.
public final class V4L2Source: CaptureSource, @unchecked Sendable {
    public let path: String
    public let options: V4L2Options
    public let isRealtime = true
    public var name: String { path }

    private let logger: Logger
    /// The device opened and configured by `init`, handed to the capture thread by `start`.
    private var configured: (device: V4L2Device, negotiated: V4L2Negotiation)?
    private var thread: OSThread?
    /// The stream `start` made, taken by the capture thread.
    private var handoff: V4L2Stream?
    private let running = ManagedAtomic<Bool>(false)
    private let wake: Wakeup

    /// Frames delivered from the device.
    let framesCaptured = ManagedAtomic<Int>(0)
    /// "No signal" frames delivered while the device was gone.
    let slateFrames = ManagedAtomic<Int>(0)
    /// Times the device disappeared.
    let deviceLosses = ManagedAtomic<Int>(0)
    /// Times the format was renegotiated after a source change.
    let renegotiations = ManagedAtomic<Int>(0)
    /// Frames the driver flagged as damaged (V4L2_BUF_FLAG_ERROR), given back unused.
    let corruptFrames = ManagedAtomic<Int>(0)
    /// Frames copied into a buffer of our own because the driver was down to its last queued buffers.
    let copiedFrames = ManagedAtomic<Int>(0)
    /// Frames given back to the driver undelivered: the driver was short of buffers and every copy
    /// buffer was still with the session.
    let droppedFrames = ManagedAtomic<Int>(0)
    /// Frames the driver skipped (gaps in the buffers' sequence numbers) although it had buffers
    /// queued to fill: its own thread ran late (a loaded or emulated machine).
    let driverSkippedFrames = ManagedAtomic<Int>(0)
    /// Frames the driver skipped while it may have had no buffer to fill (ours to avoid: counted
    /// whenever the gap ends with the driver's last queued buffer).
    let starvedFrames = ManagedAtomic<Int>(0)
    /// 1 while the device is gone (slate), 0 while capturing.
    private let gone = ManagedAtomic<Bool>(false)

    public struct Statistics: Sendable, Hashable {
        public var framesCaptured: Int
        public var slateFrames: Int
        public var deviceLosses: Int
        public var renegotiations: Int
        public var corruptFrames: Int
        public var copiedFrames: Int
        public var droppedFrames: Int
        public var driverSkippedFrames: Int
        public var starvedFrames: Int
    }

    /// A snapshot of the counters, readable from any thread.
    public var statistics: Statistics {
        Statistics(
            framesCaptured: framesCaptured.load(ordering: .relaxed),
            slateFrames: slateFrames.load(ordering: .relaxed),
            deviceLosses: deviceLosses.load(ordering: .relaxed),
            renegotiations: renegotiations.load(ordering: .relaxed),
            corruptFrames: corruptFrames.load(ordering: .relaxed),
            copiedFrames: copiedFrames.load(ordering: .relaxed),
            droppedFrames: droppedFrames.load(ordering: .relaxed),
            driverSkippedFrames: driverSkippedFrames.load(ordering: .relaxed),
            starvedFrames: starvedFrames.load(ordering: .relaxed)
        )
    }

    /// Frames lost at the source: given back undelivered for want of a buffer, or never delivered
    /// by the driver (sequence gaps).
    public var droppedCount: Int {
        droppedFrames.load(ordering: .relaxed) + driverSkippedFrames.load(ordering: .relaxed)
            + starvedFrames.load(ordering: .relaxed)
    }

    public var health: CaptureHealth {
        CaptureHealth(
            state: gone.load(ordering: .relaxed) ? .deviceLost : .capturing,
            deviceLosses: deviceLosses.load(ordering: .relaxed)
        )
    }

    /// What was negotiated at open time, e.g. "YUYV 320x180 @ 25 fps (input 0: Webcam 0)".
    public let negotiatedDescription: String
    /// What the frames copied out of driver buffers may take (the memory budget's share; the
    /// driver's own buffers are not this process's memory); set before `start`.
    public var copyPoolBytes = 64 << 20
    /// Bytes of one captured frame (the negotiated sizeimage).
    public let frameBytes: Int
    /// What the captured YUV is, as negotiated (nil: RGB, converted by the encoder).
    public let colour: VideoColour?

    /// Opens and configures `path` at once, so a bad device, size or format is reported before
    /// anything else starts. Throws `.invalidArgument` with a message naming the device and what it supports.
    public init(path: String, options: V4L2Options, logger: Logger) throws(BroadcastError) {
        self.wake = try Wakeup()
        self.path = path
        self.options = options
        self.logger = logger
        let device: V4L2Device
        do {
            device = try V4L2Device(path: path)
        } catch {
            throw V4L2Negotiation.openError(error, path: path)
        }
        let negotiated = try V4L2Negotiation.configure(device, options: options, logger: logger)
        configured = (device, negotiated)
        negotiatedDescription = negotiated.description
        frameBytes = negotiated.pixFormat.sizeImage
        colour = negotiated.colour
    }

    public func start(into sink: SourceSink) throws {
        guard let (device, negotiated) = configured else {
            throw BroadcastError(.sourceFailed, "\(path): the source was already started")
        }
        configured = nil
        let stream: V4L2Stream
        do {
            stream = try V4L2Stream(device: device, negotiated: negotiated, wake: wake, copyPoolBytes: copyPoolBytes)
        } catch {
            throw BroadcastError(.sourceFailed, "\(path): cannot start streaming: \(error)")
        }
        logger.info("\(path): capturing \(negotiated.description)")
        running.store(true, ordering: .releasing)
        // Handed over through a property the thread empties, not captured by the closure: the
        // closure lives as long as the thread, and would keep the device open after a loss (so
        // the driver could not be unloaded, nor the device come back).
        handoff = stream
        thread = OSThread(name: "bc-v4l2") { [self] in capture(into: sink) }
    }

    public func stop() {
        running.store(false, ordering: .releasing)
        wake.signal()
        thread?.join()
        thread = nil
    }

    private var shouldRun: Bool { running.load(ordering: .acquiring) }

    // MARK: The capture thread

    private func capture(into sink: SourceSink) {
        var stream: V4L2Stream? = handoff
        handoff = nil
        guard var lastFormat = stream?.negotiated else { return }
        var lastFrameAt = sink.clock.now()
        var failures = 0
        var slate: SlateGenerator?
        var nextRetry: Int64 = 0

        // Made once: a new array every turn of the loop would be an allocation per frame.
        var fds = [pollfd](repeating: pollfd(), count: 2)
        while shouldRun && !sink.isStopping {
            guard let current = stream else {
                // The device is gone: a slate at the frame rate, and a reopen twice a second.
                if slate == nil {
                    slate = SlateGenerator(width: lastFormat.pixFormat.width, height: lastFormat.pixFormat.height,
                                           frameDuration: lastFormat.frameDurationNanoseconds, start: sink.clock.now())
                }
                let now = sink.clock.now()
                if now >= nextRetry {
                    nextRetry = now + 500_000_000
                    if let reopened = reopen() {
                        stream = reopened
                        lastFormat = reopened.negotiated
                        slate = nil
                        lastFrameAt = sink.clock.now()
                        failures = 0
                        gone.store(false, ordering: .relaxed)
                        logger.notice("\(path): back, capturing \(reopened.negotiated.description)")
                        continue
                    }
                }
                slate!.deliverDue(into: sink, now: now, counter: slateFrames, dropped: droppedFrames)
                MonotonicClock.sleep(until: min(nextRetry, slate!.wakeTime(now: now)))
                continue
            }

            do {
                try current.requeueReturned()
            } catch {
                lose(&stream, because: "\(error)")
                continue
            }

            fds[0] = pollfd(fd: current.hasQueuedBuffers ? current.device.fd : -1, events: Int16(POLLIN | POLLPRI), revents: 0)
            fds[1] = pollfd(fd: wake.descriptor, events: Int16(POLLIN), revents: 0)
            let ready = poll(&fds, 2, 200)
            wake.drain()
            if ready < 0 { continue }
            let events = Int32(fds[0].revents)

            if events & Int32(POLLPRI) != 0, current.device.takeEvents() {
                renegotiate(&stream, sink: sink)
                if let s = stream { lastFormat = s.negotiated }
                continue
            }
            if events & Int32(POLLIN | POLLERR | POLLHUP) != 0 {
                // One buffer per wake-up: asking until EAGAIN would make libv4l2 print an error line each time.
                do {
                    if let frame = try current.dequeue() {
                        failures = 0
                        lastFrameAt = sink.clock.now()
                        try deliver(frame, of: current, into: sink)
                    }
                } catch {
                    failures += 1
                    if current.device.isGone || failures > 20 {
                        lose(&stream, because: "\(error)")
                        continue
                    }
                }
            }
            // A device that stops answering without an error (no frame for 2 s) is checked for loss.
            if sink.clock.now() - lastFrameAt > 2_000_000_000 {
                if current.device.isGone {
                    lose(&stream, because: "no frames, and the device no longer answers")
                } else {
                    lastFrameAt = sink.clock.now()
                    logger.warning("\(path): no frame for 2 s (input without signal?)")
                }
            }
        }
        stream?.device.streamOff()
        stream = nil
        let stats = statistics
        logger.info(
            "\(path): \(stats.framesCaptured) frames delivered (\(stats.copiedFrames) copied while the driver was short of buffers), \(stats.droppedFrames) dropped for want of a buffer, \(stats.starvedFrames) lost with the driver out of buffers, \(stats.driverSkippedFrames) skipped by the driver running late, \(stats.corruptFrames) damaged, \(stats.slateFrames) slate frames, \(stats.deviceLosses) losses, \(stats.renegotiations) renegotiations"
        )
    }

    /// Hands a dequeued frame to the session: the driver's buffer itself while the driver still has
    /// `V4L2Stream.minimumQueued` others to fill; otherwise a copy, and the driver's buffer goes back
    /// at once, so a session that is slow for a moment never starves the driver (GStreamer's v4l2src
    /// copies when its pool runs low too).
    private func deliver(_ frame: V4L2Device.Dequeued, of stream: V4L2Stream, into sink: SourceSink) throws(SystemCallError) {
        let now = sink.clock.now()
        let captureTime = DeviceTimestamps.videoCaptureTime(
            bufferTimestamp: frame.timestampNanoseconds,
            isMonotonic: frame.monotonicTimestamp && sink.clock is MonotonicClock,
            dequeuedAt: now
        )
        if let skipped = stream.noteSequence(frame.sequence), skipped > 0 {
            (stream.queuedCount == 0 ? starvedFrames : driverSkippedFrames).wrappingIncrement(by: skipped, ordering: .relaxed)
        }
        // A compressed frame is as long as the driver filled it (bytesused); an empty one is damaged.
        let isCompressed = stream.negotiated.pixelFormat == .mjpeg
        let compressedBytes = min(frame.bytesUsed, stream.mapping.buffers[frame.index].length)
        let empty = isCompressed && compressedBytes <= 0
        if frame.error || empty || captureTime < sink.startTime {
            if frame.error || empty { corruptFrames.wrappingIncrement(ordering: .relaxed) }
            try stream.requeue(frame.index)
            return
        }
        let format = MediaFormat.video(stream.negotiated.videoFormat)
        let duration = MediaTime(nanoseconds: stream.negotiated.frameDurationNanoseconds)
        /// The planes as captured; for MJPEG the one plane of JPEG bytes, cut to `bytesused`.
        func captured(_ planes: [Plane]) -> [Plane] {
            guard isCompressed, let whole = planes.first else { return planes }
            let count = min(compressedBytes, whole.count)
            return [Plane(base: whole.base, count: count, bytesPerRow: count)]
        }
        if stream.queuedCount < V4L2Stream.minimumQueued {
            guard let copy = stream.copyPool.acquire(wait: false, shouldStop: { false }) else {
                droppedFrames.wrappingIncrement(ordering: .relaxed)
                try stream.requeue(frame.index)
                return
            }
            let source = stream.mapping.buffers[frame.index]
            let length = isCompressed ? compressedBytes : source.length
            copy.memory.copyMemory(from: source.address, byteCount: min(copy.byteCount, length))
            try stream.requeue(frame.index)
            copiedFrames.wrappingIncrement(ordering: .relaxed)
            framesCaptured.wrappingIncrement(ordering: .relaxed)
            sink.offer(CapturedBuffer(format: format, captureTime: captureTime, duration: duration, planes: captured(copy.planes), backing: copy))
            return
        }
        stream.markWithSession(frame.index)
        framesCaptured.wrappingIncrement(ordering: .relaxed)
        sink.offer(
            CapturedBuffer(
                format: format,
                captureTime: captureTime,
                duration: duration,
                planes: captured(stream.planes[frame.index]),
                backing: stream.backings[frame.index]
            )
        )
    }

    private func lose(_ stream: inout V4L2Stream?, because reason: String) {
        deviceLosses.wrappingIncrement(ordering: .relaxed)
        gone.store(true, ordering: .relaxed)
        logger.warning("\(path): device lost (\(reason)); sending a no-signal slate and retrying")
        stream?.device.streamOff()
        // Buffers still with the session keep the mapping (and so the file) open until released.
        stream = nil
    }

    /// Why the last reopen failed, so each new reason is logged once (not twice a second).
    private var lastReopenFailure: String?

    private func reopen() -> V4L2Stream? {
        do {
            let device: V4L2Device
            do {
                device = try V4L2Device(path: path)
            } catch {
                throw BroadcastError(.sourceFailed, "\(error)")
            }
            let negotiated = try V4L2Negotiation.configure(device, options: options, logger: logger)
            do {
                return try V4L2Stream(device: device, negotiated: negotiated, wake: wake, copyPoolBytes: copyPoolBytes)
            } catch {
                throw BroadcastError(.sourceFailed, "\(error)")
            }
        } catch {
            let reason = "\(error)"
            if reason != lastReopenFailure {
                lastReopenFailure = reason
                logger.info("\(path): not back yet: \(reason)")
            }
            return nil
        }
    }

    /// Waits (up to 5 s) until the session has released every buffer of `stream`. On a starved
    /// machine the session's queue can be seconds long (the VM under load: 2 s were not enough).
    private func waitForSessionBuffers(_ stream: V4L2Stream) {
        let deadline = MonotonicClock().now() + 5_000_000_000
        while stream.buffersWithSession > 0 && MonotonicClock().now() < deadline && shouldRun {
            var fd = pollfd(fd: wake.descriptor, events: Int16(POLLIN), revents: 0)
            _ = poll(&fd, 1, 50)
            wake.drain()
            stream.collectReturned()
        }
    }

    /// Stream off, wait until the session gave every buffer back, free them, negotiate again, stream on.
    private func renegotiate(_ stream: inout V4L2Stream?, sink: SourceSink) {
        guard let device = stream?.device else { return }
        renegotiations.wrappingIncrement(ordering: .relaxed)
        device.streamOff()
        if let old = stream {
            waitForSessionBuffers(old)
            // REQBUFS 0 fails with EBUSY while a buffer is mapped: unmap at once rather than when
            // the last reference goes (the capture loop still holds one).
            if old.buffersWithSession == 0 { old.mapping.unmap() }
        }
        stream = nil
        var freed = false
        for _ in 0..<100 where shouldRun {
            if (try? device.requestBuffers(0)) != nil {
                freed = true
                break
            }
            usleep(10_000)
        }
        do {
            if freed {
                let negotiated = try V4L2Negotiation.configure(device, options: options, logger: logger)
                stream = try V4L2Stream(device: device, negotiated: negotiated, wake: wake, copyPoolBytes: copyPoolBytes)
                logger.notice("\(path): source changed, now capturing \(negotiated.description)")
            } else if let reopened = reopen() {
                // The session still holds buffers of the old format; they keep the old handle and
                // its mapping until released, and a new handle gets buffers of its own.
                stream = reopened
                logger.notice("\(path): source changed, now capturing \(reopened.negotiated.description) (on a new handle: the session still held buffers of the old format)")
            } else {
                throw BroadcastError(.sourceFailed, "buffers still in use")
            }
        } catch {
            lose(&stream, because: "renegotiation after a source change failed: \(error)")
        }
    }
}

/// What a device was configured to.
struct V4L2Negotiation: Sendable, CustomStringConvertible {
    var pixFormat: V4L2Device.PixFormat
    var pixelFormat: PixelFormat
    var frameDurationNanoseconds: Int64
    var inputDescription: String
    var rateText: String

    var videoFormat: VideoFormat {
        VideoFormat(pixelFormat: pixelFormat, width: pixFormat.width, height: pixFormat.height, colour: colour)
    }

    /// What the device's YUV is (nil for RGB formats), from the format's colour fields.
    var colour: VideoColour? {
        V4L2Colour.describe(
            pixelFormat: pixelFormat, colorspace: pixFormat.colorspace, ycbcrEncoding: pixFormat.ycbcrEncoding,
            quantization: pixFormat.quantization, transfer: pixFormat.transfer, width: pixFormat.width, height: pixFormat.height)
    }

    var description: String {
        "\(pixFormat.fourcc) \(pixFormat.width)x\(pixFormat.height) @ \(rateText) fps (\(inputDescription))"
    }

    static func openError(_ error: SystemCallError, path: String) -> BroadcastError {
        let others = DeviceDiscovery.videoCaptureDevices().map(\.path).filter { $0 != path }
        let list = others.isEmpty ? "no V4L2 capture devices found" : "capture devices: \(others.joined(separator: ", "))"
        switch error.errno {
        case ENOENT, ENODEV, ENXIO:
            return BroadcastError(.invalidArgument, "no video device \(path) (\(list))")
        case EACCES, EPERM:
            return BroadcastError(.invalidArgument, "permission denied opening \(path): join the 'video' group")
        case EBUSY:
            return busy(path)
        case ENOTTY, EINVAL:
            return BroadcastError(.invalidArgument, "\(path) is not a V4L2 device (\(list))")
        default:
            return BroadcastError(.invalidArgument, "cannot open \(path): \(String(cString: strerror(error.errno)))")
        }
    }

    static func busy(_ path: String) -> BroadcastError {
        BroadcastError(.invalidArgument, "\(path) is busy: another program is capturing from it")
    }

    /// Selects the input, format, size and rate `options` ask for, checking each against what the
    /// device offers; every error names the device and what it supports.
    static func configure(_ device: V4L2Device, options: V4L2Options, logger: Logger) throws(BroadcastError) -> V4L2Negotiation {
        try checkCapabilities(of: device)
        let input = try selectInput(of: device, options: options)
        let fourcc = try choosePixelFormat(of: device, options: options, input: input, logger: logger)
        let size = try frameSize(of: device, fourcc: fourcc, options: options, input: input, logger: logger)
        let pix = try setFormat(of: device, fourcc: fourcc, size: size, input: input)
        guard let pixelFormat = V4L2PixelFormats.pixelFormat(for: fourcc) else {
            throw BroadcastError(.invalidArgument, "\(device.path): cannot use \(fourcc)")
        }
        let rate = setFrameRate(of: device, options: options, fourcc: fourcc, size: size, logger: logger)
        _ = device.subscribeSourceChange(input: input.index)
        return V4L2Negotiation(
            pixFormat: pix,
            pixelFormat: pixelFormat,
            frameDurationNanoseconds: rate.frameDuration,
            inputDescription: input.description,
            rateText: rate.text
        )
    }

    /// A failed ioctl as the error `configure` throws: EBUSY says who is to blame.
    private static func failure(_ error: SystemCallError, path: String) -> BroadcastError {
        error.errno == EBUSY ? busy(path) : BroadcastError(.invalidArgument, "\(error)")
    }

    /// The device must capture video and stream it.
    private static func checkCapabilities(of device: V4L2Device) throws(BroadcastError) {
        let path = device.path
        let caps: V4L2Device.Capabilities
        do { caps = try device.capabilities() } catch { throw failure(error, path: path) }
        guard caps.isVideoCapture else {
            let others = DeviceDiscovery.videoCaptureDevices().map(\.path).filter { $0 != path }
            throw BroadcastError(
                .invalidArgument,
                "\(path) (\(caps.card), driver \(caps.driver)) is not a video capture device: it is \(caps.kind); "
                    + (others.isEmpty ? "no V4L2 capture devices found" : "capture devices: \(others.joined(separator: ", "))")
            )
        }
        guard caps.canStream else {
            throw BroadcastError(.invalidArgument, "\(path) (\(caps.card)) cannot stream (no V4L2_CAP_STREAMING)")
        }
    }

    /// The input captured from: the one `options` ask for (selected if it is not already), else the current one.
    private struct SelectedInput {
        var index: Int
        var input: V4L2Device.Input?
        /// "input 0: HDMI", for messages and the negotiation's description.
        var description: String
        /// An HDMI-style input, which captures the signal's size and rate.
        var hasDVTimings: Bool { input?.hasDVTimings == true }
    }

    private static func selectInput(of device: V4L2Device, options: V4L2Options) throws(BroadcastError) -> SelectedInput {
        let path = device.path
        let inputs = device.inputs()
        if let wanted = options.input {
            guard inputs.indices.contains(wanted) else {
                let list = inputs.map { "\($0.index) (\($0.name))" }.joined(separator: ", ")
                throw BroadcastError(.invalidArgument, "\(path) has no input \(wanted): inputs are \(list.isEmpty ? "none" : list)")
            }
            if device.currentInput() != wanted {
                do { try device.setInput(wanted) } catch { throw failure(error, path: path) }
            }
        }
        let inputIndex = device.currentInput() ?? 0
        let input = inputs.first { $0.index == inputIndex }
        let inputDescription = input.map { "input \($0.index): \($0.name)" } ?? "input \(inputIndex)"
        return SelectedInput(index: inputIndex, input: input, description: inputDescription)
    }

    /// The pixel format `options` ask for, if the device offers it and broadcast can convert it;
    /// else the usable one that best matches the size and rate asked for.
    private static func choosePixelFormat(
        of device: V4L2Device, options: V4L2Options, input: SelectedInput, logger: Logger
    ) throws(BroadcastError) -> FourCC {
        let path = device.path
        let offered = device.formats()
        let usable = offered.filter { V4L2PixelFormats.isUsable($0.fourcc) }.map(\.fourcc)
        let usableText = usable.map(\.description).joined(separator: ", ")
        if let wanted = options.pixelFormat {
            guard offered.contains(where: { $0.fourcc == wanted }) else {
                throw BroadcastError(.invalidArgument, "\(path) (\(input.description)) does not offer pixel format \(wanted); usable formats: \(usableText)")
            }
            guard V4L2PixelFormats.isUsable(wanted) else {
                throw BroadcastError(.invalidArgument, "\(path): broadcast cannot convert \(wanted); usable formats: \(usableText)")
            }
        }
        let hasDVTimings = input.hasDVTimings
        let askedRate = Double(options.frameRate.numerator) / Double(options.frameRate.denominator)
        let chosen = V4L2PixelFormats.choose(offered: usable, wanted: options.pixelFormat) { fourcc in
            // An HDMI-style input captures the signal's size and rate, whatever the format.
            if hasDVTimings { return .sizeAndRate }
            return V4L2FormatMatch.of(
                sizes: device.frameSizes(fourcc),
                rates: device.frameRates(fourcc, width: options.width, height: options.height),
                width: options.width, height: options.height, framesPerSecond: askedRate
            )
        }
        guard let fourcc = chosen else {
            let all = offered.map(\.fourcc.description).joined(separator: ", ")
            throw BroadcastError(.invalidArgument, "\(path) offers no pixel format broadcast can use (it offers \(all))")
        }
        if options.pixelFormat == nil, V4L2PixelFormats.compressed.contains(fourcc) {
            logger.notice(
                "\(path): capturing \(fourcc) (decoded before encoding): no uncompressed format gives \(options.width)x\(options.height) at \(V4L2Fraction(options.frameRate.denominator, options.frameRate.numerator).rateText) fps"
            )
        }
        return fourcc
    }

    /// The size captured, and an HDMI-style input's rate (millihertz) from its timings.
    private struct FrameSize {
        var width: Int
        var height: Int
        var dvRate: Int?
    }

    /// An HDMI-style input's size is the signal's (the receiver's detected timings, else the ones
    /// set); any other input's is the one asked for, if the device captures it.
    private static func frameSize(
        of device: V4L2Device, fourcc: FourCC, options: V4L2Options, input: SelectedInput, logger: Logger
    ) throws(BroadcastError) -> FrameSize {
        let path = device.path
        var size = FrameSize(width: options.width, height: options.height, dvRate: nil)
        if input.hasDVTimings {
            // An HDMI-style input: the size is the signal's. Take what the receiver detects.
            let timings: V4L2Device.DVTimings
            do {
                timings = try device.applyDetectedDVTimings()
            } catch {
                if error.errno == EBUSY { throw busy(path) }
                guard let current = device.currentDVTimings() else { throw failure(error, path: path) }
                logger.warning("\(path): no stable signal detected (\(error)); using the set timings \(current)")
                timings = current
            }
            size.width = timings.width
            size.height = timings.height
            size.dvRate = timings.millihertz
        } else {
            let sizes = device.frameSizes(fourcc)
            if !sizes.isEmpty && !sizes.contains(where: { $0.contains(width: size.width, height: size.height) }) {
                throw BroadcastError(
                    .invalidArgument,
                    "\(path) (\(input.description)) does not capture \(fourcc) at \(size.width)x\(size.height); sizes: \(sizes.map(\.description).joined(separator: ", "))"
                )
            }
        }
        return size
    }

    /// Sets the format (S_FMT); the device must give exactly what was asked.
    private static func setFormat(
        of device: V4L2Device, fourcc: FourCC, size: FrameSize, input: SelectedInput
    ) throws(BroadcastError) -> V4L2Device.PixFormat {
        let path = device.path
        let (width, height) = (size.width, size.height)
        let pix: V4L2Device.PixFormat
        do { pix = try device.setFormat(fourcc, width: width, height: height) } catch { throw failure(error, path: path) }
        guard pix.fourcc == fourcc, pix.width == width, pix.height == height else {
            throw BroadcastError(
                .invalidArgument,
                "\(path) (\(input.description)) gave \(pix.fourcc) \(pix.width)x\(pix.height) when asked for \(fourcc) \(width)x\(height)"
            )
        }
        return pix
    }

    /// The frame rate: an HDMI-style input's from its timings; else the one asked for, set on the
    /// device (S_PARM), and what the device says it captures at (a warning when it is more than 1 %
    /// off); the one asked for when the device does not say.
    private static func setFrameRate(
        of device: V4L2Device, options: V4L2Options, fourcc: FourCC, size: FrameSize, logger: Logger
    ) -> (frameDuration: Int64, text: String) {
        let path = device.path
        let (width, height) = (size.width, size.height)
        var frameDuration: Int64
        var rateText: String
        if let millihertz = size.dvRate, millihertz > 0 {
            frameDuration = 1_000_000_000_000 / Int64(millihertz)
            rateText = millihertz % 1000 == 0 ? "\(millihertz / 1000)" : String(Double(millihertz) / 1000)
        } else {
            let (num, den) = options.frameRate
            let interval = device.setFrameRate(numerator: num, denominator: den) ?? device.frameInterval()
            if let interval, interval.denominator > 0, interval.numerator > 0 {
                frameDuration = Int64(interval.numerator) * 1_000_000_000 / Int64(interval.denominator)
                rateText = interval.rateText
                let asked = Double(num) / Double(den)
                if abs(interval.framesPerSecond - asked) / asked > 0.01 {
                    let offeredRates = device.frameIntervals(fourcc, width: width, height: height).map(\.rateText)
                    logger.warning(
                        "\(path) captures \(width)x\(height) at \(rateText) fps, not \(V4L2Fraction(den, num).rateText) (offered: \(offeredRates.joined(separator: ", ")))"
                    )
                }
            } else {
                frameDuration = Int64(den) * 1_000_000_000 / Int64(num)
                rateText = V4L2Fraction(den, num).rateText
            }
        }
        return (frameDuration, rateText)
    }
}

extension V4L2Device {
    /// True once the device node is gone (unplugged, driver unbound): its ioctls answer ENODEV.
    var isGone: Bool {
        do {
            _ = try capabilities()
            return false
        } catch {
            return error.errno == ENODEV || error.errno == ENXIO || error.errno == EIO
        }
    }
}

/// One streaming setup on the capture thread: the mapped buffers, one backing each, and which of
/// them the session holds. Made on the thread that starts the source, then used by the capture
/// thread alone (hence unchecked Sendable).
final class V4L2Stream: @unchecked Sendable {
    let device: V4L2Device
    let negotiated: V4L2Negotiation
    let mapping: V4L2Mapping
    let backings: [V4L2FrameBacking]
    let planes: [[Plane]]
    /// Buffers of our own for frames copied while the driver is short of buffers.
    let copyPool: BufferPool
    private var withSession: [Bool]
    /// Buffers queued with the driver (to be filled).
    private(set) var queuedCount = 0
    private var lastSequence: UInt32?

    /// Buffers to ask of the driver (REQBUFS): about 0.6 s of frames (8 to 32, within 96 MiB), so a
    /// capture thread that runs late on a loaded machine finds the frames waiting instead of
    /// skipped by the driver for want of a buffer.
    static func bufferCount(frameBytes: Int, frameDuration: Int64) -> Int {
        let frames = Int(600_000_000 / max(frameDuration, 1_000_000))
        return max(4, min(max(8, min(frames, 32)), 96 << 20 / max(frameBytes, 1)))
    }
    /// Below this many buffers queued with the driver, frames are copied and their buffer re-queued.
    static let minimumQueued = 2
    /// Copies to keep: up to a second of frames, within `limit` bytes (64 MiB unless the memory
    /// budget says less), and never fewer than 4.
    static func copyCount(frameBytes: Int, frameDuration: Int64, limit: Int = 64 << 20) -> Int {
        let perSecond = Int(1_000_000_000 / max(frameDuration, 1_000_000))
        return max(4, min(perSecond, limit / max(frameBytes, 1), 64))
    }

    init(device: V4L2Device, negotiated: V4L2Negotiation, wake: Wakeup, copyPoolBytes: Int) throws(SystemCallError) {
        self.device = device
        self.negotiated = negotiated
        let count = try device.requestBuffers(
            Self.bufferCount(frameBytes: negotiated.pixFormat.sizeImage, frameDuration: negotiated.frameDurationNanoseconds)
        )
        var buffers: [(address: UnsafeMutableRawPointer, length: Int)] = []
        do {
            for index in 0..<count { buffers.append(try device.map(index)) }
        } catch {
            for buffer in buffers { _ = v4l2_munmap(buffer.address, buffer.length) }
            throw error
        }
        let mapping = V4L2Mapping(device: device, buffers: buffers)
        self.mapping = mapping
        self.backings = (0..<count).map { V4L2FrameBacking(index: $0, mapping: mapping, wake: wake) }
        let pix = negotiated.pixFormat
        let layout = V4L2PixelFormats.planeLayout(
            negotiated.pixelFormat, width: pix.width, height: pix.height, bytesPerLine: pix.bytesPerLine, sizeImage: pix.sizeImage
        )
        self.planes = buffers.map { buffer in
            layout.map { Plane(base: UnsafeRawPointer(buffer.address + $0.offset), count: min($0.count, buffer.length - $0.offset), bytesPerRow: $0.bytesPerRow) }
        }
        let frameBytes = min(max(pix.sizeImage, layout.map { $0.offset + $0.count }.max() ?? 0), buffers.map(\.length).min() ?? 0)
        copyPool = BufferPool(
            count: Self.copyCount(frameBytes: frameBytes, frameDuration: negotiated.frameDurationNanoseconds, limit: copyPoolBytes),
            byteCount: frameBytes,
            planeLayout: layout.map { ($0.offset, min($0.count, frameBytes - $0.offset), $0.bytesPerRow) }
        )
        withSession = Array(repeating: false, count: count)
        for index in 0..<count { try device.queue(index) }
        queuedCount = count
        try device.streamOn()
    }

    var hasQueuedBuffers: Bool { queuedCount > 0 }

    /// The next filled buffer (nil: none yet), no longer counted as queued.
    func dequeue() throws(SystemCallError) -> V4L2Device.Dequeued? {
        let frame = try device.dequeue()
        if frame != nil { queuedCount -= 1 }
        return frame
    }

    /// Gives buffer `index` (dequeued, not with the session) back to the driver.
    func requeue(_ index: Int) throws(SystemCallError) {
        try device.queue(index)
        queuedCount += 1
    }

    /// Frames the driver skipped before the one with sequence number `sequence`; nil for the first.
    func noteSequence(_ sequence: UInt32) -> Int? {
        defer { lastSequence = sequence }
        guard let last = lastSequence else { return nil }
        let gap = Int(sequence &- last) - 1
        return gap >= 0 && gap < 1_000_000 ? gap : 0
    }
    var buffersWithSession: Int { withSession.filter { $0 }.count }

    func markWithSession(_ index: Int) { withSession[index] = true }

    /// Gives the buffers the session released back to the driver.
    func requeueReturned() throws(SystemCallError) {
        for index in withSession.indices where withSession[index] {
            if backings[index].takeReturned() {
                withSession[index] = false
                try requeue(index)
            }
        }
    }

    /// Notes released buffers without queueing them (while renegotiating).
    func collectReturned() {
        for index in withSession.indices where withSession[index] && backings[index].takeReturned() {
            withSession[index] = false
        }
    }
}

/// One V4L2 buffer as the session sees it. `release()` (the session's thread, or the capture
/// thread's own when the ring was full) only marks it returned and wakes the capture thread,
/// which re-queues it.
final class V4L2FrameBacking: SampleBufferBacking, @unchecked Sendable {
    let index: Int
    /// Keeps the memory mapped (and the device open) while the session holds the frame.
    let mapping: V4L2Mapping
    private let returned = ManagedAtomic<Bool>(false)
    private let wake: Wakeup

    init(index: Int, mapping: V4L2Mapping, wake: Wakeup) {
        self.index = index
        self.mapping = mapping
        self.wake = wake
    }

    func release() {
        returned.store(true, ordering: .releasing)
        wake.signal()
    }

    /// True (once) after a release.
    func takeReturned() -> Bool {
        returned.exchange(false, ordering: .acquiringAndReleasing)
    }
}

/// "No signal": a blue yuv420p frame at the frame rate while a device is gone.
struct SlateGenerator {
    let pool: BufferPool
    let format: VideoFormat
    let frameDuration: Int64
    private(set) var nextDue: Int64

    init(width: Int, height: Int, frameDuration: Int64, start: Int64) {
        let w = max(16, width & ~1)
        let h = max(16, height & ~1)
        format = VideoFormat(pixelFormat: .yuv420p, width: w, height: h)
        self.frameDuration = max(frameDuration, 1_000_000)
        let luma = w * h
        let chroma = (w / 2) * (h / 2)
        pool = BufferPool(count: 4, byteCount: luma + 2 * chroma, planeLayout: [(0, luma, w), (luma, chroma, w / 2), (luma + chroma, chroma, w / 2)])
        // Fill every pooled buffer once: BT.601 blue.
        var filled: [BufferPool.Buffer] = []
        while let buffer = pool.acquire(wait: false, shouldStop: { false }) {
            let bytes = buffer.memory.assumingMemoryBound(to: UInt8.self)
            bytes.update(repeating: 41, count: luma)
            (bytes + luma).update(repeating: 240, count: chroma)
            (bytes + luma + chroma).update(repeating: 110, count: chroma)
            filled.append(buffer)
        }
        for buffer in filled { buffer.release() }
        nextDue = start
    }

    /// Delivers the slate frames due by `now`, counting them in `counter`; with no free buffer (the
    /// encoder behind holds them all) the frame goes out late, on a later call. Slots more than a
    /// second behind (a starved machine) are skipped and counted in `dropped`, as capture frames
    /// given back for want of a buffer are.
    mutating func deliverDue(into sink: SourceSink, now: Int64, counter: ManagedAtomic<Int>, dropped: ManagedAtomic<Int>) {
        if now - nextDue > 1_000_000_000 {
            dropped.wrappingIncrement(by: Int((now - nextDue) / frameDuration), ordering: .relaxed)
            nextDue += (now - nextDue) / frameDuration * frameDuration
        }
        while nextDue <= now {
            if let buffer = pool.acquire(wait: false, shouldStop: { false }) {
                sink.offer(
                    CapturedBuffer(
                        format: .video(format),
                        captureTime: nextDue,
                        duration: MediaTime(nanoseconds: frameDuration),
                        planes: buffer.planes,
                        backing: buffer
                    )
                )
                counter.wrappingIncrement(ordering: .relaxed)
            } else {
                // Every slate buffer is still with the session: this slot's frame goes out on the
                // next call, late but in order, rather than leaving a hole in the output.
                return
            }
            nextDue += frameDuration
        }
    }

    /// When to call `deliverDue` next: the next frame's time, or shortly when one is overdue (the
    /// session still held every buffer).
    func wakeTime(now: Int64) -> Int64 { max(nextDue, now + 2_000_000) }
}
