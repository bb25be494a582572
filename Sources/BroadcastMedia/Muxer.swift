internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CFFmpegShim
internal import CSwResample
internal import CSwScale
public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Writes encoded streams into a container (libavformat), following avformat.h's contract:
/// add streams → `writeHeader` → `write` packets (interleaved) → `finish` (trailer).
///
/// Not thread-safe: one thread (an output's) calls it. Packets may come from encoders on another
/// thread: each `write` takes its own reference to the shared payload.
public final class Muxer {
    /// Where the output goes, as given (a path or a URL); opened, never printed.
    public let url: String
    /// How messages name the output: `url`, or a redacted form of it (a stream URL without its key).
    public let displayName: String
    /// The container format in use ("mp4", "matroska", "mpegts", "flv").
    public let formatName: String
    private let logger: Logger
    private let context: UnsafeMutablePointer<AVFormatContext>
    private var sourceTimeBases: [Rational] = []
    /// Per packet stream index (`EncodedPacket.streamIndex`): the container's stream, or -1 for a
    /// stream this output does not carry.
    private var containerIndex: [Int] = []
    private var headerWritten = false
    private var finished = false
    private var ioOpen = false
    /// Keeps the interrupt check alive while FFmpeg may call it (until the context is freed).
    private let interrupt: InterruptCheck?
    /// The descriptor written through instead of opening `url` (see `init(fileDescriptor:...)`);
    /// owned: closed with the output.
    private var descriptor: Descriptor?

    /// The file behind a custom AVIOContext: FFmpeg's write and seek callbacks get it as their opaque.
    private final class Descriptor {
        let fd: Int32
        init(_ fd: Int32) { self.fd = fd }
    }

    /// The closure behind AVIOInterruptCB: FFmpeg polls it inside blocking I/O (connect, write).
    private final class InterruptCheck {
        let shouldInterrupt: @Sendable () -> Bool
        init(_ shouldInterrupt: @escaping @Sendable () -> Bool) { self.shouldInterrupt = shouldInterrupt }
    }

    /// Prepares an output. `formatName` nil: guessed from the extension of `url`. `displayName`
    /// names the output in messages (default: `url`). `shouldInterrupt`, when given, is polled by
    /// FFmpeg during blocking I/O (about every 100 ms): returning true makes the call fail at once
    /// (AVERROR_EXIT), so a dead connection never blocks the caller for ever.
    public init(
        url: String,
        formatName: String? = nil,
        displayName: String? = nil,
        logger: Logger,
        shouldInterrupt: (@Sendable () -> Bool)? = nil
    ) throws(FFmpegError) {
        let name = displayName ?? url
        var context: UnsafeMutablePointer<AVFormatContext>? = nil
        try check(
            avformat_alloc_output_context2(&context, nil, formatName, url),
            "choosing a container for \(name)\(formatName.map { " (format \($0))" } ?? "")"
        )
        guard let context else { throw FFmpegError.outOfMemory("allocating an output for \(name)") }
        self.context = context
        self.url = url
        self.displayName = name
        self.formatName = String(cString: context.pointee.oformat.pointee.name)
        self.logger = logger
        if let shouldInterrupt {
            let check = InterruptCheck(shouldInterrupt)
            interrupt = check
            context.pointee.interrupt_callback = AVIOInterruptCB(
                callback: { opaque in
                    guard let opaque else { return 0 }
                    return Unmanaged<InterruptCheck>.fromOpaque(opaque).takeUnretainedValue().shouldInterrupt() ? 1 : 0
                },
                opaque: Unmanaged.passUnretained(check).toOpaque()
            )
        } else {
            interrupt = nil
        }
    }

    /// Prepares an output written through `fileDescriptor` (a file this process created and
    /// opened for writing), never reopened by name: no `O_TRUNC` of whatever the name points to by
    /// then, no link followed. The muxer takes the descriptor: it is closed when the output is
    /// finished or freed, or when this throws. `displayName` is the file's name, for messages.
    public convenience init(
        fileDescriptor: Int32, formatName: String?, displayName: String, logger: Logger
    ) throws(FFmpegError) {
        do {
            try self.init(url: displayName, formatName: formatName, displayName: displayName, logger: logger)
        } catch {
            close(fileDescriptor)
            throw error
        }
        descriptor = Descriptor(fileDescriptor)
    }

