import Atomics

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Wakes one sleeping thread without a lock: a non-blocking pipe the sleeper polls, written only when the
/// sleeper said it is about to sleep (so a busy consumer costs its producers no system calls).
///
/// Protocol for the sleeper: `prepareToSleep()`, check its condition once more, then `sleep(...)`
/// (or `cancelSleep()` if the condition already holds). Wakers call `wake()` after publishing.
public final class Wakeup: @unchecked Sendable {
    private let fd: Int32
    private let writeFD: Int32
    private let sleeping = ManagedAtomic<Bool>(false)

    public init() {
        var fds: [Int32] = [-1, -1]
        let rc = pipe(&fds)
        precondition(rc == 0, "pipe failed: errno \(errno)")
        for end in fds {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        self.fd = fds[0]
        self.writeFD = fds[1]
    }

    deinit {
        close(fd)
        close(writeFD)
    }

    public func prepareToSleep() { sleeping.store(true, ordering: .sequentiallyConsistent) }
    public func cancelSleep() { sleeping.store(false, ordering: .sequentiallyConsistent) }

    /// Sleeps until woken or `timeoutNanoseconds` pass (nil: no limit). Spurious wake-ups are allowed.
    public func sleep(timeoutNanoseconds: Int64?) {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ms: Int32
        if let t = timeoutNanoseconds {
            ms = Int32(clamping: max(0, (t + 999_999) / 1_000_000))
        } else {
            ms = -1
        }
        _ = poll(&pfd, 1, ms)
        var drain = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        while withUnsafeMutableBytes(of: &drain, { read(fd, $0.baseAddress, $0.count) }) > 0 {}
        sleeping.store(false, ordering: .sequentiallyConsistent)
    }

    /// Wakes the sleeper if it is (about to be) asleep.
    public func wake() {
        if sleeping.load(ordering: .sequentiallyConsistent) {
            var one: UInt8 = 1
            _ = write(writeFD, &one, 1)
        }
    }
}
