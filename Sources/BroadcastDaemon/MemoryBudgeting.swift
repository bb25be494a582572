import BroadcastCapture
public import BroadcastKit
import BroadcastComposition
import BroadcastMedia
public import BroadcastOutputs
import BroadcastService

#if canImport(Glibc)
import Glibc
#endif

/// Sizes a broadcast within its memory budget (record and stream: --memory-budget; the daemon: [limits] memory).
public enum MemoryBudgeting {
    /// What the video source among `sources` keeps of its own.
    static func captureMemory(
        _ sources: [(type: SampleBufferType, source: any CaptureSource)], width: Int, height: Int
    ) -> CaptureMemory? {
        guard let video = sources.first(where: { $0.type == .video })?.source else { return nil }
        return captureMemory(of: video, width: width, height: height)
    }

    /// What one video source keeps; a composite counts its base, every layer's source, each layer's
    /// converted picture (and its RGB step), the composite picture with the base's conversion, and
    /// its own frames (a pool the plan sizes, like the test pattern's).
    static func captureMemory(of video: any CaptureSource, width: Int, height: Int) -> CaptureMemory {
        switch video {
        case let composite as LayeredVideoSource:
            var total = captureMemory(of: composite.base, width: width, height: height)
            // The base converted into a yuv420p picture, and the composite beside it.
            total.fixedBytes += 2 * composite.frameBytes
            total.converts = false
            total.poolFrameBytes += composite.frameBytes
            for input in composite.inputs {
                let own = captureMemory(of: input, width: width, height: height)
                total.poolFrameBytes += own.poolFrameBytes
                total.fixedBytes += own.fixedBytes
            }
            for layer in composite.scenes.flatMap(\.layers) {
                // The layer's picture (yuv420p) and an RGB step at its box's size, and a frame for
                // its source's conversion.
                let box = layer.placement.box(frameWidth: width, frameHeight: height) ?? PixelRegion(x: 0, y: 0, width: 0, height: 0)
                total.fixedBytes += box.width * box.height * 11 / 2
                if captureMemory(of: composite.inputs[layer.input], width: box.width, height: box.height).converts {
                    total.fixedBytes += box.width * box.height * 3
                }
            }
            return total
        case let test as TestPatternSource:
            return CaptureMemory(
                poolFrameBytes: test.width * test.height * 3 / 2, converts: test.width != width || test.height != height)
        case let device as V4L2Source:
            return CaptureMemory(poolFrameBytes: device.frameBytes, converts: true)
        case is X11ScreenSource:
            // MIT-SHM segments are shared with the X server, not private memory; without MIT-SHM
            // (a remote display) a GetImage reply is one BGRx frame of ours at a time.
            return CaptureMemory(fixedBytes: width * height * 4, converts: true)
        default:
            // PipeWire: up to 4 BGRx frames of its own, converted to yuv420p.
            return CaptureMemory(fixedBytes: width * height * 4 * 4, converts: true)
        }
    }

    /// Plans `configuration` within `budget`, gives the sources their pool sizes, and returns the
    /// configuration with the planned sizes. Exit 2 (one line, needed vs budget) when it cannot fit.
    public static func plan(
        _ configuration: EncodingConfiguration, budget: Int64,
        sources: [(type: SampleBufferType, source: any CaptureSource)], replayLimitsSet: Set<String>
    ) throws -> (EncodingConfiguration, MemoryPlan) {
        let capture = configuration.video.flatMap { captureMemory(sources, width: $0.width, height: $0.height) }
        let plan: MemoryPlan
        do {
            plan = try MemoryPlan(
                budget: budget, configuration: configuration, capture: capture, cores: Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))),
                replayLimitsSet: replayLimitsSet)
        } catch {
            throw ValueError(error.message)
        }
        for (_, source) in sources {
            givePool(plan.capturePoolBytes, to: source, of: capture?.poolFrameBytes ?? 0)
        }
        return (plan.applied(to: configuration, replayLimitsSet: replayLimitsSet), plan)
    }

    /// Gives `source` its pool: `bytes` for `frameBytes` a frame in all; a composite shares it out
    /// among its sources and its own frames by their frames' sizes, so each holds as many frames.
    static func givePool(_ bytes: Int, to source: any CaptureSource, of frameBytes: Int) {
        switch source {
        case let test as TestPatternSource:
            test.poolBytes = bytes
        case let device as V4L2Source:
            device.copyPoolBytes = bytes
        case let composite as LayeredVideoSource:
            let frames = frameBytes > 0 ? bytes / frameBytes : 4
            composite.poolBytes = frames * composite.frameBytes
            for part in [composite.base] + composite.inputs {
                let own = captureMemory(of: part, width: composite.width, height: composite.height).poolFrameBytes
                givePool(frames * own, to: part, of: own)
            }
        default:
            break
        }
    }
}
