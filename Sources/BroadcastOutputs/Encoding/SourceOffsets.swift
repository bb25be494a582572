import Atomics
public import BroadcastKit

/// Each source's sync offset in nanoseconds: positive delays the source (its buffers are stamped
/// that much later), negative makes it early. From -2 s to +2 s (`Values.offset`).
public struct SourceOffsets: Sendable, Hashable {
    public var video: Int64 = 0
    public var mic: Int64 = 0
    public var app: Int64 = 0

    public init(video: Int64 = 0, mic: Int64 = 0, app: Int64 = 0) {
        self.video = video
        self.mic = mic
        self.app = app
    }

    public subscript(type: SampleBufferType) -> Int64 {
        get {
            switch type {
            case .video: video
            case .audioMic: mic
            case .audioApp: app
            }
        }
        set {
            switch type {
            case .video: video = newValue
            case .audioMic: mic = newValue
            case .audioApp: app = newValue
            }
        }
    }

    public var isZero: Bool { video == 0 && mic == 0 && app == 0 }
}

/// The sources' sync offsets, set from any thread (the control API, a reload) and read by the
/// encoding handler on the session's thread at every buffer: one atomic integer per source, one
/// relaxed load per buffer, no lock. A change applies from that source's next buffer.
public final class SourceOffsetControl: Sendable {
    private let video: ManagedAtomic<Int64>
    private let mic: ManagedAtomic<Int64>
    private let app: ManagedAtomic<Int64>

    public init(_ offsets: SourceOffsets = SourceOffsets()) {
        video = ManagedAtomic(offsets.video)
        mic = ManagedAtomic(offsets.mic)
        app = ManagedAtomic(offsets.app)
    }

    private func slot(_ type: SampleBufferType) -> ManagedAtomic<Int64> {
        switch type {
        case .video: video
        case .audioMic: mic
        case .audioApp: app
        }
    }

    /// The offset of `type` now, in nanoseconds.
    public func offset(of type: SampleBufferType) -> Int64 { slot(type).load(ordering: .relaxed) }

    /// All three as they stand.
    public var offsets: SourceOffsets {
        SourceOffsets(video: offset(of: .video), mic: offset(of: .audioMic), app: offset(of: .audioApp))
    }

    /// Sets the offset of `type`; returns whether it changed.
    @discardableResult
    public func set(_ nanoseconds: Int64, of type: SampleBufferType) -> Bool {
        slot(type).exchange(nanoseconds, ordering: .relaxed) != nanoseconds
    }
}
