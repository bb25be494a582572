internal import CDeviceShim
internal import CV4L2

#if canImport(Glibc)
import Glibc
#endif

/// A failed system call: the errno and what we were doing.
struct SystemCallError: Error, CustomStringConvertible {
    let errno: Int32
    let what: String

    var description: String { "\(what): \(String(cString: strerror(errno)))" }
}

/// An open V4L2 device node (through libv4l2). A class so buffer mappings can keep it open: the
/// file descriptor closes when the last owner lets go. Used by one thread at a time.
final class V4L2Device: @unchecked Sendable {
    let path: String
    let fd: Int32

    init(path: String) throws(SystemCallError) {
        self.path = path
        let fd = CBroadcast_v4l2_open_checked(path, O_RDWR | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw SystemCallError(errno: errno, what: "opening \(path)") }
        self.fd = fd
    }

    deinit { _ = CBroadcast_v4l2_close(fd) }

    @discardableResult
    func ioctl<T>(_ request: UInt, _ argument: inout T, _ what: @autoclosure () -> String) throws(SystemCallError) -> Int32 {
        let rc = withUnsafeMutableBytes(of: &argument) { CBroadcast_v4l2_ioctl(fd, request, $0.baseAddress) }
        if rc < 0 { throw SystemCallError(errno: errno, what: "\(what()) on \(path)") }
        return rc
    }

    // MARK: Discovery

    struct Capabilities: Sendable {
        var driver: String
        var card: String
        var bus: String
        /// The node's own capabilities (device_caps when the driver reports them).
        var deviceCaps: UInt32

        var isVideoCapture: Bool { deviceCaps & UInt32(V4L2_CAP_VIDEO_CAPTURE) != 0 }
        var canStream: Bool { deviceCaps & UInt32(V4L2_CAP_STREAMING) != 0 }

        /// What the node is, for messages about a node that does not capture video.
        var kind: String {
            var kinds: [String] = []
            if deviceCaps & UInt32(V4L2_CAP_VIDEO_CAPTURE) != 0 { kinds.append("video capture") }
            if deviceCaps & UInt32(V4L2_CAP_VIDEO_CAPTURE_MPLANE) != 0 { kinds.append("multi-planar video capture") }
            if deviceCaps & UInt32(V4L2_CAP_VIDEO_OUTPUT) != 0 { kinds.append("video output") }
            if deviceCaps & UInt32(V4L2_CAP_VIDEO_OUTPUT_MPLANE) != 0 { kinds.append("multi-planar video output") }
            if deviceCaps & UInt32(V4L2_CAP_VBI_CAPTURE) != 0 { kinds.append("VBI capture") }
            if deviceCaps & UInt32(V4L2_CAP_VBI_OUTPUT) != 0 { kinds.append("VBI output") }
            if deviceCaps & UInt32(V4L2_CAP_SLICED_VBI_CAPTURE) != 0 { kinds.append("sliced VBI capture") }
            if deviceCaps & UInt32(V4L2_CAP_RADIO) != 0 { kinds.append("radio") }
            if deviceCaps & UInt32(V4L2_CAP_SDR_CAPTURE) != 0 { kinds.append("SDR capture") }
            if deviceCaps & UInt32(V4L2_CAP_META_CAPTURE) != 0 { kinds.append("metadata capture") }
            if deviceCaps & UInt32(V4L2_CAP_TOUCH) != 0 { kinds.append("touch") }
            return kinds.isEmpty ? "no capture or output" : kinds.joined(separator: ", ")
        }
    }

    func capabilities() throws(SystemCallError) -> Capabilities {
        var cap = v4l2_capability()
        try ioctl(CBroadcast_VIDIOC_QUERYCAP(), &cap, "VIDIOC_QUERYCAP")
        let caps = cap.capabilities & UInt32(V4L2_CAP_DEVICE_CAPS) != 0 ? cap.device_caps : cap.capabilities
        return Capabilities(
            driver: cString(&cap.driver),
            card: cString(&cap.card),
            bus: cString(&cap.bus_info),
            deviceCaps: caps
        )
    }

