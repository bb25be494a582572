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

    /// Adds the squares of every sample (scaled to -1...1) of an audio buffer.
    private func accumulate(_ buffer: borrowing SampleBuffer, format: AudioFormat, into total: inout (sumOfSquares: Double, samples: Int)) {
        let count = buffer.frameCount * (format.sampleFormat.isPlanar ? 1 : format.channels)
        for plane in buffer.planes {
            switch format.sampleFormat {
            case .s16:
                let samples = plane.bytes.assumingMemoryBound(to: Int16.self)
                for i in 0..<min(count, samples.count) { let v = Double(samples[i]) / 32768; total.sumOfSquares += v * v }
            case .s32:
                let samples = plane.bytes.assumingMemoryBound(to: Int32.self)
                for i in 0..<min(count, samples.count) { let v = Double(samples[i]) / 2147483648; total.sumOfSquares += v * v }
            case .f32, .f32Planar:
                let samples = plane.bytes.assumingMemoryBound(to: Float.self)
                for i in 0..<min(count, samples.count) { let v = Double(samples[i]); total.sumOfSquares += v * v }
            }
            total.samples += count
        }
    }
}
