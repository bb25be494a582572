import BroadcastKit
import Synchronization

/// The thread the control server's requests run on (a `TaskExecutor`): the server prefers it for
/// all its tasks, so answering requests does not depend on Swift's cooperative pool, which has two
/// threads on a 2-core machine and which other work (the daemon's services, a host's tests) may
/// keep busy. Jobs run one at a time, in order; blocking work is not done here (the handler runs
/// on dispatch queues).
final class ControlExecutor: TaskExecutor, @unchecked Sendable {
    private let jobs = Mutex<(queue: [UnownedJob], stopped: Bool)>(([], false))
    private let wakeup = Wakeup()
    private var thread: OSThread?

    init(name: String = "bc-control") {
        thread = OSThread(name: name) { [self] in loop() }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        jobs.withLock { $0.queue.append(unowned) }
        wakeup.wake()
    }

    private func loop() {
        while true {
            let (batch, stopped) = jobs.withLock { state -> ([UnownedJob], Bool) in
                defer { state.queue.removeAll(keepingCapacity: true) }
                return (state.queue, state.stopped)
            }
            for job in batch { job.runSynchronously(on: asUnownedTaskExecutor()) }
            if batch.isEmpty {
                if stopped { return }
                // Wakeup's protocol: say we sleep, look once more, then sleep (or not).
                wakeup.prepareToSleep()
                if jobs.withLock({ !$0.queue.isEmpty || $0.stopped }) {
                    wakeup.cancelSleep()
                } else {
                    _ = wakeup.sleep(timeout: .seconds(1))
                }
            }
        }
    }

    /// Ends the thread once the jobs queued so far have run.
    func stop() {
        jobs.withLock { $0.stopped = true }
        wakeup.wake()
        thread?.join()
        thread = nil
    }
}