    struct Input: Sendable {
        var index: Int
        var name: String
        /// "camera" or "tuner".
        var type: String
        var hasDVTimings: Bool
        var hasStandards: Bool
        /// V4L2_IN_ST_NO_SIGNAL and friends, 0 when all is well.
        var status: UInt32
    }

    func inputs() -> [Input] {
        var result: [Input] = []
        for index in 0..<64 {
            var input = v4l2_input()
            input.index = UInt32(index)
            guard (try? ioctl(CBroadcast_VIDIOC_ENUMINPUT(), &input, "VIDIOC_ENUMINPUT")) != nil else { break }
            result.append(
                Input(
                    index: index,
                    name: cString(&input.name),
                    type: input.type == UInt32(V4L2_INPUT_TYPE_TUNER) ? "tuner" : "camera",
                    hasDVTimings: input.capabilities & UInt32(V4L2_IN_CAP_DV_TIMINGS) != 0,
                    hasStandards: input.capabilities & UInt32(V4L2_IN_CAP_STD) != 0,
                    status: input.status
                )
            )
        }
        return result
    }

    func currentInput() -> Int? {
        var index: Int32 = 0
        guard (try? ioctl(CBroadcast_VIDIOC_G_INPUT(), &index, "VIDIOC_G_INPUT")) != nil else { return nil }
        return Int(index)
    }

    func setInput(_ index: Int) throws(SystemCallError) {
        var value = Int32(index)
        try ioctl(CBroadcast_VIDIOC_S_INPUT(), &value, "selecting input \(index) (VIDIOC_S_INPUT)")
    }

    struct FormatDescription: Sendable {
        var fourcc: FourCC
        var description: String
        var compressed: Bool
        var emulated: Bool
    }

    func formats() -> [FormatDescription] {
        var result: [FormatDescription] = []
        for index in 0..<256 {
            var desc = v4l2_fmtdesc()
            desc.index = UInt32(index)
            desc.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
            guard (try? ioctl(CBroadcast_VIDIOC_ENUM_FMT(), &desc, "VIDIOC_ENUM_FMT")) != nil else { break }
            result.append(
                FormatDescription(
                    fourcc: FourCC(rawValue: desc.pixelformat),
                    description: cString(&desc.description),
                    compressed: desc.flags & UInt32(V4L2_FMT_FLAG_COMPRESSED) != 0,
                    emulated: desc.flags & UInt32(V4L2_FMT_FLAG_EMULATED) != 0
                )
            )
        }
        return result
    }

    func frameSizes(_ fourcc: FourCC) -> [V4L2FrameSize] {
        var result: [V4L2FrameSize] = []
        for index in 0..<512 {
            var size = v4l2_frmsizeenum()
            size.index = UInt32(index)
            size.pixel_format = fourcc.rawValue
            guard (try? ioctl(CBroadcast_VIDIOC_ENUM_FRAMESIZES(), &size, "VIDIOC_ENUM_FRAMESIZES")) != nil else { break }
            if size.type == V4L2_FRMSIZE_TYPE_DISCRETE.rawValue {
                result.append(.discrete(width: Int(size.discrete.width), height: Int(size.discrete.height)))
            } else {
                let s = size.stepwise
                result.append(
                    .stepwise(
                        minWidth: Int(s.min_width), maxWidth: Int(s.max_width), stepWidth: Int(s.step_width),
                        minHeight: Int(s.min_height), maxHeight: Int(s.max_height), stepHeight: Int(s.step_height)
                    )
                )
                break
            }
        }
        return result
    }

    /// Discrete frame intervals for a size (a stepwise range is given as its two ends).
    func frameIntervals(_ fourcc: FourCC, width: Int, height: Int) -> [V4L2Fraction] {
        frameRates(fourcc, width: width, height: height).intervals
    }

