import Atomics
internal import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// How a `Wakeup`'s sleeps ended, counted since it was made. Read from any thread (a snapshot).
public struct WakeupStatistics: Sendable, Hashable {
    /// Sleeps ended by a waker's byte (or one left over from an earlier wake).
    public var signalled = 0
    /// Sleeps ended by their timeout.
    public var timedOut = 0
    /// Sleeps ended by their timeout although `wake()` was called while the sleeper was asleep: a
    /// wake-up that did not arrive and was delivered by the timeout. Zero when the hand-off is right.
    public var late = 0
    /// Bytes written to the pipe (wake-ups that found the sleeper asleep or about to be).
    public var writes = 0

    public init(signalled: Int = 0, timedOut: Int = 0, late: Int = 0, writes: Int = 0) {
        self.signalled = signalled
        self.timedOut = timedOut
        self.late = late
        self.writes = writes
    }

    public static func + (a: Self, b: Self) -> Self {
        Self(signalled: a.signalled + b.signalled, timedOut: a.timedOut + b.timedOut, late: a.late + b.late, writes: a.writes + b.writes)
    }

    public static func - (a: Self, b: Self) -> Self {
        Self(signalled: a.signalled - b.signalled, timedOut: a.timedOut - b.timedOut, late: a.late - b.late, writes: a.writes - b.writes)
    }
}

/// Wakes one sleeping thread without a lock: a non-blocking pipe the sleeper polls, written only when the
/// sleeper said it is about to sleep (so a busy consumer costs its producers no system calls).
///
/// Protocol for the sleeper: `prepareToSleep()`, check its condition once more, then `sleep(...)`
/// (or `cancelSleep()` if the condition already holds). Wakers call `wake()` after publishing.
///
/// The two sides are Dekker's pattern: the waker stores its data then loads `sleeping`, the sleeper
/// stores `sleeping` then loads the data. Each side needs a full (sequentially consistent) fence
/// between its store and its load: a release store followed by a load may be reordered (on x86 too:
/// the store waits in the store buffer while the load goes ahead), and then the waker sees "awake"
/// while the sleeper sees "no data", and the wake-up is lost until the timeout. With the fences, at
/// least one side sees the other's store.
///
/// *Why a pipe and not eventfd or a futex*: Glibc's Swift module exports neither `eventfd` nor a
/// `syscall` that Swift can call (it is variadic), and BroadcastKit imports no C module of ours. A
/// pipe costs the same as an eventfd here: nothing at all while the consumer is busy (no write), one
/// write and one read per sleep otherwise.
///
/// The same type also serves a thread that polls other descriptors too (a V4L2 device):
/// `descriptor` goes into its poll set, `signal()` writes unconditionally, `drain()` empties it.
///
/// The pipe is made with swift-system (`pipe2`, non-blocking and close-on-exec at once: no
/// `fcntl` whose failure could go unseen); its reads and writes stay plain system calls on the raw
/// descriptors, because swift-system's throw untyped errors and a drain ends on EAGAIN: the
/// error's box would be an allocation per wake-up on the frame path.
public final class Wakeup: @unchecked Sendable {
    private let readEnd: FileDescriptor
    private let writeEnd: FileDescriptor
    private var fd: Int32 { readEnd.rawValue }
    private let sleeping = ManagedAtomic<Bool>(false)
    /// `wake()` calls, for `late`: a sleep that times out after a wake() came in while it slept.
    private let wakeCalls = ManagedAtomic<Int>(0)
    private var wakeCallsAtSleep = 0
    private let signalledCount = ManagedAtomic<Int>(0)
    private let timedOutCount = ManagedAtomic<Int>(0)
    private let lateCount = ManagedAtomic<Int>(0)
    private let writeCount = ManagedAtomic<Int>(0)

    /// Throws `outOfResources` when no pipe can be made (the process is out of descriptors): what
    /// needed it (a start, an output a reload adds) fails with that error; nothing stops the process.
    public init() throws(BroadcastError) {
        do {
            (readEnd, writeEnd) = try FileDescriptor.pipe(options: [.nonBlocking, .closeOnExec])
        } catch {
            throw BroadcastError(.outOfResources, "cannot make a wake-up pipe: \(error)")
        }
    }

