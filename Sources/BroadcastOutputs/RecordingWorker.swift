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
        self.hasVideo = hasVideo
        self.streams = streams
        self.segments = segments
        self.logger = logger
        self.join = PauseJoin(streamCount: streams.count)
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
            }
            if awaitingKeyframe {
                guard isStartPoint(packet) else {
                    status.drop(.paused)
                    continue
                }
                awaitingKeyframe = false
                // Skip the paused time: this keyframe follows the last packet written directly.
                join.resume(at: dts)
                status.set(.recording)
                bitrate.restart(at: .now())
            }
            if segmentStart == nil { segmentStart = dts }
            if let segments, let length = segments.length, let start = segmentStart, isStartPoint(packet),
                .nanoseconds(dts - start) >= length
            {
                do {
                    try startNextSegment(segments, at: dts)
                } catch {
                    output.failed(error.message)
                    return
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
                output.failed(error.message)
                return
            }
            status.sent(packet)
            status.bytes.store(recording.bytesWritten, ordering: .relaxed)
            if let rate = bitrate.add(packet.size, now: .now()) { status.bitrate.store(rate, ordering: .relaxed) }
            status.setBacklog(max(0, feed.newestDTS.load(ordering: .relaxed) - dts))
        }
        do {
            try recording.finish()
            // What finishing wrote counts too (an audio-only recording may write nothing before).
            status.bytes.store(recording.bytesWritten, ordering: .relaxed)
            status.set(.finished)
            status.bitrate.store(0, ordering: .relaxed)
            output.fileFinished(recording.path)
        } catch {
            output.failed(error.message)
        }
        if let segments { RecordingRetention.apply(segments, keeping: recording.path, manifest: manifest, logger: logger) }
        feed.close()
    }

    /// Finishes the current file and opens the next, which starts at `dts` (time zero in it).
    private func startNextSegment(_ segments: RecordingSegments, at dts: Int64) throws(BroadcastError) {
        try recording.finish()
        output.fileFinished(recording.path)
        let path = RecordingRetention.nextPath(segments.pathTemplate, after: recording.path)
        // A template with conversions in its directories (`%Y/%m/rec.mp4`) moves on to new ones.
        if let problem = RecordingTemplate.makeParentDirectories(of: path) {
            throw BroadcastError(.outputFailed, "recording \(output.name): \(problem)")
        }
        recording = try Recording(path: path, streams: streams, logger: logger)
        manifest?.recordCreated(recording)
        segmentStart = dts
        join.restart(at: dts)
        logger.info("recording \(output.name): next segment \(path)")
        RecordingRetention.apply(segments, keeping: path, manifest: manifest, logger: logger)
    }
}

/// Segment names and the deletion of old segments.
public enum RecordingRetention {
    /// strftime(3) of `template` now, in local time; "-2", "-3", ... added when that file exists.
    public static func nextPath(_ template: String, after previous: String = "") -> String {
        let base = expand(template)
        if base != previous && access(base, F_OK) != 0 { return base }
        let dot = base.lastIndex(of: ".") ?? base.endIndex
        var n = 2
        while true {
            let candidate = "\(base[..<dot])-\(n)\(base[dot...])"
            if access(candidate, F_OK) != 0 { return candidate }
            n += 1
        }
    }

    /// strftime(3) of `template` now, in local time.
    public static func expand(_ template: String) -> String {
        var now = time(nil)
        var parts = tm()
        localtime_r(&now, &parts)
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = strftime(&buffer, buffer.count, template, &parts)
        return n > 0 ? String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : template
    }

    /// The finished files of `template` that this output wrote: listed in `manifest` and named as
    /// the template names files. Oldest first. Never a file only because it is in the directory.
    static func segments(of template: String, manifest: RecordingManifest) -> [(path: String, modified: Int, bytes: Int64)] {
        var found: [(path: String, modified: Int, bytes: Int64)] = []
        for path in manifest.files() where RecordingTemplate.matches(template, path: path) {
            var info = stat()
            guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { continue }
            found.append((path, info.st_mtim.tv_sec, Int64(info.st_size)))
        }
        return found.sorted { ($0.modified, $0.path) < ($1.modified, $1.path) }
    }

    /// Deletes finished segments older than the retention age, then the oldest while the total
    /// exceeds the size limit. Only files this output wrote (see `segments(of:manifest:)`); never
    /// the file being written. Without a manifest nothing is deleted.
    static func apply(_ policy: RecordingSegments, keeping current: String, manifest: RecordingManifest?, logger: Logger) {
        guard policy.retainSeconds != nil || policy.retainBytes != nil else { return }
        guard let manifest else { return }
        var files = segments(of: policy.pathTemplate, manifest: manifest)
        let now = time(nil)
        if let age = policy.retainSeconds {
            for file in files where file.path != current && now - file.modified > age {
                if unlink(file.path) == 0 {
                    manifest.recordDeleted(file.path)
                    logger.notice("retention: deleted \(file.path) (older than \(age) s)")
                }
            }
            files = segments(of: policy.pathTemplate, manifest: manifest)
        }
        if let limit = policy.retainBytes {
            var total = files.reduce(0) { $0 + $1.bytes }
            for file in files where total > limit && file.path != current {
                if unlink(file.path) == 0 {
                    manifest.recordDeleted(file.path)
                    total -= file.bytes
                    logger.notice("retention: deleted \(file.path) (recordings over \(limit) bytes)")
                }
            }
        }
    }
}
