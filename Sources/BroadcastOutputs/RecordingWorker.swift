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
            if let nextTry = nextTryAfterFailure {
                guard isStartPoint(packet), MonotonicInstant.now() >= nextTry, goOnInNewFile(at: dts) else {
                    status.drop(.writeFailed)
                    continue
                }
            }
            if segmentStart == nil { segmentStart = dts }
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
            status.sent(packet)
            status.bytes.store(recording.bytesWritten, ordering: .relaxed)
            if let rate = bitrate.add(packet.size, now: .now()) { status.bitrate.store(rate, ordering: .relaxed) }
            status.setBacklog(max(0, feed.newestDTS.load(ordering: .relaxed) - dts))
        }
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

    /// Opens the next segment, which starts at `dts` (time zero in it), then finishes the current
    /// one. The next file first: a finalize that fails (it needs room for a copy of the file, and
    /// retention makes room only after it) leaves that segment fragmented, which plays and which
    /// the next start finalizes (it is in the manifest), and the recording goes on.
    private func startNextSegment(_ segments: RecordingSegments, at dts: Int64) throws(BroadcastError) {
        let previous = recording
        recording = try openFile(RecordingRetention.nextPath(segments.pathTemplate, after: previous.path, manifest: manifest))
        segmentStart = dts
        join.restart(at: dts)
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
        output.status.clearError()
        output.status.set(.recording)
        logger.notice("recording \(output.name): writing again, in \(recording.path)")
        return true
    }
}

/// Segment names and the deletion of old segments.
public enum RecordingRetention {
    /// strftime(3) of `template` now, in local time; "-2", "-3", ... added when that file exists
    /// or, with a `manifest`, when the name was ever given out in its directory: the number only
    /// goes up (`rec.mp4`, `rec-2.mp4`, `rec-3.mp4`, and after retention deleted them all,
    /// `rec-4.mp4`), so a name is used once, and an uploader keyed on names never overwrites what
    /// it uploaded before. The name taken is noted in the manifest.
    public static func nextPath(_ template: String, after previous: String = "", manifest: RecordingManifest? = nil) -> String {
        let base = expand(template)
        var number = (manifest?.usedNumbers()[base] ?? 0) + 1
        while true {
            let candidate = numbered(base, number)
            if candidate != previous && access(candidate, F_OK) != 0 {
                manifest?.recordUsed(base, number: number)
                return candidate
            }
            number += 1
        }
    }

    /// `path` with `-number` before its extension; `path` itself for 1.
    static func numbered(_ path: String, _ number: Int) -> String {
        guard number > 1 else { return path }
        let name = path.lastIndex(of: "/").map { path.index(after: $0) } ?? path.startIndex
        let dot = path[name...].lastIndex(of: ".") ?? path.endIndex
        return "\(path[..<dot])-\(number)\(path[dot...])"
    }

    /// The name and number `numbered` made `path` from, when it has a `-N` (N ≥ 2) before its extension.
    static func unnumbered(_ path: String) -> (base: String, number: Int)? {
        let name = path.lastIndex(of: "/").map { path.index(after: $0) } ?? path.startIndex
        let dot = path[name...].lastIndex(of: ".") ?? path.endIndex
        guard let dash = path[name..<dot].lastIndex(of: "-") else { return nil }
        let digits = path[path.index(after: dash)..<dot]
        guard !digits.isEmpty, digits.first != "0", digits.allSatisfy({ $0.isASCII && $0.isNumber }),
            let number = Int(digits), number >= 2
        else { return nil }
        return (String(path[..<dash]) + String(path[dot...]), number)
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

    /// The finished files of `template` that output `owner` wrote: listed in `manifest` under its
    /// name, and named as the template names files (exactly, or with a number the manifest says
    /// was given out). Oldest first. Never a file only because it is in the directory, never
    /// another output's.
    static func segments(
        of template: String, owner: String, manifest: RecordingManifest
    ) -> [(path: String, modified: Int, bytes: Int64)] {
        let used = manifest.usedNumbers()
        var found: [(path: String, modified: Int, bytes: Int64)] = []
        for entry in manifest.entries()
        where entry.owner == owner && RecordingTemplate.isNamed(by: template, path: entry.path, used: used) {
            var info = stat()
            guard lstat(entry.path, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { continue }
            found.append((entry.path, info.st_mtim.tv_sec, Int64(info.st_size)))
        }
        return found.sorted { ($0.modified, $0.path) < ($1.modified, $1.path) }
    }

    /// Deletes finished segments older than the retention age, then the oldest while the total
    /// exceeds the size limit. Only files output `owner` wrote (see `segments(of:owner:manifest:)`);
    /// never the file being written, nor any file a process has open (another output's recording,
    /// an uploader reading it: left for a later pass). Without a manifest nothing is deleted.
    static func apply(
        _ policy: RecordingSegments, owner: String, keeping current: String, manifest: RecordingManifest?, logger: Logger
    ) {
        guard policy.retainSeconds != nil || policy.retainBytes != nil else { return }
        guard let manifest else { return }
        var files = segments(of: policy.pathTemplate, owner: owner, manifest: manifest)
        var open = Set(OpenFiles.holders(of: files.map(\.path), includingThisProcess: true).keys)
        open.insert(current)
        let now = time(nil)
        if let age = policy.retainSeconds {
            for file in files where !open.contains(file.path) && now - file.modified > age {
                if unlink(file.path) == 0 {
                    manifest.recordDeleted(file.path)
                    logger.notice("retention: deleted \(file.path) (older than \(age) s)")
                }
            }
            files = segments(of: policy.pathTemplate, owner: owner, manifest: manifest)
        }
        if let limit = policy.retainBytes {
            var total = files.reduce(0) { $0 + $1.bytes }
            for file in files where total > limit && !open.contains(file.path) {
                if unlink(file.path) == 0 {
                    manifest.recordDeleted(file.path)
                    total -= file.bytes
                    logger.notice("retention: deleted \(file.path) (recordings over \(limit) bytes)")
                }
            }
        }
    }
}
