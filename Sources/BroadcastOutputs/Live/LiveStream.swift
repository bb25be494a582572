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
    private let sendBufferBytes: Int
    private let logger: Logger
    private let report: LiveStreamReport

    // The output thread's own state. FFmpeg's interrupt callback runs on this thread too (inside a
    // blocking connect, write or close), so it may use it.

    /// What the output does next: every decision is the state machine's; this class performs them.
    private var machine: LiveStreamStateMachine<EncodedPacket>
    private var muxer: Muxer?
    /// Benchmark instrumentation (BROADCAST_STAGES_FILE): when each video packet left the feed and the socket.
    private let stages = StageLog(part: "output", columns: ["pts", "popped", "written"])
    private var poppedAt: [Int64: Int64] = [:]
    /// Bytes sent over earlier connections, and by this one when last looked.
    private var sentBefore: Int64 = 0
    private var lastBytes: Int64 = 0
    /// The bitrate's one-second window.
    private var windowStart = MonotonicInstant.now()
    private var windowBytes: Int64 = 0
    /// The transport's figures when last read (SRT, RTMP), when they are next read, and the packets it
    /// dropped since they were last said.
    private var transportFigures: TransportFigures?
    private var transportReadDue = MonotonicInstant.now()
    private var transportDropsUnsaid: Int64 = 0
    private var lastTransportWarning: MonotonicInstant?
    /// An RTMP output's writes and reads of its socket (what it holds, told in time), and when
    /// the write going on began (ns; nil between writes).
    private var ledger = SocketLedger()
    private var writingSince: Int64?

    init(output: Output, url: StreamURL, streams: [StreamDescription], totalBitrate: Int, logger: Logger) {
        self.output = output
        self.url = url
        self.settings = output.configuration.live
        self.streams = streams
        // Linux doubles SO_SNDBUF: a quarter second asked is about half a second held.
        self.sendBufferBytes = settings.sendBufferBytes ?? max(32 * 1024, totalBitrate / 8 / 4)
        self.logger = logger
        self.report = LiveStreamReport(output: output, url: url, logger: logger)
        self.machine = LiveStreamStateMachine(
            settings: settings, hasVideo: streams.contains { $0.parameters.mediaType == .video }, now: .now())
    }

    private var status: OutputStatus { output.status }
    private var feed: PacketFeed { output.feed }

    func run() {
        defer { stages?.write() }
        status.set(.connecting)
        if url.scheme == .rtmps, !settings.tls.verify {
            let who = "whoever answers at \(url.host) receives the stream and its key"
            logger.warning("stream \(url.redacted): the server's certificate is not checked (--tls-insecure, tls_verify = false): \(who)")
        }
        loop: while true {
            intake()
            if feed.ended.load(ordering: .acquiring) {
                machine.finishRequested(by: output.finishBy.instant ?? .now())
            }
            publishState()
            let now = MonotonicInstant.now()
            switch machine.nextAction(now: now) {
            case .wait(let until):
                if machine.isConnected { status.setBacklog(0) }
                // Capped, so a missed wake-up costs at most 200 ms.
                var timeout = Duration.milliseconds(200)
                if let until { timeout = max(.milliseconds(1), min(now.duration(to: until), timeout)) }
                feed.waitForPackets(timeout: timeout)
            case .connect:
                publishState()
                let (opened, errorLines) = FFmpegLog.collectingErrors { () throws(FFmpegError) -> Muxer in try connect() }
                switch opened {
                case .success(let connection):
                    muxer = connection
                case .failure(let failure):
                    // A certificate that is not trusted is a refusal (counted; three in a row give
                    // up), never a network failure to retry for ever.
                    let certificate = certificateProblem(errorLines)
                    let error = certificate.map { FFmpegError(code: failure.code, reason: $0, operation: failure.operation) } ?? failure
                    lost(
                        machine.connectFailed(isNetworkFailure: certificate == nil && Self.isNetworkFailure(error), now: .now()), error,
                        sending: false, certificate: certificate != nil)
                    continue
                }
                let connected = machine.connected(now: .now())
                if connected.isReconnect { status.reconnects.wrappingIncrement(ordering: .relaxed) }
                status.attempt.store(0, ordering: .relaxed)
                status.everDelivered.store(true, ordering: .releasing)
                lastBytes = 0
                windowStart = .now()
                windowBytes = 0
                publishState()
                logger.notice("stream \(url.redacted): live")
                drop(.offline, connected.dropped)
                if connected.requestKeyframe { output.keyframeRequest.store(true, ordering: .releasing) }
            case .send(let packet, _):
                send(packet)
            case .finish(let closeConnection, _, let dropped):
                if closeConnection, let open = muxer {
                    do {
                        try open.finish(settle: Self.settleBeforeClose(url))
                    } catch {
                        logger.warning("stream \(url.redacted): closing: \(url.scrub(error.description))")
                    }
                }
                muxer = nil
                forgetTransport()
                machine.closed()
                drop(.offline, dropped)
                break loop
            case .stop:
                break loop
            }
        }
        status.setBacklog(0)
        if status.current != .failed { status.set(.finished) }
        feed.close()
    }

    private func send(_ packet: EncodedPacket) {
        let started = MonotonicInstant.now().nanoseconds
        writingSince = started
        defer { writingSince = nil }
        do {
            try muxer!.write(packet)
        } catch {
            lost(machine.writeFailed(isNetworkFailure: Self.isNetworkFailure(error), now: .now()), error, sending: true)
            return
        }
        if machine.written(now: .now()) {
            logger.notice("stream \(url.redacted): the server takes data again")
        }
        publishState()
        if let stages, packet.mediaType == .video {
            stages.add([packet.pts, poppedAt.removeValue(forKey: packet.pts) ?? 0, StageLog.now()])
        }
        status.sent(packet)
        let bytes = muxer!.bytesWritten
        windowBytes += bytes - lastBytes
        lastBytes = bytes
        status.bytes.store(sentBefore + bytes, ordering: .relaxed)
        ledger.wrote(upTo: sentBefore + muxer!.bytesFlushed, startedAt: started)
        let after = MonotonicInstant.now()
        let window = windowStart.duration(to: after)
        if window >= .seconds(1) {
            status.bitrate.store(Int(Double(windowBytes * 8) / window.inSeconds), ordering: .relaxed)
            windowStart = after
            windowBytes = 0
        }
        status.setBacklog(max(0, feed.newestDTS.load(ordering: .relaxed) - packet.dtsNanoseconds))
        readTransport(at: after)
    }

    /// What the transport says of its path, ten times a second (libsrt takes its own lock): after
    /// a write, and while one blocks (FFmpeg's interrupt callback).
    private func readTransport(at now: MonotonicInstant) {
        guard now >= transportReadDue, let muxer else { return }
        transportReadDue = now.advanced(by: .milliseconds(100))
        if let figures = muxer.transportFigures() { noteTransport(figures, at: now) }
    }

    /// An SRT sender's figures: its unacknowledged timespan is the path's backlog (the queue stays
    /// empty: libsrt takes everything and sends at its own pace), and packets it dropped as too
    /// late are counted and said once a second at most.
    ///
    /// An RTMP output's socket holds bytes the queue no longer sees (up to half a second of media
    /// with the send buffer it asks): how long ago its oldest byte was written counts in the
    /// backlog, and what the path took lately (written less held) is the path's rate.
    private func noteTransport(_ figures: TransportFigures, at now: MonotonicInstant) {
        var backlog = figures.unacknowledgedNanoseconds
        if let held = figures.queuedBytes {
            // What reached the socket (the I/O context's buffer may hold the rest of a packet).
            let written = sentBefore + (muxer?.bytesFlushed ?? lastBytes)
            let read = ledger.read(now: now.nanoseconds, written: written, held: held, writingSince: writingSince)
            backlog += read.age
            status.pathBitrate.store(read.pathBitsPerSecond ?? -1, ordering: .relaxed)
        }
        status.transportBacklog.store(backlog, ordering: .relaxed)
        if let last = transportFigures, figures.packetsDropped > last.packetsDropped {
            transportDropsUnsaid += figures.packetsDropped - last.packetsDropped
        }
        if transportDropsUnsaid > 0, lastTransportWarning.map({ $0.duration(to: now) >= .seconds(1) }) ?? true {
            logger.info("stream \(url.redacted): the path dropped \(transportDropsUnsaid) packets too late to resend (RTT \(Int(figures.roundTripMilliseconds)) ms, \(figures.unacknowledgedNanoseconds / 1_000_000) ms unacknowledged)")
            transportDropsUnsaid = 0
            lastTransportWarning = now
        }
        transportFigures = figures
    }

    /// Forgets the transport's figures: the connection they were of is closed.
    private func forgetTransport() {
        transportFigures = nil
        ledger.reset()
        status.transportBacklog.store(0, ordering: .relaxed)
        status.pathBitrate.store(-1, ordering: .relaxed)
    }

    /// Performs what the state machine decided after a connect or a write failed.
    private func lost(
        _ action: LiveStreamReport.LossAction, _ error: FFmpegError, sending: Bool, certificate: Bool = false
    ) {
        // What is left of the connection closes here, within the action's close deadline.
        muxer = nil
        forgetTransport()
        machine.closed()
        sentBefore += lastBytes
        lastBytes = 0
        var message = url.scrub(error.description)
        switch action {
        case .reconnect(_, _, _, true, _), .fail(_, _, true, _):
            // FFmpeg says "Immediate exit requested" for a call its interrupt callback ended.
            let timeout = LiveStreamReport.seconds(settings.timeout)
            message = sending
                ? "timed out after \(timeout) writing to \(url.redacted): the server took no data in that time"
                : "timed out after \(timeout) connecting to \(url.redacted)"
        default:
            break
        }
        report.lost(action, message: message, failures: machine.failures, state: machine.outputState, sending: sending) { times in
            certificate
                ? "the server's certificate was refused \(times) times in a row"
                : "the server refused the stream \(times) times in a row (wrong stream key, or publishing not allowed?)"
        }
    }

    private func publishState() { report.publish(machine.outputState) }
    private func drop(_ reason: DropReason, _ count: Int = 1) { report.drop(reason, count) }
    private func count(_ drops: Drops) { report.count(drops) }

    /// Moves what the encoder queued into the state machine's send queue (which drops by its
    /// policy), after telling it whether the output is paused.
    private func intake() {
        count(machine.paused(output.isPaused))
        if feed.overflowed.exchange(false, ordering: .acquiringAndReleasing) { machine.feedOverflowed() }
        while let packet = feed.pop() {
            if stages != nil, packet.mediaType == .video { poppedAt[packet.pts] = StageLog.now() }
            count(machine.packet(packet))
        }
    }

    /// FFmpeg's interrupt callback (every 100 ms or so while a call blocks), on this thread. While
    /// a packet's write blocks, the socket takes nothing: the backlog is everything encoded since
    /// that packet and grows; new packets still come off the encoder's queue into the send queue,
    /// where the backlog policy drops video; after a second the output is "stalled".
    private func shouldInterrupt() -> Bool {
        if machine.finishDeadline == nil, feed.ended.load(ordering: .acquiring) {
            if let by = output.finishBy.instant { machine.finishRequested(by: by) }
        }
        switch machine.blocked(now: .now()) {
        case .carryOn:
            return false
        case .interrupt:
            return true
        case .takePackets:
            takePacketsWhileBlocked()
            return false
        case .takePacketsStalled(let blocked):
            takePacketsWhileBlocked()
            publishState()
            status.bitrate.store(0, ordering: .relaxed)
            logger.warning(
                "stream \(url.redacted): stalled: a write has blocked for \(LiveStreamReport.seconds(blocked.inSeconds)), the server takes no data")
            return false
        }
    }

    private func takePacketsWhileBlocked() {
        intake()
        if let dts = machine.writingDTS {
            status.setBacklog(max(0, feed.newestDTS.load(ordering: .relaxed) - dts))
        }
        readTransport(at: .now())
    }

    /// Opens the connection and writes the header (blocking, at most `settings.timeout`).
    private func connect() throws(FFmpegError) -> Muxer {
        if let problem = Self.resolve(url.host) {
            throw FFmpegError(code: FFmpegError.posix(EHOSTUNREACH), reason: problem, operation: "connecting to \(url.redacted)")
        }
        let muxer = try Muxer(
            url: url.url,
            formatName: url.scheme.formatName,
            displayName: url.redacted,
            logger: logger,
            shouldInterrupt: { [unowned self] in self.shouldInterrupt() }
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
            // The close waits (at most a second) for what libsrt has not sent yet (see settleBeforeClose).
            ioOptions["linger"] = "1"
        case .whipHTTPS, .whipHTTP:
            break  // WHIPWorker's, never opened here
        }
        if url.scheme == .rtmps {
            // FFmpeg checks nothing unless asked: with tls_verify the chain (to the system's store, or
            // ca_file instead) and the URL's host against the certificate.
            ioOptions["tls_verify"] = settings.tls.verify ? "1" : "0"
            if let file = settings.tls.authorityFile { ioOptions["ca_file"] = file }
        }
        try muxer.writeHeader(options: options, ioOptions: ioOptions)
        return muxer
    }

    /// Why the server's certificate was not accepted, from the error lines FFmpeg logged while
    /// connecting (its error code is a plain EIO), or nil when the failure was something else.
    private func certificateProblem(_ lines: [String]) -> String? {
        guard url.scheme == .rtmps, settings.tls.verify,
            let line = lines.first(where: { $0.lowercased().contains("certificate") })
        else { return nil }
        let trust = settings.tls.authorityFile.map { "the authorities in \($0)" } ?? "the system's certificate authorities"
        let why: String
        if line.contains("does not match hostname") {
            why = "it is not issued for \(url.host)"
        } else if line.contains("failed verification") || line.contains("verify failed") {
            why = "it is not signed by \(trust) (self-signed, another CA, or expired)"
        } else {
            why = String(line.split(separator: "\n").first ?? "")
        }
        return "certificate of \(url.host) not accepted: \(why); trust a private CA with --tls-ca FILE (daemon: tls_ca), "
            + "or skip the check with --tls-insecure (tls_verify = false)"
    }

    /// How long a clean finish waits between the last bytes and the close. SRT: libsrt's live
    /// mode closes at once (linger 0), dropping what is still unsent or unacknowledged, and the
    /// listener drops what its latency window still holds when the connection ends: the last
    /// ~130 ms never reached it (176 of 180 frames into srt-live-transmit). Three times the
    /// receiver's latency (the URL's `latency`/`peerlatency`, µs; libsrt's default 120 ms) and
    /// 0.5 s for the acknowledgements and a busy receiver, at most 2 s; `linger` (set when
    /// connecting) covers what is still unsent at the close. On the output's own thread: nothing
    /// else waits for it but the end of the broadcast.
    static func settleBeforeClose(_ url: StreamURL) -> Double {
        guard url.scheme == .srt else { return 0 }
        let query = url.url.split(separator: "?", maxSplits: 1).dropFirst().first?.split(separator: "&") ?? []
        let latencies = query.compactMap { item -> Double? in
            let pair = item.split(separator: "=", maxSplits: 1)
            guard pair.count == 2, pair[0] == "latency" || pair[0] == "peerlatency" else { return nil }
            return Double(pair[1])
        }
        let latency = (latencies.max() ?? 120_000) / 1e6
        return min(2, 3 * latency + 0.5)
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
}

