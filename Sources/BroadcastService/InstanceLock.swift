internal import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// One daemon per directory: an exclusive `flock(2)` on a lock file (`.broadcast.lock` in a
/// recording directory, `.SOCKET.lock` beside the control socket), taken before the daemon touches
/// anything there (crash recovery, retention, the socket) and held until the process ends.
///
/// The kernel drops the lock when the process dies however it dies, so a crash never leaves a
/// stale lock; the file itself stays (removing a lock file races with the next locker). The holder
/// writes its pid into the file after locking so that a second instance can say who holds it.
/// The descriptor is close-on-exec: a child process does not inherit the lock.
public final class InstanceLock: Sendable {
    public static let fileName = ".broadcast.lock"

    public let path: String
    private let fd: FileDescriptor

    /// Why a lock was not taken: held by another process (its pid when it wrote one), or the file
    /// could not be opened.
    public struct Failure: Error, Sendable, CustomStringConvertible {
        /// What the lock guards: a directory, "control socket PATH".
        public var subject: String
        public var path: String
        public var holder: Int32?
        public var reason: String?
        public var description: String {
            if let reason { return "cannot lock \(subject) (\(path)): \(reason)" }
            let who = holder.map { "pid \($0)" } ?? "a process that has not written its pid yet"
            return "\(subject) is in use by another broadcast daemon (\(who), holding \(path)): "
                + "one daemon per directory; stop that one or give this one other paths"
        }
    }

    /// Locks `directory`'s `.broadcast.lock`.
    public static func forDirectory(_ directory: String) throws(Failure) -> InstanceLock {
        try InstanceLock(path: directory == "/" ? "/\(fileName)" : "\(directory)/\(fileName)", subject: directory)
    }

    /// Locks the file at `path` (created if missing) without waiting.
    public init(path: String, subject: String) throws(Failure) {
        self.path = path
        let fd: FileDescriptor
        do {
            fd = try FileDescriptor.open(
                FilePath(path), .readWrite, options: [.create, .closeOnExec, .noFollow],
                permissions: FilePermissions(rawValue: 0o644))
        } catch {
            throw Failure(subject: subject, path: path, reason: String(cString: strerror((error as? Errno ?? .ioError).rawValue)))
        }
        // swift-system has no flock: the one EINTR loop left here.
        var locked = flock(fd.rawValue, LOCK_EX | LOCK_NB)
        while locked != 0 && errno == EINTR { locked = flock(fd.rawValue, LOCK_EX | LOCK_NB) }
        guard locked == 0 else {
            let busy = errno == EWOULDBLOCK
            let reason = String(cString: strerror(errno))
            let holder = busy ? Self.holder(fd) : nil
            try? fd.close()
            throw Failure(subject: subject, path: path, holder: holder, reason: busy ? nil : reason)
        }
        self.fd = fd
        // The pid is only for a second instance's message ("in use by pid N"): the lock holds
        // without it, so a failure to write it is not one to stop for.
        let text = Array("\(getpid())\n".utf8)
        if (try? fd.resize(to: 0)) != nil {
            _ = try? fd.writeAll(toAbsoluteOffset: 0, text)
        }
    }

    // The lock goes with the descriptor; close(2) frees it even when it reports an error.
    deinit { try? fd.close() }

    /// The pid the holder wrote; it writes right after locking, so an empty file is read again
    /// for a moment before giving up.
    private static func holder(_ fd: FileDescriptor) -> Int32? {
        for _ in 0..<50 {
            var buffer = [UInt8](repeating: 0, count: 32)
            let n = (try? buffer.withUnsafeMutableBytes { try fd.read(fromAbsoluteOffset: 0, into: $0) }) ?? 0
            if n > 0, let pid = Int32(String(decoding: buffer[0..<n], as: UTF8.self).trimmingNewline), pid > 0 {
                return pid
            }
            usleep(10_000)
        }
        return nil
    }
}

extension String {
    fileprivate var trimmingNewline: Substring { self[...].prefix { $0 != "\n" } }
}
