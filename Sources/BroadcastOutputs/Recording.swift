public import BroadcastKit
public import BroadcastMedia
public import Logging

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A local file the broadcast is recorded into; the container follows the file's extension.
///
/// Written so that a recording killed at any moment (SIGKILL, power loss) still plays up to the
/// last couple of seconds: every packet is flushed to the file as it is muxed, MP4/MOV are written
/// fragmented (a fragment per keyframe, so per keyframe interval), MKV in clusters of at most a
/// second. A clean `finish()` turns a fragmented MP4/MOV into a regular one with its index at the
/// front (faststart), remuxed to a temporary file in the same directory and renamed over the
/// original, so the file is complete under its name at every moment.
///
/// Not thread-safe: one thread (the session's, or later an output's own) calls it.
public final class Recording {
    public enum Container: String, Sendable, Hashable, CaseIterable {
        case mp4, mov, mkv, ts, flv

        /// libavformat's muxer name.
        public var formatName: String {
            switch self {
            case .mp4: "mp4"
            case .mov: "mov"
            case .mkv: "matroska"
            case .ts: "mpegts"
            case .flv: "flv"
            }
        }

        /// Written fragmented while recording and finalized by a remux on a clean stop.
        public var isFinalizedByRemux: Bool { self == .mp4 || self == .mov }

        /// The container's encoders must put codec headers out of band (AVFMT_GLOBALHEADER).
        public var needsGlobalHeader: Bool { Muxer.formatNeedsGlobalHeader(formatName: formatName) ?? false }

        /// Muxer options used while recording.
        var recordingOptions: [String: String] {
            var options = ["flush_packets": "1"]
            switch self {
            case .mp4, .mov: options["movflags"] = "frag_keyframe+empty_moov+default_base_moof"
            case .mkv: options["cluster_time_limit"] = "1000"
            case .ts, .flv: break
            }
            return options
        }
    }

    /// File extensions accepted, lowercase without the dot.
    public static let supportedExtensions: [String] = Container.allCases.map(\.rawValue)

    /// The container for `path`'s extension, or an `invalidArgument` error naming it and what is accepted.
    public static func container(for path: String) throws(BroadcastError) -> Container {
        let name = path.split(separator: "/", omittingEmptySubsequences: false).last.map(String.init) ?? path
        let ext = name.contains(".") ? String(name.split(separator: ".").last!).lowercased() : ""
        guard let container = Container(rawValue: ext) else {
            throw BroadcastError(
                .invalidArgument,
                "recording \(path): unsupported extension \(ext.isEmpty ? "(none)" : "." + ext); "
                    + "use one of \(supportedExtensions.map { "." + $0 }.joined(separator: ", "))"
            )
        }
        return container
    }

    /// Checks, before anything starts, that `path` can be recorded to: a supported extension, an
    /// existing writable directory, and not a directory itself. Creates nothing.
    public static func validate(path: String) throws(BroadcastError) {
        _ = try container(for: path)
        let directory = Self.directory(of: path)
        var info = stat()
        guard stat(directory, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw BroadcastError(.invalidArgument, "recording \(path): directory \(directory) does not exist")
        }
        guard access(directory, W_OK) == 0 else {
            throw BroadcastError(.invalidArgument, "recording \(path): directory \(directory) is not writable")
        }
        if stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR {
            throw BroadcastError(.invalidArgument, "recording \(path): is a directory")
        }
    }

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }

    public let path: String
    public let container: Container
    private let logger: Logger
    private var muxer: Muxer?
    private var finished = false

    /// Creates the file and writes the header. On failure nothing is left behind.
    public init(path: String, streams: [StreamDescription], logger: Logger) throws(BroadcastError) {
        try Self.validate(path: path)
        let container = try Self.container(for: path)
        self.path = path
        self.container = container
        self.logger = logger
        do {
            let muxer = try Muxer(url: path, formatName: container.formatName, logger: logger)
            for stream in streams { try muxer.addStream(stream) }
            try muxer.writeHeader(options: container.recordingOptions)
            self.muxer = muxer
        } catch {
            unlink(path)
            throw BroadcastError(.outputFailed, "recording \(path): \(error)")
        }
        logger.info("recording to \(path)", metadata: ["container": "\(container.formatName)"])
    }

    /// Bytes written to the file so far.
    public var bytesWritten: Int64 { muxer?.bytesWritten ?? finishedBytes }
    /// The finished file's size (after finalizing, which rewrites it).
    private var finishedBytes: Int64 = 0

    /// Writes `packet`, `shiftNanoseconds` earlier than its timestamps (see `Muxer.write`).
    public func write(_ packet: EncodedPacket, shiftNanoseconds: Int64 = 0) throws(BroadcastError) {
        guard let muxer else { throw BroadcastError(.outputFailed, "recording \(path): already finished") }
        do {
            try muxer.write(packet, shiftNanoseconds: shiftNanoseconds)
        } catch {
            throw BroadcastError(.outputFailed, "recording \(path): \(error)")
        }
    }

    /// Writes the trailer, and for MP4/MOV rewrites the file with its index at the front. If that
    /// rewrite fails, the fragmented file stays (it plays) and the error says so.
    public func finish() throws(BroadcastError) {
        guard !finished, let muxer else { return }
        finished = true
        self.muxer = nil
        do {
            try muxer.finish()
        } catch {
            throw BroadcastError(.outputFailed, "recording \(path): \(error)")
        }
        defer {
            var info = stat()
            if stat(path, &info) == 0 { finishedBytes = Int64(info.st_size) }
        }
        guard container.isFinalizedByRemux else { return }
        try Self.finalize(path: path, container: container, logger: logger)
    }

    /// Rewrites a fragmented MP4/MOV at `path` as a regular file with its index at the front,
    /// through a temporary file in the same directory renamed over the original. If that fails,
    /// the fragmented file stays (it plays) and the error says so. Also used to repair recordings
    /// a crash left fragmented.
    public static func finalize(path: String, container: Container, logger: Logger) throws(BroadcastError) {
        let name = path.split(separator: "/").last.map(String.init) ?? path
        let temporary = "\(Self.directory(of: path))/.\(name).finalizing.\(container.rawValue)"
        do {
            try Muxer.remux(
                from: path,
                to: temporary,
                formatName: container.formatName,
                options: ["movflags": "+faststart"],
                logger: logger
            )
        } catch {
            unlink(temporary)
            throw BroadcastError(
                .outputFailed,
                "recording \(path): could not finalize (the fragmented recording is kept and plays): \(error)"
            )
        }
        guard rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw BroadcastError(
                .outputFailed, "recording \(path): could not replace it with the finalized file: \(reason)")
        }
    }

    /// Closes the file without finalizing and deletes it (a broadcast that never really started).
    func discard() {
        finished = true
        try? muxer?.finish()
        muxer = nil
        unlink(path)
    }
}
