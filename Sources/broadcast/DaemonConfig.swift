import ArgumentParser
import BroadcastKit
import BroadcastOutputs
import BroadcastService

import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// A config error: file, line and key, and what is expected. Exit code 2 before anything starts.
struct ConfigError: Error, CustomStringConvertible {
    var file: String
    var line: Int
    var key: String?
    var message: String

    var description: String {
        "\(file):\(line): \(key.map { "\($0): " } ?? "")\(message)"
    }
}

/// The daemon's TOML config, checked completely before anything starts.
///
/// The [video], [audio] and [encoder] keys are the command line's options in another syntax: each
/// maps to one flag (`video.size` is `--size`), and both go through the same parsing and checks, so
/// the daemon accepts exactly what `broadcast record` accepts.
struct DaemonConfig {
    struct Output {
        enum Kind {
            case recording(pathTemplate: String)
            case live(url: String)
        }
        var name: String
        var kind: Kind
        var line: Int
        /// Start a new file every this much media time (recordings).
        var segment: MediaTime?
        /// Delete finished segments older than this (recordings).
        var retainFor: MediaTime?
        /// Delete the oldest finished segments beyond this many bytes (recordings).
        var retainBytes: Int64?
        /// Replace an existing file at `path` (when the new recording is complete) instead of
        /// recording under a new name beside it.
        var overwrite = false
        /// A replay buffer of this length instead of a recording (`path` names the saves).
        var replay: MediaTime? = nil
        /// The replay buffer's byte bound.
        var maxMemory: Int64? = nil
        /// Run for every finished file: an argument vector, `{path}` replaced.
        var onFileFinished: [String]? = nil
    }

    var file: String
    var sourceArguments: [String] = []
    var encoderArguments: [String] = []
    var setup: SetupInfo = SetupInfo()
    var socketPath = "/run/broadcast/control.sock"
    var socketMode: mode_t = 0o660
    var tcp: (host: String, port: UInt16)?
    /// Where control.tcp was set (a TCP listener needs a token).
    var tcpLine: Int?
    var token: String?
    var autostart = true
    var outputs: [Output] = []
    /// [limits] memory: the memory budget (see `MemoryPlan`), and its line.
    var memoryBudget: (bytes: Int64, line: Int)?

    /// Config key → command-line flag, per table.
    static let flags: [String: [String: String]] = [
        "video": ["source": "--video", "size": "--size", "fps": "--fps", "input": "--video-input", "format": "--video-format"],
        "audio": ["mic": "--audio-mic", "app": "--audio-app", "period": "--audio-period"],
        "encoder": [
            "video_bitrate": "--video-bitrate", "audio_bitrate": "--audio-bitrate", "preset": "--preset",
            "tune": "--tune", "encoder": "--encoder", "keyframe_interval": "--keyframe-interval",
            "rate_control": "--rate-control", "crf": "--crf", "profile": "--profile", "threads": "--threads",
            "frame_rate_mode": "--frame-rate-mode",
        ],
    ]
    static let controlKeys = ["socket", "socket_mode", "tcp", "token"]
    static let daemonKeys = ["autostart"]
    static let limitsKeys = ["memory"]
    static let outputKeys = ["name", "path", "url", "segment", "retain_for", "retain_bytes", "overwrite", "replay", "max_memory", "on_file_finished"]
    static let tables = ["video", "audio", "encoder", "setup", "control", "daemon", "limits", "output"]

    /// The manifests of the recordings' files, one per base directory (see `RecordingManifest`).
    var manifests: [RecordingManifest] {
        var seen: Set<RecordingManifest> = []
        return outputs.compactMap { output -> RecordingManifest? in
            guard case .recording(let template) = output.kind else { return nil }
            let manifest = RecordingManifest(template: template)
            return seen.insert(manifest).inserted ? manifest : nil
        }
    }

    /// Where each flag came from, to point errors found by the shared option parsing at the config.
    private var flagOrigins: [String: (key: String, line: Int, value: String)] = [:]

