import Atomics
public import BroadcastKit
import BroadcastMedia
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// How the microphone and the application audio become audio tracks.
public enum AudioTrackMode: String, Sendable, Hashable, CaseIterable {
    /// One track: the two sources mixed (what the built-in handler always did).
    case mixed
    /// One track per source present ("Microphone", "Desktop audio"), no mix (an output that
    /// carries a single audio track, FLV, still gets a mix).
    case separate
    /// The mix first, then a track per source.
    case both
}

/// One audio source's level: a volume in decibels (0: as captured) and a mute.
public struct AudioLevel: Sendable, Hashable {
    public var volumeDecibels: Double
    public var muted: Bool

    public init(volumeDecibels: Double = 0, muted: Bool = false) {
        self.volumeDecibels = volumeDecibels
        self.muted = muted
    }

    /// The factor the samples are multiplied by.
    public var gain: Float { muted ? 0 : Float(pow(10, volumeDecibels / 20)) }
}

/// The audio sources' volumes and mutes, set from any thread (the control API, a reload) and read
/// by the encoding handler on the session's thread at every audio buffer: one atomic reference per
/// source to an immutable level with its gain, replaced whole by compare-and-exchange, so a mute
/// and a reload at once never lose one of the two, and the gain applied is always the one of the
/// level reported. A change applies from the next buffer of that source, i.e. within one audio
/// period, with no lock and no allocation on the media path (a load and a retain).
public final class AudioSourceControl: Sendable {
    /// A level and the factor it multiplies by (0 when muted), never changed once made.
    final class Setting: AtomicReference, Sendable {
        let level: AudioLevel
        let gain: Float

        init(_ level: AudioLevel) {
            self.level = level
            gain = level.gain
        }
    }

    /// `.audioMic`, `.audioApp`.
    private let settings: [ManagedAtomic<Setting>]

    public init(_ levels: [SampleBufferType: AudioLevel] = [:]) {
        settings = [levels[.audioMic] ?? AudioLevel(), levels[.audioApp] ?? AudioLevel()].map { ManagedAtomic(Setting($0)) }
    }

    private static func slot(_ type: SampleBufferType) -> Int { type == .audioApp ? 1 : 0 }

    /// The level of `type` as last set.
    public func level(of type: SampleBufferType) -> AudioLevel {
        settings[Self.slot(type)].load(ordering: .acquiring).level
    }

    /// Changes the level of `type` by `change`, applied to the level as it stands: a change made
    /// meanwhile from another thread is not overwritten but taken in (the exchange is tried again
    /// on the newer level). Returns whether the level changed.
    @discardableResult
    public func update(_ type: SampleBufferType, _ change: (inout AudioLevel) -> Void) -> Bool {
        let slot = settings[Self.slot(type)]
        var current = slot.load(ordering: .acquiring)
        while true {
            var level = current.level
            change(&level)
            if level == current.level { return false }
            let (exchanged, found) = slot.compareExchange(
                expected: current, desired: Setting(level), ordering: .acquiringAndReleasing)
            if exchanged { return true }
            current = found
        }
    }

    /// Sets the level of `type`; the handler applies it from that source's next buffer.
    /// Returns whether the level changed.
    @discardableResult
    public func set(_ level: AudioLevel, of type: SampleBufferType) -> Bool {
        update(type) { $0 = level }
    }

    /// Mutes or unmutes `type`, keeping its volume as it stands. Returns whether that changed anything.
    @discardableResult
    public func setMuted(_ muted: Bool, of type: SampleBufferType) -> Bool {
        update(type) { $0.muted = muted }
    }

    /// Sets the volume of `type`, keeping its mute as it stands. Returns whether that changed anything.
    @discardableResult
    public func setVolume(_ decibels: Double, of type: SampleBufferType) -> Bool {
        update(type) { $0.volumeDecibels = decibels }
    }

    /// The factor for `type`'s samples now (session thread, per buffer: one atomic load).
    func gain(of type: SampleBufferType) -> Float {
        settings[Self.slot(type)].load(ordering: .acquiring).gain
    }
}

/// Which audio tracks the handler encodes, their stream indices, and which of them each output
/// carries: worked out once at the start from the mode, the sources present and the outputs.
struct AudioTrackLayout: Sendable {
    enum Track: Sendable, Hashable {
        case mix
        case source(SampleBufferType)

        /// The track's title in the containers that carry one.
        func title(alone: Bool) -> String? {
            switch self {
            case .mix: alone ? nil : "Mix"
            case .source(.audioApp): "Desktop audio"
            case .source: "Microphone"
            }
        }
    }

