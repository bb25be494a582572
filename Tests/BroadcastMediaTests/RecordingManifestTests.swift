import BroadcastOutputs
import Foundation
import Testing

@Suite struct RecordingTemplateTests {
    /// A name matches the template it could have been made from, and nothing else that merely
    /// shares the directory or the extension.
    @Test(arguments: [
        ("/d/%H%M%S.mp4", "/d/123456.mp4", true),
        ("/d/%H%M%S.mp4", "/d/123456-2.mp4", true),
        ("/d/%H%M%S.mp4", "/d/my-wedding.mp4", false),
        ("/d/%H%M%S.mp4", "/d/1234567.mp4", false),
        ("/d/%H%M%S.mp4", "/d/123456.mkv", false),
        ("/d/%H%M%S.mp4", "/e/123456.mp4", false),
        ("/d/rec-%Y%m%d-%H%M%S.mkv", "/d/rec-20261123-214501.mkv", true),
        ("/d/rec-%Y%m%d-%H%M%S.mkv", "/d/rec-20261123-214501-12.mkv", true),
        ("/d/rec-%Y%m%d-%H%M%S.mkv", "/d/rec-holiday.mkv", false),
        ("/d/%Y/%m/x-%F_%T.mp4", "/d/2026/11/x-2026-11-23_21:45:01.mp4", true),
        ("/d/%Y/%m/x-%F_%T.mp4", "/d/2026/x-2026-11-23_21:45:01.mp4", false),
        ("/d/%a-%b-%s.ts", "/d/Mon-Nov-1795000000.ts", true),
        ("/d/%a-%b-%s.ts", "/d/Mon/x-Nov-1.ts", false),
        ("/d/100%%-%H.mp4", "/d/100%-07.mp4", true),
        ("/d/rec.mp4", "/d/rec.mp4", true),
        ("/d/rec.mp4", "/d/rec-2.mp4", true),
        ("/d/rec.mp4", "/d/rec-x.mp4", false),
    ] as [(String, String, Bool)])
    func namesMatchTheirTemplate(template: String, path: String, expected: Bool) {
        #expect(RecordingTemplate.matches(template, path: path) == expected, "\(template) ~ \(path)")
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
}
