import Dispatch
import Foundation
import Synchronization

/// A thread of its own for async work (a `TaskExecutor`). In a full test run the other tests fill
/// Swift's cooperative pool (two threads on two cores) for minutes: an in-process daemon's tasks
/// and a test's timed waits queued behind them (a loaded clean-clone run saw two in-process
/// daemons never start within 300 s, and both waits end at the same instant). Test code only: a
/// plain lock and semaphore.
final class ThreadExecutor: TaskExecutor, @unchecked Sendable {
    private let jobs = Mutex<[UnownedJob]>([])
    private let waiting = DispatchSemaphore(value: 0)

    init(name: String) {
        let thread = Thread { [self] in loop() }
        thread.name = name
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        jobs.withLock { $0.append(unowned) }
        waiting.signal()
    }

    private func loop() {
        while true {
            waiting.wait()
            let job = jobs.withLock { $0.removeFirst() }
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }

    /// One for the tests' timed waits (`poll`), one for their in-process daemons: neither waits
    /// for the cooperative pool.
    static let waits = ThreadExecutor(name: "test-waits")
    static let daemons = ThreadExecutor(name: "test-daemons")
}

/// `daemon.run()` (or any long async work) in a task on `ThreadExecutor.daemons`.
func runOnOwnThread(_ work: @escaping @Sendable () async throws -> Void) -> Task<Void, any Error> {
    Task(executorPreference: ThreadExecutor.daemons) { try await work() }
}
