import Foundation
import Testing

/// Each Swift target links only the C libraries it wraps: a handler built on BroadcastKit and the
/// capture sources (samples/LevelMeter) must not drag FFmpeg in.
@Suite struct LinkageTests {
    static let ffmpegLibraries = ["libavcodec", "libavformat", "libavutil", "libswscale", "libswresample"]

    func linkedLibraries(_ binary: String) throws -> [String] {
        let r = try run("/usr/bin/ldd", [binary])
        try #require(r.status == 0, "ldd \(binary): \(r.stderr)")
        return r.stdout.split(separator: "\n").compactMap { $0.split(whereSeparator: { $0 == " " || $0 == "\t" }).first.map(String.init) }
    }

    @Test func levelMeterSampleLinksNoFFmpeg() throws {
        let sample = URL(fileURLWithPath: broadcastBinary).deletingLastPathComponent().appendingPathComponent("level-meter").path
        try #require(FileManager.default.fileExists(atPath: sample), "build the sample first (swift build)")
        let linked = try linkedLibraries(sample)
        let ffmpeg = linked.filter { library in Self.ffmpegLibraries.contains { library.hasPrefix($0) } }
        #expect(ffmpeg.isEmpty, "level-meter links \(ffmpeg)")
        // The microphone's noise suppressor (webrtc-audio-processing, C++) is BroadcastMedia's.
        #expect(!linked.contains { $0.hasPrefix("libwebrtc_audio_processing") }, "level-meter links \(linked)")
        // The capture sources' own libraries are there: the check looks at the right binary.
        #expect(linked.contains { $0.hasPrefix("libasound") })
    }

    /// GStreamer (webrtcbin, for WHIP) and libcurl are BroadcastWebRTC's alone: the sample links
    /// neither, and no object file of the capture, session, media, composition or outputs targets refers to
    /// one of their symbols (those targets are linked into the one executable, so ldd cannot tell).
    @Test func onlyBroadcastWebRTCLinksGStreamer() throws {
        let debug = URL(fileURLWithPath: broadcastBinary).deletingLastPathComponent()
        let sample = debug.appendingPathComponent("level-meter").path
        try #require(FileManager.default.fileExists(atPath: sample), "build the sample first (swift build)")
        for path in [sample, debug.appendingPathComponent("event-tail").path] {
            let links = try linkedLibraries(path).filter { $0.hasPrefix("libgst") || $0.hasPrefix("libcurl") || $0.hasPrefix("libnice") }
            #expect(links.isEmpty, "\(path) links \(links)")
        }
        #expect(try linkedLibraries(broadcastBinary).contains { $0.hasPrefix("libgstwebrtc") })
        func undefinedForeignSymbols(_ target: String) throws -> [String] {
            let directory = debug.appendingPathComponent("\(target).build")
            let objects = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".o") }
            try #require(!objects.isEmpty, "no object files in \(directory.path)")
            let r = try run("/usr/bin/nm", ["-u"] + objects.map { directory.appendingPathComponent($0).path })
            try #require(r.status == 0, "nm: \(r.stderr)")
            return r.stdout.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) }
                .filter { $0.hasPrefix("gst_") || $0.hasPrefix("g_") || $0.hasPrefix("curl_") || $0.hasPrefix("CBroadcastWHIP") }
        }
        for target in [
            "BroadcastKit", "BroadcastCapture", "BroadcastMedia", "BroadcastComposition", "BroadcastOutputs", "BroadcastService",
        ] {
            #expect(try undefinedForeignSymbols(target).isEmpty, "\(target) refers to GStreamer/curl")
        }
        // The check can see such a reference: the WebRTC target has them.
        #expect(try undefinedForeignSymbols("BroadcastWebRTC").contains { $0.hasPrefix("CBroadcastWHIP") })
    }

    /// The control plane a client links (BroadcastService, here through samples/EventTail) needs
    /// neither FFmpeg nor the capture libraries.
    @Test func controlClientSampleLinksNoFFmpegNorDevices() throws {
        let sample = URL(fileURLWithPath: broadcastBinary).deletingLastPathComponent().appendingPathComponent("event-tail").path
        try #require(FileManager.default.fileExists(atPath: sample), "build the sample first (swift build)")
        let linked = try linkedLibraries(sample)
        let media = linked.filter { library in
            (Self.ffmpegLibraries + ["libasound", "libv4l2", "libpipewire", "libxcb"]).contains { library.hasPrefix($0) }
        }
        #expect(media.isEmpty, "event-tail links \(media)")
        // The Swift runtime is there: the check looks at a linked binary.
        #expect(linked.contains { $0.hasPrefix("libswiftCore") || $0.hasPrefix("libFoundation") || $0.hasPrefix("libdispatch") })
    }

    @Test func broadcastLinksFFmpeg() throws {
        let linked = try linkedLibraries(broadcastBinary)
        #expect(linked.contains { $0.hasPrefix("libavcodec") })
        #expect(linked.contains { $0.hasPrefix("libwebrtc_audio_processing") })
    }
}