    static func load(path: String, environment: [String: String]) throws -> DaemonConfig {
        let text: String
        switch readFile(path) {
        case .success(let contents): text = contents
        case .failure(let problem): throw ConfigError(file: path, line: 0, key: nil, message: "cannot read the config file: \(problem.reason)")
        }
        let document: TOMLDocument
        do {
            document = try TOMLDocument(parsing: text)
        } catch {
            throw ConfigError(file: path, line: error.line, key: nil, message: error.message)
        }
        var config = DaemonConfig(file: path)
        try config.read(document, environment: environment)
        if let tcp = config.tcpLine, config.token == nil {
            throw ConfigError(
                file: path, line: tcp, key: "control.tcp",
                message: "a TCP control listener needs a token: set control.token (at least 16 characters, e.g. \"${credential:control-token}\")")
        }
        try config.check()
        // Nothing to do is a mistake, not a service: refuse before any socket or file exists.
        if config.outputs.isEmpty {
            let lines = text.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r\n" })
            let last = max(1, lines.last?.isEmpty == true ? lines.count - 1 : lines.count)
            throw ConfigError(
                file: path, line: last, key: "output",
                message: "no [[output]]: add at least one, with path = \"/dir/rec.mp4\" (a recording) or url = \"rtmp://...\" (a live stream)")
        }
        return config
    }

    /// The largest config (or credential) read: a config is a page of text.
    static let maxFileBytes = 1 << 20

    struct ReadProblem: Error { var reason: String }

    /// The contents of a regular file of at most `maxFileBytes`, or why not.
    static func readFile(_ path: String) -> Result<String, ReadProblem> {
        func problem(_ error: Errno) -> ReadProblem { ReadProblem(reason: String(cString: strerror(error.rawValue))) }
        let fd: FileDescriptor
        do {
            fd = try FileDescriptor.open(FilePath(path), .readOnly, options: .closeOnExec)
        } catch {
            return .failure(problem(error as? Errno ?? .ioError))
        }
        // Closing what was only read: a failure there loses nothing.
        defer { try? fd.close() }
        var info = stat()
        guard fstat(fd.rawValue, &info) == 0 else { return .failure(problem(Errno(rawValue: errno))) }
        if info.st_mode & S_IFMT == S_IFDIR { return .failure(ReadProblem(reason: "it is a directory")) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n: Int
            do {
                n = try chunk.withUnsafeMutableBytes { try fd.read(into: $0, retryOnInterrupt: true) }
            } catch {
                return .failure(problem(error as? Errno ?? .ioError))
            }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
            if bytes.count > maxFileBytes {
                return .failure(ReadProblem(reason: "it is larger than \(maxFileBytes >> 20) MiB (is it the right file?)"))
            }
        }
        return .success(String(decoding: bytes, as: UTF8.self))
    }

    static func readText(_ path: String) -> String? {
        try? readFile(path).get()
    }

    func error(_ line: Int, _ key: String?, _ message: String) -> ConfigError {
        ConfigError(file: file, line: line, key: key, message: message)
    }

