import BroadcastKit
import BroadcastMedia
import Foundation
import Testing

/// `NoiseSuppressor` (`--mic-denoise`): buffers of any size in, every sample out once at its own
/// position (the library's frames and delay do not move the audio on the timeline), runs split
/// where the input jumps, the tail flushed by `finish`.
@Suite struct NoiseSuppressorTests {
    static let rate = 48_000

    /// A chirp burst every half second over a faint noise, on both channels.
    static func signal(_ count: Int) -> [Float] {
        var seed: UInt64 = 38
        return (0..<count).map { i in
            seed = seed &* 6364136223846793005 &+ 1442695040888963407
            let noise = Float(Int64(bitPattern: seed >> 11) % 1000) / 1000 * 0.003
            let t = Double(i % (rate / 2)) / Double(rate)
            let burst = t < 0.2 ? 0.3 * sin(2 * Double.pi * (200 * t + 1500 * t * t)) : 0
            return noise + Float(burst)
        }
    }

    /// Feeds `input` from `start` in buffers of the given sizes (cycled), a jump of `gap` samples
    /// after `gapAfter` samples; returns what came out, by position.
    static func run(_ input: [Float], start: Int64, sizes: [Int], gapAfter: Int? = nil, gap: Int64 = 0)
        throws -> (positions: [Int64: Float], runs: [(Int64, Int)])
    {
        let denoiser = try NoiseSuppressor(sampleRate: rate, channelCount: 2)
        var out: [Int64: Float] = [:]
        var runs: [(Int64, Int)] = []
        func take(_ samples: PlanarAudio) {
            runs.append((samples.startSample, samples.frameCount))
            let left = samples.channel(0), right = samples.channel(1)
            var twice = 0, different = 0
            for i in 0..<samples.frameCount {
                if left[i] != right[i] { different += 1 }
                if out.updateValue(left[i], forKey: samples.startSample + Int64(i)) != nil { twice += 1 }
            }
            #expect(twice == 0 && different == 0, "\(twice) positions came out twice, \(different) differ between the channels")
        }
        var offset = 0, k = 0
        while offset < input.count {
            let n = min(sizes[k % sizes.count], input.count - offset)
            k += 1
            let jumped = gapAfter.map { offset >= $0 } ?? false
            let chunk = AudioChunk(startSample: start + Int64(offset) + (jumped ? gap : 0), channels: [Array(input[offset..<offset + n]), Array(input[offset..<offset + n])])
            chunk.withPlanarAudio { samples in denoiser.denoise(samples) { take($0) } }
            offset += n
        }
        denoiser.finish { take($0) }
        return (out, runs)
    }

    @Test func everySampleComesOutOnceAtItsOwnPosition() throws {
        let input = Self.signal(Self.rate * 3)
        let (out, _) = try Self.run(input, start: 1_000, sizes: [441, 37, 960, 480, 1, 1500])
        #expect(out.count == input.count)
        #expect(out.keys.min() == 1_000 && out.keys.max() == 1_000 + Int64(input.count) - 1)
        // Aligned: the output correlates best with the input at lag 0 (the library's 338-sample
        // delay taken off), not at the delay.
        let lags = (-400...400).map { lag -> (Int, Double) in
            var sum = 0.0
            for i in stride(from: Self.rate, to: input.count - 500, by: 1) {
                sum += Double(input[i]) * Double(out[1_000 + Int64(i + lag)] ?? 0)
            }
            return (lag, sum)
        }
        let best = lags.max { $0.1 < $1.1 }!.0
        #expect(best == 0, "the denoised audio is \(best) samples off its input")
    }

    @Test func aJumpEndsTheRunAndStartsAnother() throws {
        let input = Self.signal(Self.rate)
        let (out, runs) = try Self.run(input, start: 0, sizes: [500], gapAfter: 24_000, gap: 4_800)
        #expect(out.count == input.count)
        #expect(out.keys.filter { $0 >= 24_000 && $0 < 28_800 }.isEmpty, "nothing in the gap")
        #expect(out[23_999] != nil && out[28_800] != nil)
        // The first run's end came out before the second run's start.
        let jump = try #require(runs.firstIndex { $0.0 >= 28_800 })
        #expect(runs[jump - 1].0 + Int64(runs[jump - 1].1) == 24_000)
    }

    @Test func otherRatesAreRefusedWithWhy() {
        #expect(throws: NoiseSuppressor.Unsupported.self) { try NoiseSuppressor(sampleRate: 22_050, channelCount: 2) }
    }
}
