import Atomics
public import BroadcastKit
public import BroadcastMedia

/// Whether video frames go out at every tick of the frame rate or only when the picture changed.
public enum FrameRateMode: String, Sendable, Hashable, CaseIterable {
    /// Constant: a frame every tick, repeats included (what live platforms expect).
    case cfr
    /// Variable, for files: a frame when the picture changed (``SampleBuffer/changedRegions`` not
    /// empty), and at least one every keyframe interval, which is a keyframe, so seeking works.
    case vfr
}

/// What the built-in handler encodes and where it writes it.
public struct EncodingConfiguration: Sendable {
    /// nil: no video stream.
    public var video: VideoEncoderSettings?
    /// nil: no audio stream. The settings of every audio track (`audioTracks`: the mix of the
    /// microphone and application audio, a track per source, or both).
    public var audio: AudioEncoderSettings?
    /// Files to record into, at the broadcast's own settings (the encode they share).
    public var recordings: [String]
    /// More outputs (live streams, files with a name): each gets the packets of the broadcast's
    /// encode, or of an encode of its own quality (`OutputConfiguration.video`) that the outputs
    /// asking the same settings share.
    public var outputs: [OutputConfiguration]
    /// cfr unless set; vfr is refused with a live output.
    public var frameRateMode: FrameRateMode = .cfr
    /// WebRTC for whip+https:// outputs (BroadcastWebRTC's `GStreamerWebRTC`); nil: refused.
    public var webRTC: (any WebRTCEngine)? = nil
    /// One mixed audio track (the default), one per source, or both (see `AudioTrackMode`).
    public var audioTracks: AudioTrackMode = .mixed
    /// The audio sources the broadcast has (a track each in `separate` and `both`).
    public var audioSources: [SampleBufferType] = [.audioMic, .audioApp]
    /// Each audio source's volume and mute at the start (`EncodingHandler.audioControl` changes them).
    public var audioLevels: [SampleBufferType: AudioLevel] = [:]
    /// The microphone's samples go through noise suppression (`NoiseSuppressor`) before its track
    /// and the mix. Only with a microphone among `audioSources` (`validate` refuses it otherwise).
    public var micDenoise = false
    /// Each source's sync offset at the start (`EncodingHandler.offsetControl` changes them).
    public var sourceOffsets = SourceOffsets()

    public init(
        video: VideoEncoderSettings?,
        audio: AudioEncoderSettings? = AudioEncoderSettings(),
        recordings: [String],
        outputs: [OutputConfiguration] = []
    ) {
        self.video = video
        self.audio = audio
        self.recordings = recordings
        self.outputs = outputs
    }

    /// Every output: the recordings (named by their path), then `outputs`.
    public var allOutputs: [OutputConfiguration] {
        recordings.map { OutputConfiguration(destination: .file($0)) } + outputs
    }

    /// Checks everything that can be checked before a broadcast starts: encoder settings and
    /// recording paths. Creates nothing.
    public func validate() throws(BroadcastError) {
        if video == nil, audio == nil {
            throw BroadcastError(.invalidArgument, "nothing to encode: neither video nor audio is configured")
        }
        if let problem = video?.problem() { throw BroadcastError(.invalidArgument, "video: \(problem)") }
        if micDenoise, audio == nil || !audioSources.contains(.audioMic) {
            throw BroadcastError(.invalidArgument, "noise suppression is for the microphone, and this broadcast has none")
        }
        if frameRateMode == .vfr, let live = allOutputs.first(where: { $0.destination.isLive }) {
            throw BroadcastError(
                .invalidArgument,
                "frame rate mode vfr is for files only: the live output \(live.destination) needs a constant frame rate (cfr)")
        }
        for output in allOutputs {
            if let problem = webRTCProblem(output) { throw BroadcastError(.invalidArgument, problem) }
            if case .file(let path) = output.destination {
                guard output.replay != nil else {
                    try Recording.validate(path: path, overwrite: output.overwrite)
                    continue
                }
                // A replay's path is a strftime template: check what it gives now, unless its
                // directories have conversions too (each save makes them): then the container.
                let now = RecordingRetention.expand(path)
                if Recording.directory(of: now) == RecordingTemplate.baseDirectory(of: path) {
                    try Recording.validate(path: now, overwrite: output.overwrite)
                } else {
                    _ = try Recording.container(for: now)
                }
            }
        }
        try OutputConfiguration.checkDistinctFiles(allOutputs)
    }

    /// Why a WHIP output cannot take this encode, or nil (also nil for other outputs): plain
    /// http:// goes to this machine only unless allowed; WebRTC needs H.264 without B-frames (zerolatency) and 48 kHz audio for Opus.
    func webRTCProblem(_ output: OutputConfiguration) -> String? {
        guard case .live(let url) = output.destination, url.scheme.isWHIP else { return nil }
        if let problem = url.plainHTTPProblem, !output.live.allowPlainHTTP { return problem }
        if webRTC == nil { return "\(url.redacted): this build has no WebRTC (GStreamer's webrtcbin) for WHIP outputs" }
        if let video {
            if !video.encoder.contains("264") { return "\(url.redacted): WHIP sends H.264, not \(video.encoder)" }
            if video.tune != "zerolatency" {
                return "\(url.redacted): WebRTC takes no B-frames: the encoder needs --tune zerolatency (the default), not \(video.tune ?? "none")"
            }
        }
        if audio != nil, audioTracks == .separate {
            return "\(url.redacted): WHIP sends the mix (in Opus): --audio-tracks mixed or both, not separate"
        }
        if let audio, audio.sampleRate != 48_000 {
            return "\(url.redacted): WebRTC's Opus audio needs 48 kHz, not \(audio.sampleRate) Hz"
        }
        return nil
    }
}

/// A snapshot of what the encoding handler has done.
public struct EncodingStatistics: Sendable, Hashable {
    public var videoFramesEncoded = 0
    public var audioFramesEncoded = 0
    public var keyframesEncoded = 0
    /// Bytes written to all recordings together.
    public var bytesWritten: Int64 = 0
    /// Encoded bits per second (all streams) over the last second of media time.
    public var bitrate = 0
    /// Recordings that failed and were dropped while the others went on.
    public var failedOutputs = 0
    /// Captured frames dropped because they did not decode (damaged MJPEG from a webcam).
    public var undecodableFrames = 0

    public init() {}
}

/// The encoding handler's counters: written on the session's thread, read from any (atomics only).
public final class EncodingCounters: Sendable {
    let videoFrames = ManagedAtomic<Int>(0)
    let audioFrames = ManagedAtomic<Int>(0)
    let keyframes = ManagedAtomic<Int>(0)
    let bytesWritten = ManagedAtomic<Int64>(0)
    let bitrate = ManagedAtomic<Int>(0)
    let failedOutputs = ManagedAtomic<Int>(0)
    let undecodableFrames = ManagedAtomic<Int>(0)

    public func snapshot() -> EncodingStatistics {
        var s = EncodingStatistics()
        s.videoFramesEncoded = videoFrames.load(ordering: .relaxed)
        s.audioFramesEncoded = audioFrames.load(ordering: .relaxed)
        s.keyframesEncoded = keyframes.load(ordering: .relaxed)
        s.bytesWritten = bytesWritten.load(ordering: .relaxed)
        s.bitrate = bitrate.load(ordering: .relaxed)
        s.failedOutputs = failedOutputs.load(ordering: .relaxed)
        s.undecodableFrames = undecodableFrames.load(ordering: .relaxed)
        return s
    }
}
