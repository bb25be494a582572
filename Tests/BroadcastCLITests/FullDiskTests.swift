import Foundation
import Testing

/// A full disk does not end a recording for good: the file being written is closed with what it
/// holds (it plays), the output says `failed` and why, and when space comes back it goes on in a
/// new file, with its state back to `recording`. A segment whose finalize fails for want of room
/// stays fragmented (it plays) and the next segment goes on. On a small tmpfs of the test's own.
@Suite(.serialized) struct FullDiskTests {
    static func outputState(_ socket: String) -> (state: String, error: String)? {
        guard let r = try? broadcast(["status", "--json", "--socket", socket], timeout: 30), r.status == 0,
              let document = try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any],
              let outputs = document["outputs"] as? [[String: Any]],
              let rec = outputs.first(where: { $0["name"] as? String == "rec" }) else { return nil }
        return (rec["state"] as? String ?? "?", rec["error"] as? String ?? "")
    }

    /// The recording's `target` in the status.
    static func target(_ socket: String) -> String? {
        guard let r = try? broadcast(["status", "--json", "--socket", socket], timeout: 30), r.status == 0,
              let document = try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any],
              let outputs = document["outputs"] as? [[String: Any]] else { return nil }
        return outputs.first { $0["name"] as? String == "rec" }?["target"] as? String
    }

    static func waitFor(_ socket: String, _ condition: ((state: String, error: String)) -> Bool) -> (state: String, error: String)? {
        var last: (state: String, error: String)?
        for _ in 0..<600 {
            last = outputState(socket)
            if let last, condition(last) { return last }
            usleep(100_000)
        }
        return last
    }

    @Test func aFullDiskClosesTheFileAndTheRecordingGoesOnWhenSpaceReturns() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let disk = dir.path("disk")
        try FileManager.default.createDirectory(atPath: disk, withIntermediateDirectories: true)
        let mounted = try run("/bin/mount", ["-t", "tmpfs", "-o", "size=48m", "tmpfs", disk])
        try #require(mounted.status == 0, "a tmpfs of the test's own (the suite runs as root): \(mounted.stderr)")
        defer { _ = try? run("/bin/umount", ["-l", disk]) }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "rec"
            path = "\(disk)/seg-%H%M%S.mp4"
            segment = "2s"
            """)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        _ = try waitUntilRecording(socket)
        usleep(3_000_000)
        // The disk fills up (another program's file takes what is left).
        let filler = disk + "/filler"
        _ = try run("/bin/dd", ["if=/dev/zero", "of=\(filler)", "bs=64k"], timeout: 60)
        let failed = Self.waitFor(socket) { $0.state == "failed" }
        #expect(failed?.state == "failed" && failed?.error.contains("new file") == true, "while full: \(String(describing: failed))")
        #expect(daemon.process.isRunning, "the daemon goes on")
        // Space comes back: the recording goes on in a new file.
        try FileManager.default.removeItem(atPath: filler)
        let back = Self.waitFor(socket) { $0.state == "recording" }
        #expect(back?.state == "recording" && back?.error == "", "after space came back: \(String(describing: back))")
        #expect(daemon.waitForStderr(timeout: 60) { $0.contains("writing again") }, "\(daemon.stderrSoFar.suffix(2000))")
        // The status names the file written now, not the one the full disk closed (issue 35 item 22).
        let writing = daemon.stderrSoFar.split(separator: "\n").last { $0.contains("writing again, in ") }
            .flatMap { line in line.range(of: "writing again, in ").map { String(line[$0.upperBound...].prefix { $0 != "\u{1B}" }) } }?
            .trimmingCharacters(in: .whitespaces)
        // (Or a later segment's: names count up with the time, seg-%H%M%S.)
        let target = Self.target(socket)
        #expect(writing != nil && target != nil && target! >= writing!, "status target \(target ?? "?"), writing \(writing ?? "?")")
        usleep(3_000_000)
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 90)
        #expect(r.status == 0, "\(r.stderr.suffix(3000))")
        // Every file holds media: the one the full disk closed (fragmented, cut where the disk was
        // full: it plays up to there), and the others, which decode cleanly, among them the file
        // the recording went on in.
        func path(after marker: String, before end: String) -> String? {
            guard let line = r.stderr.split(separator: "\n").last(where: { $0.contains(marker) }),
                  let at = line.range(of: marker) else { return nil }
            let rest = line[at.upperBound...]
            return String(rest[..<(rest.range(of: end)?.lowerBound ?? rest.endIndex)])
        }
        let resumedIn = path(after: "writing again, in ", before: "\u{1B}")?.trimmingCharacters(in: .whitespaces)
        let cut = r.stderr.split(separator: "\n").first { $0.contains("closed unfinished after a write error") }
            .flatMap { line in line.range(of: "recording ").map { String(line[$0.upperBound...].prefix { $0 != ":" }) } }
        #expect(resumedIn.map { FileManager.default.fileExists(atPath: $0) } == true, "went on in \(resumedIn ?? "?")")
        let files = try FileManager.default.contentsOfDirectory(atPath: disk).filter { $0.hasSuffix(".mp4") }.sorted()
        #expect(files.count >= 3, "\(files)")
        for name in files {
            let file = disk + "/" + name
            let frames = try probe(file).video?.frames ?? 0
            #expect(frames > 0, "\(name) holds no video")
            if file != cut {
                #expect(try decodeErrors(file).isEmpty, "\(name) does not decode cleanly")
            }
        }
    }
}
