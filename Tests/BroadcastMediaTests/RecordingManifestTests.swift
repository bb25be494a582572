import Foundation
import Logging
import Testing

import BroadcastMedia
@testable import BroadcastOutputs

@Suite struct RecordingTemplateTests {
    /// A name matches the template it could have been made from, and nothing else that merely
    /// shares the directory or the extension.
    @Test(arguments: [
        ("/d/%H%M%S.mp4", "/d/123456.mp4", true),
        // Exactly: a "-2" is not the template's (see isNamed(by:path:used:)).
        ("/d/%H%M%S.mp4", "/d/123456-2.mp4", false),
        ("/d/%H%M%S.mp4", "/d/my-wedding.mp4", false),
        ("/d/%H%M%S.mp4", "/d/1234567.mp4", false),
        ("/d/%H%M%S.mp4", "/d/123456.mkv", false),
        ("/d/%H%M%S.mp4", "/e/123456.mp4", false),
        ("/d/rec-%Y%m%d-%H%M%S.mkv", "/d/rec-20261123-214501.mkv", true),
        ("/d/rec-%Y%m%d-%H%M%S.mkv", "/d/rec-20261123-214501-12.mkv", false),
        ("/d/rec-%Y%m%d-%H%M%S.mkv", "/d/rec-holiday.mkv", false),
        ("/d/%Y/%m/x-%F_%T.mp4", "/d/2026/11/x-2026-11-23_21:45:01.mp4", true),
        ("/d/%Y/%m/x-%F_%T.mp4", "/d/2026/x-2026-11-23_21:45:01.mp4", false),
        ("/d/%a-%b-%s.ts", "/d/Mon-Nov-1795000000.ts", true),
        ("/d/%a-%b-%s.ts", "/d/Mon/x-Nov-1.ts", false),
        ("/d/100%%-%H.mp4", "/d/100%-07.mp4", true),
        ("/d/rec.mp4", "/d/rec.mp4", true),
        ("/d/rec.mp4", "/d/rec-2.mp4", false),
        ("/d/rec.mp4", "/d/rec-120000.mp4", false),
        ("/d/rec.mp4", "/d/rec-x.mp4", false),
    ] as [(String, String, Bool)])
    func namesMatchTheirTemplate(template: String, path: String, expected: Bool) {
        #expect(RecordingTemplate.matches(template, path: path) == expected, "\(template) ~ \(path)")
    }

    /// A numbered name is a template's only when the manifest says that number was given out for
    /// that name: `rec-2.mp4` after `rec.mp4` was taken twice, never another output's
    /// `rec-%H%M%S.mp4` file `rec-120000.mp4`.
    @Test func aNumberedNameIsTheTemplatesOnlyWhenItWasGivenOut() {
        let used = ["/d/rec.mp4": 3, "/d/cam-120000.mp4": 2]
        #expect(RecordingTemplate.isNamed(by: "/d/rec.mp4", path: "/d/rec.mp4", used: used))
        #expect(RecordingTemplate.isNamed(by: "/d/rec.mp4", path: "/d/rec-2.mp4", used: used))
        #expect(RecordingTemplate.isNamed(by: "/d/rec.mp4", path: "/d/rec-3.mp4", used: used))
        #expect(!RecordingTemplate.isNamed(by: "/d/rec.mp4", path: "/d/rec-4.mp4", used: used))
        #expect(!RecordingTemplate.isNamed(by: "/d/rec.mp4", path: "/d/rec-120000.mp4", used: used))
        #expect(!RecordingTemplate.isNamed(by: "/d/rec.mp4", path: "/d/rec-03.mp4", used: used))
        #expect(!RecordingTemplate.isNamed(by: "/d/rec.mp4", path: "/d/rec-2.mp4", used: [:]))
        #expect(RecordingTemplate.isNamed(by: "/d/cam-%H%M%S.mp4", path: "/d/cam-120000-2.mp4", used: used))
        #expect(!RecordingTemplate.isNamed(by: "/d/cam.mp4", path: "/d/cam-120000-2.mp4", used: used))
        #expect(!RecordingTemplate.isNamed(by: "/d/cam.mp4", path: "/d/cam-120000.mp4", used: used))
    }

    @Test func baseDirectoryStopsAtTheFirstConversion() {
        #expect(RecordingTemplate.baseDirectory(of: "/var/lib/broadcast/rec-%H.mp4") == "/var/lib/broadcast")
        #expect(RecordingTemplate.baseDirectory(of: "/var/lib/broadcast/%Y/%m/rec.mp4") == "/var/lib/broadcast")
        #expect(RecordingTemplate.baseDirectory(of: "/rec.mp4") == "/")
        #expect(RecordingTemplate.baseDirectory(of: "/%Y/rec.mp4") == "/")
    }
}