    /// The frame intervals offered for a size.
    func frameRates(_ fourcc: FourCC, width: Int, height: Int) -> V4L2FrameRates {
        var result: [V4L2Fraction] = []
        for index in 0..<128 {
            var interval = v4l2_frmivalenum()
            interval.index = UInt32(index)
            interval.pixel_format = fourcc.rawValue
            interval.width = UInt32(width)
            interval.height = UInt32(height)
            guard (try? ioctl(CBroadcast_VIDIOC_ENUM_FRAMEINTERVALS(), &interval, "VIDIOC_ENUM_FRAMEINTERVALS")) != nil
            else { break }
            if interval.type == V4L2_FRMIVAL_TYPE_DISCRETE.rawValue {
                result.append(V4L2Fraction(Int(interval.discrete.numerator), Int(interval.discrete.denominator)))
            } else {
                let s = interval.stepwise
                return .range(
                    shortest: V4L2Fraction(Int(s.min.numerator), Int(s.min.denominator)),
                    longest: V4L2Fraction(Int(s.max.numerator), Int(s.max.denominator))
                )
            }
        }
        return result.isEmpty ? .unknown : .discrete(result)
    }

    // MARK: Configuration

    struct PixFormat: Sendable, Hashable {
        var fourcc: FourCC
        var width: Int
        var height: Int
        var bytesPerLine: Int
        var sizeImage: Int
        /// The colour fields, as the driver set them (enum v4l2_colorspace, v4l2_ycbcr_encoding,
        /// v4l2_quantization, v4l2_xfer_func); see `V4L2Colour`.
        var colorspace: UInt32 = 0
        var ycbcrEncoding: UInt32 = 0
        var quantization: UInt32 = 0
        var transfer: UInt32 = 0
    }

    func format() throws(SystemCallError) -> PixFormat {
        var format = v4l2_format()
        format.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
        try ioctl(CBroadcast_VIDIOC_G_FMT(), &format, "VIDIOC_G_FMT")
        return pixFormat(format)
    }

    func setFormat(_ fourcc: FourCC, width: Int, height: Int) throws(SystemCallError) -> PixFormat {
        var format = v4l2_format()
        format.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
        format.fmt.pix.pixelformat = fourcc.rawValue
        format.fmt.pix.width = UInt32(width)
        format.fmt.pix.height = UInt32(height)
        format.fmt.pix.field = V4L2_FIELD_NONE.rawValue
        try ioctl(CBroadcast_VIDIOC_S_FMT(), &format, "setting \(fourcc) \(width)x\(height) (VIDIOC_S_FMT)")
        return pixFormat(format)
    }

    private func pixFormat(_ format: v4l2_format) -> PixFormat {
        let pix = format.fmt.pix
        return PixFormat(
            fourcc: FourCC(rawValue: pix.pixelformat),
            width: Int(pix.width),
            height: Int(pix.height),
            bytesPerLine: Int(pix.bytesperline),
            sizeImage: Int(pix.sizeimage),
            colorspace: pix.colorspace,
            // A union in the header (ycbcr_enc / hsv_enc): one byte either way.
            ycbcrEncoding: UInt32(pix.ycbcr_enc),
            quantization: pix.quantization,
            transfer: pix.xfer_func
        )
    }

    /// Asks for `rate` frames per second; returns the interval the driver chose, nil when it has no
    /// frame-rate control.
    func setFrameRate(numerator: Int, denominator: Int) -> V4L2Fraction? {
        var parm = v4l2_streamparm()
        parm.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
        guard (try? ioctl(CBroadcast_VIDIOC_G_PARM(), &parm, "VIDIOC_G_PARM")) != nil,
            parm.parm.capture.capability & UInt32(V4L2_CAP_TIMEPERFRAME) != 0
        else { return nil }
        parm.parm.capture.timeperframe.numerator = UInt32(denominator)
        parm.parm.capture.timeperframe.denominator = UInt32(numerator)
        guard (try? ioctl(CBroadcast_VIDIOC_S_PARM(), &parm, "VIDIOC_S_PARM")) != nil else { return nil }
        let t = parm.parm.capture.timeperframe
        return V4L2Fraction(Int(t.numerator), Int(t.denominator))
    }

