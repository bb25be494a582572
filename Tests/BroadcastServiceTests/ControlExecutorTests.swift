import Foundation
import Synchronization
import Testing

@testable import BroadcastService

/// The control executor outlives every task that prefers it. Hummingbird's graceful shutdown awaits
/// its quiescing promise in an unstructured `Task` that inherits the server's executor preference
/// and may resume after the server's `run` returned; with an executor per run, stopped and freed at
/// its end, that resumption was enqueued on freed memory (the daemon's SIGSEGV at exit).
@Suite struct ControlExecutorTests {
    final class Flag: Sendable {
        let value = Mutex(false)
    }

    /// Like that shutdown task: made inside the preference's scope, still asleep when the scope ends,
    /// resumed later; it runs, on the control thread.
    @Test func aTaskThatOutlivesItsServerStillRuns() async throws {
        let resumed = Flag()
        let before = ControlExecutor.shared.jobsRun
        // The task waits for the test to let it go (not for a time: on a loaded machine the scope
        // could end after a sleep had run out, and the task would have finished inside it).
        let (gate, open) = AsyncStream<Void>.makeStream()
        await withTaskExecutorPreference(ControlExecutor.shared) {
            Task {
                for await _ in gate { break }
                resumed.value.withLock { $0 = true }
            }
        }
        // The scope (the server's run) has ended; the task has not run to its end yet.
        #expect(!resumed.value.withLock { $0 })
        open.yield()
        open.finish()
        // A guard against hanging, not a measurement: a loaded fresh-clone run (beside two busy
        // processes and a VM) did not see a 300 ms sleep end within 30 s.
        let deadline = Date().addingTimeInterval(180)
        while !resumed.value.withLock({ $0 }) && Date() < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(resumed.value.withLock { $0 }, "the task never resumed")
        #expect(ControlExecutor.shared.jobsRun > before, "the task did not run on the control executor")
    }

    /// Servers one after the other share the one executor: the last one's requests are answered too.
    @Test func serversInTurnShareTheExecutor() async throws {
        for _ in 0..<3 {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("ctl-\(UUID().uuidString.prefix(8)).sock").path
            let server = try ControlServer(socketPath: path, logger: .init(label: "test")) { _ in .json(200, .object([])) }
            let status = try await serving(server) { try ControlClient(socketPath: path).send(method: "GET", path: "/v1/status").status }
            #expect(status == 200)
        }
    }
}