@Suite struct RecordingManifestTests {
    /// Created and deleted files are appended; `files()` lists what was created and not deleted;
    /// `compact()` keeps only the files that still exist.
    @Test func listsCreatedFilesAndCompacts() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("manifest-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir + "/2026", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let manifest = RecordingManifest(directory: dir)
        #expect(manifest.files().isEmpty)
        for name in ["a.mp4", "2026/b.mp4", "c.mp4"] {
            FileManager.default.createFile(atPath: "\(dir)/\(name)", contents: Data([1]))
            manifest.recordCreated(path: "\(dir)/\(name)")
        }
        manifest.recordCreated(path: "/elsewhere/d.mp4")
        manifest.recordCreated(path: "\(dir)//e.mp4")
        manifest.recordDeleted("\(dir)/a.mp4")
        #expect(manifest.files() == ["\(dir)/2026/b.mp4", "\(dir)/c.mp4", "/elsewhere/d.mp4", "\(dir)//e.mp4"])
        let text = try String(contentsOfFile: manifest.path, encoding: .utf8)
        #expect(text == "+ a.mp4\n+ 2026/b.mp4\n+ c.mp4\n+ /elsewhere/d.mp4\n+ \(dir)//e.mp4\n- a.mp4\n")
        try FileManager.default.removeItem(atPath: "\(dir)/c.mp4")
        manifest.compact()
        #expect(try String(contentsOfFile: manifest.path, encoding: .utf8) == "+ 2026/b.mp4\n")
        #expect(manifest.files() == ["\(dir)/2026/b.mp4"])
    }

    /// A replacement through a link writes its `.partial` beside the link's target, in another
    /// directory: that is the file listed (before: the same name in the link's directory, where
    /// nothing is, so a crash's `.partial` was never found).
    @Test func aReplacementThroughALinkListsItsPartialBesideTheTarget() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("manifest-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: base) }
        try FileManager.default.createDirectory(atPath: base + "/links", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: base + "/files", withIntermediateDirectories: true)
        FileManager.default.createFile(atPath: base + "/files/old.mkv", contents: Data("old".utf8))
        try FileManager.default.createSymbolicLink(atPath: base + "/links/rec.mkv", withDestinationPath: base + "/files/old.mkv")
        let encoder = try VideoEncoder(
            settings: VideoEncoderSettings(width: 160, height: 96, bitrate: 200_000), globalHeader: true, streamIndex: 0,
            logger: Logger(label: "test"))
        let recording = try Recording(path: base + "/links/rec.mkv", streams: [encoder.stream], overwrite: true, logger: Logger(label: "test"))
        defer { recording.discard() }
        let manifest = RecordingManifest(directory: base + "/links")
        manifest.recordCreated(recording, owner: "rec")
        #expect(recording.writingPath == base + "/files/old.partial.mkv")
        #expect(manifest.files() == [base + "/links/rec.mkv", base + "/files/old.partial.mkv"])
        #expect(FileManager.default.fileExists(atPath: manifest.files()[1]))
    }

    /// Each file is listed with the output that created it; a line written before owners were
    /// recorded has none. Compaction keeps the owners and every name's number.
    @Test func ownersAndNumbersSurviveCompaction() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("manifest-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let manifest = RecordingManifest(directory: dir)
        try "+ old.mp4\n".write(toFile: manifest.path, atomically: true, encoding: .utf8)
        for (name, owner) in [("a.mp4", "cam"), ("b.mp4", "screen"), ("gone.mp4", "cam"), ("odd.mp4", "x]y")] {
            FileManager.default.createFile(atPath: "\(dir)/\(name)", contents: Data([1]))
            manifest.recordCreated(path: "\(dir)/\(name)", owner: owner)
        }
        FileManager.default.createFile(atPath: "\(dir)/old.mp4", contents: Data([1]))
        manifest.recordUsed("\(dir)/a.mp4", number: 1)
        manifest.recordUsed("\(dir)/a.mp4", number: 3)
        manifest.recordUsed("\(dir)/a.mp4", number: 2)
        try FileManager.default.removeItem(atPath: "\(dir)/gone.mp4")
        let expected = [
            RecordingManifest.Entry(path: "\(dir)/old.mp4", owner: nil),
            RecordingManifest.Entry(path: "\(dir)/a.mp4", owner: "cam"),
            RecordingManifest.Entry(path: "\(dir)/b.mp4", owner: "screen"),
            // An owner that cannot be written: nobody's (never deleted by retention).
            RecordingManifest.Entry(path: "\(dir)/odd.mp4", owner: nil),
        ]
        #expect(manifest.entries().filter { $0.path != "\(dir)/gone.mp4" } == expected)
        #expect(manifest.usedNumbers() == ["\(dir)/a.mp4": 3])
        manifest.compact()
        #expect(manifest.entries() == expected)
        #expect(manifest.usedNumbers() == ["\(dir)/a.mp4": 3])
        #expect(
            try String(contentsOfFile: manifest.path, encoding: .utf8)
                == "+ old.mp4\n+[cam] a.mp4\n+[screen] b.mp4\n+ odd.mp4\n~ 3 a.mp4\n")
    }
}