    func frameInterval() -> V4L2Fraction? {
        var parm = v4l2_streamparm()
        parm.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
        guard (try? ioctl(CBroadcast_VIDIOC_G_PARM(), &parm, "VIDIOC_G_PARM")) != nil else { return nil }
        let t = parm.parm.capture.timeperframe
        return t.numerator > 0 && t.denominator > 0 ? V4L2Fraction(Int(t.numerator), Int(t.denominator)) : nil
    }

    struct DVTimings: Sendable, Hashable, CustomStringConvertible {
        var width: Int
        var height: Int
        var interlaced: Bool
        var millihertz: Int

        var description: String {
            let rate = millihertz % 1000 == 0 ? "\(millihertz / 1000)" : String(Double(millihertz) / 1000)
            return "\(width)x\(height)\(interlaced ? "i" : "p")\(rate)"
        }
    }

    private func timings(_ t: CBroadcast_dv_timings) -> DVTimings {
        DVTimings(width: Int(t.width), height: Int(t.height), interlaced: t.interlaced != 0, millihertz: Int(t.millihertz))
    }

    /// Sets the input to the timings its receiver detects (the HDMI source's); throws ENOLINK and
    /// friends when there is no stable signal.
    func applyDetectedDVTimings() throws(SystemCallError) -> DVTimings {
        var t = CBroadcast_dv_timings()
        guard CBroadcast_v4l2_apply_detected_dv_timings(fd, &t) == 0 else {
            throw SystemCallError(errno: errno, what: "VIDIOC_QUERY_DV_TIMINGS/VIDIOC_S_DV_TIMINGS on \(path)")
        }
        return timings(t)
    }

    func currentDVTimings() -> DVTimings? {
        var t = CBroadcast_dv_timings()
        guard CBroadcast_v4l2_get_dv_timings(fd, &t) == 0 else { return nil }
        return timings(t)
    }

    /// Asks for V4L2_EVENT_SOURCE_CHANGE (resolution/timing changes) on `input`; false when unsupported.
    /// The event's id is the input's index: a subscription for input 0 hears nothing of an HDMI input 3.
    func subscribeSourceChange(input: Int) -> Bool {
        var sub = v4l2_event_subscription()
        sub.type = UInt32(V4L2_EVENT_SOURCE_CHANGE)
        sub.id = UInt32(input)
        return (try? ioctl(CBroadcast_VIDIOC_SUBSCRIBE_EVENT(), &sub, "VIDIOC_SUBSCRIBE_EVENT")) != nil
    }

    /// Takes every pending event; true if one was a source change.
    func takeEvents() -> Bool {
        var changed = false
        for _ in 0..<32 {
            var event = v4l2_event()
            guard (try? ioctl(CBroadcast_VIDIOC_DQEVENT(), &event, "VIDIOC_DQEVENT")) != nil else { break }
            if event.type == UInt32(V4L2_EVENT_SOURCE_CHANGE) { changed = true }
            if event.pending == 0 { break }
        }
        return changed
    }

    // MARK: Streaming

    func requestBuffers(_ count: Int) throws(SystemCallError) -> Int {
        var request = v4l2_requestbuffers()
        request.count = UInt32(count)
        request.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
        request.memory = V4L2_MEMORY_MMAP.rawValue
        try ioctl(CBroadcast_VIDIOC_REQBUFS(), &request, "requesting \(count) buffers (VIDIOC_REQBUFS)")
        return Int(request.count)
    }