    private mutating func read(_ document: TOMLDocument, environment: [String: String]) throws {
        for table in document.tables {
            let tableName = table.name
            if tableName.isEmpty {
                if let key = table.keys.first {
                    throw error(table.entries[key]!.line, key, "keys must be inside a table: \(Self.tables.map { "[\($0)]" }.joined(separator: ", "))")
                }
                continue
            }
            guard Self.tables.contains(tableName) else {
                throw error(table.line, nil, "unknown table [\(tableName)]: known are \(Self.tables.map { "[\($0)]" }.joined(separator: ", "))")
            }
            if tableName == "output" && !document.arrayTableNames.contains("output") {
                throw error(table.line, nil, "outputs are an array of tables: write [[output]], not [output]")
            }
            if tableName != "output" && document.arrayTableNames.contains(tableName) {
                throw error(table.line, nil, "[[\(tableName)]] must be a single table: write [\(tableName)]")
            }
            var overwrite = false
            var output: (name: String?, path: String?, url: String?, line: Int, segment: MediaTime?, retainFor: MediaTime?, retainBytes: Int64?) =
                (nil, nil, nil, table.line, nil, nil, nil)
            var extra = ReplayKeys()
            for key in table.keys {
                let entry = table.entries[key]!
                let dotted = "\(tableName).\(key)"
                switch tableName {
                case "video", "audio", "encoder":
                    guard let flag = Self.flags[tableName]![key] else {
                        throw unknownKey(dotted, entry.line, known: Self.flags[tableName]!.keys.sorted(), table: tableName)
                    }
                    let value = try scalarText(entry, key: dotted, environment: environment)
                    if tableName == "encoder" { encoderArguments += [flag, value] } else { sourceArguments += [flag, value] }
                    flagOrigins[flag] = (dotted, entry.line, value)
                case "setup":
                    setup[key] = try scalarText(entry, key: dotted, environment: environment)
                case "control":
                    switch key {
                    case "socket":
                        socketPath = try string(entry, key: dotted, environment: environment)
                        guard socketPath.hasPrefix("/") else { throw error(entry.line, dotted, "expected an absolute path, got \"\(socketPath)\"") }
                    case "socket_mode":
                        let text = try scalarText(entry, key: dotted, environment: environment)
                        guard let mode = mode_t(text.hasPrefix("0o") ? String(text.dropFirst(2)) : text, radix: 8), mode <= 0o777 else {
                            throw error(entry.line, dotted, "expected an octal mode such as \"0660\", got \(text)")
                        }
                        socketMode = mode
                    case "tcp":
                        let text = try string(entry, key: dotted, environment: environment)
                        let parts = text.split(separator: ":")
                        guard parts.count == 2, let port = UInt16(parts[1]), port > 0 else {
                            throw error(entry.line, dotted, "expected HOST:PORT such as \"127.0.0.1:9090\", got \"\(text)\"")
                        }
                        tcp = (String(parts[0]), port)
                        tcpLine = entry.line
                    case "token":
                        token = try string(entry, key: dotted, environment: environment)
                        if token!.count < 16 { throw error(entry.line, dotted, "a token needs at least 16 characters") }
                    default:
                        throw unknownKey(dotted, entry.line, known: Self.controlKeys, table: tableName)
                    }
                case "daemon":
                    guard key == "autostart" else { throw unknownKey(dotted, entry.line, known: Self.daemonKeys, table: tableName) }
                    guard case .boolean(let b) = entry.value else { throw error(entry.line, dotted, "expected true or false, got \(entry.value.typeName)") }
                    autostart = b
                case "limits":
                    guard key == "memory" else { throw unknownKey(dotted, entry.line, known: Self.limitsKeys, table: tableName) }
                    let text = try scalarText(entry, key: dotted, environment: environment)
                    do {
                        memoryBudget = (try Values.memoryBudget(text, option: dotted), entry.line)
                    } catch let e as ValueError {
                        throw error(entry.line, dotted, e.description.replacingFirst("invalid \(dotted) ", with: ""))
                    }
                default:  // output
                    switch key {
                    case "name":
                        let name = try string(entry, key: dotted, environment: environment)
                        guard !name.isEmpty, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else {
                            throw error(entry.line, dotted, "expected a name of letters, digits, '-' and '_', got \"\(name)\"")
                        }
                        output.name = name
                    case "path": output.path = try string(entry, key: dotted, environment: environment)
                    case "url": output.url = try string(entry, key: dotted, environment: environment)
                    case "segment":
                        output.segment = try duration(entry, key: dotted, environment: environment)
                    case "retain_for":
                        output.retainFor = try duration(entry, key: dotted, environment: environment)
                    case "retain_bytes":
                        let text = try scalarText(entry, key: dotted, environment: environment)
                        do {
                            output.retainBytes = try Values.byteCount(text, option: dotted)
                        } catch let e as ValueError {
                            throw error(entry.line, dotted, e.description.replacingFirst("invalid \(dotted) ", with: ""))
                        }
                    case "overwrite":
                        guard case .boolean(let b) = entry.value else { throw error(entry.line, dotted, "expected true or false, got \(entry.value.typeName)") }
                        overwrite = b
                    case "replay", "max_memory", "on_file_finished":
                        try readReplayKey(key, entry, into: &extra, environment: environment)
                    default:
                        throw unknownKey(dotted, entry.line, known: Self.outputKeys, table: "[output]")
                    }
                }
            }
            if tableName == "output" {
                guard let name = output.name else { throw error(table.line, "output.name", "every [[output]] needs a name") }
                if outputs.contains(where: { $0.name == name }) {
                    throw error(table.line, "output.name", "two outputs are named \"\(name)\"")
                }
                let kind: Output.Kind
                switch (output.path, output.url) {
                case (let path?, nil):
                    guard path.hasPrefix("/") else { throw error(table.line, "output.path", "expected an absolute path, got \"\(path)\"") }
                    // The container follows the extension: a wrong one is a config error, not a failed start.
                    do {
                        _ = try Recording.container(for: path)
                    } catch {
                        throw self.error(table.entries["path"]?.line ?? table.line, "output.path", error.message)
                    }
                    kind = .recording(pathTemplate: path)
                case (nil, let url?):
                    do {
                        _ = try OutputDestination.parse(url)
                    } catch {
                        throw self.error(table.line, "output.url", error.message)
                    }
                    kind = .live(url: url)
                case (nil, nil):
                    throw error(table.line, "output", "output \"\(name)\" needs either path (a recording) or url (a live stream)")
                default:
                    throw error(table.line, "output", "output \"\(name)\" has both path and url: choose one")
                }
                if case .live = kind, output.segment != nil || output.retainFor != nil || output.retainBytes != nil || overwrite {
                    throw error(table.line, "output", "segment, retain_* and overwrite apply to recordings (path), not to \"\(name)\"")
                }
                // One file cannot take two recordings: compared with the directories' links resolved.
                if case .recording(let template) = kind, let other = outputs.first(where: {
                    if case .recording(let t) = $0.kind { return Self.sameFile(t, template) }
                    return false
                }) {
                    throw error(table.line, "output.path", "outputs \"\(other.name)\" (line \(other.line)) and \"\(name)\" write the same file \(template)")
                }
                var made = Output(name: name, kind: kind, line: table.line, segment: output.segment, retainFor: output.retainFor, retainBytes: output.retainBytes, overwrite: overwrite)
                try applyReplayKeys(extra, to: &made)
                outputs.append(made)
            }
        }
    }

