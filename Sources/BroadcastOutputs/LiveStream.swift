import Atomics
import BroadcastKit
import BroadcastMedia
import Logging

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A live output's thread: connects to an RTMP/RTMPS (FLV) or SRT (MPEG-TS) server with
/// libavformat, sends the queue, drops by backlog when the network is slower than the encoder
/// (`SendQueue`), and reconnects with jittered exponential backoff when the connection breaks.
///
/// The connection is owned by this thread alone. No call blocks for ever: FFmpeg's interrupt
/// callback ends a connect or write that passes its deadline, or when the broadcast's finish
/// timeout passes.
final class LiveStreamWorker: OutputWorker, @unchecked Sendable {
    private let output: Output
    private let url: StreamURL
    private let settings: LiveStreamSettings
    private let streams: [StreamDescription]
    private let hasVideo: Bool
    private let sendBufferBytes: Int
    private let logger: Logger
    private let clock = MonotonicClock()
    /// The current operation's deadline (CLOCK_MONOTONIC ns), 0: none. Read by the interrupt callback.
    private let operationDeadline = ManagedAtomic<Int64>(0)

    // The output thread's own state. FFmpeg's interrupt callback runs on this thread too (inside a
    // blocking write), so it may use it.

    /// Packets taken from the encoder, waiting to be sent, thinned by backlog.
    private var queue: SendQueue
    /// Waiting for a keyframe to (re)start from: everything before it is dropped.
    private var restartPending = true
    /// A connection is open (packets go through the drop policy).
    private var connected = false
    /// When the packet being written was handed to the muxer (ns), 0: not writing.
    private var writeStartedAt: Int64 = 0
    /// dts (ns) of the packet being written: the oldest media the socket has not taken.
    private var writingDTS: Int64 = 0
    /// The interrupt callback ended the current operation because its deadline passed.
    private var deadlinePassed = false
    /// Benchmark instrumentation (BROADCAST_STAGES_FILE): when each video packet left the feed and the socket.
    private let stages = StageLog(part: "output", columns: ["pts", "popped", "written"])
    private var poppedAt: [Int64: Int64] = [:]
    /// A write blocked this long means the server takes nothing: the output is stalled.
    static let stallNanoseconds: Int64 = 1_000_000_000
    /// While a write blocks longer than this, packets keep coming off the encoder's queue into the
    /// send queue, where the backlog policy drops them.
    static let intakeWhileBlockedNanoseconds: Int64 = 100_000_000

    init(output: Output, url: StreamURL, streams: [StreamDescription], totalBitrate: Int, logger: Logger) {
        self.output = output
        self.url = url
        self.settings = output.configuration.live
        self.streams = streams
        self.hasVideo = streams.contains { $0.parameters.mediaType == .video }
        // Linux doubles SO_SNDBUF: a quarter second asked is about half a second held.
        self.sendBufferBytes = settings.sendBufferBytes ?? max(32 * 1024, totalBitrate / 8 / 4)
        self.logger = logger
        self.queue = SendQueue(threshold: settings.dropThreshold, referenceThreshold: settings.referenceDropThreshold)
    }

    private var status: OutputStatus { output.status }
    private var feed: PacketFeed { output.feed }

    /// The packet a (re)started stream may begin with.
    private func isStart(_ packet: EncodedPacket) -> Bool {
        packet.isKeyframe && (packet.mediaType == .video || !hasVideo)
    }

