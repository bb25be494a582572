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

        /// Markers become chapters in it (MPEG-TS and FLV have none).
        public var holdsChapters: Bool { self == .mp4 || self == .mov || self == .mkv }

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

    /// Checks, before anything starts, that `path` can be recorded to (see `target(for:overwrite:)`).
    /// Creates nothing.
    public static func validate(path: String, overwrite: Bool = false) throws(BroadcastError) {
        _ = try target(for: path, overwrite: overwrite)
    }

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }

    static func name(of path: String) -> String {
        path.split(separator: "/", omittingEmptySubsequences: false).last.map(String.init) ?? path
    }

    /// The file `path` names, as the kernel would find it: the directory's real path (symbolic
    /// links resolved) plus the name, and when the name itself is a symbolic link, its target. Two
    /// outputs write the same file exactly when these are equal. nil when the directory does not exist.
    public static func resolvedPath(_ path: String) -> String? {
        guard let directory = realPath(Self.directory(of: path)) else { return nil }
        let joined = (directory == "/" ? "" : directory) + "/" + Self.name(of: path)
        var info = stat()
        if lstat(joined, &info) == 0, info.st_mode & S_IFMT == S_IFLNK { return realPath(joined) }
        return joined
    }

    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// Decides where a recording of `path` goes, before anything is created; refuses (an
    /// `invalidArgument` error, one line) what would destroy data or cannot work:
    ///
    /// - a missing file: created by this run (exclusively: if it appears meanwhile, the recording
    ///   fails rather than replace it), written in place, so a crash leaves it under its name;
    /// - an existing regular file: refused unless `overwrite`; then the recording goes to a new
    ///   file beside it (`NAME.partial.EXT`) renamed over it only once it is complete;
    /// - a symbolic link: followed to its target (which is what gets written or replaced, the
    ///   link stays); a link to nothing is refused;
    /// - a FIFO or a character device (`/dev/null`): written as a stream, never replaced or
    ///   deleted; MP4/MOV stay fragmented (they play as they are; finalizing needs a file it can
    ///   read back), MKV has no index at the end (it cannot seek back to write one);
    /// - a directory, a block device, a socket: refused.
    public static func target(for path: String, overwrite: Bool) throws(BroadcastError) -> RecordingTarget {
        let container = try container(for: path)
        let directory = Self.directory(of: path)
        var info = stat()
        guard stat(directory, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, let realDirectory = realPath(directory) else {
            throw BroadcastError(.invalidArgument, "recording \(path): directory \(directory) does not exist")
        }
        var resolved = (realDirectory == "/" ? "" : realDirectory) + "/" + name(of: path)
        if Self.name(of: path).isEmpty || lstat(resolved, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR {
            throw BroadcastError(.invalidArgument, "recording \(path): is a directory")
        }
        if lstat(resolved, &info) == 0, info.st_mode & S_IFMT == S_IFLNK {
            guard let target = realPath(resolved), stat(target, &info) == 0 else {
                throw BroadcastError(
                    .invalidArgument, "recording \(path): is a symbolic link to a file that does not exist; "
                        + "broadcast follows links but does not create their targets")
            }
            resolved = target
        }
        guard lstat(resolved, &info) == 0 else {
            guard errno == ENOENT else {
                throw BroadcastError(.invalidArgument, "recording \(path): \(String(cString: strerror(errno)))")
            }
            guard access(Self.directory(of: resolved), W_OK) == 0 else {
                throw BroadcastError(.invalidArgument, "recording \(path): directory \(directory) is not writable")
            }
            return RecordingTarget(path: resolved, kind: .newFile, container: container)
        }
        switch info.st_mode & S_IFMT {
        case S_IFREG:
            guard overwrite else {
                throw BroadcastError(
                    .invalidArgument,
                    "recording \(path): the file exists; broadcast replaces a file only when asked (--overwrite or -y)")
            }
            guard access(resolved, W_OK) == 0, access(Self.directory(of: resolved), W_OK) == 0 else {
                throw BroadcastError(
                    .invalidArgument,
                    "recording \(path): the file exists and is not writable (or its directory is not): not replaced")
            }
            return RecordingTarget(path: resolved, kind: .replace, container: container)
        case S_IFIFO, S_IFCHR:
            guard access(resolved, W_OK) == 0 else {
                throw BroadcastError(.invalidArgument, "recording \(path): not writable")
            }
            return RecordingTarget(path: resolved, kind: .stream, container: container)
        case S_IFDIR:
            throw BroadcastError(.invalidArgument, "recording \(path): is a directory")
        case S_IFBLK:
            throw BroadcastError(.invalidArgument, "recording \(path): is a block device; broadcast does not write to disks")
        default:
            throw BroadcastError(.invalidArgument, "recording \(path): is a socket or another special file, not something to record to")
        }
    }

    /// Creates `path` if it does not exist (O_EXCL: never one that does, never through a link)
    /// and returns a descriptor writing it; nil when it exists or cannot be created, errno telling why.
    static func createExclusively(_ path: String) -> Int32? {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
        return fd >= 0 ? fd : nil
    }

    /// A new, empty file in `destination`'s directory, created by this call: `NAME` with `tag`
    /// before the extension (`rec.partial.mp4`), or a dot file (`.rec.mp4.finalizing.mp4`) when
    /// `hidden`; a number is added while the name is taken.
    static func createTemporary(beside destination: String, tag: String, hidden: Bool) throws(BroadcastError) -> String {
        let (path, fd) = try openTemporary(beside: destination, tag: tag, hidden: hidden)
        close(fd)
        return path
    }

    /// `createTemporary`, with the descriptor that created the file, open for writing.
    static func openTemporary(beside destination: String, tag: String, hidden: Bool) throws(BroadcastError) -> (String, Int32) {
        let directory = Self.directory(of: destination)
        let name = Self.name(of: destination)
        let ext = name.lastIndex(of: ".").map { String(name[$0...]) } ?? ""
        for n in 1...1000 {
            let number = n == 1 ? "" : ".\(n)"
            let candidate = hidden
                ? "\(directory)/.\(name)\(number).\(tag)\(ext)"
                : "\(directory)/\(name.dropLast(ext.count))\(number).\(tag)\(ext)"
            if let fd = createExclusively(candidate) { return (candidate, fd) }
            guard errno == EEXIST else {
                throw BroadcastError(
                    .outputFailed, "recording \(destination): cannot create \(candidate): \(String(cString: strerror(errno)))")
            }
        }
        throw BroadcastError(.outputFailed, "recording \(destination): no free name for a temporary file")
    }

    /// The path as given.
    public let path: String
    /// Where it really goes and how (new file, replacement, stream).
    public let target: RecordingTarget
    /// The file being written: the target, or for a replacement the new file beside it.
    public let writingPath: String
    public let container: Container
    private let logger: Logger
    private var muxer: Muxer?
    private var finished = false
    /// Packets handed to the muxer: a recording that got none holds no media.
    public private(set) var packetsWritten = 0
    /// What the header took (the file's size before any media).
    private var headerBytes: Int64 = 0
    /// The markers taken in this file, in the order taken (chapters when it is finished).
    public private(set) var marks: [RecordingMark] = []
    /// End (ns, the file's time) of the latest packet written: the file's length so far.
    public private(set) var mediaEnd: Int64 = 0

    /// Creates the file and writes the header. On failure nothing is left behind, and nothing that
    /// was there before is touched. `overwrite`: an existing file may be replaced (at the end, when
    /// the new one is complete).
    public init(path: String, streams: [StreamDescription], overwrite: Bool = false, logger: Logger) throws(BroadcastError) {
        let target = try Self.target(for: path, overwrite: overwrite)
        self.path = path
        self.target = target
        self.container = target.container
        self.logger = logger
        // The file this run creates is written through the descriptor that created it, never
        // reopened by name (which could by then be a link, or another file).
        let descriptor: Int32?
        switch target.kind {
        case .newFile:
            guard let fd = Self.createExclusively(target.path) else {
                let reason = errno == EEXIST ? "the file appeared meanwhile; not replaced" : String(cString: strerror(errno))
                throw BroadcastError(.outputFailed, "recording \(path): \(reason)")
            }
            descriptor = fd
            writingPath = target.path
        case .replace:
            (writingPath, descriptor) = try Self.openTemporary(beside: target.path, tag: "partial", hidden: false)
        case .stream:
            descriptor = nil
            writingPath = target.path
        }
        do {
            let muxer =
                try descriptor.map { fd throws(FFmpegError) in
                    try Muxer(fileDescriptor: fd, formatName: container.formatName, displayName: path, logger: logger)
                } ?? Muxer(url: writingPath, formatName: container.formatName, displayName: path, logger: logger)
            for stream in streams { try muxer.addStream(stream) }
            var options = container.recordingOptions
            // FLV would try to seek back to its header to write the duration and size.
            if target.kind == .stream, container == .flv { options["flvflags"] = "no_duration_filesize" }
            try muxer.writeHeader(options: options, seekable: target.kind != .stream)
            headerBytes = muxer.bytesWritten
            self.muxer = muxer
        } catch {
            // Only what this run created goes: never the target of a stream, never a replaced file.
            if target.kind != .stream { unlink(writingPath) }
            throw BroadcastError(.outputFailed, "recording \(path): \(error)")
        }
        logger.info(
            "recording to \(path)",
            metadata: ["container": "\(container.formatName)", "written_as": "\(target.kind)"]
                .merging(writingPath == path ? [:] : ["file": "\(writingPath)"]) { $1 })
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
            packetsWritten += 1
            let end = packet.dtsNanoseconds + max(0, packet.durationNanoseconds) - shiftNanoseconds
            if end > mediaEnd { mediaEnd = end }
        } catch {
            throw BroadcastError(.outputFailed, "recording \(path): \(error)\(replacementNote)")
        }
    }

    /// Adds a marker at `nanoseconds` of the file's time: a chapter when the file is finished
    /// (MKV, MP4, MOV), noted at once beside the file (`RecordingMarksSidecar`) for a recovery
    /// after a crash. A stream target (FIFO, device) keeps no sidecar.
    public func addMark(_ mark: RecordingMark) {
        marks.append(mark)
        if target.kind != .stream, container.holdsChapters, !RecordingMarksSidecar.append(mark, to: writingPath) {
            logger.warning("recording \(path): could not note marker \"\(mark.title)\" beside the file (it is kept in memory until the file is finished)")
        }
    }

    /// For a replacement that fails: the old file stays, and where the new recording is.
    private var replacementNote: String {
        target.kind == .replace ? " (\(target.path) is unchanged; what was recorded is in \(writingPath))" : ""
    }

    /// Writes the trailer, and for MP4/MOV rewrites the file with its index at the front; a
    /// replacement is then renamed over the file it replaces. If the rewrite fails, the fragmented
    /// file stays (it plays) and the error says so; a file being replaced is then left as it was.
    ///
    /// A recording that got no packet (a source that failed to start, a stop before the first
    /// frame) holds no media: it is discarded instead, so a failed start leaves nothing behind and
    /// replaces nothing. Returns whether a file was finished (false: discarded).
    @discardableResult
    public func finish() throws(BroadcastError) -> Bool {
        guard !finished, muxer != nil else { return false }
        guard packetsWritten > 0 || target.kind == .stream else {
            discard()
            let unchanged = target.kind == .replace ? " and \(target.path) is unchanged" : ""
            logger.notice("recording \(path): nothing was recorded; the empty file was removed\(unchanged)")
            return false
        }
        guard let muxer else { return false }
        finished = true
        self.muxer = nil
        let kept = replacementNote
        // Matroska writes chapters with its trailer (when it can seek back: not to a stream).
        if container == .mkv, !marks.isEmpty, target.kind != .stream {
            do {
                try muxer.setChapters(RecordingMark.chapters(marks, duration: mediaEnd, leadingChapter: false))
            } catch {
                logger.error("recording \(path): \(error); the file is finished without chapters")
            }
        }
        defer { if target.kind != .stream, container.holdsChapters { RecordingMarksSidecar.remove(for: writingPath) } }
        do {
            try muxer.finish()
        } catch {
            throw BroadcastError(.outputFailed, "recording \(path): \(error)\(kept)")
        }
        defer {
            var info = stat()
            if stat(target.path, &info) == 0, info.st_mode & S_IFMT == S_IFREG { finishedBytes = Int64(info.st_size) }
        }
        switch target.kind {
        case .stream:
            return true
        case .newFile:
            if container.isFinalizedByRemux {
                try Self.finalize(source: writingPath, destination: target.path, container: container, marks: marks, logger: logger)
            }
        case .replace:
            if container.isFinalizedByRemux {
                do {
                    try Self.finalize(source: writingPath, destination: target.path, container: container, marks: marks, logger: logger)
                } catch {
                    throw BroadcastError(.outputFailed, "\(error.message)\(kept)")
                }
                unlink(writingPath)
            } else if rename(writingPath, target.path) != 0 {
                throw BroadcastError(
                    .outputFailed, "recording \(path): could not replace it: \(String(cString: strerror(errno)))\(kept)")
            }
            logger.notice("recording \(path): replaced the file that was there")
        }
        return true
    }

    /// Rewrites a fragmented MP4/MOV at `path` as a regular file with its index at the front,
    /// through a temporary file in the same directory renamed over the original. If that fails,
    /// the fragmented file stays (it plays) and the error says so. Also used to repair recordings
    /// a crash left fragmented.
    public static func finalize(path: String, container: Container, marks: [RecordingMark] = [], logger: Logger) throws(BroadcastError) {
        try finalize(source: path, destination: path, container: container, marks: marks, logger: logger)
    }

    /// Rewrites the fragmented MP4/MOV `source` as a regular file at `destination` (which may be
    /// the same path), through a temporary file beside `destination` created for it and renamed
    /// over `destination` only when complete. On failure only that temporary file is removed.
    static func finalize(
        source: String, destination: String, container: Container, marks: [RecordingMark] = [], logger: Logger
    ) throws(BroadcastError) {
        // Written through the descriptors of the file created for it, never reopened by name; a
        // second one for libavformat's remux should the streaming rewrite give up.
        let (temporary, fd) = try openTemporary(beside: destination, tag: "finalizing", hidden: true)
        let spare = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        if marks.isEmpty {
            do {
                // In memory that does not grow with the recording's length; libavformat's remux (about
                // 30 MB more per hour) only for what the streaming rewrite does not understand.
                try MP4Defragmenter.defragment(source: source, destination: temporary, descriptor: fd)
                if spare >= 0 { close(spare) }
                guard rename(temporary, destination) == 0 else {
                    let reason = String(cString: strerror(errno))
                    unlink(temporary)
                    throw BroadcastError(
                        .outputFailed, "recording \(destination): could not replace it with the finalized file: \(reason)")
                }
                return
            } catch let error as BroadcastError {
                throw error
            } catch {
                logger.notice("recording \(destination): finalizing with libavformat (\(error))")
            }
        } else {
            // Markers become chapters: libavformat's mov muxer writes them (a chapter track and
            // `chpl`), which the streaming rewrite does not.
            close(fd)
            logger.info("recording \(destination): finalizing with libavformat, with \(marks.count) marker(s) as chapters")
        }
        do {
            guard spare >= 0, ftruncate(spare, 0) == 0, lseek(spare, 0, SEEK_SET) == 0 else {
                let reason = String(cString: strerror(errno))
                if spare >= 0 { close(spare) }
                throw BroadcastError(.outputFailed, "starting \(temporary) again: \(reason)")
            }
            try Muxer.remux(
                from: source,
                to: temporary,
                descriptor: spare,
                formatName: container.formatName,
                options: ["movflags": "+faststart"],
                chapters: RecordingMark.chapters(marks, duration: .max, leadingChapter: true),
                stopAtDamage: !marks.isEmpty,
                logger: logger
            )
        } catch {
            unlink(temporary)
            throw BroadcastError(
                .outputFailed,
                "recording \(destination): could not finalize (the fragmented recording is kept and plays): \(error)"
            )
        }
        guard rename(temporary, destination) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw BroadcastError(
                .outputFailed, "recording \(destination): could not replace it with the finalized file: \(reason)")
        }
    }

    /// Rewrites the Matroska file at `path` (cut by a crash: no chapters, no index) with `marks`
    /// as chapters, through a temporary file beside it renamed over it when complete; on failure
    /// the file stays as it was.
    static func addChapters(toMatroska path: String, marks: [RecordingMark], logger: Logger) throws(BroadcastError) {
        let (temporary, fd) = try openTemporary(beside: path, tag: "finalizing", hidden: true)
        do {
            try Muxer.remux(
                from: path, to: temporary, descriptor: fd, formatName: Container.mkv.formatName,
                chapters: RecordingMark.chapters(marks, duration: .max, leadingChapter: false), stopAtDamage: true,
                logger: logger)
        } catch {
            unlink(temporary)
            throw BroadcastError(.outputFailed, "recording \(path): could not add its markers as chapters (the file is kept as it was): \(error)")
        }
        guard rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw BroadcastError(.outputFailed, "recording \(path): could not replace it with the file with chapters: \(reason)")
        }
    }

    /// Closes the file without finalizing after a write failed, keeping what was written: a
    /// fragmented MP4 plays as it is and the next start finalizes it (it is in the manifest); MKV,
    /// TS and FLV play as written. The file being replaced, if any, stays as it was.
    func abandon() {
        guard !finished else { return }
        // Nothing in it: nothing to keep (a failed start leaves nothing behind).
        guard packetsWritten > 0 else { return discard() }
        finished = true
        muxer = nil
        // What reached the disk may be no media at all (a fragmented MP4 whose first fragment did
        // not fit, or only the header): this run's own file then goes, as an empty one would.
        if target.kind != .stream, !holdsMedia() {
            unlink(writingPath)
            logger.notice("recording \(path): closed after a write error before any media reached the disk; the file was removed\(replacementNote)")
            return
        }
        logger.notice("recording \(path): closed unfinished after a write error; what was written is kept\(replacementNote)")
    }

    /// Whether the file as written holds media: for MP4/MOV a complete fragment, for the others
    /// more than the header.
    private func holdsMedia() -> Bool {
        if container.isFinalizedByRemux { return (MP4Defragmenter.completeFragments(in: writingPath) ?? 1) > 0 }
        var info = stat()
        return stat(writingPath, &info) != 0 || Int64(info.st_size) > headerBytes
    }

    /// Closes the file without finalizing and deletes it if this run created it (a broadcast that
    /// never really started): a stream's target (a FIFO, a device) is never deleted. Does nothing
    /// once `finish()` was called: what finishing left (a fragmented file whose finalize failed,
    /// which plays) is never deleted.
    func discard() {
        guard !finished else { return }
        finished = true
        try? muxer?.finish()
        muxer = nil
        if target.kind != .stream { unlink(writingPath) }
    }
}

/// Where a recording goes (see `Recording.target(for:overwrite:)`).
public struct RecordingTarget: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable, CustomStringConvertible {
        /// A file this run creates.
        case newFile = "new file"
        /// An existing file, replaced by a new one when the recording is complete.
        case replace = "replacement"
        /// A FIFO or character device, written as a stream.
        case stream = "stream"
        public var description: String { rawValue }
    }
    /// Absolute, links resolved.
    public var path: String
    public var kind: Kind
    public var container: Recording.Container
}
