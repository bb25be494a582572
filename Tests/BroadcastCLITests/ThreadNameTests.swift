import Foundation
import Testing

/// Every thread broadcast starts has a name (what `top -H` and perf show): the sources', the
/// output's and the signal watcher's, read from /proc/PID/task/*/comm while a recording runs.
@Suite struct ThreadNameTests {
    @Test func threadsAreNamed() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let recording = try Child(broadcastBinary, ["record", dir.path("n.mkv"), "--video", "test", "--audio-mic", "test", "--duration", "30s", "-q"])
        defer {
            recording.signal(SIGINT)
            _ = recording.wait(timeout: 30)
        }
        let pid = recording.process.processIdentifier
        var names: Set<String> = []
        let wanted: Set<String> = ["bc-test-video", "bc-test-audio", "bc-out-n.mkv", "bc-signals"]
        for _ in 0..<300 where !wanted.isSubset(of: names) {
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            for task in tasks {
                if let comm = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/comm", encoding: .utf8) {
                    names.insert(comm.trimmingCharacters(in: .whitespacesAndNewlines))
                }
            }
            usleep(50_000)
        }
        #expect(wanted.isSubset(of: names), "threads: \(names.sorted())")
    }
}
