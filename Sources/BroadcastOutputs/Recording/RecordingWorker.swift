import Atomics
import BroadcastKit
import BroadcastMedia
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Writes every packet to a recording, in order, on the output's thread; finalizes it at the end.
///
/// Paused on its own (the stream goes on), a recording skips the paused time: it resumes on a
/// keyframe, and every later packet is written earlier by the length of the pause, so the file has
/// no gap. An output added while the broadcast runs starts on a keyframe at time zero. With
/// segments, a new file starts at the first keyframe past the segment length; each
/// file starts at time zero, no packet is lost or repeated at the cut, and old files are deleted
/// by age and total size.
final class RecordingWorker: OutputWorker, @unchecked Sendable {
    private let output: Output
    /// Owned by the output's thread once started.
    private var recording: Recording
    private let hasVideo: Bool
    private let streams: [StreamDescription]
    private let segments: RecordingSegments?
    /// Where the files this output creates are noted (the daemon's; nil: none kept, nothing deleted).
    private let manifest: RecordingManifest?
    private let logger: Logger
    private let joinsRunningBroadcast: Bool
    /// Taken off every packet's timestamps (the start of the current segment plus skipped pauses),
    /// and what keeps each stream going forward across a resume.
    private var join: PauseJoin
    /// Where the current segment starts, in the encoder's time (ns).
    private var segmentStart: Int64?
    /// After a write failed (a full disk): the file was closed with what it holds, packets are
    /// dropped, and a new file is tried at a keyframe from this instant on; nil while writing.
    private var nextTryAfterFailure: MonotonicInstant?
    /// Markers taken from the output, waiting for the packet at their time.
    private var waitingMarks: [Output.PendingMark] = []
    /// Where (encoder's time, ns) the stretch the file holds without a cut began: its start, the
    /// last resume. A marker taken while paused goes where the file goes on.
    private var stretchStart: Int64 = .min
    /// How often a recording whose writes failed tries a new file.
    static let retryInterval = Duration.seconds(2)

    init(
        output: Output,
        recording: Recording,
        hasVideo: Bool,
        streams: [StreamDescription],
        segments: RecordingSegments?,
        manifest: RecordingManifest? = nil,
        joinsRunningBroadcast: Bool = false,
        logger: Logger
    ) {
        self.manifest = manifest
        self.joinsRunningBroadcast = joinsRunningBroadcast
        self.output = output
        self.recording = recording
        output.status.setFile(recording.path)
        self.hasVideo = hasVideo
        self.streams = streams
        self.segments = segments
        self.logger = logger
        self.join = PauseJoin(streamCount: streams.streamIndexSpan)
    }

    /// True for the packet a file may start with: a video keyframe (any packet without video).
    private func isStartPoint(_ packet: EncodedPacket) -> Bool {
        packet.isKeyframe && (packet.mediaType == .video || !hasVideo)
    }

    /// Closes the file unfinished and deletes it (a broadcast that never really started).
    func discard() { recording.discard() }

    func run() {
        let status = output.status
        let feed = output.feed
        status.set(.recording)
        status.everDelivered.store(true, ordering: .releasing)
        var awaitingKeyframe = false
        var bitrate = BitrateWindow()
        // An output added while the broadcast runs joins mid-GOP: its file starts on a keyframe.
        var joining = joinsRunningBroadcast
        while true {
            guard let packet = feed.pop() else {
                if feed.ended.load(ordering: .acquiring), feed.ring.isEmpty { break }
                feed.waitForPackets(timeout: .milliseconds(200))
                continue
            }
            if output.isPaused {
                if status.current != .paused {
                    status.set(.paused)
                    status.bitrate.store(0, ordering: .relaxed)
                }
                status.drop(.paused)
                awaitingKeyframe = true
                continue
            }
            let dts = packet.dtsNanoseconds
            if joining {
                guard isStartPoint(packet) else {
                    status.drop(.awaitingKeyframe)
                    continue
                }
                joining = false
                // Its file starts at zero, in every container, like a segment's (not at the
                // broadcast's current time, which MKV, TS and FLV would keep as a leading gap).
                join.restart(at: dts)
                stretchStart = dts
            }
            if awaitingKeyframe {
                guard isStartPoint(packet) else {
                    status.drop(.paused)
                    continue
                }
                awaitingKeyframe = false
                // Skip the paused time: this keyframe follows the last packet written directly.
                join.resume(at: dts)
                stretchStart = dts
                status.set(.recording)
                bitrate.restart(at: .now())
            }
            if let nextTry = nextTryAfterFailure {
                guard isStartPoint(packet), MonotonicInstant.now() >= nextTry, goOnInNewFile(at: dts) else {
                    status.drop(.writeFailed)
                    continue
                }
            }
            if segmentStart == nil {
                segmentStart = dts
                if stretchStart == .min { stretchStart = dts }
            }
            if let segments, let length = segments.length, let start = segmentStart, isStartPoint(packet),
                .nanoseconds(dts - start) >= length
            {
                do {
                    try startNextSegment(segments, at: dts)
                } catch {
                    writeFailed(error)
                    continue
                }
            }
            // A packet that would go back in its stream (audio begun just before the keyframe
            // a resume joined at) belongs to the paused time.
            guard join.admit(stream: packet.streamIndex, dts: dts, end: dts + max(0, packet.durationNanoseconds)) else {
                status.drop(.paused)
                continue
            }
            do {
                try recording.write(packet, shiftNanoseconds: join.shift)
            } catch {
                writeFailed(error)
                continue
            }
            if !waitingMarks.isEmpty || output.pendingMarks.load(ordering: .relaxed) != nil { placeMarks(upTo: dts) }
            status.sent(packet)
            status.bytes.store(recording.bytesWritten, ordering: .relaxed)
            if let rate = bitrate.add(packet.size, now: .now()) { status.bitrate.store(rate, ordering: .relaxed) }
            status.setBacklog(max(0, feed.newestDTS.load(ordering: .relaxed) - dts))
        }
        // Markers taken after the last packet: at the end of the file.
        placeMarks(upTo: .max)
        // Still waiting for space at the end: what the last file holds is kept as it was closed.
        if nextTryAfterFailure != nil {
            feed.close()
            return
        }
        do {
            let kept = try recording.finish()
            // What finishing wrote counts too (an audio-only recording may write nothing before).
            status.bytes.store(recording.bytesWritten, ordering: .relaxed)
            status.set(.finished)
            status.bitrate.store(0, ordering: .relaxed)
            // A recording that got no packet was removed: no file to announce.
            if kept { output.fileFinished(recording.path) }
        } catch {
            output.failed(error.message)
        }
        if let segments {
            RecordingRetention.apply(segments, owner: output.name, keeping: recording.path, manifest: manifest, logger: logger)
        }
        feed.close()
    }

