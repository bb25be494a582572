import BroadcastKit
import BroadcastMedia
import BroadcastOutputs
import Foundation
import Testing

/// Where a recording goes, decided before anything is written (`Recording.target`), and the
/// refusal of two outputs in one file.
@Suite struct RecordingTargetTests {
    @Test func kindsOfTargets() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let real = try #require(Recording.resolvedPath(directory.path + "/x"))
        let realDirectory = String(real.dropLast(2))

        let fresh = try Recording.target(for: directory.file("new.mp4"), overwrite: false)
        #expect(fresh.kind == .newFile && fresh.path == realDirectory + "/new.mp4")

        try Data("x".utf8).write(to: URL(fileURLWithPath: directory.file("old.mkv")))
        let refused = try #require(throws: BroadcastError.self) { try Recording.target(for: directory.file("old.mkv"), overwrite: false) }
        #expect(refused.code == .invalidArgument && refused.message.contains("--overwrite"), "\(refused)")
        #expect(try Recording.target(for: directory.file("old.mkv"), overwrite: true).kind == .replace)

        try FileManager.default.createSymbolicLink(atPath: directory.file("link.mkv"), withDestinationPath: directory.file("old.mkv"))
        let linked = try Recording.target(for: directory.file("link.mkv"), overwrite: true)
        #expect(linked.kind == .replace && linked.path == realDirectory + "/old.mkv")

        try FileManager.default.createSymbolicLink(atPath: directory.file("dangling.mp4"), withDestinationPath: directory.file("none/x.mp4"))
        #expect(throws: BroadcastError.self) { try Recording.target(for: directory.file("dangling.mp4"), overwrite: true) }

        #expect(mkfifo(directory.file("fifo.ts"), 0o644) == 0)
        #expect(try Recording.target(for: directory.file("fifo.ts"), overwrite: false).kind == .stream)

        try FileManager.default.createDirectory(atPath: directory.file("dir.mp4"), withIntermediateDirectories: false)
        #expect(throws: BroadcastError.self) { try Recording.target(for: directory.file("dir.mp4"), overwrite: true) }
        #expect(directory.contents().sorted() == ["dangling.mp4", "dir.mp4", "fifo.ts", "link.mkv", "old.mkv"])
    }

    @Test func characterDevicesAreStreamsAndSocketsAreRefused() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try FileManager.default.createSymbolicLink(atPath: directory.file("null.mp4"), withDestinationPath: "/dev/null")
        let null = try Recording.target(for: directory.file("null.mp4"), overwrite: false)
        #expect(null.kind == .stream && null.path == "/dev/null")

        let socketPath = directory.file("s.mkv")
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in socketPath.utf8.enumerated() where i < raw.count - 1 { raw[i] = byte }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        #expect(bound == 0)
        #expect(throws: BroadcastError.self) { try Recording.target(for: socketPath, overwrite: true) }
    }

    @Test func twoOutputsInOneFileAreRefused() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try FileManager.default.createSymbolicLink(atPath: directory.file("alias"), withDestinationPath: directory.path)
        let a = OutputConfiguration(name: "a", destination: .file(directory.file("r.mp4")))
        for other in [directory.path + "/./r.mp4", directory.file("alias/r.mp4"), directory.path + "//r.mp4"] {
            let b = OutputConfiguration(name: "b", destination: .file(other))
            let error = try #require(throws: BroadcastError.self) { try OutputConfiguration.checkDistinctFiles([a, b]) }
            #expect(error.code == .invalidArgument && error.message.contains("same file"), "\(other): \(error)")
        }
        let c = OutputConfiguration(name: "c", destination: .file(directory.file("r.mkv")))
        try OutputConfiguration.checkDistinctFiles([a, c])
        #expect(directory.contents() == ["alias"])
    }
}

@Suite struct DescriptorMuxerTests {
    /// A muxer on a descriptor writes through it, never by name: by the time it writes, the name
    /// it was created under points to another file (unlinked and made again here), which stays
    /// untouched, while the file the descriptor opened gets the container.
    @Test func aMuxerOnADescriptorWritesThroughItNotByName() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("r.mkv")
        let kept = directory.file("kept.mkv")
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        try #require(fd >= 0)
        try #require(link(path, kept) == 0 && unlink(path) == 0)
        #expect(FileManager.default.createFile(atPath: path, contents: Data("decoy".utf8)))
        let encoder = try VideoEncoder(
            settings: VideoEncoderSettings(width: 160, height: 96, bitrate: 200_000), globalHeader: true, streamIndex: 0,
            logger: quietLogger())
        let muxer = try Muxer(fileDescriptor: fd, formatName: "matroska", displayName: path, logger: quietLogger())
        try muxer.addStream(encoder.stream)
        try muxer.writeHeader()
        try muxer.finish()
        #expect(FileManager.default.contents(atPath: path) == Data("decoy".utf8), "the name was written")
        let written = FileManager.default.contents(atPath: kept) ?? Data()
        #expect(Array(written.prefix(4)) == [0x1A, 0x45, 0xDF, 0xA3], "no Matroska header through the descriptor: \(written.count) bytes")
        // The muxer closed the descriptor it took.
        #expect(fcntl(fd, F_GETFD) == -1)
    }
}
