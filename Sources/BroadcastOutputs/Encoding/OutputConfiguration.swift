public import BroadcastKit
public import BroadcastMedia

#if canImport(Glibc)
    import Glibc
#endif

/// Where one output of the encode goes.
public enum OutputDestination: Sendable, Hashable, CustomStringConvertible {
    /// A local recording; the container follows the extension.
    case file(String)
    /// A live stream.
    case live(StreamURL)

    /// A stream URL (anything with a scheme) or a file path. An unsupported scheme is an
    /// `invalidArgument` error, never taken for a file name.
    public static func parse(_ text: String) throws(BroadcastError) -> OutputDestination {
        if StreamURL.looksLikeURL(text) { return .live(try StreamURL(text)) }
        return .file(text)
    }

    /// Printable: a path, or the URL without its secrets.
    public var description: String {
        switch self {
        case .file(let path): path
        case .live(let url): url.redacted
        }
    }

    public var isLive: Bool {
        if case .live = self { return true }
        return false
    }

    /// A WHIP URL's bearer token set (nil: none); other destinations as they are.
    public func withWHIPToken(_ token: String?) -> OutputDestination {
        if case .live(let url) = self, url.scheme.isWHIP { return .live(url.withToken(token)) }
        return self
    }

    public var isWHIP: Bool {
        if case .live(let url) = self { return url.scheme.isWHIP }
        return false
    }
}

/// When and how often a live output reconnects: jittered exponential backoff.
public struct ReconnectPolicy: Sendable, Hashable {
    /// The first delay, before jitter; each attempt's delay is jittered to 0.5–1.5 times its value,
    /// so many publishers cut off together do not come back in lockstep.
    public var initialDelay: Double = 1
    public var multiplier: Double = 1.5
    /// The longest delay before jitter. Low on purpose: viewers are waiting, and an attempt costs
    /// one TCP connect.
    public var maxDelay: Double = 2.5
    /// Failed attempts in a row before the output gives up; nil: never.
    public var maxAttempts: Int?
    /// Times in a row the server refuses the publish (or drops it at once) before the output gives
    /// up: a wrong stream key does not fix itself.
    public var maxRefusals: Int = 3

    public init(initialDelay: Double = 1, multiplier: Double = 1.5, maxDelay: Double = 2.5, maxAttempts: Int? = nil) {
        self.initialDelay = initialDelay
        self.multiplier = multiplier
        self.maxDelay = maxDelay
        self.maxAttempts = maxAttempts
    }

    /// Seconds to wait after `failures` failed attempts in a row (0: the connection just broke);
    /// `unit` is a random number in 0..<1.
    public func delay(afterFailures failures: Int, unit: Double) -> Double {
        var base = initialDelay
        for _ in 0..<min(failures, 64) {
            base *= multiplier
            if base >= maxDelay { break }
        }
        base = min(base, maxDelay)
        return base * (0.5 + unit)
    }
}

/// How a live output behaves on a bad network.
public struct LiveStreamSettings: Sendable, Hashable {
    public var reconnect = ReconnectPolicy()
    /// Seconds a connect or a single write may block before the connection counts as dead.
    public var timeout: Double = 10
    /// Backlog (seconds of media waiting to be sent) past which disposable (non-reference) video
    /// frames are dropped. OBS's default.
    public var dropThreshold: Double = 0.7
    /// Backlog past which every video frame but keyframes is dropped. OBS's default.
    public var referenceDropThreshold: Double = 0.9
    /// Packets the queue between the encoder and the output holds; when full, packets are
    /// dropped (counted as queue-full). About a minute of media at 30 fps.
    public var queueCapacity = 4096
    /// The socket's send buffer; nil: about half a second of the stream's bitrate (as the kernel counts), so the backlog
    /// waits in our queue, where the drop policy sees it, rather than in the kernel.
    public var sendBufferBytes: Int?
    /// Seconds spent sending what is queued when the broadcast finishes.
    public var finishTimeout: Double = 5
    /// How an rtmps:// output checks the server's certificate.
    public var tls = TLSVerification()
    /// whip+http:// to a host other than this machine: the token and the session's keys (the
    /// SDP's DTLS fingerprints) cross the network in clear. Refused unless the user said so
    /// (`--whip-allow-http`, `allow_http = true`).
    public var allowPlainHTTP = false

    public init() {}
}

/// How an rtmps:// output checks whom it talks to: by default the server's certificate must chain
/// to a trusted authority (the system's store, or `authorityFile`) and name the URL's host, so a
/// man in the middle gets neither the stream nor its key. FFmpeg's own default is not to check.
public struct TLSVerification: Sendable, Hashable {
    /// Check the certificate (FFmpeg's `tls_verify`). Off (`--tls-insecure`, `tls_verify = false`):
    /// whoever answers at the address receives the stream and its key.
    public var verify = true
    /// A PEM file of the authorities to trust instead of the system's store (FFmpeg's `ca_file`):
    /// a private CA.
    public var authorityFile: String?

    public init(verify: Bool = true, authorityFile: String? = nil) {
        self.verify = verify
        self.authorityFile = authorityFile
    }