    private func unknownKey(_ key: String, _ line: Int, known: [String], table: String) -> ConfigError {
        error(line, key, "unknown key: [\(table)] accepts \(known.joined(separator: ", "))")
    }

    /// A string, integer or float as text (sizes, rates and bitrates may be written either way).
    func scalarText(_ entry: TOMLDocument.Entry, key: String, environment: [String: String]) throws -> String {
        switch entry.value {
        case .string: return try string(entry, key: key, environment: environment)
        case .integer(let n): return String(n)
        case .float(let x): return String(x)
        case .boolean, .array: throw error(entry.line, key, "expected a string or a number, got \(entry.value.typeName)")
        }
    }

    /// A string with ${VAR} taken from the environment and ${credential:NAME} from systemd's
    /// $CREDENTIALS_DIRECTORY.
    func string(_ entry: TOMLDocument.Entry, key: String, environment: [String: String]) throws -> String {
        guard case .string(let raw) = entry.value else {
            throw error(entry.line, key, "expected a string in quotes, got \(entry.value.typeName)")
        }
        var out = ""
        var rest = Substring(raw)
        while let start = rest.firstRange(of: "${") {
            out += rest[..<start.lowerBound]
            guard let end = rest[start.upperBound...].firstIndex(of: "}") else {
                throw error(entry.line, key, "unterminated ${ in \"\(raw)\"")
            }
            let name = String(rest[start.upperBound..<end])
            if name.hasPrefix("credential:") {
                let credential = String(name.dropFirst("credential:".count))
                guard let directory = environment["CREDENTIALS_DIRECTORY"], let value = Self.readText("\(directory)/\(credential)") else {
                    throw error(entry.line, key, "systemd credential \"\(credential)\" is not available (is LoadCredential= set?)")
                }
                out += value.hasSuffix("\n") ? String(value.dropLast()) : value
            } else {
                guard !name.isEmpty, let value = environment[name] else {
                    throw error(entry.line, key, "environment variable \(name.isEmpty ? "(empty name)" : name) is not set")
                }
                out += value
            }
            rest = rest[rest.index(after: end)...]
        }
        return out + rest
    }

    func duration(_ entry: TOMLDocument.Entry, key: String, environment: [String: String]) throws -> MediaTime {
        let text = try scalarText(entry, key: key, environment: environment)
        do {
            return try Values.duration(text, option: key)
        } catch let e as ValueError {
            throw error(entry.line, key, e.description.replacingFirst("invalid \(key) ", with: ""))
        }
    }

    /// Runs the shared option parsing on what the config said; errors point back at the config.
    /// At load: the values, and the devices opened once to say early (file:line) that one is missing
    /// or cannot do what the config asks. Not the ScreenCast portal: asking it is a Start (a prompt
    /// on a desktop with a chooser, a restore token spent), so it is asked once, when the broadcast
    /// starts; a refusal there is exit 2 too.
    private func check() throws {
        let sources = try parse(SourceOptions.self, sourceArguments, openDevices: true)
        let encoder = try encoderOptions()
        try checkMemory(sources: sources, encoder: encoder)
    }

    /// The budget the broadcast runs within: [limits] memory, else the default.
    var memoryBudgetBytes: Int64 { memoryBudget?.bytes ?? MemoryPlan.defaultBudget }

    /// The outputs whose replay byte limit the config sets (kept as set by the memory plan).
    var replayLimitsSet: Set<String> { Set(outputs.filter { $0.maxMemory != nil }.map(\.name)) }