    deinit {
        closeOutput()
        avformat_free_context(context)
    }

    /// Closes what `writeHeader` opened (and the descriptor this muxer owns); 0, or for a
    /// descriptor the error its output had (a write that failed, a close that did).
    @discardableResult
    private func closeOutput() -> Int32 {
        var result: Int32 = 0
        if ioOpen {
            if descriptor != nil, let pb = context.pointee.pb {
                avio_flush(pb)
                if pb.pointee.error < 0 { result = pb.pointee.error }
                av_freep(&pb.pointee.buffer)
                avio_context_free(&context.pointee.pb)
            } else {
                // As before descriptors: a URL's close (a network stream's) is not the caller's failure.
                avio_closep(&context.pointee.pb)
            }
            ioOpen = false
        }
        if let descriptor {
            if close(descriptor.fd) != 0 && result == 0 { result = -errno }
            self.descriptor = nil
        }
        return result
    }

    /// A custom AVIOContext on `descriptor`: FFmpeg's writes become write(2) on it (EINTR
    /// retried), its seeks lseek(2) (none when not `seekable`).
    private func openDescriptor(_ descriptor: Descriptor, seekable: Bool, _ what: String) throws(FFmpegError) {
        let size: Int32 = 65536
        guard let buffer = av_malloc(Int(size)) else { throw FFmpegError.outOfMemory(what) }
        let opaque = Unmanaged.passUnretained(descriptor).toOpaque()
        let pb = avio_alloc_context(
            buffer.assumingMemoryBound(to: UInt8.self), size, 1, opaque, nil,
            { opaque, bytes, count in
                guard let opaque, let bytes else { return -EINVAL }
                let fd = Unmanaged<Descriptor>.fromOpaque(opaque).takeUnretainedValue().fd
                var done = 0
                while done < Int(count) {
                    let n = Glibc.write(fd, bytes + done, Int(count) - done)
                    if n < 0 {
                        if errno == EINTR { continue }
                        return -errno
                    }
                    done += n
                }
                return count
            },
            seekable
                ? { opaque, offset, whence in
                    guard let opaque else { return Int64(-EINVAL) }
                    let fd = Unmanaged<Descriptor>.fromOpaque(opaque).takeUnretainedValue().fd
                    if whence & AVSEEK_SIZE != 0 {
                        var info = stat()
                        return fstat(fd, &info) == 0 ? Int64(info.st_size) : Int64(-errno)
                    }
                    let position = lseek(fd, off_t(offset), whence & ~AVSEEK_FORCE)
                    return position < 0 ? Int64(-errno) : Int64(position)
                } : nil
        )
        guard let pb else {
            av_free(buffer)
            throw FFmpegError.outOfMemory(what)
        }
        context.pointee.pb = pb
        context.pointee.flags |= AVFMT_FLAG_CUSTOM_IO
        ioOpen = true
    }

    /// Whether a container wants codec headers out of band (AVFMT_GLOBALHEADER): encoders feeding
    /// it must be opened with a global header. nil when there is no such muxer.
    public static func formatNeedsGlobalHeader(formatName: String? = nil, url: String? = nil) -> Bool? {
        guard let format = av_guess_format(formatName, url, nil) else { return nil }
        return format.pointee.flags & AVFMT_GLOBALHEADER != 0
    }

    /// The muxer FFmpeg would pick for `formatName` or the extension of `url`, or nil.
    public static func resolveFormatName(formatName: String? = nil, url: String? = nil) -> String? {
        av_guess_format(formatName, url, nil).map { String(cString: $0.pointee.name) }
    }

    public var needsGlobalHeader: Bool { context.pointee.oformat.pointee.flags & AVFMT_GLOBALHEADER != 0 }

