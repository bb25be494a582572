public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Startup recovery: MP4/MOV recordings that a crash left fragmented (the daemon writes them
/// fragmented while recording and finalizes them on a clean stop) are finalized into regular files
/// with the index at the front. Fragmented files play already; finalizing makes them seekable and
/// lets every player open them quickly.
///
/// Only files the daemon's manifests list as its own are touched, and none that another process
/// has open (`OpenFiles`): a live recording of another program is not an orphan. The daemon runs
/// this holding the directories' locks (`InstanceLock`), so no other daemon records there.
public enum RecordingRecovery {
    /// Per manifest: removes what an interrupted finalize left (`.NAME.finalizing.EXT` beside a
    /// listed recording), finalizes the listed recordings left fragmented, then compacts the
    /// manifest. Returns the repaired paths. A file that cannot be repaired is logged and left as it is.
    @discardableResult
    public static func recover(
        _ manifests: [RecordingManifest], logger: Logger, willFinalize: (String) -> Void = { _ in }
    ) -> [String] {
        var repaired: [String] = []
        for manifest in Set(manifests) {
            let files = manifest.files().filter { isRegularFile($0) }
            let leftovers = finalizeLeftovers(besides: files)
            let candidates = files.filter { path in
                guard let container = try? Recording.container(for: path), container.isFinalizedByRemux,
                    let boxes = topLevelBoxes(path)
                else { return false }
                return boxes.contains("moof")
            }
            // MKV files cut with markers noted beside them: remuxed with the markers as chapters.
            let markedMatroska = files.filter { path in
                (try? Recording.container(for: path)) == .mkv && access(RecordingMarksSidecar.path(for: path), F_OK) == 0
            }
            let holders = OpenFiles.holders(of: leftovers + candidates + markedMatroska)
            for path in leftovers {
                if let pid = holders[path] {
                    logger.notice("not removing \(path): process \(pid) has it open")
                } else if unlink(path) == 0 {
                    logger.notice("removed \(path): the temporary file of a finalize that was interrupted")
                }
            }
            for path in candidates {
                if let pid = holders[path] {
                    logger.notice("not recovering \(path): fragmented, but process \(pid) has it open (still being written?)")
                    continue
                }
                guard let container = try? Recording.container(for: path) else { continue }
                let marks = RecordingMarksSidecar.read(for: path) ?? []
                let withMarks = marks.isEmpty ? "" : " with its \(marks.count) marker(s) as chapters"
                logger.notice("recovering \(path): left fragmented by an unclean stop, finalizing it\(withMarks)")
                willFinalize(path)
                do {
                    try Recording.finalize(path: path, container: container, marks: marks, logger: logger)
                    RecordingMarksSidecar.remove(for: path)
                    repaired.append(path)
                } catch {
                    logger.error("\(error.message)")
                }
            }
            for path in markedMatroska {
                if let pid = holders[path] {
                    logger.notice("not recovering the markers of \(path): process \(pid) has it open (still being written?)")
                    continue
                }
                let marks = RecordingMarksSidecar.read(for: path) ?? []
                if marks.isEmpty {
                    RecordingMarksSidecar.remove(for: path)
                    continue
                }
                logger.notice("recovering \(path): cut by an unclean stop, adding its \(marks.count) marker(s) as chapters")
                willFinalize(path)
                do {
                    try Recording.addChapters(toMatroska: path, marks: marks, logger: logger)
                    RecordingMarksSidecar.remove(for: path)
                    repaired.append(path)
                } catch {
                    logger.error("\(error.message)")
                }
            }
            // A finalized MP4/MOV whose markers file outlived it (a crash just after the finalize,
            // which wrote the chapters): nothing left to do with it.
            for path in files where !candidates.contains(path) && !markedMatroska.contains(path) {
                if (try? Recording.container(for: path))?.isFinalizedByRemux == true, holders[path] == nil,
                    access(RecordingMarksSidecar.path(for: path), F_OK) == 0
                {
                    RecordingMarksSidecar.remove(for: path)
                }
            }
            manifest.compact()
        }
        return repaired
    }

    /// The temporary files of an interrupted finalize of `files`: `.NAME.finalizing.EXT` or
    /// `.NAME.N.finalizing.EXT` beside a file NAME (the names `Recording.finalize` creates); regular
    /// files only. They are incomplete copies: the original stays.
    static func finalizeLeftovers(besides files: [String]) -> [String] {
        var byDirectory: [String: Set<String>] = [:]
        for file in files {
            guard let slash = file.lastIndex(of: "/") else { continue }
            byDirectory[String(file[..<slash]), default: []].insert(String(file[file.index(after: slash)...]))
        }
        var found: [String] = []
        for (directory, names) in byDirectory {
            guard let dir = opendir(directory.isEmpty ? "/" : directory) else { continue }
            var entries: [String] = []
            while let entry = readdir(dir) {
                entries.append(withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) })
            }
            closedir(dir)
            for entry in entries where entry.hasPrefix(".") && entry.contains(".finalizing.") {
                let isLeftover = names.contains { name in
                    guard let dot = name.lastIndex(of: ".") else { return false }
                    let ext = name[dot...]
                    let head = ".\(name)."
                    let tail = "finalizing\(ext)"
                    guard entry.hasPrefix(head), entry.hasSuffix(tail), entry.count >= head.count + tail.count else { return false }
                    let middle = entry.dropFirst(head.count).dropLast(tail.count)
                    // "" or "N." (a number added while a name was taken)
                    return middle.isEmpty
                        || (middle.count > 1 && middle.hasSuffix(".") && middle.dropLast().allSatisfy { $0.isASCII && $0.isNumber })
                }
                let path = "\(directory)/\(entry)"
                if isLeftover && isRegularFile(path) { found.append(path) }
            }
        }
        return found.sorted()
    }

    static func isRegularFile(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFREG
    }

    /// The four-character types of the top-level boxes of an ISO BMFF file, reading only headers.
    static func topLevelBoxes(_ path: String) -> [String]? {
        guard let file = fopen(path, "rbe") else { return nil }
        defer { fclose(file) }
        var types: [String] = []
        var header = [UInt8](repeating: 0, count: 16)
        var offset: Int64 = 0
        while types.count < 100_000 {
            guard fseeko(file, off_t(offset), SEEK_SET) == 0, fread(&header, 1, 8, file) == 8 else { break }
            var size = Int64(header[0]) << 24 | Int64(header[1]) << 16 | Int64(header[2]) << 8 | Int64(header[3])
            types.append(String(decoding: header[4..<8], as: UTF8.self))
            if size == 1 {
                guard fread(&header[8], 1, 8, file) == 8 else { break }
                size = header[8..<16].reduce(0) { $0 << 8 | Int64($1) }
            }
            if size == 0 { break }
            guard size >= 8 else { break }
            offset += size
        }
        return types
    }
}
