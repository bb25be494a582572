#if canImport(Glibc)
import Glibc
#endif

/// What this process costs in memory, from `/proc/self/smaps_rollup` (Linux 4.14+).
///
/// The footprint broadcast reports and holds to its memory budget is **private dirty** memory:
/// pages only this process maps and has written, i.e. its heap, thread stacks, the encoder's
/// frames, the capture pools, and the written data pages of the libraries it loaded. That is what
/// a second broadcast would add to the machine, what the kernel must keep or swap, and the anon
/// part of what a cgroup is charged (`memory.current`, what systemd's `MemoryMax=` caps).
///
/// Not counted: shared library code (clean file pages, shared with every other process using
/// libavcodec; reclaimable), and the page cache of what the recordings write. The cgroup is charged
/// that page cache too, but it is reclaimed (written back) before the cgroup hits `MemoryMax=`, so it
/// never makes the service fail; RSS counts library code, so it says little about what one more
/// process costs. Both figures are reported.
public struct ProcessMemory: Sendable, Hashable {
    /// Private_Dirty: the footprint.
    public var privateDirtyBytes: Int64
    /// Rss: every page mapped and resident, shared library code included.
    public var residentBytes: Int64

    public init(privateDirtyBytes: Int64, residentBytes: Int64) {
        self.privateDirtyBytes = privateDirtyBytes
        self.residentBytes = residentBytes
    }

    /// Reads this process's figures; nil when /proc is not there (or too old for smaps_rollup).
    public static func current() -> ProcessMemory? { read(path: "/proc/self/smaps_rollup") }

    /// Reads another process's figures (benchmarks, tests).
    public static func of(pid: Int32) -> ProcessMemory? { read(path: "/proc/\(pid)/smaps_rollup") }

    static func read(path: String) -> ProcessMemory? {
        guard let file = fopen(path, "re") else { return nil }
        defer { fclose(file) }
        var text: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = chunk.withUnsafeMutableBytes { fread($0.baseAddress, 1, $0.count, file) }
            if n <= 0 { break }
            text.append(contentsOf: chunk[0..<n])
        }
        return parse(String(decoding: text, as: UTF8.self))
    }

    /// Parses smaps_rollup's "Key:   1234 kB" lines.
    public static func parse(_ text: String) -> ProcessMemory? {
        var dirty: Int64?
        var resident: Int64?
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 2, let kilobytes = Int64(fields[1]) else { continue }
            switch fields[0] {
            case "Private_Dirty:": dirty = kilobytes * 1024
            case "Rss:": resident = kilobytes * 1024
            default: break
            }
        }
        guard let dirty, let resident else { return nil }
        return ProcessMemory(privateDirtyBytes: dirty, residentBytes: resident)
    }
}
