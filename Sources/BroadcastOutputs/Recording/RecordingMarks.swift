public import BroadcastKit
public import BroadcastMedia
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// A marker (a chapter for whoever edits the recording): where it is in the file and its title.
public struct RecordingMark: Sendable, Hashable {
    /// The file's own time (ns from its start: after pauses were taken out, from the segment's start).
    public var nanoseconds: Int64
    public var title: String

    public init(nanoseconds: Int64, title: String) {
        self.nanoseconds = nanoseconds
        self.title = title
    }

    /// The longest title accepted, in UTF-8 bytes.
    public static let maxTitleBytes = 1024

    /// Why `title` cannot be a marker's title, or nil when it can.
    public static func problem(with title: String) -> String? {
        if title.utf8.count > maxTitleBytes {
            return "marker title too long: \(title.utf8.count) bytes (at most \(maxTitleBytes) bytes of UTF-8)"
        }
        if title.unicodeScalars.contains(where: { $0.value == 0 }) { return "marker title contains a NUL character" }
        return nil
    }

    /// The chapters for `marks` in a file `duration` ns long: each runs to the next mark (the last
    /// to the end; `.max`: the end of the file, as `Muxer.remux` finds it). `leadingChapter`: one, untitled, from zero to the first mark when that is
    /// later (MP4/MOV: libavformat's demuxer reads a chapter track's first chapter as starting at
    /// zero whatever its time, so without it the first mark would move to the start).
    static func chapters(_ marks: [RecordingMark], duration: Int64, leadingChapter: Bool) -> [Muxer.Chapter] {
        let sorted = marks.sorted { $0.nanoseconds < $1.nanoseconds }
        let end = duration == .max ? .max : max(duration, sorted.last.map { $0.nanoseconds + 1 } ?? 0)
        var chapters: [Muxer.Chapter] = []
        if leadingChapter, let first = sorted.first, first.nanoseconds > 0 {
            chapters.append(Muxer.Chapter(start: 0, end: first.nanoseconds, title: ""))
        }
        for (i, mark) in sorted.enumerated() {
            let next = i + 1 < sorted.count ? sorted[i + 1].nanoseconds : end
            chapters.append(Muxer.Chapter(start: mark.nanoseconds, end: max(mark.nanoseconds, next), title: mark.title))
        }
        return chapters
    }
}

/// The marks of a recording as they are taken, kept beside its file so that a recording cut by a
/// crash (SIGKILL, power loss) gets them as chapters when the next start recovers it: the
/// containers written crash-safe (fragmented MP4, MKV written as it goes) get chapters only when
/// the file is finished. `.NAME.marks` beside the file, one line a mark (`NS<TAB>TITLE`, the title
/// with `\\`, tab and line breaks escaped), each one `write(2)` on an `O_APPEND` descriptor.
/// Removed once the finished file holds the chapters.
public enum RecordingMarksSidecar {
    /// `.NAME.marks` beside `file`.
    public static func path(for file: String) -> String {
        let directory = Recording.directory(of: file)
        return RecordingTemplate.join(directory, "." + Recording.name(of: file) + ".marks")
    }

    static func line(_ mark: RecordingMark) -> String {
        var escaped = ""
        for c in mark.title.unicodeScalars {
            switch c {
            case "\\": escaped += "\\\\"
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            default: escaped.unicodeScalars.append(c)
            }
        }
        return "\(mark.nanoseconds)\t\(escaped)\n"
    }

    /// Appends `mark` to the sidecar of `file`; false when it could not be written.
    @discardableResult
    static func append(_ mark: RecordingMark, to file: String) -> Bool {
        guard
            let fd = try? FileDescriptor.open(
                FilePath(path(for: file)), .writeOnly, options: [.append, .create, .closeOnExec],
                permissions: FilePermissions(rawValue: 0o644))
        else { return false }
        return (try? fd.closeAfter { try fd.writeAll(line(mark).utf8) }) != nil
    }

    /// The marks noted for `file`, in order; nil when there is no sidecar. A line cut by a crash is left out.
    public static func read(for file: String) -> [RecordingMark]? {
        guard let fp = fopen(path(for: file), "rbe") else { return nil }
        defer { fclose(fp) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&chunk, 1, chunk.count, fp)
            if n <= 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
        }
        let text = String(decoding: bytes, as: UTF8.self)
        var marks: [RecordingMark] = []
        // Only whole lines: the last one without its line break was being written.
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
        for line in lines {
            guard let tab = line.firstIndex(of: "\t"), let ns = Int64(line[..<tab]) else { continue }
            var title = ""
            var escape = false
            for c in line[line.index(after: tab)...].unicodeScalars {
                if escape {
                    switch c {
                    case "n": title += "\n"
                    case "r": title += "\r"
                    case "t": title += "\t"
                    default: title.unicodeScalars.append(c)
                    }
                    escape = false
                } else if c == "\\" {
                    escape = true
                } else {
                    title.unicodeScalars.append(c)
                }
            }
            marks.append(RecordingMark(nanoseconds: ns, title: title))
        }
        return marks
    }

    static func remove(for file: String) { unlink(path(for: file)) }
}

/// A marker taken: its title, the session's media time it was taken at and the recordings it went to.
public struct TakenMark: Sendable, Hashable {
    public var number: Int
    public var title: String
    /// The session's media time (ns).
    public var media: Int64
    public var outputs: [String]
}

extension Output {
    /// Takes marker number `number` (its default title "Marker N") in every recording among
    /// `outputs` that is writing or paused, at the session's media time now. Throws
    /// `invalidArgument` for a title that cannot be one (`RecordingMark.problem`),
    /// `illegalTransition` when nothing records.
    public static func mark(_ outputs: [Output], title: String?, number: Int) throws(BroadcastError) -> TakenMark {
        let title = title ?? "Marker \(number)"
        if let problem = RecordingMark.problem(with: title) { throw BroadcastError(.invalidArgument, problem) }
        let recordings = outputs.filter { $0.takesMarks && ($0.state == .recording || $0.state == .paused || $0.state == .idle) && !$0.hasExited }
        guard !recordings.isEmpty else {
            throw BroadcastError(
                .illegalTransition,
                outputs.contains(where: \.takesMarks)
                    ? "cannot take a marker: no recording is writing now (\(outputs.filter(\.takesMarks).map { "\($0.name) \($0.state)" }.joined(separator: ", ")))"
                    : "cannot take a marker: nothing records (markers go into recordings and replay buffers; this broadcast has neither)")
        }
        // The session's media time now; without a clock (--no-realtime), the newest packet encoded.
        let media = recordings[0].mediaClock.now()?.media
            ?? recordings.map { $0.feed.newestDTS.load(ordering: .relaxed) }.max() ?? 0
        for output in recordings { output.mark(atMedia: media, title: title) }
        return TakenMark(number: number, title: title, media: media, outputs: recordings.map(\.name))
    }
}
