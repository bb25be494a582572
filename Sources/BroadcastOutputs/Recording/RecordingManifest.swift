import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The record of the files the daemon's recordings created under one directory, and of which
/// output created each: retention deletes only an output's own files (listed here under its name,
/// and named like its path template), crash recovery finalizes only listed files; never "any .mp4
/// in the directory", never another output's file.
///
/// A text file, `.broadcast-files` in the directory, appended to one line at a time:
/// `+[OUTPUT] NAME` when an output created a file (`+ NAME`, without an owner, was written before
/// owners were recorded: such a file is nobody's to delete), `- NAME` when retention deleted it,
/// and `~ N NAME` when a file name was taken: NAME, as the template expanded, has been used with
/// the numbers up to N (1: NAME itself, 2: `NAME-2` before the extension, ...), so a name is never
/// given out twice in a directory, even after retention deleted the file; `h OUTPUT<TAB>NAME` when
/// an output's on_file_finished command was queued for a file and `H ...` when it ran (what was
/// queued and never ran is run by the next start). NAME is relative to the
/// directory, or absolute when the file is elsewhere. Each line is one `write(2)` on an `O_APPEND`
/// descriptor, so outputs sharing the directory append without a lock and a crash loses at most
/// the line being written (its file is then not ours as far as deletion goes: the safe side). The
/// daemon holds the directory's instance lock (`InstanceLock`), so no other daemon writes it;
/// `compact()` rewrites it at start, before any recording, keeping the files that still exist and
/// every name's number.
public struct RecordingManifest: Sendable, Hashable {
    public static let fileName = ".broadcast-files"

    /// A file the manifest lists as created and not deleted.
    public struct Entry: Sendable, Hashable {
        /// Absolute.
        public var path: String
        /// The output that created it; nil for a line written before owners were recorded.
        public var owner: String?
    }

    /// The directory whose files it lists (an output's base directory).
    public let directory: String

    public init(directory: String) {
        self.directory = directory
    }

    /// The manifest for a recording path template: in its base directory (see `RecordingTemplate`).
    public init(template: String) {
        self.init(directory: RecordingTemplate.baseDirectory(of: template))
    }

    public var path: String { RecordingTemplate.join(directory, Self.fileName) }

    /// Notes that output `owner` created the files `recording` writes.
    public func recordCreated(_ recording: Recording, owner: String?) {
        var files = [recording.path]
        if recording.target.kind == .replace {
            // The complete recording is renamed over the file it replaces; until then (or after a
            // crash) it is this file beside it: beside the target, which through a link may be in
            // another directory than the path.
            files.append(recording.writingPath)
        }
        if recording.target.kind != .stream { append(files.map { createdLine($0, owner: owner) }) }
    }

    public func recordCreated(path: String, owner: String? = nil) { append([createdLine(path, owner: owner)]) }

    public func recordDeleted(_ path: String) { append(["- \(relative(path))"]) }

    /// Notes that `output`'s on_file_finished command is queued for `path` (`h OUTPUT<TAB>NAME`),
    /// and that it has run (`H ...`): what is queued and never run (the program ended first, or
    /// crashed) is `pendingCommands`, for the next start. A name with a tab is not noted.
    public func recordCommandPending(_ path: String, output: String) { append(["h " + commandKey(path, output)]) }

    public func recordCommandRun(_ path: String, output: String) { append(["H " + commandKey(path, output)]) }

    /// The files whose command for `output` was queued and has not run, absolute, in order.
    public func pendingCommands(output: String) -> [String] {
        guard let text = Self.read(path) else { return [] }
        return Self.pending(in: text).compactMap { key in
            let parts = key.split(separator: "\t", maxSplits: 1)
            return parts.count == 2 && parts[0] == output ? absolute(String(parts[1])) : nil
        }
    }

    private func commandKey(_ path: String, _ output: String) -> String {
        output.contains("\t") || path.contains("\t") ? "\n" : "\(output)\t\(relative(path))"
    }

    /// The `h` keys without an `H` after them, in order.
    private static func pending(in text: String) -> [String] {
        var order: [String] = []
        var open: Set<String> = []
        for line in text.split(separator: "\n") where line.count > 2 {
            let key = String(line.dropFirst(2))
            if line.hasPrefix("h ") {
                if open.insert(key).inserted { order.append(key) }
            } else if line.hasPrefix("H ") {
                open.remove(key)
            }
        }
        return order.filter { open.contains($0) }
    }

    /// Notes that `name` (a template's expansion, absolute) was taken with `number` (1: the name
    /// itself; n: the name with `-n` before its extension).
    public func recordUsed(_ name: String, number: Int) { append(["~ \(number) \(relative(name))"]) }

    /// An owner that cannot be written in the line (a `]`, a line break) leaves the file without
    /// one: nobody's to delete, the safe side.
    private func createdLine(_ path: String, owner: String?) -> String {
        guard let owner, !owner.isEmpty, !owner.contains("]"), !owner.contains("\n"), !owner.contains("\r") else {
            return "+ \(relative(path))"
        }
        return "+[\(owner)] \(relative(path))"
    }

    /// The files created and not since deleted, absolute, in the order they were created. Whether
    /// each still exists is for the caller to check.
    public func files() -> [String] { entries().map(\.path) }