@Suite struct RecordingRetentionTests {
    static func directory() throws -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("retention-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    /// After retention deleted every earlier file, the name does not come round again: the number
    /// only goes up (before: cam.mp4, cam-2.mp4, cam-3.mp4, then cam.mp4 again).
    @Test func aNameIsGivenOutOnce() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let manifest = RecordingManifest(directory: dir)
        var names: [String] = []
        var previous = ""
        for _ in 0..<6 {
            let path = RecordingRetention.nextPath("\(dir)/cam.mp4", after: previous, manifest: manifest)
            names.append(String(path.dropFirst(dir.count + 1)))
            FileManager.default.createFile(atPath: path, contents: Data([1]))
            manifest.recordCreated(path: path, owner: "cam")
            // Retention keeps only the newest.
            if !previous.isEmpty {
                try FileManager.default.removeItem(atPath: previous)
                manifest.recordDeleted(previous)
            }
            previous = path
        }
        #expect(names == ["cam.mp4", "cam-2.mp4", "cam-3.mp4", "cam-4.mp4", "cam-5.mp4", "cam-6.mp4"])
        // Across a restart (compaction), too.
        manifest.compact()
        #expect(RecordingRetention.nextPath("\(dir)/cam.mp4", manifest: manifest) == "\(dir)/cam-7.mp4")
        // A file someone else put there is stepped over, never taken.
        FileManager.default.createFile(atPath: "\(dir)/cam-8.mp4", contents: Data([9]))
        #expect(RecordingRetention.nextPath("\(dir)/cam.mp4", manifest: manifest) == "\(dir)/cam-9.mp4")
    }

    /// One directory, two outputs whose names overlap: "cam" (`cam.mp4`, segmented, a size limit)
    /// and "screen" (`cam-%H%M%S.mp4`). cam's retention deletes its own old segment, and neither
    /// screen's file (before: `cam-120000.mp4` passed for cam's `-N`), nor a file of its own some
    /// process has open, nor one listed without an owner.
    @Test func retentionDeletesOnlyThisOutputsClosedFiles() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let manifest = RecordingManifest(directory: dir)
        var cam: [String] = []
        for _ in 0..<3 {
            let path = RecordingRetention.nextPath("\(dir)/cam.mp4", after: cam.last ?? "", manifest: manifest)
            FileManager.default.createFile(atPath: path, contents: Data(repeating: 1, count: 1000))
            manifest.recordCreated(path: path, owner: "cam")
            cam.append(path)
        }
        let screen = "\(dir)/cam-120000.mp4"
        let legacy = "\(dir)/cam-2000.mp4"
        for path in [screen, legacy] { FileManager.default.createFile(atPath: path, contents: Data(repeating: 2, count: 5000)) }
        manifest.recordCreated(path: screen, owner: "screen")
        manifest.recordCreated(path: legacy)
        manifest.recordUsed("\(dir)/cam.mp4", number: 2000)
        // cam-2.mp4 is open (as a recording being written is).
        let open = Glibc.open(cam[1], O_RDONLY)
        defer { close(open) }
        let policy = RecordingSegments(pathTemplate: "\(dir)/cam.mp4", length: .seconds(1), retainBytes: 1)
        RecordingRetention.apply(policy, owner: "cam", keeping: cam[2], manifest: manifest, logger: Logger(label: "test"))
        #expect(cam == ["\(dir)/cam.mp4", "\(dir)/cam-2.mp4", "\(dir)/cam-3.mp4"])
        #expect(!FileManager.default.fileExists(atPath: cam[0]), "cam's old closed segment was kept")
        for path in [cam[1], cam[2], screen, legacy] {
            #expect(FileManager.default.fileExists(atPath: path), "\(path) was deleted")
        }
        // The other output's retention, on its own files: screen's file goes once closed.
        let other = RecordingSegments(pathTemplate: "\(dir)/cam-%H%M%S.mp4", length: .seconds(1), retainBytes: 1)
        RecordingRetention.apply(other, owner: "screen", keeping: "\(dir)/cam-120001.mp4", manifest: manifest, logger: Logger(label: "test"))
        #expect(!FileManager.default.fileExists(atPath: screen))
        #expect(FileManager.default.fileExists(atPath: cam[1]) && FileManager.default.fileExists(atPath: cam[2]))
    }
}