    /// Refuses a config whose broadcast cannot fit its memory budget, naming [limits] memory (or
    /// the video size when the budget is the default) with what it needs.
    private func checkMemory(sources: SourceOptions, encoder: EncoderOptions) throws {
        let opened = (try? sources.makeSources(openingPortal: false)) ?? []
        let size = try sources.videoSize()
        let outputs = self.outputs.map { output -> OutputConfiguration in
            switch output.kind {
            case .recording(let template):
                return OutputConfiguration(
                    name: output.name, destination: .file(template),
                    replay: output.replay.map { ReplaySettings(seconds: $0.seconds, maxBytes: output.maxMemory ?? ReplaySettings.defaultMaxBytes) })
            case .live(let url):
                return OutputConfiguration(name: output.name, destination: (try? OutputDestination.parse(url)) ?? .file("/dev/null"))
            }
        }
        let hasVideo = sourceArguments.firstIndex(of: "--video").map { sourceArguments[$0 + 1] != "none" } ?? true
        let configuration = EncodingConfiguration(
            video: hasVideo ? try encoder.videoSettings(width: size.width, height: size.height, frameRate: try sources.frameRate(), live: true) : nil,
            audio: try encoder.audioSettings(), recordings: [], outputs: outputs)
        do {
            _ = try MemoryBudgeting.plan(configuration, budget: memoryBudgetBytes, sources: opened, replayLimitsSet: replayLimitsSet)
        } catch let e as ValueError {
            if let budget = memoryBudget { throw error(budget.line, "limits.memory", e.description) }
            let origin = flagOrigins["--size"] ?? flagOrigins["--video"]
            throw error(origin?.line ?? 0, origin?.key ?? "limits.memory", e.description + " (the default budget; set [limits] memory)")
        }
    }

    /// The source options as parsed and range-checked, without opening anything (the caller opens
    /// the sources once, with `makeSources`).
    func sourceOptions() throws -> SourceOptions {
        try parse(SourceOptions.self, sourceArguments, openDevices: false)
    }

    func encoderOptions() throws -> EncoderOptions {
        try parse(EncoderOptions.self, encoderArguments, openDevices: false)
    }

    private func parse<T: ParsableArguments>(_ type: T.Type, _ arguments: [String], openDevices: Bool) throws -> T {
        do {
            let options = try T.parse(arguments)
            if let sources = options as? SourceOptions {
                _ = try sources.videoSize()
                _ = try sources.frameRate()
                if openDevices {
                    _ = try sources.makeSources(openingPortal: false)
                }
            }
            if let encoder = options as? EncoderOptions {
                _ = try encoder.videoSettings(width: 1280, height: 720, frameRate: (30, 1), live: true)
                _ = try encoder.audioSettings()
                _ = try encoder.rateMode(live: false)
            }
            return options
        } catch {
            let text = (error as? ValueError)?.description ?? T.message(for: error)
            // Name the config keys instead of the flags they stand for; point at the first one named.
            var message = text
            var first: (position: Int, key: String, line: Int)?
            for (flag, origin) in flagOrigins.sorted(by: { $0.key.count > $1.key.count }) {
                guard let range = Self.flagRange(flag, in: message) else { continue }
                let position = message.distance(from: message.startIndex, to: range.lowerBound)
                message = message.replacingFirst("invalid \(flag) ", with: "invalid value ")
                if let again = Self.flagRange(flag, in: message) { message.replaceSubrange(again, with: origin.key) }
                if first == nil || position < first!.position { first = (position, origin.key, origin.line) }
            }
            if let first { throw self.error(first.line, first.key, message) }
            // A message about a value (a device that is not there) rather than a flag.
            if let origin = flagOrigins.values.filter({ $0.value.count > 2 && text.contains($0.value) }).max(by: { $0.value.count < $1.value.count }) {
                throw self.error(origin.line, origin.key, text)
            }
            throw self.error(0, nil, text)
        }
    }
}

extension DaemonConfig {
    /// Whether two recording paths (strftime templates) name one file: equal once their
    /// directories' links are resolved (a directory that does not exist yet compares as written).
    static func sameFile(_ a: String, _ b: String) -> Bool {
        func normal(_ path: String) -> String {
            if let resolved = Recording.resolvedPath(path) { return resolved }
            return "/" + path.split(separator: "/").filter { $0 != "." }.joined(separator: "/")
        }
        return normal(a) == normal(b)
    }

    /// Where `flag` stands as a whole flag in `text` (not as the start of a longer one).
    static func flagRange(_ flag: String, in text: String) -> Range<String.Index>? {
        var searchStart = text.startIndex
        while let range = text[searchStart...].firstRange(of: flag) {
            let next = range.upperBound < text.endIndex ? text[range.upperBound] : " "
            if !(next.isLetter || next == "-") { return range }
            searchStart = range.upperBound
        }
        return nil
    }
}

extension String {
    func replacingFirst(_ target: String, with replacement: String) -> String {
        replacing(target, with: replacement, maxReplacements: 1)
    }
}