    func run() {
        defer { stages?.write() }
        var muxer: Muxer?
        var failures = 0
        var refusals = 0
        var nextAttempt = clock.now()
        var connectedAt: Int64 = 0
        var windowStart = clock.now()
        var windowBytes: Int64 = 0
        var lastBytes: Int64 = 0
        /// Bytes sent over earlier connections.
        var sentBefore: Int64 = 0
        status.set(.connecting)

        func drop(_ reason: DropReason, _ count: Int = 1) { self.drop(reason, count) }

        func connectionLost(_ error: FFmpegError, sending: Bool) {
            let now = clock.now()
            // Give the old connection a second to close, then let it go.
            operationDeadline.store(now + 1_000_000_000, ordering: .relaxed)
            muxer = nil
            connected = false
            operationDeadline.store(0, ordering: .relaxed)
            sentBefore += lastBytes
            lastBytes = 0
            status.bitrate.store(0, ordering: .relaxed)
            status.setBacklog(0)
            var message = url.scrub(error.description)
            if deadlinePassed {
                // FFmpeg says "Immediate exit requested" for a call its interrupt callback ended.
                message = sending
                    ? "timed out after \(Self.seconds(settings.timeout)) writing to \(url.redacted): the server took no data in that time"
                    : "timed out after \(Self.seconds(settings.timeout)) connecting to \(url.redacted)"
                deadlinePassed = false
            }
            status.setError(message)
            // A publish the server drops at once (nginx-rtmp's deny, a rejected key) counts as refused.
            let refused = !sending || now - connectedAt < 3_000_000_000
            if Self.isNetworkFailure(error) || !refused {
                refusals = 0
            } else {
                refusals += 1
            }
            if sending { failures = 0 } else { failures += 1 }
            status.attempt.store(failures, ordering: .relaxed)
            if refusals >= settings.reconnect.maxRefusals {
                output.failed(
                    "stream \(url.redacted): the server refused the stream \(refusals) times in a row "
                        + "(wrong stream key, or publishing not allowed?); giving up. Last error: \(message)")
                return
            }
            if let max = settings.reconnect.maxAttempts, failures >= max {
                output.failed("stream \(url.redacted): gave up after \(failures) failed attempts. Last error: \(message)")
                return
            }
            let delay = settings.reconnect.delay(afterFailures: failures, unit: Double.random(in: 0..<1))
            nextAttempt = now + Int64(delay * 1e9)
            status.set(.reconnecting)
            let what = sending ? "connection lost" : "could not connect"
            logger.warning(
                "stream \(url.redacted): \(what): \(message); reconnecting in \(Self.seconds(delay)) (attempt \(failures + 1))")
            drop(.offline, queue.removeAll())
            restartPending = true
        }

        while true {
            let now = clock.now()
            let ended = feed.ended.load(ordering: .acquiring)
            if status.current == .failed { break }

            // Move what the encoder queued into the send queue, dropping by policy.
            let isPaused = output.isPaused
            intake(paused: isPaused)
            if isPaused {
                if status.current != .paused { status.set(.paused) }
                drop(.paused, queue.removeAll())
            } else if status.current == .paused {
                status.set(muxer == nil ? .reconnecting : .live)
            }

            if ended, muxer == nil || queue.isEmpty || aborting() { break }

            if muxer == nil {
                if ended { break }
                if now < nextAttempt || isPaused {
                    feed.waitForPackets(timeoutNanoseconds: min(max(nextAttempt - now, 1_000_000), 200_000_000))
                    continue
                }
                status.set(status.everDelivered.load(ordering: .relaxed) || failures > 0 ? .reconnecting : .connecting)
                do {
                    muxer = try connect()
                    connected = true
                } catch {
                    connectionLost(error, sending: false)
                    continue
                }
                connectedAt = clock.now()
                if status.everDelivered.load(ordering: .relaxed) {
                    status.reconnects.wrappingIncrement(ordering: .relaxed)
                }
                failures = 0
                status.attempt.store(0, ordering: .relaxed)
                status.set(.live)
                status.everDelivered.store(true, ordering: .releasing)
                lastBytes = 0
                windowStart = connectedAt
                windowBytes = 0
                logger.notice("stream \(url.redacted): live")
                // Start from what is queued if it begins with a keyframe recent enough; otherwise
                // from a fresh keyframe, asked of the encoder now.
                if restartPending || queue.first.map({ !isStart($0) }) ?? true || queue.backlog > queue.threshold {
                    drop(.offline, queue.removeAll())
                    restartPending = true
                    output.keyframeRequest.store(true, ordering: .releasing)
                }
                continue
            }

            guard let packet = queue.popFirst() else {
                status.setBacklog(0)
                feed.waitForPackets(timeoutNanoseconds: 200_000_000)
                continue
            }
            writeStartedAt = clock.now()
            writingDTS = packet.dtsNanoseconds
            deadlinePassed = false
            operationDeadline.store(writeStartedAt + Int64(settings.timeout * 1e9), ordering: .relaxed)
            do {
                try muxer!.write(packet)
            } catch {
                operationDeadline.store(0, ordering: .relaxed)
                writeStartedAt = 0
                connectionLost(error, sending: true)
                continue
            }
            operationDeadline.store(0, ordering: .relaxed)
            writeStartedAt = 0
            if let stages, packet.mediaType == .video {
                stages.add([packet.pts, poppedAt.removeValue(forKey: packet.pts) ?? 0, StageLog.now()])
            }
            if status.current == .stalled {
                status.set(.live)
                logger.notice("stream \(url.redacted): the server takes data again")
            }
            status.sent(packet)
            let bytes = muxer!.bytesWritten
            windowBytes += bytes - lastBytes
            lastBytes = bytes
            status.bytes.store(sentBefore + bytes, ordering: .relaxed)
            let after = clock.now()
            if after - windowStart >= 1_000_000_000 {
                status.bitrate.store(Int(Double(windowBytes * 8) / (Double(after - windowStart) / 1e9)), ordering: .relaxed)
                windowStart = after
                windowBytes = 0
            }
            status.setBacklog(max(0, feed.newestDTS.load(ordering: .relaxed) - packet.dtsNanoseconds))
        }

        if let open = muxer {
            operationDeadline.store(clock.now() + 2_000_000_000, ordering: .relaxed)
            do {
                try open.finish()
            } catch {
                logger.warning("stream \(url.redacted): closing: \(url.scrub(error.description))")
            }
            muxer = nil
            operationDeadline.store(0, ordering: .relaxed)
        }
        drop(.offline, queue.removeAll())
        status.setBacklog(0)
        if status.current != .failed { status.set(.finished) }
        feed.close()
    }

    private func drop(_ reason: DropReason, _ count: Int = 1) { if count > 0 { status.drop(reason, count: count) } }

