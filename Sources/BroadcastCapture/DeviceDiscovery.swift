internal import CALSA

#if canImport(Glibc)
import Glibc
#endif

/// What capture devices this machine has: V4L2 video nodes and ALSA capture PCMs.
public enum DeviceDiscovery {
    public struct VideoDevice: Sendable {
        public var path: String
        /// Stable names udev made for the node (/dev/v4l/by-id/..., /dev/v4l/by-path/...).
        public var links: [String]
        public var card: String
        public var driver: String
        public var bus: String
        public var inputs: [VideoInput]
        /// Formats of the current input (empty unless details were asked for).
        public var formats: [VideoFormatInfo]
    }

    public struct VideoInput: Sendable {
        public var index: Int
        public var name: String
        public var type: String
        public var current: Bool
        /// An HDMI-style input whose size follows the signal (DV timings).
        public var dvTimings: Bool
        /// The set DV timings, e.g. "1280x720p60" (DV inputs that are current only).
        public var timings: String?
    }

    public struct VideoFormatInfo: Sendable {
        public var fourcc: String
        public var description: String
        public var compressed: Bool
        /// broadcast can capture it (see `V4L2PixelFormats`).
        public var usable: Bool
        public var sizes: [VideoSizeInfo]
    }

    public struct VideoSizeInfo: Sendable {
        /// "640x480", or a stepwise range.
        public var size: String
        /// Frame rates for a discrete size: "25", "12.5".
        public var frameRates: [String]
    }

    public struct AudioCaptureDevice: Sendable {
        public var card: Int
        public var cardID: String
        public var cardName: String
        public var device: Int
        public var name: String
        public var subdevices: Int
        /// The name to pass as --audio-mic/--audio-app: "hw:CARD=Loopback,DEV=1".
        public var pcm: String { "hw:CARD=\(cardID),DEV=\(device)" }
        /// The same by numbers: "hw:0,1".
        public var numericPCM: String { "hw:\(card),\(device)" }
    }

    /// /dev/video* nodes, in numeric order.
    static func videoNodes() -> [String] {
        guard let dir = opendir("/dev") else { return [] }
        defer { closedir(dir) }
        var numbers: [Int] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name.hasPrefix("video"), let n = Int(name.dropFirst(5)) { numbers.append(n) }
        }
        return numbers.sorted().map { "/dev/video\($0)" }
    }

    /// Symlinks in /dev/v4l/by-id and /dev/v4l/by-path that point at `path`.
    static func links(to path: String) -> [String] {
        guard let target = realPath(path) else { return [] }
        var result: [String] = []
        for folder in ["/dev/v4l/by-id", "/dev/v4l/by-path"] {
            guard let dir = opendir(folder) else { continue }
            defer { closedir(dir) }
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                if name == "." || name == ".." { continue }
                let link = "\(folder)/\(name)"
                if realPath(link) == target { result.append(link) }
            }
        }
        return result.sorted()
    }

    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// V4L2 nodes that capture video. With `details`, each with the formats, sizes and frame rates
    /// of its current input (this asks the driver a lot, so error messages go without).
    public static func videoCaptureDevices(details: Bool = false) -> [VideoDevice] {
        var result: [VideoDevice] = []
        for path in videoNodes() {
            guard let device = try? V4L2Device(path: path), let caps = try? device.capabilities(), caps.isVideoCapture else {
                continue
            }
            let current = device.currentInput()
            let inputs = device.inputs().map { input in
                VideoInput(
                    index: input.index,
                    name: input.name,
                    type: input.type,
                    current: input.index == current,
                    dvTimings: input.hasDVTimings,
                    timings: input.hasDVTimings && input.index == current ? device.currentDVTimings()?.description : nil
                )
            }
            var formats: [VideoFormatInfo] = []
            if details {
                for format in device.formats() {
                    var sizes: [VideoSizeInfo] = []
                    for size in device.frameSizes(format.fourcc) {
                        var rates: [String] = []
                        if case .discrete(let w, let h) = size {
                            rates = device.frameIntervals(format.fourcc, width: w, height: h).map(\.rateText)
                        }
                        sizes.append(VideoSizeInfo(size: size.description, frameRates: rates))
                    }
                    formats.append(
                        VideoFormatInfo(
                            fourcc: format.fourcc.description,
                            description: format.description,
                            compressed: format.compressed,
                            usable: V4L2PixelFormats.isUsable(format.fourcc),
                            sizes: sizes
                        )
                    )
                }
            }
            result.append(
                VideoDevice(
                    path: path,
                    links: links(to: path),
                    card: caps.card,
                    driver: caps.driver,
                    bus: caps.bus,
                    inputs: inputs,
                    formats: formats
                )
            )
        }
        return result
    }

    /// ALSA PCMs with a capture stream, card by card.
    public static func audioCaptureDevices() -> [AudioCaptureDevice] {
        var result: [AudioCaptureDevice] = []
        var card: Int32 = -1
        var cardInfo: OpaquePointer?
        var pcmInfo: OpaquePointer?
        guard snd_ctl_card_info_malloc(&cardInfo) == 0, snd_pcm_info_malloc(&pcmInfo) == 0 else { return [] }
        defer {
            snd_ctl_card_info_free(cardInfo)
            snd_pcm_info_free(pcmInfo)
        }
        while snd_card_next(&card) == 0 && card >= 0 {
            var ctl: OpaquePointer?
            guard snd_ctl_open(&ctl, "hw:\(card)", 0) == 0 else { continue }
            defer { snd_ctl_close(ctl) }
            guard snd_ctl_card_info(ctl, cardInfo) == 0 else { continue }
            let cardID = String(cString: snd_ctl_card_info_get_id(cardInfo))
            let cardName = String(cString: snd_ctl_card_info_get_name(cardInfo))
            var device: Int32 = -1
            while snd_ctl_pcm_next_device(ctl, &device) == 0 && device >= 0 {
                snd_pcm_info_set_device(pcmInfo, UInt32(device))
                snd_pcm_info_set_subdevice(pcmInfo, 0)
                snd_pcm_info_set_stream(pcmInfo, SND_PCM_STREAM_CAPTURE)
                guard snd_ctl_pcm_info(ctl, pcmInfo) == 0 else { continue }
                result.append(
                    AudioCaptureDevice(
                        card: Int(card),
                        cardID: cardID,
                        cardName: cardName,
                        device: Int(device),
                        name: String(cString: snd_pcm_info_get_name(pcmInfo)),
                        subdevices: Int(snd_pcm_info_get_subdevices_count(pcmInfo))
                    )
                )
            }
        }
        return result
    }
}