    func queue(_ index: Int) throws(SystemCallError) {
        var buffer = v4l2_buffer()
        buffer.index = UInt32(index)
        buffer.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
        buffer.memory = V4L2_MEMORY_MMAP.rawValue
        try ioctl(CBroadcast_VIDIOC_QBUF(), &buffer, "VIDIOC_QBUF")
    }

    struct Dequeued {
        var index: Int
        var bytesUsed: Int
        var timestampNanoseconds: Int64
        var monotonicTimestamp: Bool
        var sequence: UInt32
        var error: Bool
    }

    /// The next filled buffer; nil when none is ready yet (EAGAIN).
    func dequeue() throws(SystemCallError) -> Dequeued? {
        var buffer = v4l2_buffer()
        buffer.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
        buffer.memory = V4L2_MEMORY_MMAP.rawValue
        do {
            try ioctl(CBroadcast_VIDIOC_DQBUF(), &buffer, "VIDIOC_DQBUF")
        } catch where error.errno == EAGAIN {
            return nil
        }
        return Dequeued(
            index: Int(buffer.index),
            bytesUsed: Int(buffer.bytesused),
            timestampNanoseconds: Int64(buffer.timestamp.tv_sec) * 1_000_000_000 + Int64(buffer.timestamp.tv_usec) * 1000,
            monotonicTimestamp: buffer.flags & UInt32(V4L2_BUF_FLAG_TIMESTAMP_MASK) == UInt32(V4L2_BUF_FLAG_TIMESTAMP_MONOTONIC),
            sequence: buffer.sequence,
            error: buffer.flags & UInt32(V4L2_BUF_FLAG_ERROR) != 0
        )
    }

    /// Maps buffer `index`: its address and length.
    func map(_ index: Int) throws(SystemCallError) -> (UnsafeMutableRawPointer, Int) {
        var buffer = v4l2_buffer()
        buffer.index = UInt32(index)
        buffer.type = V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue
        buffer.memory = V4L2_MEMORY_MMAP.rawValue
        try ioctl(CBroadcast_VIDIOC_QUERYBUF(), &buffer, "VIDIOC_QUERYBUF")
        let length = Int(buffer.length)
        guard let address = v4l2_mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, Int64(buffer.m.offset)),
            address != MAP_FAILED
        else { throw SystemCallError(errno: errno, what: "mapping buffer \(index) of \(path)") }
        return (address, length)
    }

    func streamOn() throws(SystemCallError) {
        var type = Int32(V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue)
        try ioctl(CBroadcast_VIDIOC_STREAMON(), &type, "VIDIOC_STREAMON")
    }

    func streamOff() {
        var type = Int32(V4L2_BUF_TYPE_VIDEO_CAPTURE.rawValue)
        _ = try? ioctl(CBroadcast_VIDIOC_STREAMOFF(), &type, "VIDIOC_STREAMOFF")
    }
}

/// The mmap'd buffers of one streaming setup. Unmapped when the last frame handed out is released
/// and the capture thread has let go, so the session never reads unmapped memory.
final class V4L2Mapping: @unchecked Sendable {
    let device: V4L2Device
    let buffers: [(address: UnsafeMutableRawPointer, length: Int)]

    init(device: V4L2Device, buffers: [(address: UnsafeMutableRawPointer, length: Int)]) {
        self.device = device
        self.buffers = buffers
    }

    private var unmapped = false

    /// Unmaps now, before the last reference goes (REQBUFS 0 answers EBUSY while a buffer is
    /// mapped). Only once every frame handed out was released; capture thread only.
    func unmap() {
        guard !unmapped else { return }
        unmapped = true
        for buffer in buffers { _ = v4l2_munmap(buffer.address, buffer.length) }
    }

    deinit { unmap() }
}

/// A C char array imported as a tuple, read as a NUL-terminated string.
func cString<T>(_ tuple: inout T) -> String {
    withUnsafeBytes(of: &tuple) { raw in
        let bytes = raw.prefix { $0 != 0 }
        return String(decoding: bytes, as: UTF8.self)
    }
}