    /// Moves what the encoder queued into the send queue: dropped while paused or while waiting for
    /// a keyframe to (re)start from, through the backlog policy while connected.
    private func intake(paused: Bool) {
        if feed.overflowed.exchange(false, ordering: .acquiringAndReleasing) { restartPending = true }
        while let packet = feed.pop() {
            if stages != nil, packet.mediaType == .video { poppedAt[packet.pts] = StageLog.now() }
            if paused {
                drop(.paused)
                restartPending = true
                continue
            }
            if restartPending {
                if isStart(packet) {
                    drop(.offline, queue.removeAll())
                    restartPending = false
                    queue.append(packet)
                } else {
                    drop(.offline)
                }
            } else if !connected {
                queue.append(packet)
            } else {
                queue.add(packet) { drop($0) }
            }
        }
    }

    /// Called by FFmpeg's interrupt callback (every 100 ms or so while a call blocks), on this
    /// thread. While a packet's write blocks, the socket takes nothing: the backlog is everything
    /// encoded since that packet and grows; new packets still come off the encoder's queue into the
    /// send queue, where the backlog policy drops video; after a second the output is "stalled".
    private func whileBlocked(now: Int64) {
        guard writeStartedAt != 0 else { return }
        let blocked = now - writeStartedAt
        guard blocked >= Self.intakeWhileBlockedNanoseconds else { return }
        intake(paused: output.isPaused)
        status.setBacklog(max(0, feed.newestDTS.load(ordering: .relaxed) - writingDTS))
        if blocked >= Self.stallNanoseconds, status.current == .live {
            status.set(.stalled)
            status.bitrate.store(0, ordering: .relaxed)
            logger.warning(
                "stream \(url.redacted): stalled: a write has blocked for \(Self.seconds(Double(blocked) / 1e9)), the server takes no data")
        }
    }

    /// True once the broadcast's finish timeout passed: stop sending, close.
    private func aborting() -> Bool {
        let by = output.finishBy.load(ordering: .relaxed)
        return by != 0 && clock.now() > by
    }

    /// Opens the connection and writes the header (blocking, at most `settings.timeout`).
    private func connect() throws(FFmpegError) -> Muxer {
        if let problem = Self.resolve(url.host) {
            throw FFmpegError(code: FFmpegError.posix(EHOSTUNREACH), reason: problem, operation: "connecting to \(url.redacted)")
        }
        let deadline = operationDeadline
        let finishBy = output.finishBy
        let muxer = try Muxer(
            url: url.url,
            formatName: url.scheme.formatName,
            displayName: url.redacted,
            logger: logger,
            shouldInterrupt: { [unowned self] in
                var ts = timespec()
                clock_gettime(CLOCK_MONOTONIC, &ts)
                let now = Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
                let d = deadline.load(ordering: .relaxed)
                let f = finishBy.load(ordering: .relaxed)
                if f != 0 && now > f { return true }
                if d != 0 && now > d {
                    self.deadlinePassed = true
                    return true
                }
                self.whileBlocked(now: now)
                return false
            }
        )
        for stream in streams { try muxer.addStream(stream) }
        var ioOptions = ["rw_timeout": "\(Int64(settings.timeout * 1e6))"]
        var options: [String: String] = [:]
        switch url.scheme {
        case .rtmp, .rtmps:
            ioOptions["send_buffer_size"] = "\(sendBufferBytes)"
            // FFmpeg's RTMP writes each message as several small writes (header, chunks): with Nagle
            // on, one is held until the server ACKs the last segment, and a delayed ACK takes 40 ms.
            ioOptions["tcp_nodelay"] = "1"
            // A live FLV is not seekable: do not try to write duration and size back at the end.
            options["flvflags"] = "no_duration_filesize"
        case .srt:
            ioOptions["connect_timeout"] = "\(Int64(settings.timeout * 1000))"
        }
        operationDeadline.store(clock.now() + Int64(settings.timeout * 1e9), ordering: .relaxed)
        deadlinePassed = false
        defer { operationDeadline.store(0, ordering: .relaxed) }
        try muxer.writeHeader(options: options, ioOptions: ioOptions)
        return muxer
    }

    /// Errors that say the network or server is not there (retry without counting a refusal).
    static func isNetworkFailure(_ error: FFmpegError) -> Bool {
        let codes = [ECONNREFUSED, ETIMEDOUT, EHOSTUNREACH, ENETUNREACH, ENETDOWN, EHOSTDOWN]
        return codes.contains { error.code == FFmpegError.posix($0) } || error.code == FFmpegError.interrupted
    }

    /// nil when `host` resolves; otherwise why not. FFmpeg reports a failed lookup as a plain I/O
    /// error, so the output looks the name up itself first to say what is wrong.
    static func resolve(_ host: String) -> String? {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(host, nil, &hints, &result)
        if rc == 0 {
            freeaddrinfo(result)
            return nil
        }
        return "cannot resolve host '\(host)': \(String(cString: gai_strerror(rc)))"
    }

    static func seconds(_ value: Double) -> String {
        let tenths = Int((value * 10).rounded())
        return "\(tenths / 10).\(tenths % 10) s"
    }
}
