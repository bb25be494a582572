import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The memory budget holds under stress: at the default budget, 1080p60 test pattern recorded to a
/// FIFO that is read slower than the stream's bitrate (the recording's queue fills, then the
/// encoder waits and capture drops) plus a live stream to an nginx frozen with SIGSTOP. The
/// daemon's own report of its footprint (private dirty bytes, /v1/status) stays under the budget
/// at every sample.
@Suite(.serialized) struct MemoryBudgetTests {
    struct Memory {
        var privateDirty: Double
        var resident: Double
        var budget: Double
    }

    func memory(_ socket: String) throws -> Memory? {
        let r = try broadcast(["status", "--socket", socket], timeout: 30)
        guard r.status == 0, let json = try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any],
            let memory = json["memory"] as? [String: Any], let dirty = memory["private_dirty_bytes"] as? Double,
            let budget = memory["budget_bytes"] as? Double
        else { return nil }
        return Memory(privateDirty: dirty, resident: memory["resident_bytes"] as? Double ?? 0, budget: budget)
    }

    @Test func footprintStaysUnderTheDefaultBudgetAt1080p60WithSlowOutputs() throws {
        let server = try RTMPServer()
        defer { server.cleanup() }
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let fifo = dir.path("slow.mkv")
        #expect(mkfifo(fifo, 0o600) == 0)
        // Opened before the daemon, without waiting for it: the daemon's open for writing then
        // finds a reader. Read 16 KiB every 100 ms: 1.3 Mbit/s, less than the stream's 3 Mbit/s.
        let reader = open(fifo, O_RDONLY | O_NONBLOCK)
        try #require(reader >= 0)
        let reading = ManagedFlag()
        let readerThread = Thread {
            var chunk = [UInt8](repeating: 0, count: 16 << 10)
            while !reading.stopped {
                _ = chunk.withUnsafeMutableBytes { Glibc.read(reader, $0.baseAddress, $0.count) }
                usleep(100_000)
            }
        }
        readerThread.start()
        defer {
            reading.stop()
            usleep(200_000)
            close(reader)
        }
        let socket = dir.path("c.sock")
        let config = """
            [video]
            size = "1920x1080"
            fps = 60
            [control]
            socket = "\(socket)"
            [[output]]
            name = "slow"
            path = "\(fifo)"
            overwrite = true
            [[output]]
            name = "live"
            url = "rtmp://127.0.0.1:\(server.port)/live/memory"
            """
        let daemon = try spawnDaemon(config: config, in: dir)
        defer {
            daemon.signal(SIGTERM)
            _ = daemon.wait(timeout: 60)
        }
        var samples: [Memory] = []
        for _ in 0..<150 where samples.isEmpty {
            if let m = try memory(socket) { samples.append(m) } else { usleep(200_000) }
        }
        try #require(!samples.isEmpty, "the daemon never reported its memory")
        let pid = try #require(Int32((try String(contentsOfFile: server.pidFile, encoding: .utf8)).trimmingCharacters(in: .whitespacesAndNewlines)))
        kill(pid, SIGSTOP)
        defer { kill(pid, SIGCONT) }
        // 20 s: the FIFO's queue fills (it holds tens of seconds at most), the live backlog grows.
        for _ in 0..<80 {
            if let m = try memory(socket) { samples.append(m) }
            usleep(250_000)
        }
        let peak = samples.map(\.privateDirty).max() ?? 0
        let budget = samples[0].budget
        print("memory at 1080p60 with slow outputs: peak \(Int(peak) >> 20) MiB private dirty (resident \(Int(samples.map(\.resident).max() ?? 0) >> 20) MiB) of a \(Int(budget) >> 20) MiB budget, \(samples.count) samples")
        #expect(budget == Double(160 << 20), "the default budget: \(budget)")
        #expect(peak > 20 * Double(1 << 20), "a 1080p encoder is in the footprint: \(peak)")
        #expect(samples.allSatisfy { $0.privateDirty < $0.budget },
            "footprint over the budget: peak \(Int(peak) >> 20) MiB of \(Int(budget) >> 20) MiB; samples \(samples.map { Int($0.privateDirty) >> 20 })")
        // Library code is not counted: the resident size is larger than the footprint.
        #expect(samples.allSatisfy { $0.resident > $0.privateDirty })
        // The same figures as Prometheus gauges.
        let metrics = try run("/usr/bin/curl", ["-s", "--unix-socket", socket, "http://localhost/metrics"]).stdout
        #expect(metrics.contains("broadcast_memory_budget_bytes 167772160"), "\(metrics)")
        #expect(metrics.contains("broadcast_private_dirty_bytes "), "\(metrics)")
    }
}

extension MemoryBudgetTests {
    /// record's status line (a log line every 5 s off a terminal) says the footprint and the budget.
    @Test func statusLineShowsTheFootprintAgainstTheBudget() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let r = try broadcast([
            "record", dir.path("a.mkv"), "--size", "320x180", "--duration", "7s", "--memory-budget", "64M",
        ])
        #expect(r.status == 0, "\(r.stderr)")
        let line = r.stderr.split(separator: "\n").first { $0.contains("elapsed=") } ?? ""
        let mem = line.split(separator: " ").first { $0.hasPrefix("mem=") } ?? ""
        // "mem=23.4 MiB/64.0 MiB": the footprint, then the budget.
        #expect(mem.hasPrefix("mem=") && line.contains(" MiB/64.0 MiB"), "\(line)")
    }
}

/// A flag a test's helper thread polls.
final class ManagedFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    var stopped: Bool { lock.withLock { value } }
    func stop() { lock.withLock { value = true } }
}