    /// The files created and not since deleted, with the output that created each, in order.
    public func entries() -> [Entry] { Self.parse(Self.read(path) ?? "", self).entries }

    /// For each name a template expanded to (absolute), the highest number it was used with.
    public func usedNumbers() -> [String: Int] { Self.parse(Self.read(path) ?? "", self).used }

    private static func parse(_ text: String, _ manifest: RecordingManifest) -> (entries: [Entry], used: [String: Int]) {
        var order: [String] = []
        var live: [String: String?] = [:]
        var used: [String: Int] = [:]
        for line in text.split(separator: "\n") {
            guard line.count > 2 else { continue }
            if line.hasPrefix("+[") {
                guard let close = line.firstIndex(of: "]"), line[line.index(after: close)...].hasPrefix(" ") else { continue }
                let owner = String(line[line.index(line.startIndex, offsetBy: 2)..<close])
                let name = manifest.absolute(String(line[line.index(close, offsetBy: 2)...]))
                if live[name] == nil { order.append(name) }
                live[name] = .some(owner)
            } else if line.hasPrefix("+ ") {
                let name = manifest.absolute(String(line.dropFirst(2)))
                if live[name] == nil {
                    order.append(name)
                    live[name] = .some(nil)
                }
            } else if line.hasPrefix("- ") {
                let name = manifest.absolute(String(line.dropFirst(2)))
                live[name] = nil
            } else if line.hasPrefix("~ ") {
                let rest = line.dropFirst(2)
                guard let space = rest.firstIndex(of: " "), let number = Int(rest[..<space]) else { continue }
                let name = manifest.absolute(String(rest[rest.index(after: space)...]))
                used[name] = max(used[name] ?? 0, number)
            }
        }
        // A name created again after its deletion counts from its latest creation.
        var seen: Set<String> = []
        let latest = order.reversed().filter { seen.insert($0).inserted }.reversed()
        return (latest.compactMap { path in live[path].map { Entry(path: path, owner: $0) } }, used)
    }

    /// Rewrites the manifest with only the listed files that still exist, with their owners, and
    /// the number of every name ever taken (a manifest only grows while the daemon runs). Call
    /// while holding the directory's lock, before any recording starts.
    public func compact() {
        guard let text = Self.read(path) else { return }
        let (entries, used) = Self.parse(text, self)
        let kept = entries.filter { access($0.path, F_OK) == 0 }
        // Commands still to run for files that are still there stay noted.
        let commands = Self.pending(in: text).filter { key in
            key.split(separator: "\t", maxSplits: 1).last.map { access(absolute(String($0)), F_OK) == 0 } ?? false
        }
        let lines = kept.map { createdLine($0.path, owner: $0.owner) + "\n" }.joined()
            + used.sorted { $0.key < $1.key }.map { "~ \($0.value) \(relative($0.key))\n" }.joined()
            + commands.map { "h \($0)\n" }.joined()
        if lines == text { return }
        let temporary = path + ".new"
        guard
            let fd = try? FileDescriptor.open(
                FilePath(temporary), .writeOnly, options: [.create, .truncate, .closeOnExec], permissions: Self.permissions)
        else { return }
        let written = (try? fd.writeAll(lines.utf8)) != nil
        // swift-system has no fsync.
        let synced = fsync(fd.rawValue) == 0
        let closed = (try? fd.close()) != nil
        if written && synced && closed && rename(temporary, path) == 0 { return }
        unlink(temporary)
    }

    /// rw-r--r--
    private static let permissions = FilePermissions(rawValue: 0o644)

    /// `file` relative to the directory when it is under it, else as given (absolute).
    private func relative(_ file: String) -> String {
        let prefix = directory == "/" ? "/" : directory + "/"
        guard file.hasPrefix(prefix) else { return file }
        let name = file.dropFirst(prefix.count)
        // "/dir//x.mp4" would leave "/x.mp4", which reads back as another, absolute, path.
        return name.isEmpty || name.hasPrefix("/") ? file : String(name)
    }

    private func absolute(_ name: String) -> String {
        name.hasPrefix("/") ? name : RecordingTemplate.join(directory, name)
    }

    /// Appends the lines, best effort: a line that cannot be written leaves its file unlisted,
    /// so never deleted by us (the safe side), and the recording goes on.
    private func append(_ lines: [String]) {
        // A name with a line break cannot be one line: not recorded, so never deleted by us.
        let text = lines.filter { !$0.contains("\n") && !$0.contains("\r") }.map { $0 + "\n" }.joined()
        guard !text.isEmpty else { return }
        guard
            let fd = try? FileDescriptor.open(
                FilePath(path), .writeOnly, options: [.append, .create, .closeOnExec], permissions: Self.permissions)
        else { return }
        _ = try? fd.closeAfter { try fd.writeAll(text.utf8) }
    }

    private static func read(_ path: String) -> String? {
        guard let fd = try? FileDescriptor.open(FilePath(path), .readOnly, options: .closeOnExec) else { return nil }
        // Closing what was only read: a failure there loses nothing.
        defer { try? fd.close() }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            // Interrupted reads are retried; an error ends the text there, as the end of the file does.
            let n = (try? chunk.withUnsafeMutableBytes { try fd.read(into: $0, retryOnInterrupt: true) }) ?? 0
            if n <= 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
