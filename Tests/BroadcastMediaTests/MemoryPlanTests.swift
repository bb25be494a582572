import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Testing

/// The memory budget turned into sizes (no FFmpeg runs: settings only).
@Suite struct MemoryPlanTests {
    static let mib: Int64 = 1 << 20

    static func configuration(
        width: Int = 1920, height: Int = 1080, fps: Int = 60, tune: String? = "zerolatency", threads: Int = 0,
        outputs: [OutputConfiguration] = [OutputConfiguration(destination: .file("/tmp/a.mkv"))]
    ) -> EncodingConfiguration {
        EncodingConfiguration(
            video: VideoEncoderSettings(
                width: width, height: height, frameRate: FrameRate(fps), bitrate: 3_000_000, rateControl: .vbr, tune: tune,
                threads: threads),
            recordings: [], outputs: outputs)
    }

    static let testPattern = CaptureMemory(poolFrameBytes: 1920 * 1080 * 3 / 2)

    @Test func aBudgetTooSmallFor1080pIsRefusedWithTheFigures() throws {
        let error = #expect(throws: BroadcastError.self) {
            _ = try MemoryPlan(budget: 48 * Self.mib, configuration: Self.configuration(), capture: Self.testPattern, cores: 2)
        }
        let message = try #require(error).message
        #expect(message.contains("memory budget 48 MiB is too small for 1920x1080 at 60 fps: it needs at least "), "\(message)")
        #expect(message.contains("encoder ") && message.contains("capture ") && message.contains("queues "), "\(message)")
        #expect(!message.contains("\n"))
    }

    /// At the default the default 1080p60 job keeps x264 as asked, and nothing planned exceeds the budget.
    @Test func theDefaultFits1080p60AsAsked() throws {
        let plan = try MemoryPlan(
            budget: MemoryPlan.defaultBudget, configuration: Self.configuration(), capture: Self.testPattern, cores: 2)
        #expect(!plan.reducesEncoder, "\(plan)")
        #expect(plan.estimate.total <= plan.budget, "\(plan)")
        #expect(plan.capturePoolBytes >= 4 * 1920 * 1080 * 3 / 2)
        // At least two seconds of packets (60 video + 47 audio a second).
        #expect(plan.fileQueueCapacity >= 2 * 107, "\(plan)")
    }

    /// A tighter budget shrinks the queues and the pool before it refuses; a larger one never
    /// goes past today's sizes.
    @Test func sizesFollowTheBudget() throws {
        let small = try MemoryPlan(budget: 96 * Self.mib, configuration: Self.configuration(), capture: Self.testPattern, cores: 2)
        let large = try MemoryPlan(budget: 1 << 30, configuration: Self.configuration(), capture: Self.testPattern, cores: 2)
        #expect(small.fileQueueCapacity < large.fileQueueCapacity, "\(small) vs \(large)")
        #expect(small.capturePoolBytes <= large.capturePoolBytes)
        #expect(large.fileQueueCapacity == 8192)
        #expect(small.estimate.total <= small.budget, "\(small)")
    }

    /// Without zerolatency x264 holds B-frames, a lookahead and frame threads: a budget that
    /// cannot hold them all gets fewer threads first, then a shorter lookahead.
    @Test func x264ThreadsThenLookaheadAreCutToFit() throws {
        let asked = Self.configuration(width: 1280, height: 720, fps: 30, tune: nil)
        let roomy = try MemoryPlan(budget: 1 << 30, configuration: asked, capture: Self.testPattern, cores: 8)
        #expect(!roomy.reducesEncoder && roomy.encoderThreads == 0, "\(roomy)")
        let tight = try MemoryPlan(budget: 128 * Self.mib, configuration: asked, capture: Self.testPattern, cores: 8)
        #expect(tight.reducesEncoder, "\(tight)")
        #expect(tight.encoderThreads >= 1 && tight.encoderThreads < 12, "\(tight)")
        #expect(tight.estimate.total <= tight.budget, "\(tight)")
        let tighter = try MemoryPlan(budget: 96 * Self.mib, configuration: asked, capture: Self.testPattern, cores: 8)
        #expect(tighter.encoderThreads == 1, "\(tighter)")
        #expect((tighter.lookahead ?? 99) < 10, "\(tighter)")
        #expect((tighter.lookahead ?? 0) >= 3, "never below the B-frames: \(tighter)")
        let applied = tighter.applied(to: asked)
        #expect(applied.video?.threads == 1 && applied.video?.lookahead == tighter.lookahead)
    }

    /// A replay buffer without a limit gets what is left, up to the default; one with a limit keeps it.
    @Test func replayBuffersTakeWhatIsLeft() throws {
        let outputs = [
            OutputConfiguration(destination: .file("/tmp/a.mkv")),
            OutputConfiguration(name: "replay", destination: .file("/tmp/r-%s.mkv"), replay: ReplaySettings(seconds: 30)),
        ]
        let configuration = Self.configuration(width: 1280, height: 720, fps: 30, outputs: outputs)
        let plan = try MemoryPlan(budget: 128 * Self.mib, configuration: configuration, capture: Self.testPattern, cores: 2)
        // 30 s at 4.6 Mbit/s peak is about 17 MiB: it gets that and more, but not the 256 MiB default.
        #expect(plan.replayMaxBytes > 17 * Self.mib && plan.replayMaxBytes < ReplaySettings.defaultMaxBytes, "\(plan)")
        #expect(plan.estimate.total <= plan.budget, "\(plan)")
        let applied = plan.applied(to: configuration)
        #expect(applied.outputs.first { $0.name == "replay" }?.replay?.maxBytes == plan.replayMaxBytes)
        #expect(applied.outputs.first { $0.name == "/tmp/a.mkv" }?.fileQueueCapacity == plan.fileQueueCapacity)

        var limited = configuration
        limited.outputs[1].replay!.maxBytes = 200 * Self.mib
        #expect(throws: BroadcastError.self) {
            _ = try MemoryPlan(
                budget: 128 * Self.mib, configuration: limited, capture: Self.testPattern, cores: 2, replayLimitsSet: ["replay"])
        }
        let kept = try MemoryPlan(
            budget: 512 * Self.mib, configuration: limited, capture: Self.testPattern, cores: 2, replayLimitsSet: ["replay"])
        #expect(kept.applied(to: limited, replayLimitsSet: ["replay"]).outputs[1].replay?.maxBytes == 200 * Self.mib)
    }

    /// Replay buffers of different lengths without limits: each gets at least what the longest
    /// needs (its seconds plus a keyframe interval at peak bitrate), and the total stays in budget.
    @Test func replayBuffersOfDifferentLengthsEachGetWhatTheLongestNeeds() throws {
        let outputs = [
            OutputConfiguration(name: "short", destination: .file("/tmp/s-%s.mkv"), replay: ReplaySettings(seconds: 10)),
            OutputConfiguration(name: "long", destination: .file("/tmp/l-%s.mkv"), replay: ReplaySettings(seconds: 120)),
        ]
        let configuration = Self.configuration(width: 1280, height: 720, fps: 30, outputs: outputs)
        let plan = try MemoryPlan(budget: 256 * Self.mib, configuration: configuration, capture: Self.testPattern, cores: 2)
        // 122 s at 4.6 Mbit/s peak: about 67 MiB.
        #expect(plan.replayMaxBytes >= 67 * Self.mib, "\(plan)")
        #expect(plan.estimate.total <= plan.budget, "\(plan)")
        #expect(throws: BroadcastError.self) {
            _ = try MemoryPlan(budget: 128 * Self.mib, configuration: configuration, capture: Self.testPattern, cores: 2)
        }
    }

    /// A replay limit near the largest size a value may spell (1000000T) is refused with what it
    /// needs against the budget; its message's MiB figure used to overflow (exit 132).
    @Test func aHugeReplayLimitIsRefusedNotATrap() throws {
        var huge = Self.configuration(outputs: [
            OutputConfiguration(name: "replay", destination: .file("/tmp/r-%s.mkv"), replay: ReplaySettings(seconds: 30))
        ])
        huge.outputs[0].replay!.maxBytes = 1_000_000 << 40
        do {
            _ = try MemoryPlan(budget: 1 << 40, configuration: huge, capture: Self.testPattern, cores: 2, replayLimitsSet: ["replay"])
            Issue.record("a 1000000T replay buffer fit a 1T budget")
        } catch {
            #expect(error.message.contains("needs at least 104857600"), "\(error.message)")
        }
    }
}
