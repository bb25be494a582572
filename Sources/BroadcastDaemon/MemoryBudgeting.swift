public import BroadcastCapture
public import BroadcastKit
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
        switch video {
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
            (source as? TestPatternSource)?.poolBytes = plan.capturePoolBytes
            (source as? V4L2Source)?.copyPoolBytes = plan.capturePoolBytes
        }
        return (plan.applied(to: configuration, replayLimitsSet: replayLimitsSet), plan)
    }
}
