import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A thread of the operating system's, for work that blocks (a device read, the session loop).
public final class OSThread: @unchecked Sendable {
    private let handle: pthread_t
    /// Joined or detached: pthread_join a second time (a stop asked over the API and by SIGTERM
    /// at once) is undefined and hung for ever. Held while joining, so a second `join` waits for
    /// the first one's end.
    private let released = Mutex(false)

    private final class Body {
        let name: String
        let run: @Sendable () -> Void
        init(name: String, run: @escaping @Sendable () -> Void) {
            self.name = name
            self.run = run
        }
    }

    /// Starts `body` on a new thread named `name` (what `top -H`, perf and /proc/PID/task/*/comm
    /// show; the kernel keeps 15 bytes of it). Every thread broadcast starts has one: "bc-" and
    /// what it does.
    public init(name: String, _ body: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(Body(name: name, run: body)).toOpaque()
        var thread = pthread_t()
        let rc = pthread_create(&thread, nil, { argument in
            let body = Unmanaged<Body>.fromOpaque(argument!).takeRetainedValue()
            OSThread.nameCurrent(body.name)
            body.run()
            return nil
        }, box)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        self.handle = thread
    }

    /// Names the calling thread: writes /proc/thread-self/comm (what pthread_setname_np does on
    /// Linux; Glibc's Swift module does not export that GNU function). Best effort: a /proc that
    /// cannot be written leaves the name as it was.
    static func nameCurrent(_ name: String) {
        let fd = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        let bytes = Array(name.utf8.prefix(15))
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }

    /// Waits for the thread's body to return; from any number of threads, any number of times.
    public func join() {
        released.withLock { released in
            // A join that failed (the thread joining itself: EDEADLK) joined nothing.
            guard !released else { return }
            released = pthread_join(handle, nil) == 0
        }
    }

    /// Lets the thread's resources go when its body returns, for a thread nobody joins.
    public func detach() {
        released.withLock { released in
            guard !released else { return }
            released = pthread_detach(handle) == 0
        }
    }
}