    /// Adds a stream; returns its index. Packets name their stream by this index, so add the
    /// streams in the order the encoders were given their `streamIndex`.
    @discardableResult
    public func addStream(_ description: StreamDescription) throws(FFmpegError) -> Int {
        let what = "adding a \(description.parameters.codecName) stream to \(url)"
        guard !headerWritten else { throw FFmpegError.invalidArgument("the header is already written", what) }
        guard let stream = avformat_new_stream(context, nil) else { throw FFmpegError.outOfMemory(what) }
        try check(avcodec_parameters_copy(stream.pointee.codecpar, description.parameters.pointer), what)
        stream.pointee.codecpar.pointee.codec_tag = 0
        stream.pointee.time_base = description.timeBase.av
        if let rate = description.frameRate {
            stream.pointee.avg_frame_rate = rate.av
            stream.pointee.r_frame_rate = rate.av
        }
        if let title = description.title {
            // MP4/MOV name a track in its handler reference (`hdlr`), Matroska in TrackName (`title`).
            let key = formatName == "mp4" || formatName == "mov" ? "handler_name" : "title"
            av_dict_set(&stream.pointee.metadata, key, title, 0)
        }
        let source = description.streamIndex ?? sourceTimeBases.count
        sourceTimeBases.append(description.timeBase)
        if containerIndex.count <= source { containerIndex += Array(repeating: -1, count: source + 1 - containerIndex.count) }
        containerIndex[source] = Int(stream.pointee.index)
        return Int(stream.pointee.index)
    }

    /// Opens the file or connection and writes the header. `options` go to the muxer and the
    /// format context (e.g. movflags, flush_packets); any not recognised are logged. `ioOptions` go
    /// to the protocol (rw_timeout, send_buffer_size, tls_verify); the protocol ignores those it
    /// does not know, silently, since which ones apply depends on the URL's scheme. `seekable`
    /// false: the muxer is told it cannot seek back (a FIFO, a character device), so it writes
    /// nothing that needs it (Matroska's index at the end); libavformat finds that out by itself
    /// only for FIFOs.
    public func writeHeader(
        options: [String: String] = [:], ioOptions: [String: String] = [:], seekable: Bool = true
    ) throws(FFmpegError) {
        let what = "opening output \(displayName)"
        if context.pointee.oformat.pointee.flags & AVFMT_NOFILE == 0, let descriptor {
            try openDescriptor(descriptor, seekable: seekable, what)
        } else if context.pointee.oformat.pointee.flags & AVFMT_NOFILE == 0 {
            var io = OptionDictionary(ioOptions)
            try check(
                avio_open2(&context.pointee.pb, url, AVIO_FLAG_WRITE, &context.pointee.interrupt_callback, &io.pointer),
                what
            )
            ioOpen = true
            if !seekable { context.pointee.pb.pointee.seekable = 0 }
        }
        var dictionary = OptionDictionary(options)
        try check(
            avformat_write_header(context, &dictionary.pointer), "writing the \(formatName) header of \(displayName)")
        headerWritten = true
        let unused = dictionary.keys
        if !unused.isEmpty {
            logger.warning("\(formatName) muxer for \(displayName) ignored options: \(unused.joined(separator: ", "))")
        }
    }

    /// Writes one packet, interleaved with the other streams by dts (av_interleaved_write_frame),
    /// `shiftNanoseconds` earlier than its own timestamps (a recording that skips a pause, a segment
    /// that starts at zero).
    public func write(_ packet: EncodedPacket, shiftNanoseconds: Int64 = 0) throws(FFmpegError) {
        let what = "writing a packet to \(displayName)"
        guard headerWritten, !finished else { throw FFmpegError.invalidArgument("the output is not open", what) }
        let index = packet.streamIndex < containerIndex.count ? containerIndex[packet.streamIndex] : -1
        guard index >= 0 else {
            throw FFmpegError.invalidArgument("no stream \(packet.streamIndex)", what)
        }
        let reference = try packet.reference()
        let stream = context.pointee.streams[index]!
        reference.pointer.pointee.stream_index = Int32(index)
        if shiftNanoseconds != 0 {
            let ticks = av_rescale_q(shiftNanoseconds, AVRational(num: 1, den: 1_000_000_000), packet.timeBase.av)
            let none = CBroadcastShimBridge.noTimestamp
            if reference.pointer.pointee.pts != none { reference.pointer.pointee.pts -= ticks }
            if reference.pointer.pointee.dts != none { reference.pointer.pointee.dts -= ticks }
        }
        av_packet_rescale_ts(reference.pointer, packet.timeBase.av, stream.pointee.time_base)
        try check(av_interleaved_write_frame(context, reference.pointer), what)
    }

