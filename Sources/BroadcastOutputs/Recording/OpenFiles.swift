#if canImport(Glibc)
import Glibc
#endif

/// Which other processes have a file open, read from `/proc/PID/fd` (each entry a link to an open
/// file; `stat` on it names the file's device and inode, so renames and links do not fool it).
///
/// Crash recovery asks before it rewrites or deletes a file: a recording another process is
/// writing (a second `broadcast record`, any program) is not an orphan. Retention asks too, this
/// process included: a file any output is writing is never deleted. Processes of other users
/// are not visible to an unprivileged daemon; the daemon's own directory lock (`InstanceLock`)
/// covers other daemons whatever their user.
public enum OpenFiles {
    /// For each of `paths` that another process (or, `includingThisProcess`, this one) has open,
    /// that process's pid.
    public static func holders(of paths: [String], includingThisProcess: Bool = false) -> [String: Int32] {
        var wanted: [FileID: String] = [:]
        for path in paths {
            var info = stat()
            if stat(path, &info) == 0 { wanted[FileID(info)] = path }
        }
        guard !wanted.isEmpty, let proc = opendir("/proc") else { return [:] }
        defer { closedir(proc) }
        let me = getpid()
        var found: [String: Int32] = [:]
        while let entry = readdir(proc) {
            let name = entryName(entry)
            guard let pid = Int32(name), includingThisProcess || pid != me else { continue }
            guard let fds = opendir("/proc/\(pid)/fd") else { continue }
            while let fdEntry = readdir(fds) {
                let fd = entryName(fdEntry)
                guard fd.first?.isNumber == true else { continue }
                var info = stat()
                guard stat("/proc/\(pid)/fd/\(fd)", &info) == 0, let path = wanted[FileID(info)] else { continue }
                found[path] = pid
            }
            closedir(fds)
            if found.count == wanted.count { break }
        }
        return found
    }

    private struct FileID: Hashable {
        var device: UInt64
        var inode: UInt64
        init(_ info: stat) {
            device = UInt64(info.st_dev)
            inode = UInt64(info.st_ino)
        }
    }

    private static func entryName(_ entry: UnsafeMutablePointer<dirent>) -> String {
        withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    }
}
