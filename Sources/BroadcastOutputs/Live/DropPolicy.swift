import BroadcastMedia

/// Why a live output did not send a packet.
public enum DropReason: Int, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// The backlog passed the drop threshold: disposable (non-reference) video frames went.
    case backlog
    /// The backlog passed the higher threshold: reference video frames went too (keyframes stay).
    case backlogReference
    /// After a drop, video frames until the next keyframe (they would not decode).
    case awaitingKeyframe
    /// Media while the output was not connected (connecting, reconnecting).
    case offline
    /// The queue from the encoder was full.
    case queueFull
    /// Media while the output was paused.
    case paused
    /// Media while a recording could not write (a full disk) and waited to go on in a new file.
    case writeFailed

    public var description: String {
        switch self {
        case .backlog: "backlog"
        case .backlogReference: "backlog-ref"
        case .awaitingKeyframe: "keyframe-wait"
        case .offline: "offline"
        case .queueFull: "queue-full"
        case .paused: "paused"
        case .writeFailed: "write-failed"
        }
    }
}

/// How much a video packet matters to the frames after it, OBS's drop priority.
enum DropPriority: Int, Comparable {
    /// A frame nothing refers to (an H.264 slice with nal_ref_idc 0, a non-reference B-frame).
    case disposable = 0
    /// A frame later frames predict from.
    case reference = 2
    /// A keyframe (IDR): decoding restarts here.
    case keyframe = 3

    static func < (a: DropPriority, b: DropPriority) -> Bool { a.rawValue < b.rawValue }

    /// The priority of an H.264 packet: its keyframe flag, else the nal_ref_idc of its first slice.
    /// Annex B (start codes, what libx264 writes) or length-prefixed (AVCC) payloads.
    static func of(_ packet: EncodedPacket) -> DropPriority {
        if packet.isKeyframe { return .keyframe }
        return packet.withUnsafeBytes { bytes in
            guard let referenceIDC = firstSliceReferenceIDC(bytes) else { return .reference }
            return referenceIDC == 0 ? .disposable : .reference
        }
    }

    /// nal_ref_idc of the first slice NAL unit (types 1–5), or nil when there is none.
    static func firstSliceReferenceIDC(_ bytes: UnsafeRawBufferPointer) -> UInt8? {
        let n = bytes.count
        if n >= 4, bytes[0] == 0, bytes[1] == 0, bytes[2] == 1 || (bytes[2] == 0 && bytes[3] == 1) {
            var i = 0
            while i + 3 < n {
                if bytes[i] == 0, bytes[i + 1] == 0, bytes[i + 2] == 1 {
                    let header = bytes[i + 3]
                    if (1...5).contains(header & 0x1F) { return (header >> 5) & 3 }
                    i += 3
                } else {
                    i += 1
                }
            }
            return nil
        }
        var offset = 0
        while offset + 5 <= n {
            let length = Int(bytes[offset]) << 24 | Int(bytes[offset + 1]) << 16 | Int(bytes[offset + 2]) << 8
                | Int(bytes[offset + 3])
            let header = bytes[offset + 4]
            if (1...5).contains(header & 0x1F) { return (header >> 5) & 3 }
            guard length > 0 else { return nil }
            offset += 4 + length
        }
        return nil
    }
}

/// What the live output's queue and state machine need of a packet: `EncodedPacket` in the
/// output, a plain value in tests.
protocol LivePacket {
    var mediaType: MediaType { get }
    var isKeyframe: Bool { get }
    /// Decoding time in nanoseconds.
    var dtsNanoseconds: Int64 { get }
    /// How much the frames after it need it (video).
    var dropPriority: DropPriority { get }
}

extension EncodedPacket: LivePacket {
    var dropPriority: DropPriority { DropPriority.of(self) }
}

/// A live output's queue of packets waiting to be sent, with OBS's drop policy
/// (plugins/obs-outputs/rtmp-stream.c, check_to_drop_frames): when the media waiting in the queue
/// spans more than `threshold`, disposable video frames in it are dropped; past
/// `referenceThreshold`, every video frame but keyframes. Audio and keyframes are never dropped.
/// After a drop, later video frames below the dropped priority are dropped too until one at that
/// priority comes (so after dropping reference frames, the stream resumes on a keyframe).
///
/// Pure state: the output's thread owns it; tests drive it with packets.
struct SendQueue<Packet: LivePacket> {
    let threshold: Int64
    let referenceThreshold: Int64
    /// Fewer packets than this are never thinned (OBS: 5).
    let minimumPackets = 5

