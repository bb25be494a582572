import BroadcastKit
import Dispatch
import Testing

/// `OSThread.join` from two callers (the daemon's stop asked over the API and by SIGTERM at once,
/// or one after the other): the second returns once the thread has ended, whatever threads were
/// made since. Before, the second was a second pthread_join of a handle whose descriptor glibc had
/// already given to a new thread (its stack cache), so it waited for that thread: for ever.
@Suite struct OSThreadTests {
    @Test func aSecondJoinDoesNotWaitForAnotherThread() {
        for _ in 0..<5 {
            let first = OSThread(name: "test-first") {}
            first.join()
            // New threads made after the join take the freed descriptors; they wait until released.
            let release = DispatchSemaphore(value: 0)
            let others = (0..<4).map { _ in OSThread(name: "test-other") { release.wait() } }
            let joined = DispatchSemaphore(value: 0)
            let joiner = OSThread(name: "test-joiner") {
                first.join()
                joined.signal()
            }
            let returned = joined.wait(timeout: .now() + 30) == .success
            #expect(returned, "the second join of an ended thread waited for another thread")
            for _ in others { release.signal() }
            for other in others { other.join() }
            if !returned { joined.wait() }
            joiner.join()
        }
    }

    /// Two threads joining one thread at once both return when it ends.
    @Test func twoJoinersAtOnceBothReturn() {
        let release = DispatchSemaphore(value: 0)
        let worker = OSThread(name: "test-worker") { release.wait() }
        let done = DispatchSemaphore(value: 0)
        let joiners = (0..<2).map { _ in
            OSThread(name: "test-joiner") {
                worker.join()
                done.signal()
            }
        }
        release.signal()
        #expect(done.wait(timeout: .now() + 30) == .success)
        #expect(done.wait(timeout: .now() + 30) == .success)
        for joiner in joiners { joiner.join() }
    }
}
