import Foundation
import Testing

/// Finalizing does not take memory in proportion to the recording's length. Measured where it
/// runs alone: the daemon finalizes, at start, the fragmented recordings its list has (autostart off,
/// so nothing else runs), and its peak RSS is read from wait4. A 3-hour recording is made in a
/// second from a short one by repeating its fragments with their decoding times moved on.
@Suite(.serialized) struct FinalizeMemoryTests {
    /// A fragmented MP4 recorded through a FIFO (so it is never finalized).
    func shortFragmented(_ dir: TemporaryDirectory) throws -> [UInt8] {
        let fifo = dir.path("pipe.mp4")
        #expect(mkfifo(fifo, 0o644) == 0)
        let caught = dir.path("short-source.bin")
        let reader = try Child("/bin/sh", ["-c", "cat \"$0\" > \"$1\"", fifo, caught])
        let r = try broadcast(["record", fifo, "--size", "64x64", "--no-realtime", "--duration", "9s", "--quiet", "--keyframe-interval", "1s"])
        #expect(r.status == 0, "\(r.stderr)")
        _ = reader.wait(timeout: 30)
        unlink(fifo)
        defer { unlink(caught) }
        return [UInt8](try Data(contentsOf: URL(fileURLWithPath: caught)))
    }

    struct Box {
        var type: String
        var range: Range<Int>
    }

    func boxes(_ d: [UInt8], _ range: Range<Int>) -> [Box] {
        var result: [Box] = []
        var p = range.lowerBound
        while p + 8 <= range.upperBound {
            let size = Int(u32(d, p))
            guard size >= 8, p + size <= range.upperBound else { break }
            result.append(Box(type: String(decoding: d[(p + 4)..<(p + 8)], as: UTF8.self), range: p..<(p + size)))
            p += size
        }
        return result
    }

    func u32(_ d: [UInt8], _ p: Int) -> UInt32 { UInt32(d[p]) << 24 | UInt32(d[p + 1]) << 16 | UInt32(d[p + 2]) << 8 | UInt32(d[p + 3]) }
    func u64(_ d: [UInt8], _ p: Int) -> UInt64 { UInt64(u32(d, p)) << 32 | UInt64(u32(d, p + 4)) }
    func put64(_ d: inout [UInt8], _ p: Int, _ v: UInt64) { for i in 0..<8 { d[p + i] = UInt8(v >> (56 - 8 * UInt64(i)) & 0xFF) } }

    /// (track ID, offset of its tfdt's 64-bit time) for each traf of the moof.
    func decodeTimes(_ d: [UInt8], moof: Box) -> [(track: UInt32, at: Int)] {
        boxes(d, (moof.range.lowerBound + 8)..<moof.range.upperBound).filter { $0.type == "traf" }.compactMap { traf in
            let inner = boxes(d, (traf.range.lowerBound + 8)..<traf.range.upperBound)
            guard let tfhd = inner.first(where: { $0.type == "tfhd" }), let tfdt = inner.first(where: { $0.type == "tfdt" }),
                d[tfdt.range.lowerBound + 8] == 1
            else { return nil }
            return (u32(d, tfhd.range.lowerBound + 12), tfdt.range.lowerBound + 12)
        }
    }

