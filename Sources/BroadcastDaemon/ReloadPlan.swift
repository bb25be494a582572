import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import BroadcastService

/// What a reload does to a running broadcast, worked out from the config it ran with, the new one
/// and what runs now, and nothing else: no device, no session, no lock (ReloadPlanTests). The
/// controller applies it (`BroadcastController.reloadAlone`): the output set goes to the session's
/// thread, the levels and offsets to their atomics, the sources to their swap.
struct ReloadPlan {
    /// What runs now, as the planner needs it.
    struct Running {
        /// Each running output's configuration, by name.
        var outputs: [String: OutputConfiguration]
        /// The config entries the running outputs were made from.
        var definitions: [String: DaemonConfiguration.Output]
        /// The running picture an output's own encode is made from (nil without video).
        var video: VideoEncoderSettings?
        /// Sizes an output's queues like the running ones (`MemoryPlan.sized`).
        var size: (OutputConfiguration, _ replayLimitSet: Bool) -> OutputConfiguration = { output, _ in output }
    }

    /// The output set asked of the session, in the new config's order: an unchanged output keeps
    /// its configuration (a recording keeps the file it writes), a changed or new one its new one.
    var desired: [OutputConfiguration] = []
    /// Outputs whose new entry cannot be made: `kept` on their old settings, or `failed` (not added).
    var unmade: [OutputChange] = []
    /// The running encode's keys the new config changed: they wait for the next start (the
    /// answer's `next_start`), each said in words.
    var nextStart: [String] = []
    /// The audio sources whose volume or mute changed, with what changed (applied now).
    var levels: [(type: SampleBufferType, volume: Double?, muted: Bool?)] = []
    /// The sources whose sync offset changed, with the new offset in nanoseconds (applied now).
    var offsets: [(type: SampleBufferType, nanoseconds: Int64)] = []

    init(previous: DaemonConfiguration, fresh: DaemonConfiguration, running: Running) {
        for entry in fresh.outputs {
            let current = running.outputs[entry.name]
            if let before = running.definitions[entry.name], Self.sameDefinition(before, entry), let current {
                desired.append(current)
                continue
            }
            do {
                // Sized like the others; not counted against the budget until the next start.
                desired += try BroadcastController.outputConfigurations([entry]).map { output in
                    var output = running.size(output, entry.maxMemory != nil)
                    // An encode of its own, from the running picture: refused here (the output kept
                    // or not added) when it cannot be made from it (larger than the picture).
                    output.audioBitrate = entry.encode?.audioBitrate
                    if let encode = entry.encode, let video = running.video {
                        try EncoderSettings.apply(
                            encode, to: &output, picture: VideoSize(width: video.width, height: video.height), frameRate: video.frameRate,
                            colour: video.colour)
                    }
                    return output
                }
            } catch {
                let reason = (error as? BroadcastError)?.message ?? "\(error)"
                if let current {
                    desired.append(current)
                    unmade.append(OutputChange(name: entry.name, result: .kept, reason: reason))
                } else {
                    unmade.append(OutputChange(name: entry.name, result: .failed, reason: reason))
                }
            }
        }
        // The running encode keeps its settings (its tracks, bitrate, preset ...): a changed
        // [encoder] key waits for the next start, and the answer says so. [audio] mic_denoise too:
        // the suppressor is made with the encode (its state allocated at the start, none on the
        // audio path), so a running broadcast keeps it on or off.
        nextStart = previous.encoder.changedKeys(to: fresh.encoder).map {
            $0.hasPrefix("audio.")
                ? "[\($0.replacing("audio.", with: "audio] ", maxReplacements: 1)): the running broadcast keeps its microphone's noise suppression as it started; this applies at the next start"
                : "[\($0.replacing("encoder.", with: "encoder] ", maxReplacements: 1)): the running encode keeps its settings; this applies at the next start"
        }
        // Only what the reload changed: a mute the control API set meanwhile stays when the reload
        // changed the volume alone (and the other way round).
        for (type, level, before) in [
            (SampleBufferType.audioMic, fresh.encoder.micLevel, previous.encoder.micLevel),
            (.audioApp, fresh.encoder.appLevel, previous.encoder.appLevel),
        ] where level != before {
            levels.append((
                type, level.volumeDecibels != before.volumeDecibels ? level.volumeDecibels : nil,
                level.muted != before.muted ? level.muted : nil
            ))
        }
        let was = previous.encoder.offsets, now = fresh.encoder.offsets
        for (type, value, before) in [
            (SampleBufferType.audioMic, now.mic, was.mic), (.audioApp, now.app, was.app), (.video, now.video, was.video),
        ] where value != before {
            offsets.append((type, value))
        }
    }

    /// Whether two config entries describe the same output (their lines may differ).
    static func sameDefinition(_ a: DaemonConfiguration.Output, _ b: DaemonConfiguration.Output) -> Bool {
        let sameKind: Bool
        switch (a.kind, b.kind) {
        case (.recording(let x), .recording(let y)), (.live(let x), .live(let y)): sameKind = x == y
        default: sameKind = false
        }
        return sameKind && a.name == b.name && a.segment == b.segment && a.retainFor == b.retainFor
            && a.retainBytes == b.retainBytes && a.overwrite == b.overwrite && BroadcastController.sameReplayKeys(a, b)
            && a.tls == b.tls && a.encode == b.encode
    }
}