    deinit {
        // close(2) frees the descriptor even when it reports an error; there is nothing to retry.
        try? readEnd.close()
        try? writeEnd.close()
    }

    /// Sleeper: about to sleep. Then check the condition again, and `sleep` or `cancelSleep`.
    public func prepareToSleep() {
        sleeping.store(true, ordering: .relaxed)
        // Dekker: the store above is visible before the caller's check of its condition (a load).
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        wakeCallsAtSleep = wakeCalls.load(ordering: .relaxed)
    }

    public func cancelSleep() { sleeping.store(false, ordering: .relaxed) }

    /// Sleeps until woken or `timeout` passes (nil: no limit). Spurious wake-ups are allowed.
    /// Returns true when woken by a signal, false on the timeout.
    @discardableResult
    public func sleep(timeout: Duration?) -> Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ms: Int32
        if let timeout {
            // poll's milliseconds, rounded up: a sleep never ends before its timeout.
            let (seconds, attoseconds) = timeout.components
            let attosecondsPerMillisecond: Int64 = 1_000_000_000_000_000
            let whole = seconds.multipliedReportingOverflow(by: 1000)
            let milliseconds =
                whole.overflow
                ? (seconds < 0 ? 0 : Int64.max)
                : whole.partialValue + attoseconds / attosecondsPerMillisecond
                    + (attoseconds % attosecondsPerMillisecond > 0 ? 1 : 0)
            ms = Int32(clamping: max(0, milliseconds))
        } else {
            ms = -1
        }
        var ready: Int32
        repeat {
            ready = poll(&pfd, 1, ms)
        } while ready < 0 && errno == EINTR
        let drained = drain()
        sleeping.store(false, ordering: .relaxed)
        // A byte that came between the timeout and the drain was a wake-up on time.
        if ready > 0 || drained {
            signalledCount.wrappingIncrement(ordering: .relaxed)
            return true
        }
        timedOutCount.wrappingIncrement(ordering: .relaxed)
        if wakeCalls.load(ordering: .relaxed) != wakeCallsAtSleep {
            lateCount.wrappingIncrement(ordering: .relaxed)
        }
        return false
    }

    /// Waker, after publishing: wakes the sleeper if it is (about to be) asleep. Only the first
    /// waker of a sleep writes.
    public func wake() {
        wakeCalls.wrappingIncrement(ordering: .relaxed)
        // Dekker: what the caller published (a release store) is visible before `sleeping` is read.
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        if sleeping.load(ordering: .relaxed), sleeping.exchange(false, ordering: .relaxed) {
            signal()
        }
    }

    /// `sleep(timeout:)` in nanoseconds, for the callers not moved to `Duration` yet (the session).
    @discardableResult
    public func sleep(timeoutNanoseconds: Int64?) -> Bool {
        sleep(timeout: timeoutNanoseconds.map { .nanoseconds($0) })
    }

    // MARK: For a thread that polls other descriptors too

    /// The read end, for a poll set: readable after `signal()` (or a `wake()` that wrote).
    public var descriptor: Int32 { fd }

    /// Writes a byte whatever the sleeper is doing. A full pipe (EAGAIN) already wakes the
    /// sleeper; any other failure is a descriptor gone wrong, which no wake-up survives.
    public func signal() {
        var one: UInt8 = 1
        var written: Int
        repeat { written = write(writeEnd.rawValue, &one, 1) } while written < 0 && errno == EINTR
        if written < 0 {
            let error = Errno(rawValue: errno)
            precondition(error == .wouldBlock, "writing to a wake-up pipe: \(error)")
        }
        writeCount.wrappingIncrement(ordering: .relaxed)
    }

    /// Empties the pipe (after a poll that included `descriptor`); true when there was something.
    @discardableResult
    public func drain() -> Bool {
        var bytes = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        var any = false
        while withUnsafeMutableBytes(of: &bytes, { read(fd, $0.baseAddress, $0.count) }) > 0 { any = true }
        return any
    }

    /// How the sleeps ended so far.
    public var statistics: WakeupStatistics {
        WakeupStatistics(
            signalled: signalledCount.load(ordering: .relaxed),
            timedOut: timedOutCount.load(ordering: .relaxed),
            late: lateCount.load(ordering: .relaxed),
            writes: writeCount.load(ordering: .relaxed)
        )
    }
}