    private(set) var packets: [Packet] = []
    private var head = 0
    /// dts (ns) of the newest packet added.
    private(set) var newestDTS: Int64 = 0
    /// Video below this priority is dropped as it arrives (set by a drop, cleared when a frame at
    /// the priority arrives).
    private var minimumPriority: DropPriority?
    /// Do not drop again until the front of the queue is past what the last drop saw.
    /// Kept per check (disposable, reference): a disposable drop must not hold off the reference
    /// check, or a stream with disposable frames (B-frames) is never thinned past 900 ms.
    /// nil: no drop since the queue was last emptied.
    private var minimumDropDTS: (disposable: Int64?, reference: Int64?) = (nil, nil)

    init(threshold: Double, referenceThreshold: Double) {
        self.threshold = Int64(threshold * 1e9)
        self.referenceThreshold = Int64(referenceThreshold * 1e9)
    }

    var count: Int { packets.count - head }
    /// The packets waiting, oldest first.
    var waiting: ArraySlice<Packet> { packets[head...] }
    var isEmpty: Bool { count == 0 }
    var first: Packet? { isEmpty ? nil : packets[head] }

    /// Media time waiting to be sent, in nanoseconds.
    var backlog: Int64 {
        guard let first else { return 0 }
        return max(0, newestDTS - first.dtsNanoseconds)
    }

    mutating func popFirst() -> Packet? {
        guard !isEmpty else { return nil }
        let packet = packets[head]
        head += 1
        if head >= 1024, head * 2 >= packets.count {
            packets.removeFirst(head)
            head = 0
        }
        return packet
    }

    /// Empties the queue; returns how many packets it held.
    @discardableResult
    mutating func removeAll() -> Int {
        let n = count
        packets.removeAll(keepingCapacity: true)
        head = 0
        minimumPriority = nil
        minimumDropDTS = (nil, nil)
        return n
    }

    /// Adds `packet` without applying the policy (while not connected: nothing is being sent).
    mutating func append(_ packet: Packet) {
        newestDTS = max(newestDTS, packet.dtsNanoseconds)
        packets.append(packet)
    }

    /// Adds `packet` or drops it (and maybe queued ones); calls `dropped` once per packet dropped.
    mutating func add(_ packet: Packet, dropped: (DropReason) -> Void) {
        newestDTS = max(newestDTS, packet.dtsNanoseconds)
        guard packet.mediaType == .video else {
            packets.append(packet)
            return
        }
        checkToDrop(referenceFrames: false, dropped: dropped)
        checkToDrop(referenceFrames: true, dropped: dropped)
        let priority = packet.dropPriority
        if let minimum = minimumPriority {
            if priority < minimum {
                dropped(.awaitingKeyframe)
                return
            }
            minimumPriority = nil
        }
        packets.append(packet)
    }

    private mutating func checkToDrop(referenceFrames: Bool, dropped: (DropReason) -> Void) {
        guard count >= minimumPackets, let first else { return }
        // Once per backlog the front has not moved past, unless another threshold's worth of media
        // came since the last drop: a connection that takes nothing (a stalled server) keeps
        // being thinned instead of queueing every reference frame from then on.
        let lastDrop = referenceFrames ? minimumDropDTS.reference : minimumDropDTS.disposable
        if let lastDrop, first.dtsNanoseconds < lastDrop, newestDTS - lastDrop <= referenceThreshold { return }
        let limit = referenceFrames ? referenceThreshold : threshold
        guard newestDTS - first.dtsNanoseconds > limit else { return }
        let keep: DropPriority = referenceFrames ? .keyframe : .reference
        // Compacted in place: what is kept moves forward over what is dropped.
        var kept = head
        var count = 0
        for index in head..<packets.count {
            let p = packets[index]
            if p.mediaType == .video, p.dropPriority < keep {
                dropped(referenceFrames ? .backlogReference : .backlog)
                count += 1
            } else {
                packets[kept] = p
                kept += 1
            }
        }
        packets.removeSubrange(kept...)
        if minimumPriority.map({ $0 < keep }) ?? true { minimumPriority = keep }
        // Only a drop that removed something holds off the next check: with no disposable frames
        // (x264's zerolatency has none), the reference check must still run.
        // A reference drop took the disposable frames too, so it holds off both checks; a disposable
        // drop holds off only its own.
        if count > 0 {
            minimumDropDTS.disposable = newestDTS
            if referenceFrames { minimumDropDTS.reference = newestDTS }
        }
    }
}

extension EncodedPacket {
    /// Decoding time in nanoseconds.
    var dtsNanoseconds: Int64 { Int64((decodingSeconds * 1e9).rounded()) }
    /// Duration in nanoseconds (0 when the encoder gave none).
    var durationNanoseconds: Int64 {
        Int64((Double(duration) * timeBase.doubleValue * 1e9).rounded())
    }
}