    /// A chapter: a stretch of the file from `start` to `end` (ns, the file's own time) with a title.
    public struct Chapter: Sendable, Hashable {
        public var start: Int64
        public var end: Int64
        public var title: String
        public init(start: Int64, end: Int64, title: String) {
            self.start = start
            self.end = end
            self.title = title
        }
    }

    /// Gives the output `chapters` (replacing any it had). Before `writeHeader` they go into the
    /// header; after it, before `finish`, the muxers that write chapters at the end take them:
    /// Matroska writes them with its trailer when the output is seekable, MP4/MOV (not fragmented)
    /// as a chapter track and `chpl` in the index it writes at the end. Fragmented MP4 and
    /// MPEG-TS/FLV write none.
    public func setChapters(_ chapters: [Chapter]) throws(FFmpegError) {
        try Self.setChapters(chapters, on: context, what: "adding chapters to \(displayName)")
    }

    /// The chapters of the media file at `path` as libavformat reads them (ns); nil when it cannot be opened.
    public static func chapters(in path: String) -> [Chapter]? {
        var opened: UnsafeMutablePointer<AVFormatContext>? = nil
        guard avformat_open_input(&opened, path, nil, nil) >= 0, let input = opened else { return nil }
        defer { avformat_close_input(&opened) }
        var chapters: [Chapter] = []
        let ns = AVRational(num: 1, den: 1_000_000_000)
        for i in 0..<Int(input.pointee.nb_chapters) {
            guard let c = input.pointee.chapters[i] else { continue }
            let title = av_dict_get(c.pointee.metadata, "title", nil, 0).map { String(cString: $0.pointee.value) } ?? ""
            chapters.append(
                Chapter(start: av_rescale_q(c.pointee.start, c.pointee.time_base, ns), end: av_rescale_q(c.pointee.end, c.pointee.time_base, ns), title: title))
        }
        return chapters
    }

    private static func setChapters(
        _ chapters: [Chapter], on context: UnsafeMutablePointer<AVFormatContext>, what: String
    ) throws(FFmpegError) {
        // What was there goes first (freed as avformat_free_context frees them).
        for i in 0..<Int(context.pointee.nb_chapters) {
            if let chapter = context.pointee.chapters[i] {
                av_dict_free(&chapter.pointee.metadata)
                av_free(chapter)
            }
        }
        av_freep(&context.pointee.chapters)
        context.pointee.nb_chapters = 0
        for (i, item) in chapters.enumerated() {
            guard let raw = av_mallocz(MemoryLayout<AVChapter>.size) else { throw FFmpegError.outOfMemory(what) }
            let chapter = raw.assumingMemoryBound(to: AVChapter.self)
            chapter.pointee.id = Int64(i + 1)
            chapter.pointee.time_base = AVRational(num: 1, den: 1_000_000_000)
            chapter.pointee.start = max(0, item.start)
            chapter.pointee.end = max(chapter.pointee.start, item.end)
            if av_dict_set(&chapter.pointee.metadata, "title", item.title, 0) < 0 {
                av_free(raw)
                throw FFmpegError.outOfMemory(what)
            }
            var count = Int32(context.pointee.nb_chapters)
            let added = withUnsafeMutablePointer(to: &context.pointee.chapters) { av_dynarray_add_nofree(UnsafeMutableRawPointer($0), &count, raw) }
            guard added >= 0 else {
                av_dict_free(&chapter.pointee.metadata)
                av_free(raw)
                throw FFmpegError.outOfMemory(what)
            }
            context.pointee.nb_chapters = UInt32(count)
        }
    }

    /// Bytes written so far (the position in the output).
    public var bytesWritten: Int64 {
        guard let pb = context.pointee.pb else { return 0 }
        return max(0, avio_tell(pb))
    }

