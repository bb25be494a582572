import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Segment names and the deletion of old segments.
public enum RecordingRetention {
    /// strftime(3) of `template` now, in local time; "-2", "-3", ... added when that file exists
    /// or, with a `manifest`, when the name was ever given out in its directory: the number only
    /// goes up (`rec.mp4`, `rec-2.mp4`, `rec-3.mp4`, and after retention deleted them all,
    /// `rec-4.mp4`), so a name is used once, and an uploader keyed on names never overwrites what
    /// it uploaded before. The name taken is noted in the manifest.
    public static func nextPath(_ template: String, after previous: String = "", manifest: RecordingManifest? = nil) -> String {
        let base = expand(template)
        var number = (manifest?.usedNumbers()[base] ?? 0) + 1
        while true {
            let candidate = numbered(base, number)
            if candidate != previous && access(candidate, F_OK) != 0 {
                manifest?.recordUsed(base, number: number)
                return candidate
            }
            number += 1
        }
    }

    /// `path` with `-number` before its extension; `path` itself for 1.
    static func numbered(_ path: String, _ number: Int) -> String {
        guard number > 1 else { return path }
        let name = path.lastIndex(of: "/").map { path.index(after: $0) } ?? path.startIndex
        let dot = path[name...].lastIndex(of: ".") ?? path.endIndex
        return "\(path[..<dot])-\(number)\(path[dot...])"
    }

    /// The name and number `numbered` made `path` from, when it has a `-N` (N ≥ 2) before its extension.
    static func unnumbered(_ path: String) -> (base: String, number: Int)? {
        let name = path.lastIndex(of: "/").map { path.index(after: $0) } ?? path.startIndex
        let dot = path[name...].lastIndex(of: ".") ?? path.endIndex
        guard let dash = path[name..<dot].lastIndex(of: "-") else { return nil }
        let digits = path[path.index(after: dash)..<dot]
        guard !digits.isEmpty, digits.first != "0", digits.allSatisfy({ $0.isASCII && $0.isNumber }),
            let number = Int(digits), number >= 2
        else { return nil }
        return (String(path[..<dash]) + String(path[dot...]), number)
    }

    /// strftime(3) of `template` now, in local time.
    public static func expand(_ template: String) -> String {
        var now = time(nil)
        var parts = tm()
        localtime_r(&now, &parts)
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = strftime(&buffer, buffer.count, template, &parts)
        return n > 0 ? String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : template
    }

    /// The finished files of `template` that output `owner` wrote: listed in `manifest` under its
    /// name, and named as the template names files (exactly, or with a number the manifest says
    /// was given out). Oldest first. Never a file only because it is in the directory, never
    /// another output's.
    static func segments(
        of template: String, owner: String, manifest: RecordingManifest
    ) -> [(path: String, modified: Int, bytes: Int64)] {
        let used = manifest.usedNumbers()
        var found: [(path: String, modified: Int, bytes: Int64)] = []
        for entry in manifest.entries()
        where entry.owner == owner && RecordingTemplate.isNamed(by: template, path: entry.path, used: used) {
            var info = stat()
            guard lstat(entry.path, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { continue }
            found.append((entry.path, info.st_mtim.tv_sec, Int64(info.st_size)))
        }
        return found.sorted { ($0.modified, $0.path) < ($1.modified, $1.path) }
    }

    /// Deletes finished segments older than the retention age, then the oldest while the total
    /// exceeds the size limit. Only files output `owner` wrote (see `segments(of:owner:manifest:)`);
    /// never the file being written, nor any file a process has open (another output's recording,
    /// an uploader reading it: left for a later pass). Without a manifest nothing is deleted.
    static func apply(
        _ policy: RecordingSegments, owner: String, keeping current: String, manifest: RecordingManifest?, logger: Logger
    ) {
        guard policy.retainSeconds != nil || policy.retainBytes != nil else { return }
        guard let manifest else { return }
        var files = segments(of: policy.pathTemplate, owner: owner, manifest: manifest)
        var open = Set(OpenFiles.holders(of: files.map(\.path), includingThisProcess: true).keys)
        open.insert(current)
        let now = time(nil)
        if let age = policy.retainSeconds {
            for file in files where !open.contains(file.path) && now - file.modified > age {
                if unlink(file.path) == 0 {
                    manifest.recordDeleted(file.path)
                    logger.notice("retention: deleted \(file.path) (older than \(age) s)")
                }
            }
            files = segments(of: policy.pathTemplate, owner: owner, manifest: manifest)
        }
        if let limit = policy.retainBytes {
            var total = files.reduce(0) { $0 + $1.bytes }
            for file in files where total > limit && !open.contains(file.path) {
                if unlink(file.path) == 0 {
                    manifest.recordDeleted(file.path)
                    total -= file.bytes
                    logger.notice("retention: deleted \(file.path) (recordings over \(limit) bytes)")
                }
            }
        }
    }
}
