import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Foundation
import Testing

@testable import BroadcastDaemon

/// The reload's planner alone: two configs and what runs, no device, no session (issue 37 item 1).
@Suite struct ReloadPlanTests {
    /// A config from `text`, read as the daemon reads it (devices not opened).
    static func config(_ text: String) throws -> DaemonConfiguration {
        let path = NSTemporaryDirectory() + "reload-plan-\(UUID().uuidString).toml"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        return try DaemonConfiguration.load(path: path, environment: [:], openingDevices: false)
    }

    static func text(encoder: String = "", audio: String = "", outputs: String) -> String {
        """
        [video]
        size = "640x360"
        [audio]
        mic = "test"
        \(audio)
        [encoder]
        preset = "ultrafast"
        \(encoder)
        [control]
        socket = "/tmp/reload-plan.sock"
        \(outputs)
        """
    }

    static let rec = "[[output]]\nname = \"rec\"\npath = \"/tmp/reload-plan/rec.mkv\"\n"

    /// What runs after a start with `config`: its outputs' configurations and entries, a 640x360 picture.
    static func running(_ config: DaemonConfiguration) throws -> ReloadPlan.Running {
        let outputs = try BroadcastController.outputConfigurations(config.outputs)
        return ReloadPlan.Running(
            outputs: Dictionary(uniqueKeysWithValues: outputs.map { ($0.name, $0) }),
            definitions: Dictionary(uniqueKeysWithValues: config.outputs.map { ($0.name, $0) }),
            video: VideoEncoderSettings(width: 640, height: 360, frameRate: FrameRate(30)))
    }

    @Test func anUnchangedOutputKeepsWhatItRunsWithAndANewOneIsMade() throws {
        let before = try Self.config(Self.text(outputs: Self.rec))
        var running = try Self.running(before)
        // What runs may differ from a fresh reading (its queues were sized at the start): kept as is.
        running.outputs["rec"]?.overwrite = true
        let after = try Self.config(Self.text(outputs: Self.rec + "[[output]]\nname = \"copy\"\npath = \"/tmp/reload-plan/copy.mp4\"\n"))
        let plan = ReloadPlan(previous: before, fresh: after, running: running)
        #expect(plan.desired.map(\.name) == ["rec", "copy"])
        #expect(plan.desired.first?.overwrite == true, "the running output was not kept as it runs")
        #expect(plan.unmade.isEmpty && plan.nextStart.isEmpty && plan.levels.isEmpty && plan.offsets.isEmpty)
    }

    @Test func aChangedOutputGetsItsNewConfiguration() throws {
        let before = try Self.config(Self.text(outputs: Self.rec))
        let after = try Self.config(Self.text(outputs: Self.rec + "size = \"320x180\"\n"))
        let plan = ReloadPlan(previous: before, fresh: after, running: try Self.running(before))
        #expect(plan.desired.count == 1)
        #expect(plan.desired.first?.video?.width == 320 && plan.desired.first?.video?.height == 180)
    }

    /// An encode the running picture cannot give: the running output stays on its old settings, a
    /// new one is not added; each says why.
    @Test func anOutputThatCannotBeMadeIsKeptOrNotAdded() throws {
        let before = try Self.config(Self.text(outputs: Self.rec))
        // The config's own check passes (the picture may grow at a restart: [video] size says 1280x720).
        let after = try Self.config(
            Self.text(outputs: Self.rec + "size = \"1280x720\"\n[[output]]\nname = \"big\"\npath = \"/tmp/reload-plan/big.mkv\"\nsize = \"1280x720\"\n")
                .replacing("size = \"640x360\"", with: "size = \"1280x720\""))
        let plan = ReloadPlan(previous: before, fresh: after, running: try Self.running(before))
        #expect(plan.unmade.map(\.name) == ["rec", "big"])
        #expect(plan.unmade.map(\.result) == [.kept, .failed])
        #expect(plan.unmade.allSatisfy { $0.reason?.contains("larger than the picture (640x360)") == true }, "\(plan.unmade)")
        #expect(plan.desired.map(\.name) == ["rec"] && plan.desired.first?.video == nil, "rec goes on as it was")
    }

    @Test func changedEncoderKeysWaitForTheNextStart() throws {
        let before = try Self.config(Self.text(outputs: Self.rec))
        let after = try Self.config(Self.text(encoder: "video_bitrate = \"2M\"", audio: "mic_denoise = true", outputs: Self.rec))
        let plan = ReloadPlan(previous: before, fresh: after, running: try Self.running(before))
        #expect(plan.nextStart.contains { $0.hasPrefix("[encoder] video_bitrate") }, "\(plan.nextStart)")
        #expect(plan.nextStart.contains { $0.hasPrefix("[audio] mic_denoise") }, "\(plan.nextStart)")
        #expect(plan.desired.map(\.name) == ["rec"] && plan.unmade.isEmpty)
    }

    /// Only what changed is applied: a volume alone leaves the mute as the API set it.
    @Test func levelsAndOffsetsCarryOnlyWhatChanged() throws {
        let before = try Self.config(Self.text(audio: "mic_volume = \"-3dB\"", outputs: Self.rec))
        let after = try Self.config(Self.text(audio: "mic_volume = \"-9dB\"\nmic_offset = \"120ms\"", outputs: Self.rec))
        let plan = ReloadPlan(previous: before, fresh: after, running: try Self.running(before))
        #expect(plan.levels.count == 1)
        #expect(plan.levels.first?.type == .audioMic && plan.levels.first?.volume == -9 && plan.levels.first?.muted == nil)
        #expect(plan.offsets.count == 1)
        #expect(plan.offsets.first?.type == .audioMic && plan.offsets.first?.nanoseconds == 120_000_000)
        let same = ReloadPlan(previous: after, fresh: after, running: try Self.running(after))
        #expect(same.levels.isEmpty && same.offsets.isEmpty && same.nextStart.isEmpty)
    }
}
