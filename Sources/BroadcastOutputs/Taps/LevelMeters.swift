import Atomics
public import BroadcastKit
public import BroadcastMedia

#if canImport(Glibc)
import Glibc
#endif

/// Audio levels for the control page's meters: peak and RMS in dBFS per audio source and per output
/// track, over each period (100 ms).
///
/// The session thread only copies the samples it delivers into a byte ring per meter (preallocated,
/// one producer, one consumer, no lock, no allocation; a chunk that does not fit is left out and
/// counted). A thread of its own (`bc-levels`) drains the rings every period, measures, and hands
/// the levels to `publish` once a period (empty when no audio came; the daemon's page feed uses
/// the call as its clock too).
public final class LevelMeters: @unchecked Sendable {
    /// One meter's level over a period.
    public struct Level: Sendable, Equatable {
        /// `audioMic`, `audioApp` (a source) or `track1`, ... (an output track).
        public var name: String
        /// dBFS of the largest sample (0: full scale); at least `floor`.
        public var peak: Double
        /// dBFS of the root mean square.
        public var rms: Double
    }

    public static let period: Duration = .milliseconds(100)
    /// What silence reads as (digital zero has no logarithm).
    public static let floor = -120.0
    /// Each ring holds about 0.7 s of 48 kHz stereo float (the meters' thread drains it every
    /// 100 ms). Its pages become resident only once written: rings of tracks or sources a
    /// broadcast does not have cost address space only.
    static let ringBytes = 1 << 18

    private let sources: [SampleBufferType: ByteRing]
    private let tracks: [ByteRing]
    private let publish: @Sendable ([Level]) -> Void
    private let running = ManagedAtomic<Bool>(true)
    private var thread: OSThread?
    /// Every ring, sources' then tracks'.
    var rings: [ByteRing] { SampleBufferType.allCases.compactMap { sources[$0] } + tracks }
    /// Chunks the meter thread had no room for (it fell behind by a second).
    public var chunksLeftOut: Int { (sources.values.map(\.leftOut) + tracks.map(\.leftOut)).reduce(0) { $0 + $1.load(ordering: .relaxed) } }

    /// `trackCount` output tracks; `publish` runs on the meters' thread, once a period.
    public init(trackCount: Int = 1, publish: @escaping @Sendable ([Level]) -> Void) {
        var sources: [SampleBufferType: ByteRing] = [:]
        for type in SampleBufferType.allCases where type.isAudio { sources[type] = ByteRing(capacity: Self.ringBytes) }
        self.sources = sources
        self.tracks = (0..<max(trackCount, 0)).map { _ in ByteRing(capacity: Self.ringBytes) }
        self.publish = publish
    }

    /// Starts the meters' thread.
    public func start() {
        let thread = OSThread(name: "bc-levels") { [self] in run() }
        self.thread = thread
    }

    /// Ends the thread (the rings' last samples are not measured).
    public func stop() {
        running.store(false, ordering: .relaxed)
        thread?.join()
        thread = nil
    }

    // MARK: Session thread

    /// A source's audio as the session delivers it: copied into the source's ring.
    public func offer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) {
        guard let ring = sources[type], let format = buffer.audioFormat, buffer.frameCount > 0 else { return }
        let planes = buffer.planes
        var total = 0
        for plane in planes { total += plane.count }
        let header = ChunkHeader(
            bytes: total, format: format.sampleFormat.code, channels: format.channels, planes: planes.count)
        ring.write(header) { write in
            for plane in planes { write(plane.base, plane.count) }
        }
    }

    /// An output track's mixed audio (planar float), as the encoder is given it: copied into its ring.
    public func offer(track index: Int, _ audio: PlanarAudio) {
        guard tracks.indices.contains(index), audio.frameCount > 0 else { return }
        let bytes = audio.frameCount * MemoryLayout<Float>.size
        let header = ChunkHeader(
            bytes: bytes * audio.channelCount, format: AudioSampleFormat.f32Planar.code, channels: audio.channelCount,
            planes: audio.channelCount)
        tracks[index].write(header) { write in
            for c in 0..<audio.channelCount { write(UnsafeRawPointer(audio.channel(c).baseAddress!), bytes) }
        }
    }

    // MARK: The meters' thread

    private func run() {
        let clock = MonotonicClock()
        let periodNanoseconds = Int64(Self.period.components.seconds) * 1_000_000_000 + Self.period.components.attoseconds / 1_000_000_000
        var next = clock.now() + periodNanoseconds
        var scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.ringBytes, alignment: 16)
        defer { scratch.deallocate() }
        var levels: [Level] = []
        while running.load(ordering: .relaxed) {
            MonotonicClock.sleep(until: next)
            next += periodNanoseconds
            if clock.now() > next { next = clock.now() + periodNanoseconds }
            levels.removeAll(keepingCapacity: true)
            for type in SampleBufferType.allCases where type.isAudio {
                if let level = sources[type].flatMap({ Self.measure($0, scratch: &scratch) }) {
                    levels.append(Level(name: type.rawValue, peak: level.peak, rms: level.rms))
                }
            }
            for (index, ring) in tracks.enumerated() {
                if let level = Self.measure(ring, scratch: &scratch) {
                    levels.append(Level(name: "track\(index + 1)", peak: level.peak, rms: level.rms))
                }
            }
            publish(levels)
        }
    }

    /// Peak and RMS (dBFS) of everything in `ring`; nil when it is empty.
    static func measure(_ ring: ByteRing, scratch: inout UnsafeMutableRawBufferPointer) -> (peak: Double, rms: Double)? {
        var meter = Meter()
        while let header = ring.read(into: scratch) {
            meter.add(UnsafeRawBufferPointer(rebasing: scratch[0..<header.bytes]), format: header.format)
        }
        return meter.count == 0 ? nil : meter.decibels
    }

    /// Peak and sum of squares of samples in [-1, 1].
    struct Meter {
        var peak: Float = 0
        var sumOfSquares: Double = 0
        var count = 0

        mutating func add(_ bytes: UnsafeRawBufferPointer, format code: UInt8) {
            switch AudioSampleFormat(code: code) {
            case .s16:
                for v in bytes.bindMemory(to: Int16.self) { add(Float(v) / 32768) }
            case .s32:
                for v in bytes.bindMemory(to: Int32.self) { add(Float(Double(v) / 2_147_483_648)) }
            case .f32, .f32Planar:
                for v in bytes.bindMemory(to: Float.self) { add(v) }
            case nil: return
            }
        }

        mutating func add(_ sample: Float) {
            let magnitude = abs(sample)
            if magnitude > peak { peak = magnitude }
            sumOfSquares += Double(sample) * Double(sample)
            count += 1
        }

        var decibels: (peak: Double, rms: Double) {
            func dB(_ amplitude: Double) -> Double { amplitude > 0 ? max(LevelMeters.floor, 20 * log10(amplitude)) : LevelMeters.floor }
            return (dB(Double(peak)), dB((sumOfSquares / Double(max(count, 1))).squareRoot()))
        }
    }
}