    /// `hours` of fragmented MP4 made of the short one's whole fragments repeated.
    func longFragmented(from short: [UInt8], hours: Double) throws -> Data {
        let top = boxes(short, 0..<short.count)
        let head = top.prefix { $0.type != "moof" }
        var pairs: [(moof: Box, mdat: Box)] = []
        for (i, box) in top.enumerated() where box.type == "moof" && i + 1 < top.count && top[i + 1].type == "mdat" {
            pairs.append((box, top[i + 1]))
        }
        #expect(pairs.count >= 5, "\(pairs.count) fragments")
        // The block: every fragment but the last, which says where the block ends.
        let block = pairs.dropLast()
        let end = decodeTimes(short, moof: pairs.last!.moof)
        let start = decodeTimes(short, moof: pairs.first!.moof)
        var span: [UInt32: UInt64] = [:]
        for (track, at) in end { span[track] = u64(short, at) - u64(short, start.first { $0.track == track }!.at) }
        // Track 1 is the video, in a 90 kHz timescale.
        let seconds = Double(span[1] ?? 0) / 90_000
        #expect(seconds > 3, "a block of \(seconds) s")
        let copies = Int(hours * 3600 / max(seconds, 1))
        var out = Data()
        for box in head { out.append(contentsOf: short[box.range]) }
        for copy in 0..<copies {
            for (moof, mdat) in block {
                var bytes = Array(short[moof.range])
                for (track, at) in decodeTimes(short, moof: moof) {
                    put64(&bytes, at - moof.range.lowerBound, u64(short, at) + UInt64(copy) * span[track]!)
                }
                out.append(contentsOf: bytes)
                out.append(contentsOf: short[mdat.range])
            }
        }
        return out
    }

    /// Runs the daemon until its control socket is up (recovery is done by then), and returns its
    /// peak RSS in KB (VmHWM, which counts from the exec: wait4's ru_maxrss would include the test
    /// process's own memory, shared by the spawned child until it runs the program).
    func daemonPeakKB(_ dir: TemporaryDirectory) throws -> Int {
        let socket = dir.path("c.sock")
        let config = """
            [daemon]
            autostart = false
            [control]
            socket = "\(socket)"
            [[output]]
            name = "rec"
            path = "\(dir.path("rec-%H%M%S.mp4"))"
            """
        try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        var pid: pid_t = 0
        let arguments = [broadcastBinary, "daemon", "--config", dir.path("d.toml"), "--log-level", "error"]
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        #expect(posix_spawn(&pid, broadcastBinary, nil, nil, &argv, environ) == 0)
        var up = false
        for _ in 0..<600 where !up {
            usleep(100_000)
            up = access(socket, F_OK) == 0
        }
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let peak = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }
            .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") } ?? -1
        kill(pid, SIGTERM)
        var exitStatus: Int32 = 0
        waitpid(pid, &exitStatus, 0)
        #expect(up, "the daemon never came up")
        #expect(peak > 0, "no VmHWM in \(status)")
        return peak
    }

    @Test func finalizingThreeHoursTakesNoMoreMemoryThanAFewSeconds() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let short = try shortFragmented(dir)
        try Data(short).write(to: URL(fileURLWithPath: dir.path("short.mp4")))
        // Recovery finalizes only what the daemon's list says it wrote: these stand for recordings
        // of a daemon that was killed.
        try "+ short.mp4\n".write(toFile: dir.path(".broadcast-files"), atomically: true, encoding: .utf8)
        let shortPeak = try daemonPeakKB(dir)
        #expect(try mp4TopLevelBoxes(dir.path("short.mp4")).prefix(2) == ["ftyp", "moov"], "the short recording was finalized")

        try longFragmented(from: short, hours: 3).write(to: URL(fileURLWithPath: dir.path("long.mp4")))
        try "+ long.mp4\n".write(toFile: dir.path(".broadcast-files"), atomically: true, encoding: .utf8)
        let longPeak = try daemonPeakKB(dir)
        #expect(try mp4TopLevelBoxes(dir.path("long.mp4")).prefix(2) == ["ftyp", "moov"], "the long recording was finalized")
        let duration = try probe(dir.path("long.mp4")).formatDuration ?? 0
        #expect(duration > 2.9 * 3600, "\(duration) s")
        print("finalize peak RSS: 3 h \(longPeak) KB, a few seconds \(shortPeak) KB")
        // libavformat's remux needed ~30 MB per hour (97 MB more here); the streaming rewrite a few hundred KB.
        #expect(longPeak - shortPeak < 10_000, "finalizing 3 h peaked at \(longPeak) KB, a few seconds at \(shortPeak) KB")
    }
}