    /// The tracks in stream order (after video): the mix first when there is one, then each source;
    /// under `separate`, a mix a reload's one-track output asked for comes after them (`addMix`).
    private(set) var tracks: [Track]

    init(mode: AudioTrackMode, sources: [SampleBufferType], singleTrackOutputs: Bool) {
        let sources = [SampleBufferType.audioMic, .audioApp].filter { sources.contains($0) }
        var tracks: [Track] = []
        // `separate` still encodes the mix when an output carries one audio track only (FLV).
        if mode != .separate || singleTrackOutputs || sources.isEmpty { tracks.append(.mix) }
        if mode != .mixed { tracks += sources.map(Track.source) }
        self.tracks = tracks
    }

    /// The tracks `configuration` asks for.
    init(_ configuration: EncodingConfiguration) {
        self.init(
            mode: configuration.audioTracks, sources: configuration.audioSources,
            singleTrackOutputs: configuration.allOutputs.contains {
                Self.formatName(of: $0.destination).map(Self.carriesOneAudioTrack) ?? false
            })
    }

    var hasMix: Bool { mixIndex != nil }

    /// The mix's place among the tracks, when there is one.
    var mixIndex: Int? { tracks.firstIndex(of: .mix) }

    /// Adds the mix after the source tracks (`separate`, once an output that carries one audio
    /// track joins a running broadcast); returns its index.
    mutating func addMix() -> Int {
        if let mixIndex { return mixIndex }
        tracks.append(.mix)
        return tracks.count - 1
    }

    /// Whether an output in `formatName` (libavformat's muxer name) holds one audio track only.
    static func carriesOneAudioTrack(formatName: String) -> Bool { formatName == "flv" }

    /// The libavformat muxer an output writes, when it can be told.
    static func formatName(of destination: OutputDestination) -> String? {
        switch destination {
        case .file(let path): try? Recording.container(for: path).formatName
        case .live(let url): url.scheme.formatName
        }
    }

    /// Of `tracks` (in stream order from `firstIndex`), those an output in `formatName` carries:
    /// a one-track container the mix (the first track when there is no mix); any other every
    /// track, but not a mix that `separate` encodes only for one-track outputs.
    func carried(by formatName: String?, mode: AudioTrackMode) -> [Int] {
        guard !tracks.isEmpty else { return [] }
        if let formatName, Self.carriesOneAudioTrack(formatName: formatName) { return [mixIndex ?? 0] }
        if mode == .separate, let mixIndex, tracks.count > 1 { return tracks.indices.filter { $0 != mixIndex } }
        return Array(tracks.indices)
    }
}

/// One source's own track: its samples kept on their timestamps (an `AudioMixer` of one input,
/// which absorbs timestamp jitter and fills gaps) and encoded by an encoder of its own.
final class SourceTrack {
    let type: SampleBufferType
    let aligner: AudioMixer
    let encoder: AudioEncoder

    init(type: SampleBufferType, encoder: AudioEncoder) {
        self.type = type
        self.encoder = encoder
        aligner = AudioMixer(
            channelCount: encoder.settings.channels, sampleRate: encoder.settings.sampleRate, expectedInputs: 1)
    }
}

/// The audio tracks' titles in stream order, published whole (any thread reads them).
final class TrackTitles: AtomicReference, Sendable {
    let titles: [String]
    init(_ titles: [String]) { self.titles = titles }
}

extension AudioTrackLayout {
    /// Each track's title as a meter or a page names it ("Mix", "Microphone", "Desktop audio").
    var titles: [String] { tracks.map { $0.title(alone: false) ?? "Mix" } }
}

/// A track encoded again at an output's own audio bitrate (`OutputConfiguration.audioBitrate`):
/// the same samples as the broadcast's encode of the track, another encoder, a stream of its own.
final class ExtraAudioEncode {
    /// The track's place in `AudioTrackLayout.tracks`.
    let track: Int
    let bitrate: Int
    let encoder: AudioEncoder
    /// With its stream index: what the outputs taking this encode are opened with.
    let stream: StreamDescription

    init(track: Int, bitrate: Int, encoder: AudioEncoder, stream: StreamDescription) {
        self.track = track
        self.bitrate = bitrate
        self.encoder = encoder
        self.stream = stream
    }
}

extension EncodingConfiguration {
    /// How many audio tracks the handler encodes (0 without audio): what the queues are sized for.
    public var audioTrackCount: Int {
        guard audio != nil else { return 0 }
        return AudioTrackLayout(self).tracks.count
    }
}
