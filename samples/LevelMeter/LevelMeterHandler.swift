// A broadcast handler written against BroadcastKit alone, in the spirit of ReplayKit's
// SampleHandler.swift template: it prints, once per second of media, the video frame rate and the
// audio level (dBFS) of each audio buffer type. Copy it to start your own handler.
public import BroadcastKit

#if canImport(Glibc)
import Glibc
#endif

public final class LevelMeterHandler: BroadcastSampleHandler {
    /// Where report lines go (stdout by default; a test can collect them).
    private let report: (String) -> Void
    private var framesThisSecond = 0
    private var second: Int64 = 0
    /// Sum of squares and sample count per audio type since the last report.
    private var energy: [SampleBufferType: (sumOfSquares: Double, samples: Int)] = [:]

    public init(report: @escaping (String) -> Void = { print($0) }) {
        self.report = report
    }

    public func broadcastStarted(setupInfo: SetupInfo) throws {
        let info = setupInfo.values.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        report("broadcast started\(info.isEmpty ? "" : " with \(info)")")
    }

    public func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        // Buffers arrive in media-time order, so a new second here means the last one is complete.
        let now = buffer.presentationTime.nanoseconds ?? 0
        while now >= (second + 1) * 1_000_000_000 {
            flushSecond()
        }
        switch type {
        case .video:
            framesThisSecond += 1
        case .audioMic, .audioApp:
            guard let format = buffer.audioFormat else { return }
            var total = energy[type] ?? (0, 0)
            accumulate(buffer, format: format, into: &total)
            energy[type] = total
        }
    }

    public func broadcastPaused() { report("paused") }
    public func broadcastResumed() { report("resumed") }

    public func broadcastFinished() {
        flushSecond()
        report("broadcast finished")
    }

    private func flushSecond() {
        var line = "t=\(second)s video \(framesThisSecond) fps"
        for type in [SampleBufferType.audioMic, .audioApp] {
            guard let e = energy[type], e.samples > 0 else { continue }
            let rms = (e.sumOfSquares / Double(e.samples)).squareRoot()
            let dbfs = rms > 0 ? 20 * log10(rms) : -Double.infinity
            line += "  \(type) \(dbfs.isFinite ? String(Int(dbfs.rounded())) : "-inf") dBFS"
        }
        report(line)
        framesThisSecond = 0
        energy = [:]
        second += 1
    }

    /// Adds the squares of every sample (scaled to -1...1) of an audio buffer. The bytes are lent
    /// for the length of `withPlane`'s closure only: nothing here can keep them.
    private func accumulate(_ buffer: borrowing SampleBuffer, format: AudioFormat, into total: inout (sumOfSquares: Double, samples: Int)) {
        let count = buffer.frameCount * (format.sampleFormat.isPlanar ? 1 : format.channels)
        for index in 0..<buffer.planeCount {
            total.sumOfSquares += buffer.withPlane(index) { bytes, _ in
                switch format.sampleFormat {
                case .s16: Self.sumOfSquares(bytes, count: count, as: Int16.self) { Double($0) / 32768 }
                case .s32: Self.sumOfSquares(bytes, count: count, as: Int32.self) { Double($0) / 2147483648 }
                case .f32, .f32Planar: Self.sumOfSquares(bytes, count: count, as: Float.self) { Double($0) }
                }
            }
            total.samples += count
        }
    }

    private static func sumOfSquares<Sample: BitwiseCopyable>(
        _ bytes: RawSpan, count: Int, as type: Sample.Type, scaled: (Sample) -> Double
    ) -> Double {
        let available = min(count, bytes.byteCount / MemoryLayout<Sample>.stride)
        var sum = 0.0
        for i in 0..<available {
            let v = scaled(bytes.unsafeLoadUnaligned(fromByteOffset: i * MemoryLayout<Sample>.stride, as: Sample.self))
            sum += v * v
        }
        return sum
    }
}
