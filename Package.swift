// swift-tools-version:6.1
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

/// One system-library module per C library, found through pkg-config (Debian's -dev packages).
func systemLibrary(_ name: String, pkgConfig: String, apt: [String]) -> Target {
    .systemLibrary(name: name, path: "Sources/CModules/\(name)", pkgConfig: pkgConfig, providers: [.apt(apt)])
}

let package = Package(
    name: "broadcast",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "BroadcastKit", targets: ["BroadcastKit"]),
        .library(name: "BroadcastCapture", targets: ["BroadcastCapture"]),
        .library(name: "BroadcastMedia", targets: ["BroadcastMedia"]),
        .library(name: "BroadcastComposition", targets: ["BroadcastComposition"]),
        .library(name: "BroadcastOutputs", targets: ["BroadcastOutputs"]),
        .library(name: "BroadcastService", targets: ["BroadcastService"]),
        .library(name: "BroadcastDaemon", targets: ["BroadcastDaemon"]),
        .executable(name: "broadcast", targets: ["broadcast"]),
        .executable(name: "level-meter", targets: ["LevelMeter"]),
        .executable(name: "event-tail", targets: ["EventTail"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-atomics.git", from: "1.3.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        // FileDescriptor and Errno where descriptors cross our own APIs (docs/DESIGN.md says where).
        .package(url: "https://github.com/apple/swift-system.git", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        // The control API's HTTP server (HummingbirdCore: the server, not the router), without the
        // default traits (full Foundation, swift-configuration) the daemon does not need.
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1", traits: []),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.34.1"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        // `swift package generate-documentation --target BroadcastKit` (run by make test, so the docs cannot rot).
        .package(url: "https://github.com/swiftlang/swift-docc-plugin.git", from: "1.5.0"),
        // Tests only: counts allocations, so the capture and audio paths' steady state is held to none.
        .package(url: "https://github.com/ordo-one/malloc-interposer.git", from: "1.6.1"),
        // Tests only: property-based checks of the value parsers.
        .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.1"),
    ],
    targets: [
        // C libraries, each behind a module map and a shim header.
        systemLibrary("CAVCodec", pkgConfig: "libavcodec", apt: ["libavcodec-dev"]),
        systemLibrary("CAVFormat", pkgConfig: "libavformat", apt: ["libavformat-dev"]),
        systemLibrary("CAVUtil", pkgConfig: "libavutil", apt: ["libavutil-dev"]),
        systemLibrary("CSwScale", pkgConfig: "libswscale", apt: ["libswscale-dev"]),
        systemLibrary("CSwResample", pkgConfig: "libswresample", apt: ["libswresample-dev"]),
        systemLibrary("CV4L2", pkgConfig: "libv4l2", apt: ["libv4l-dev"]),
        systemLibrary("CALSA", pkgConfig: "alsa", apt: ["libasound2-dev"]),
        // X11 screen capture: xcb core, MIT-SHM, XFixes (cursor), DAMAGE (xcb-damage's .pc requires the others).
        systemLibrary(
            "CXCB", pkgConfig: "xcb-damage",
            apt: ["libxcb1-dev", "libxcb-shm0-dev", "libxcb-xfixes0-dev", "libxcb-damage0-dev"]
        ),
        // Wayland desktop: libpipewire (streams) and sd-bus from libsystemd (the ScreenCast portal).
        systemLibrary("CPipeWire", pkgConfig: "libpipewire-0.3", apt: ["libpipewire-0.3-dev"]),
        systemLibrary("CSystemd", pkgConfig: "libsystemd", apt: ["libsystemd-dev"]),
        // What Swift cannot import (macros, variadic functions, ioctl numbers), one shim per family of
        // libraries, so each Swift target links only its own: FFmpeg for BroadcastMedia, the device
        // libraries for BroadcastCapture (a handler built on the capture sources links no FFmpeg).
        .target(name: "CFFmpegShim", dependencies: ["CAVUtil"], path: "Sources/CFFmpegShim"),
        .target(name: "CDeviceShim", dependencies: ["CV4L2", "CALSA"], path: "Sources/CDeviceShim"),
        // PipeWire/SPA's macros and variadic builders, apart from the FFmpeg/V4L2 shim so that only
        // what captures from PipeWire links libpipewire.
        .target(name: "CPipeWireShim", dependencies: ["CPipeWire"], path: "Sources/CPipeWireShim"),
        // The executable's first moments (.preinit_array): the handled signals blocked before any
        // library initializer runs.
        .target(name: "CProcessShim", path: "Sources/CProcessShim"),
        // WHIP: GStreamer's webrtcbin (WebRTC, not ours) and libcurl (HTTP), behind one shim that
        // only BroadcastWebRTC links.
        systemLibrary(
            "CGStreamerWebRTC", pkgConfig: "gstreamer-webrtc-1.0",
            apt: ["libgstreamer1.0-dev", "libgstreamer-plugins-bad1.0-dev", "libgstreamer-plugins-base1.0-dev"]
        ),
        systemLibrary("CCurl", pkgConfig: "libcurl", apt: ["libcurl4-gnutls-dev"]),
        // The microphone's noise suppression: webrtc-audio-processing is C++, so a C++ shim with a
        // C API (CDenoiseShim.h) includes it; the system module brings its pkg-config flags and link.
        systemLibrary("CWebRTCAudioProcessing", pkgConfig: "webrtc-audio-processing", apt: ["libwebrtc-audio-processing-dev"]),
        .target(
            name: "CDenoiseShim", dependencies: ["CWebRTCAudioProcessing"], path: "Sources/CDenoiseShim",
            // The defines its pkg-config file sets (SwiftPM passes on only its include path).
            cxxSettings: [.define("WEBRTC_POSIX"), .define("WEBRTC_AUDIO_PROCESSING_ONLY_BUILD")],
            linkerSettings: [.linkedLibrary("webrtc_audio_processing"), .linkedLibrary("stdc++")]
        ),
        .target(
            name: "CWebRTCShim", dependencies: ["CGStreamerWebRTC", "CCurl"], path: "Sources/CWebRTCShim",
            linkerSettings: ["gstwebrtc-1.0", "gstapp-1.0", "gstsdp-1.0", "gstrtp-1.0", "gstbase-1.0", "gstreamer-1.0", "gobject-2.0", "glib-2.0", "curl", "crypto"]
                .map { .linkedLibrary($0) }
        ),

        .target(
            name: "BroadcastKit",
            dependencies: [
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BroadcastCapture",
            dependencies: [
                "BroadcastKit", "CXCB", "CV4L2", "CALSA", "CDeviceShim", "CPipeWire", "CPipeWireShim", "CSystemd",
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BroadcastMedia",
            dependencies: [
                "BroadcastKit", "CAVCodec", "CAVFormat", "CAVUtil", "CSwScale", "CSwResample", "CFFmpegShim", "CDenoiseShim",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Layers and scenes: several capture sources as one (LayeredVideoSource), drawn by the
        // Compositor through BroadcastMedia's Scaler and MJPEGDecoder into AVFrames (hence libavutil).
        .target(
            name: "BroadcastComposition",
            dependencies: [
                "BroadcastKit", "BroadcastMedia", "CAVCodec", "CAVFormat", "CAVUtil", "CSwScale", "CSwResample",
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BroadcastOutputs",
            dependencies: [
                "BroadcastKit", "BroadcastMedia",
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            swiftSettings: swiftSettings
        ),
        // The WHIP output's WebRTC engine (GStreamerWebRTC): the one Swift target linking GStreamer.
        .target(
            name: "BroadcastWebRTC",
            dependencies: ["BroadcastKit", "BroadcastMedia", "BroadcastOutputs", "CWebRTCShim"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BroadcastService",
            dependencies: [
                "BroadcastKit",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                // HTTPParserError: a request NIO's parser refuses is answered with why.
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            swiftSettings: swiftSettings
        ),
        // The daemon, its typed config and control API, and the pipeline assembly the commands share
        // (options → sources, encoder settings, memory budget): everything but argument parsing.
        .target(
            name: "BroadcastDaemon",
            dependencies: [
                "BroadcastKit", "BroadcastCapture", "BroadcastMedia", "BroadcastComposition", "BroadcastOutputs",
                "BroadcastService", "BroadcastWebRTC",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            // The page's files, edited as HTML, CSS and JavaScript, go into the binary as constants
            // (Plugins/EmbedPage): one self-contained executable, no resource bundle to install.
            exclude: ["Page"],
            swiftSettings: swiftSettings,
            plugins: ["EmbedPage"]
        ),
        .executableTarget(name: "embed-files", path: "Sources/EmbedFiles"),
        .plugin(name: "EmbedPage", capability: .buildTool(), dependencies: ["embed-files"]),
        .executableTarget(
            name: "broadcast",
            dependencies: [
                "BroadcastKit", "BroadcastCapture", "BroadcastOutputs", "BroadcastService", "BroadcastDaemon", "CProcessShim",
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            swiftSettings: swiftSettings
        ),
        // samples/: a handler written against BroadcastKit alone, run on the built-in sources.
        .executableTarget(
            name: "LevelMeter",
            dependencies: ["BroadcastKit", "BroadcastCapture"],
            path: "samples/LevelMeter",
            exclude: ["README.md"],
            swiftSettings: swiftSettings
        ),
        // samples/: a client of the control plane, linking BroadcastService alone.
        .executableTarget(
            name: "EventTail",
            dependencies: ["BroadcastService"],
            path: "samples/EventTail",
            swiftSettings: swiftSettings
        ),

        .testTarget(
            name: "BroadcastKitTests",
            dependencies: ["BroadcastKit", "ChildProcesses", .product(name: "Atomics", package: "swift-atomics")],
            exclude: ["CompileChecks"],
            swiftSettings: swiftSettings
        ),
        // Tests only: the allocation counting that the steady-state allocation tests share.
        .target(
            name: "AllocationCounting",
            dependencies: [.product(name: "MallocInterposerSwift", package: "malloc-interposer")],
            path: "Tests/AllocationCounting",
            swiftSettings: swiftSettings
        ),
        // Tests only: child processes started and reaped without Foundation's Process (see ChildProcess).
        .target(
            name: "ChildProcesses",
            path: "Tests/ChildProcesses",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BroadcastCaptureTests",
            dependencies: ["BroadcastKit", "BroadcastCapture", "CPipeWireShim", "AllocationCounting", "ChildProcesses"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BroadcastMediaTests",
            dependencies: [
                "BroadcastKit", "BroadcastCapture", "BroadcastMedia", "BroadcastComposition", "BroadcastOutputs", "AllocationCounting",
                "ChildProcesses",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Atomics", package: "swift-atomics"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BroadcastServiceTests",
            dependencies: [
                "BroadcastService", "BroadcastOutputs", "BroadcastKit", "ChildProcesses",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            // The daemon in-process: started, controlled, reloaded and stopped without the binary.
            name: "BroadcastDaemonTests",
            dependencies: [
                "BroadcastDaemon", "BroadcastService", "BroadcastKit", "ChildProcesses",
                // The read model's tests build snapshots of these modules' figures by hand.
                "BroadcastOutputs", "BroadcastComposition", "BroadcastMedia",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BroadcastX11Tests",
            dependencies: ["BroadcastKit", "BroadcastCapture", "ChildProcesses", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            // Runs the built `broadcast` binary; imports none of the package's product modules.
            name: "BroadcastCLITests",
            dependencies: ["ChildProcesses"],
            swiftSettings: swiftSettings
        ),
    ]
)