    /// Bytes handed to the protocol so far: `bytesWritten` less what the I/O context still holds
    /// in its buffer (a write context's `pos` moves at each flush).
    public var bytesFlushed: Int64 {
        guard let pb = context.pointee.pb else { return 0 }
        return max(0, pb.pointee.pos)
    }

    /// What the transport knows of its path, where it tells: an srt:// output's sender figures
    /// (libsrt), an rtmp:// output's bytes its TCP socket still holds (the kernel); nil for any
    /// other output (rtmps: TLS between the two), or before the connection is open.
    public func transportFigures() -> TransportFigures? {
        guard let pb = context.pointee.pb else { return nil }
        if formatName == "flv", url.hasPrefix("rtmp://") {
            if tcpSocket == nil { tcpSocket = CBroadcast_avio_tcp_socket(pb) }
            guard let socket = tcpSocket, socket >= 0 else { return nil }
            let queued = CBroadcast_socket_queued_bytes(socket)
            guard queued >= 0 else { return nil }
            return TransportFigures(
                unacknowledgedNanoseconds: 0, roundTripMilliseconds: 0, packetsSent: 0, packetsLost: 0, packetsDropped: 0, queuedBytes: queued)
        }
        guard formatName == "mpegts", url.hasPrefix("srt://") else { return nil }
        if srtSocket == nil { srtSocket = CBroadcast_avio_srt_socket(pb) }
        guard let socket = srtSocket, socket >= 0 else { return nil }
        var figures = CBroadcast_SRTFigures()
        guard CBroadcast_srt_figures(socket, &figures) == 0 else { return nil }
        return TransportFigures(
            unacknowledgedNanoseconds: Int64(max(0, figures.unacknowledged_ms)) * 1_000_000, roundTripMilliseconds: figures.rtt_ms,
            packetsSent: figures.packets_sent, packetsLost: figures.packets_lost, packetsDropped: figures.packets_dropped)
    }

    /// The TCP socket behind an rtmp:// output, once looked up (-1: none).
    private var tcpSocket: Int32?
    /// The SRT socket behind the output, once looked up (-1: none).
    private var srtSocket: Int32?

    /// Writes the trailer and closes the output. Call once; without it the output is closed unfinished.
    /// `settle`: seconds to wait between the trailer's last byte handed to the protocol and the
    /// close, for a protocol that sends on its own threads and drops what is still in flight when
    /// closed (SRT in live mode).
    public func finish(settle: Double = 0) throws(FFmpegError) {
        guard !finished else { return }
        finished = true
        if headerWritten {
            let trailer = av_write_trailer(context)
            if settle > 0, ioOpen, let pb = context.pointee.pb {
                avio_flush(pb)
                usleep(useconds_t(settle * 1_000_000))
            }
            let closed = closeOutput()
            try check(trailer, "writing the \(formatName) trailer of \(displayName)")
            try check(closed, "closing \(displayName)")
        } else {
            closeOutput()
        }
    }