    /// Why `path` cannot serve as an authority file (unreadable, not PEM certificates), or nil.
    /// FFmpeg only logs a file it cannot load and then trusts nothing: checked before the start.
    public static func problem(withAuthorityFile path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "cannot read \(path): \(String(cString: strerror(errno)))" }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { return "\(path) is not a regular file" }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var count = 0
        while count < buffer.count {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + count, $0.count - count) }
            if n < 0, errno == EINTR { continue }
            guard n >= 0 else { return "cannot read \(path): \(String(cString: strerror(errno)))" }
            if n == 0 { break }
            count += n
        }
        let text = String(decoding: buffer[..<count], as: UTF8.self)
        guard text.contains("-----BEGIN CERTIFICATE-----") else {
            return "\(path) holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)"
        }
        return nil
    }
}

/// A recording cut into files of a set length, each named by a strftime(3) template, with old
/// files deleted by age and by total size.
public struct RecordingSegments: Sendable, Hashable {
    /// "/var/lib/broadcast/rec-%Y%m%d-%H%M%S.mp4": expanded in local time when each file starts.
    public var pathTemplate: String
    /// A new file starts at the first keyframe this long after the current one started (nil: one
    /// file, however long).
    public var length: Duration?
    /// Finished files older than this are deleted (nil: kept).
    public var retainSeconds: Int64?
    /// The oldest finished files are deleted while all together exceed this (nil: no limit).
    public var retainBytes: Int64?

    public init(pathTemplate: String, length: Duration?, retainSeconds: Int64? = nil, retainBytes: Int64? = nil) {
        self.pathTemplate = pathTemplate
        self.length = length
        self.retainSeconds = retainSeconds
        self.retainBytes = retainBytes
    }
}

/// One output of the encode, named for the daemon's API.
public struct OutputConfiguration: Sendable, Hashable {
    public var name: String
    public var destination: OutputDestination
    /// Used when `destination` is live.
    public var live: LiveStreamSettings
    /// For a file destination: packets its queue holds (when full, the encoder waits: a recording
    /// never drops). About a minute of media at 60 fps unless the memory budget says less.
    public var fileQueueCapacity = 8192
    /// For a file destination: cut into segments (the destination is the first segment's path).
    public var segments: RecordingSegments?
    /// For a file destination: an existing file may be replaced (when the new recording is
    /// complete). Without it an existing file is refused before anything starts.
    public var overwrite: Bool
    /// A replay buffer instead of a recording: the file destination is the strftime(3) template
    /// each save is named by.
    public var replay: ReplaySettings?
    /// Run for every file the output finishes (see `FileFinishedHook`); nil: nothing.
    public var onFileFinished: [String]?
    /// How long one `onFileFinished` command may run before it is stopped.
    public var hookTimeout: Duration = FileFinishedHook.defaultTimeout
    /// For a file destination: where the files it creates are noted (the daemon's record of what
    /// it may delete or repair later). nil: nothing is noted, and retention deletes nothing.
    public var manifest: RecordingManifest?
    /// The video encode this output takes: nil (or the broadcast's own settings) for the
    /// broadcast's encode; other settings for an encode of its own, shared with every output that
    /// asks the same (its size at most the picture's: each encode scales the captured picture once).
    public var video: VideoEncoderSettings?
    /// A live output whose bitrate follows its network (`adaptive`): between this minimum and its
    /// encode's bitrate (`video`, which is then its own: `adaptiveFor` names this output). nil: fixed.
    public var adaptiveMinimum: Int?
    /// The audio bitrate this output's tracks are encoded at: nil (or the broadcast's) for the
    /// broadcast's audio encodes; another for encodes of its own of the tracks it carries, shared
    /// with every output that asks the same.
    public var audioBitrate: Int?

    public init(
        name: String? = nil,
        destination: OutputDestination,
        live: LiveStreamSettings = LiveStreamSettings(),
        segments: RecordingSegments? = nil,
        overwrite: Bool = false,
        replay: ReplaySettings? = nil,
        onFileFinished: [String]? = nil,
        manifest: RecordingManifest? = nil
    ) {
        self.manifest = manifest
        self.name = name ?? destination.description
        self.destination = destination
        self.live = live
        self.segments = segments
        self.overwrite = overwrite
        self.replay = replay
        self.onFileFinished = onFileFinished
    }

    /// The file this output writes, links resolved (see `Recording.resolvedPath`); nil for a live
    /// output or a directory that does not exist.
    public var resolvedFile: String? {
        guard case .file(let path) = destination else { return nil }
        return Recording.resolvedPath(path)
    }

    /// Refuses two outputs that write one file (`rec.mp4` and `./rec.mp4`, or a link to it): they
    /// would make one corrupt file. Compares resolved paths.
    public static func checkDistinctFiles(_ outputs: [OutputConfiguration]) throws(BroadcastError) {
        var seen: [String: OutputConfiguration] = [:]
        for output in outputs {
            // A replay output's path is a template for its saves, each a new file.
            guard case .file(let path) = output.destination, output.replay == nil, let file = output.resolvedFile else { continue }
            if let first = seen[file] {
                let names = first.name == first.destination.description && output.name == path
                    ? "\(first.destination) and \(path)" : "outputs \(first.name) and \(output.name)"
                throw BroadcastError(.invalidArgument, "\(names) are the same file (\(file)): one file cannot take two recordings")
            }
            seen[file] = output
        }
    }
}
