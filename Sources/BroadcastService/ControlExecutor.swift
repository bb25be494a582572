import BroadcastKit
import Synchronization

/// The thread the control server's requests run on (a `TaskExecutor`): the server prefers it for
/// all its tasks, so answering requests does not depend on Swift's cooperative pool, which has two
/// threads on a 2-core machine and which other work (the daemon's services, a host's tests) may
/// keep busy. Jobs run one at a time, in order; blocking work is not done here (the handler runs
/// on dispatch queues).
///
/// One for the process (`shared`), never stopped: a task that prefers it can outlive the server
/// that started it. Hummingbird's graceful shutdown awaits its quiescing promise in an unstructured
/// `Task`, which inherits the preference; when the server's `run` returned first and its own
/// executor was stopped and freed, that task's resumption was enqueued on freed memory: the daemon
/// crashed (SIGSEGV in `enqueue`) after finishing its files, about once in 15 stops with an event
/// stream open (VM section 9, then reproduced on the host).
final class ControlExecutor: TaskExecutor, @unchecked Sendable {
    static let shared = ControlExecutor()

    private let jobs = Mutex<[UnownedJob]>([])
    /// nil when the process had no descriptor left for its pipe (it is made once, at the first
    /// control request): the loop then looks for jobs every 5 ms instead of sleeping until woken.
    private let wakeup = try? Wakeup()
    /// Jobs run so far (a test reads it to see the thread alive).
    private let ran = Atomic<Int>(0)

    /// `shared` for the control server; tests make their own (their waits, in-process daemons).
    init(name: String = "bc-control") {
        OSThread(name: name) { [self] in loop() }.detach()
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        jobs.withLock { $0.append(unowned) }
        wakeup?.wake()
    }

    var jobsRun: Int { ran.load(ordering: .relaxed) }

    private func loop() {
        while true {
            let batch = jobs.withLock { queue -> [UnownedJob] in
                defer { queue.removeAll(keepingCapacity: true) }
                return queue
            }
            for job in batch { job.runSynchronously(on: asUnownedTaskExecutor()) }
            if batch.isEmpty, let wakeup {
                // Wakeup's protocol: say we sleep, look once more, then sleep (or not).
                wakeup.prepareToSleep()
                if jobs.withLock({ !$0.isEmpty }) {
                    wakeup.cancelSleep()
                } else {
                    _ = wakeup.sleep(timeout: nil)
                }
            } else if batch.isEmpty {
                MonotonicClock.sleep(until: MonotonicClock().now() + 5_000_000)
            } else {
                ran.wrappingAdd(batch.count, ordering: .relaxed)
            }
        }
    }
}