    /// Places the markers taken at or before `dts` (the packet just written) in the file: at their
    /// media time less what the file's timestamps take off (its start, pauses), and never before
    /// the stretch the packet belongs to (a marker taken while paused goes where the file goes on).
    private func placeMarks(upTo dts: Int64) {
        if let taken = output.pendingMarks.exchange(nil, ordering: .acquiring) { waitingMarks += taken.marks }
        guard !waitingMarks.isEmpty else { return }
        var later: [Output.PendingMark] = []
        for mark in waitingMarks {
            guard mark.media <= dts else {
                later.append(mark)
                continue
            }
            var time = max(mark.media, stretchStart) - join.shift
            if dts == .max { time = min(time, recording.mediaEnd) }
            recording.addMark(RecordingMark(nanoseconds: max(0, time), title: mark.title))
            logger.info("recording \(output.name): marker \"\(mark.title)\" at \(Double(max(0, time)) / 1e9) s of \(recording.path)")
        }
        waitingMarks = later
        output.placedMarks.store(Output.MarkList(recording.marks), ordering: .releasing)
    }

    /// Opens the next segment, which starts at `dts` (time zero in it), then finishes the current
    /// one. The next file first: a finalize that fails (it needs room for a copy of the file, and
    /// retention makes room only after it) leaves that segment fragmented, which plays and which
    /// the next start finalizes (it is in the manifest), and the recording goes on.
    private func startNextSegment(_ segments: RecordingSegments, at dts: Int64) throws(BroadcastError) {
        let previous = recording
        recording = try openFile(RecordingRetention.nextPath(segments.pathTemplate, after: previous.path, manifest: manifest))
        segmentStart = dts
        join.restart(at: dts)
        stretchStart = dts
        output.placedMarks.store(nil, ordering: .releasing)
        logger.info("recording \(output.name): next segment \(recording.path)")
        do {
            if try previous.finish() { output.fileFinished(previous.path) }
        } catch {
            logger.error("recording \(output.name): \(error.message); it is kept fragmented (it plays) and is finalized at the next start")
        }
        RecordingRetention.apply(segments, owner: output.name, keeping: recording.path, manifest: manifest, logger: logger)
    }

    /// A new file of this output at `path`, noted in the manifest.
    private func openFile(_ path: String) throws(BroadcastError) -> Recording {
        // A template with conversions in its directories (`%Y/%m/rec.mp4`) moves on to new ones.
        if let problem = RecordingTemplate.makeParentDirectories(of: path) {
            throw BroadcastError(.outputFailed, "recording \(output.name): \(problem)")
        }
        let file = try Recording(path: path, streams: streams, logger: logger)
        manifest?.recordCreated(file, owner: output.name)
        // What the status names as the output's target from now on.
        output.status.setFile(file.path)
        return file
    }

    /// A write (or the next segment's start) failed, as on a full disk: the current file is
    /// closed with what it holds, the output says `failed` with why, and it tries a new file every
    /// `retryInterval` at a keyframe (`goOnInNewFile`) instead of ending. The packet it was
    /// writing is dropped.
    private func writeFailed(_ error: BroadcastError) {
        recording.abandon()
        output.status.drop(.writeFailed)
        if nextTryAfterFailure == nil {
            let message = "\(error.message); going on in a new file when it can be written"
            output.status.setError(message)
            output.status.set(.failed)
            output.status.bitrate.store(0, ordering: .relaxed)
            logger.error("recording \(output.name): \(message)")
        }
        nextTryAfterFailure = .now() + Self.retryInterval
    }

    /// Tries the next file after a failure, starting at the keyframe at `dts`; true when it is open.
    private func goOnInNewFile(at dts: Int64) -> Bool {
        let template = segments?.pathTemplate ?? recording.path
        do {
            recording = try openFile(RecordingRetention.nextPath(template, after: recording.path, manifest: manifest))
        } catch {
            nextTryAfterFailure = .now() + Self.retryInterval
            logger.debug("recording \(output.name): still cannot write: \(error.message)")
            return false
        }
        nextTryAfterFailure = nil
        segmentStart = dts
        join.restart(at: dts)
        stretchStart = dts
        output.placedMarks.store(nil, ordering: .releasing)
        output.status.clearError()
        output.status.set(.recording)
        logger.notice("recording \(output.name): writing again, in \(recording.path)")
        return true
    }
}