    /// Copies every stream of `input` into `output` without re-encoding (what `ffmpeg -c copy` does),
    /// e.g. to rewrite a fragmented MP4 as a regular one with `movflags=+faststart`.
    /// `descriptor`: the file `output` names, created and opened by the caller, written through
    /// (never reopened by name) and taken: closed however this ends. `chapters`: what the output
    /// gets (the input's are not copied). `stopAtDamage`: a read error ends the copy as the end
    /// of the file would (a file cut by a crash), instead of failing it.
    public static func remux(
        from input: String,
        to output: String,
        descriptor: Int32? = nil,
        formatName: String? = nil,
        options: [String: String] = [:],
        chapters: [Chapter] = [],
        stopAtDamage: Bool = false,
        logger: Logger
    ) throws(FFmpegError) {
        var owned = descriptor
        defer { if let owned { close(owned) } }
        var source: UnsafeMutablePointer<AVFormatContext>? = nil
        try check(avformat_open_input(&source, input, nil, nil), "opening \(input) to remux it")
        defer { avformat_close_input(&source) }
        guard let source else { throw FFmpegError.outOfMemory("opening \(input)") }
        try check(avformat_find_stream_info(source, nil), "reading the streams of \(input)")

        let muxer: Muxer
        if let fd = owned {
            owned = nil
            muxer = try Muxer(fileDescriptor: fd, formatName: formatName, displayName: output, logger: logger)
        } else {
            muxer = try Muxer(url: output, formatName: formatName, logger: logger)
        }
        for index in 0..<Int(source.pointee.nb_streams) {
            let stream = source.pointee.streams[index]!
            let what = "copying stream \(index) of \(input)"
            guard let target = avformat_new_stream(muxer.context, nil) else { throw FFmpegError.outOfMemory(what) }
            try check(avcodec_parameters_copy(target.pointee.codecpar, stream.pointee.codecpar), what)
            target.pointee.codecpar.pointee.codec_tag = 0
            // The track's title (`hdlr` name) and language go with it.
            av_dict_copy(&target.pointee.metadata, stream.pointee.metadata, 0)
            target.pointee.time_base = stream.pointee.time_base
            target.pointee.avg_frame_rate = stream.pointee.avg_frame_rate
            target.pointee.r_frame_rate = stream.pointee.r_frame_rate
            muxer.sourceTimeBases.append(Rational(stream.pointee.time_base))
            muxer.containerIndex.append(index)
        }
        try muxer.writeHeader(options: options)
        // End (ns) of the latest packet copied: where a chapter "to the end" ends.
        var length: Int64 = 0
        let packet = try Packet()
        while true {
            let result = av_read_frame(source, packet.pointer)
            if result == FFmpegError.endOfFile { break }
            // A file cut by a crash ends in a partial block or fragment: what came before is kept.
            if stopAtDamage && result < 0 { break }
            try check(result, "reading \(input)")
            let index = Int(packet.pointer.pointee.stream_index)
            let from = source.pointee.streams[index]!.pointee.time_base
            let pts = packet.pointer.pointee.pts
            if pts != CBroadcastShimBridge.noTimestamp {
                let end = av_rescale_q(pts + max(0, packet.pointer.pointee.duration), from, AVRational(num: 1, den: 1_000_000_000))
                if end > length { length = end }
            }
            let to = muxer.context.pointee.streams[index]!.pointee.time_base
            av_packet_rescale_ts(packet.pointer, from, to)
            packet.pointer.pointee.pos = -1
            try check(av_interleaved_write_frame(muxer.context, packet.pointer), "writing \(output)")
        }
        if !chapters.isEmpty {
            // Given before the trailer: Matroska and (not fragmented) MP4/MOV write them there. A
            // chapter that runs "to the end" (`Int64.max`) ends where the copy does.
            let fitted = chapters.map { c in
                Chapter(start: c.start, end: c.end == .max ? max(c.start + 1, length) : c.end, title: c.title)
            }
            try setChapters(fitted, on: muxer.context, what: "adding chapters to \(output)")
        }
        try muxer.finish()
    }
}

/// What a live output's transport knows of its path (SRT: libsrt's sender figures).
public struct TransportFigures: Sendable, Equatable {
    /// How long the oldest data the transport took is still unacknowledged: the path's backlog
    /// beyond the output's own queue.
    public var unacknowledgedNanoseconds: Int64
    public var roundTripMilliseconds: Double
    /// Data packets sent (with retransmissions), reported lost, and dropped as too late to send.
    public var packetsSent: Int64
    public var packetsLost: Int64
    public var packetsDropped: Int64
    /// Bytes written that the transport still holds (a TCP socket's send queue: not yet sent or
    /// not yet acknowledged); nil where it says its backlog in time instead (SRT).
    public var queuedBytes: Int64?

    public init(
        unacknowledgedNanoseconds: Int64, roundTripMilliseconds: Double, packetsSent: Int64, packetsLost: Int64, packetsDropped: Int64,
        queuedBytes: Int64? = nil
    ) {
        self.queuedBytes = queuedBytes
        self.unacknowledgedNanoseconds = unacknowledgedNanoseconds
        self.roundTripMilliseconds = roundTripMilliseconds
        self.packetsSent = packetsSent
        self.packetsLost = packetsLost
        self.packetsDropped = packetsDropped
    }
}
