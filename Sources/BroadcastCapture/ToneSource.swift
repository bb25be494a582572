import Atomics
public import BroadcastKit

#if canImport(Glibc)
import Glibc
#endif

/// The built-in audio source: 48 kHz stereo, silent except a 50 ms 1 kHz beep starting at every
/// whole second of media time (the same instants as the test pattern's white frames).
///
/// Like a device it delivers a period once the period is over (realtime), or as fast as the session
/// takes them (non-realtime). Serves `.audioMic` and `.audioApp` alike.
public final class ToneSource: CaptureSource, @unchecked Sendable {
    public let sampleRate: Int
    public let channels: Int
    /// Frames in one delivered buffer: 480 = 10 ms at 48 kHz, a low-latency sound card's period.
    /// (A video frame waits for the audio period it falls in before the session hands it on, to
    /// keep capture order across types: half a period on average.)
    public let periodFrames: Int
    public let beepFrequency: Double
    public let beepDurationNanoseconds: Int64 = 50_000_000
    public let isRealtime: Bool
    public var name: String { "test tone \(sampleRate) Hz" }

    private var thread: OSThread?
    private let running = ManagedAtomic<Bool>(false)
    let droppedPeriods = ManagedAtomic<Int>(0)
    public var droppedCount: Int { droppedPeriods.load(ordering: .relaxed) }

    public init(sampleRate: Int = 48_000, channels: Int = 2, periodFrames: Int = 480, beepFrequency: Double = 1000, realtime: Bool = true) {
        precondition(sampleRate > 0 && channels > 0 && periodFrames > 0, "tone parameters must be positive")
        self.sampleRate = sampleRate
        self.channels = channels
        self.periodFrames = periodFrames
        self.beepFrequency = beepFrequency
        self.isRealtime = realtime
    }

    /// Nanoseconds from the start to sample `index`.
    func sampleTime(_ index: Int64) -> Int64 { index * 1_000_000_000 / Int64(sampleRate) }

    /// True when sample `index` lies in a beep.
    public func isBeep(sample index: Int64) -> Bool {
        let beepFrames = Int64(sampleRate) * beepDurationNanoseconds / 1_000_000_000
        return index % Int64(sampleRate) < beepFrames
    }

    public func start(into sink: SourceSink) throws {
        let bytes = periodFrames * channels * 2
        let pool = BufferPool(count: 16, byteCount: bytes, planeLayout: [(0, bytes, bytes)])
        running.store(true, ordering: .releasing)
        thread = OSThread(name: "bc-test-audio") { [self] in produce(into: sink, pool: pool) }
    }

    private func produce(into sink: SourceSink, pool: BufferPool) {
        let format = MediaFormat.audio(AudioFormat(sampleFormat: .s16, sampleRate: sampleRate, channels: channels))
        let duration = MediaTime(value: Int64(periodFrames), timescale: Int32(sampleRate))
        let amplitude = 0.5 * Double(Int16.max)
        var first: Int64 = 0
        while running.load(ordering: .acquiring) && !sink.isStopping {
            let captureTime = sink.startTime + sampleTime(first)
            // A device hands a period over once it has been captured.
            if isRealtime { MonotonicClock.sleep(until: sink.startTime + sampleTime(first + Int64(periodFrames))) }
            guard
                let buffer = pool.acquire(
                    wait: !isRealtime,
                    shouldStop: { [running] in !running.load(ordering: .acquiring) || sink.isStopping }
                )
            else {
                if !isRealtime { break }
                droppedPeriods.wrappingIncrement(ordering: .relaxed)
                sink.noteLoss()
                first += Int64(periodFrames)
                continue
            }
            let samples = buffer.memory.assumingMemoryBound(to: Int16.self)
            for frame in 0..<periodFrames {
                let index = first + Int64(frame)
                var value: Int16 = 0
                if isBeep(sample: index) {
                    // Sampled half a tick in, so the very first sample of a beep is already non-zero.
                    let phase = (Double(index % Int64(sampleRate)) + 0.5) * beepFrequency / Double(sampleRate)
                    value = Int16(amplitude * sin(2 * Double.pi * phase))
                }
                for c in 0..<channels { samples[frame * channels + c] = value }
            }
            let captured = CapturedBuffer(
                format: format,
                captureTime: captureTime,
                duration: duration,
                planes: buffer.planes,
                frameCount: periodFrames,
                backing: buffer
            )
            if isRealtime { sink.offer(captured) } else if !sink.push(captured) { break }
            first += Int64(periodFrames)
        }
    }

    public func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        thread = nil
    }
}
