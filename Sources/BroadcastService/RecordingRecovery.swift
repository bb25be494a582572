public import BroadcastOutputs
public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Startup recovery: MP4/MOV recordings that a crash left fragmented (the daemon writes them
/// fragmented while recording and finalizes them on a clean stop) are finalized into regular files
/// with the index at the front. Fragmented files play already; finalizing makes them seekable and
/// lets every player open them quickly.
public enum RecordingRecovery {
    /// Finalizes every fragmented .mp4/.mov directly in `directories`; returns the repaired paths.
    /// A file that cannot be repaired is logged and left as it is.
    @discardableResult
    public static func finalizeOrphans(in directories: [String], logger: Logger) -> [String] {
        var repaired: [String] = []
        for directory in Set(directories) {
            guard let dir = opendir(directory) else { continue }
            var names: [String] = []
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                names.append(name)
            }
            closedir(dir)
            for name in names.sorted() where !name.hasPrefix(".") {
                let path = "\(directory)/\(name)"
                guard let container = try? Recording.container(for: path), container.isFinalizedByRemux,
                    let boxes = topLevelBoxes(path), boxes.contains("moof")
                else { continue }
                logger.notice("recovering \(path): left fragmented by an unclean stop, finalizing it")
                do {
                    try Recording.finalize(path: path, container: container, logger: logger)
                    repaired.append(path)
                } catch {
                    logger.error("\(error.message)")
                }
            }
            // Temporary files of an interrupted finalize are incomplete copies: the original stays.
            for name in names where name.hasPrefix(".") && name.contains(".finalizing.") {
                unlink("\(directory)/\(name)")
            }
        }
        return repaired
    }

    /// The four-character types of the top-level boxes of an ISO BMFF file, reading only headers.
    static func topLevelBoxes(_ path: String) -> [String]? {
        guard let file = fopen(path, "rb") else { return nil }
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