extension AudioSampleFormat {
    var code: UInt8 {
        switch self {
        case .s16: 1
        case .s32: 2
        case .f32: 3
        case .f32Planar: 4
        }
    }

    init?(code: UInt8) {
        switch code {
        case 1: self = .s16
        case 2: self = .s32
        case 3: self = .f32
        case 4: self = .f32Planar
        default: return nil
        }
    }
}

/// What a chunk in a `ByteRing` is: its payload's size and sample layout.
struct ChunkHeader {
    var bytes: Int
    var format: UInt8
    var channels: Int
    var planes: Int
    static let size = 16

    init(bytes: Int, format: UInt8, channels: Int, planes: Int) {
        self.bytes = bytes
        self.format = format
        self.channels = channels
        self.planes = planes
    }
}

/// A single-producer single-consumer ring of byte chunks over preallocated memory: the producer
/// copies a chunk in (or leaves it out when there is no room), the consumer copies chunks out.
/// Positions only grow; each side publishes its own with release and reads the other's with acquire.
final class ByteRing: @unchecked Sendable {
    let capacity: Int
    private let memory: UnsafeMutableRawPointer
    private let written = ManagedAtomic<Int>(0)
    private let read = ManagedAtomic<Int>(0)
    /// Chunks left out for want of room.
    let leftOut = ManagedAtomic<Int>(0)

    init(capacity: Int) {
        self.capacity = capacity
        memory = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 16)
    }

    deinit { memory.deallocate() }

    /// Producer: the header, then the payload that `body` writes through the function it is given.
    func write(_ header: ChunkHeader, _ body: ((UnsafeRawPointer, Int) -> Void) -> Void) {
        let position = written.load(ordering: .relaxed)
        let free = capacity - (position - read.load(ordering: .acquiring))
        let size = ChunkHeader.size + header.bytes
        guard size <= free, header.bytes <= capacity / 2 else {
            leftOut.wrappingIncrement(ordering: .relaxed)
            return
        }
        var at = position
        var fields: (Int64, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (
            Int64(header.bytes), header.format, UInt8(clamping: header.channels), UInt8(clamping: header.planes), 0, 0, 0, 0, 0
        )
        withUnsafeBytes(of: &fields) { copyIn($0.baseAddress!, ChunkHeader.size, at: &at) }
        body { base, count in copyIn(base, count, at: &at) }
        written.store(position + size, ordering: .releasing)
    }

    private func copyIn(_ source: UnsafeRawPointer, _ count: Int, at position: inout Int) {
        let offset = position % capacity
        let first = min(count, capacity - offset)
        (memory + offset).copyMemory(from: source, byteCount: first)
        if first < count { memory.copyMemory(from: source + first, byteCount: count - first) }
        position += count
    }

    private func copyOut(_ destination: UnsafeMutableRawPointer, _ count: Int, at position: inout Int) {
        let offset = position % capacity
        let first = min(count, capacity - offset)
        destination.copyMemory(from: memory + offset, byteCount: first)
        if first < count { (destination + first).copyMemory(from: memory, byteCount: count - first) }
        position += count
    }

    /// Consumer: the next chunk's payload copied to the start of `scratch` (at least `capacity` bytes), or nil.
    func read(into scratch: UnsafeMutableRawBufferPointer) -> ChunkHeader? {
        let position = read.load(ordering: .relaxed)
        guard written.load(ordering: .acquiring) > position else { return nil }
        var at = position
        var fields: (Int64, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &fields) { copyOut($0.baseAddress!, ChunkHeader.size, at: &at) }
        let header = ChunkHeader(bytes: Int(fields.0), format: fields.1, channels: Int(fields.2), planes: Int(fields.3))
        copyOut(scratch.baseAddress!, header.bytes, at: &at)
        read.store(at, ordering: .releasing)
        return header
    }
}
