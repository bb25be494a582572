@testable import BroadcastService

/// Threads of their own for async work. In a full test run the other tests fill Swift's
/// cooperative pool (two threads on two cores) for minutes: an in-process daemon's tasks and a
/// test's timed waits queued behind them (a loaded clean-clone run saw two in-process daemons
/// never start within 300 s, and both waits end at the same instant). The control server's own
/// executor type, one instance each.
enum TestExecutors {
    /// The tests' timed waits (`poll`).
    static let waits = ControlExecutor(name: "test-waits")
    /// Their in-process daemons.
    static let daemons = ControlExecutor(name: "test-daemons")
}

/// `daemon.run()` (or any long async work) in a task on `TestExecutors.daemons`.
func runOnOwnThread(_ work: @escaping @Sendable () async throws -> Void) -> Task<Void, any Error> {
    Task(executorPreference: TestExecutors.daemons) { try await work() }
}
