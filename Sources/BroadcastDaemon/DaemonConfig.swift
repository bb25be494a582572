public import BroadcastKit
public import BroadcastOutputs
import BroadcastService

import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// A config error: file, line and key, and what is expected. Exit code 2 before anything starts.
public struct ConfigError: Error, CustomStringConvertible {
    public var file: String
    public var line: Int
    public var key: String?
    public var message: String

    public init(file: String, line: Int, key: String?, message: String) {
        self.file = file
        self.line = line
        self.key = key
        self.message = message
    }

    public var description: String {
        "\(file):\(line): \(key.map { "\($0): " } ?? "")\(message)"
    }
}

/// The daemon's TOML config, typed and checked completely before anything starts.
///
/// The [video], [audio], [encoder] and [limits] keys are the command line's options under another
/// name: each key is one `OptionSpec` (`video.size` is `--size`), read from the document through
/// the same parser and limits as the flag and set on the same typed `SourceSettings` and
/// `EncoderSettings`, so the daemon accepts exactly what `broadcast record` accepts. An error names
/// the file, the line the document gives the key, and the key.
public struct DaemonConfiguration: Sendable {
    public struct Output: Sendable {
        public enum Kind: Sendable {
            case recording(pathTemplate: String)
            case live(url: String)
        }
        public var name: String
        public var kind: Kind
        public var line: Int
        /// Start a new file every this much media time (recordings).
        public var segment: MediaTime?
        /// Delete finished segments older than this (recordings).
        public var retainFor: MediaTime?
        /// Delete the oldest finished segments beyond this many bytes (recordings).
        public var retainBytes: Int64?
        /// Replace an existing file at `path` (when the new recording is complete) instead of
        /// recording under a new name beside it.
        public var overwrite = false
        /// A replay buffer of this length instead of a recording (`path` names the saves).
        public var replay: MediaTime? = nil
        /// The replay buffer's byte bound.
        public var maxMemory: Int64? = nil
        /// Run for every finished file: an argument vector, `{path}` replaced.
        public var onFileFinished: [String]? = nil
        /// How long one on_file_finished command may run before it is stopped.
        public var hookTimeout: Duration = FileFinishedHook.defaultTimeout
        /// rtmps://: how the server's certificate is checked (tls_verify, tls_ca).
        public var tls = TLSVerification()
        /// whip+https://: the bearer token (`token = "${WHIP_TOKEN}"`), a secret like a stream key.
        public var token: String? = nil
        /// An encode of its own (`size`, `video_bitrate`, ...: [encoder]'s keys, applied over it);
        /// nil: the broadcast's.
        public var encode: OutputEncode? = nil
        /// The lines its encode keys were set on, by key ("size"): errors found later name them.
        public var encodeLines: [String: Int] = [:]
        /// whip+http:// to a host other than this machine (`allow_http = true`): token and keys in clear.
        public var allowPlainHTTP = false
    }

    public var file: String
    /// [video] and [audio].
    public var sources = SourceSettings()
    /// [encoder].
    public var encoder = EncoderSettings()
    public var setup: SetupInfo = SetupInfo()
    public var socketPath = "/run/broadcast/control.sock"
    public var socketMode: UInt32 = 0o660
    /// [control] socket_group: the group the socket is given (the daemon must be a member); nil:
    /// the daemon's own group.
    public var socketGroup: ControlGroup?
    public var tcp: ControlTCP?
    public var token: String?
    public var autostart = true
    public var outputs: [Output] = []
    /// [limits] memory: the memory budget (see `MemoryPlan`); nil: the default.
    public var memoryBudget: Int64?
    /// Outputs' encode keys as written, by output name, until `applyOutputEncodes` puts them over [encoder].
    private var pendingEncodes: [String: [(key: String, text: String, line: Int)]] = [:]
    /// The line each key was set on (dotted: "video.size"), from the document: checks after reading
    /// (devices opened, the memory plan) name the key and line they found wrong.
    public private(set) var lines: [String: Int] = [:]

    public struct ControlTCP: Sendable, Hashable {
        public var host: String
        public var port: UInt16
    }

    /// A group of this system's, by name (or number), resolved when the config is read.
    public struct ControlGroup: Sendable, Hashable {
        public var name: String
        public var id: UInt32

        /// nil when the system has no such group.
        public init?(_ name: String) {
            var entry = group()
            var result: UnsafeMutablePointer<group>?
            var buffer = [CChar](repeating: 0, count: 16384)
            let found = buffer.withUnsafeMutableBufferPointer { getgrnam_r(name, &entry, $0.baseAddress, $0.count, &result) }
            if found == 0, let result {
                self.name = name
                self.id = result.pointee.gr_gid
            } else if let number = UInt32(name), getgrgid_r(number, &entry, &buffer, buffer.count, &result) == 0, result != nil {
                self.name = name
                self.id = number
            } else {
                return nil
            }
        }
    }

    public init(file: String) { self.file = file }

    /// The settings each key of [video], [audio] and [encoder] sets, by table and key.
    static var optionKeys: [String: [String: ConfigSetting]] {
        func table(_ settings: [ConfigSetting]) -> [String: ConfigSetting] {
            Dictionary(uniqueKeysWithValues: settings.map { (String($0.name.key.split(separator: ".")[1]), $0) })
        }
        return [
            "video": table([
                Options.video.setting(\.sources.video), Options.size.setting(\.sources.size), Options.fps.setting(\.sources.frameRate),
                Options.videoInput.setting(\.sources.videoInput), Options.videoFormat.setting(\.sources.videoFormat),
                Options.videoOffset.setting(\.encoder.offsets.video),
            ]),
            "audio": table([
                Options.audioMic.setting(\.sources.audioMic), Options.audioApp.setting(\.sources.audioApp),
                Options.audioPeriod.setting(\.sources.audioPeriodNanoseconds),
                Options.micVolume.setting(\.encoder.micLevel.volumeDecibels), Options.appVolume.setting(\.encoder.appLevel.volumeDecibels),
                Options.micMute.setting(\.encoder.micLevel.muted), Options.appMute.setting(\.encoder.appLevel.muted),
                Options.micDenoise.setting(\.encoder.micDenoise),
                Options.micOffset.setting(\.encoder.offsets.mic), Options.appOffset.setting(\.encoder.offsets.app),
            ]),
            "encoder": table([
                Options.videoBitrate.setting(\.encoder.videoBitrate), Options.audioBitrate.setting(\.encoder.audioBitrate),
                Options.preset.setting(\.encoder.preset), Options.tune.setting(\.encoder.tune), Options.encoder.setting(\.encoder.encoder),
                Options.keyframeInterval.setting(\.encoder.keyframeInterval), Options.rateControl.setting(\.encoder.rateControl),
                Options.crf.setting(\.encoder.crf), Options.profile.setting(\.encoder.profile), Options.threads.setting(\.encoder.threads),
                Options.frameRateMode.setting(\.encoder.frameRateMode), Options.audioTracks.setting(\.encoder.audioTracks),
            ]),
            "limits": table([Options.memoryBudget.setting(\.memoryBudget)]),
        ]
    }
    static let controlKeys = ["socket", "socket_mode", "socket_group", "tcp", "token"]
    static let daemonKeys = ["autostart"]
    static let outputKeys = ["name", "path", "url", "segment", "retain_for", "retain_bytes", "overwrite", "replay", "max_memory", "on_file_finished", "hook_timeout", "tls_ca", "tls_verify", "token", "allow_http"]
        + OutputEncode.keys
    static let tables = ["video", "audio", "encoder", "setup", "control", "daemon", "limits", "output", "scenes"]

    /// The outputs that ask for an encode of their own, by name.
    public var outputEncodes: [String: OutputEncode] {
        Dictionary(outputs.compactMap { output in output.encode.map { (output.name, $0) } }, uniquingKeysWith: { first, _ in first })
    }

    /// The live outputs' URLs (their secrets are scrubbed from FFmpeg's log).
    public var streamURLs: [StreamURL] {
        outputs.compactMap { output -> StreamURL? in
            guard case .live(let url) = output.kind else { return nil }
            return try? StreamURL(url).withToken(output.token)
        }
    }

    /// The manifests of the recordings' files, one per base directory (see `RecordingManifest`).
    public var manifests: [RecordingManifest] {
        var seen: Set<RecordingManifest> = []
        return outputs.compactMap { output -> RecordingManifest? in
            guard case .recording(let template) = output.kind else { return nil }
            let manifest = RecordingManifest(template: template)
            return seen.insert(manifest).inserted ? manifest : nil
        }
    }

    /// Reads, parses and checks the config at `path` (devices opened once to check them, unless
    /// `openingDevices` is false: a reload while a broadcast holds them); throws `ConfigError`
    /// naming file:line: key.
    public static func load(path: String, environment: [String: String], openingDevices: Bool = true) throws(ConfigError) -> DaemonConfiguration {
        do {
            return try loadChecked(path: path, environment: environment, openingDevices: openingDevices)
        } catch let error as ConfigError {
            throw error
        } catch {
            throw ConfigError(file: path, line: 0, key: nil, message: "\(error)")
        }
    }

    private static func loadChecked(path: String, environment: [String: String], openingDevices: Bool) throws -> DaemonConfiguration {
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
        var config = DaemonConfiguration(file: path)
        try config.read(document, environment: environment)
        try config.applyOutputEncodes()
        if config.tcp != nil, config.token == nil {
            throw ConfigError(
                file: path, line: config.lines["control.tcp"] ?? 0, key: "control.tcp",
                message: "a TCP control listener needs a token: set control.token (at least 16 characters, e.g. \"${credential:control-token}\")")
        }
        try config.checkScenes()
        if config.encoder.micDenoise, config.sources.audioMic == .none {
            throw config.error(Options.micDenoise.name, EncoderSettings.noMicrophoneToDenoise)
        }
        try config.check(openingDevices: openingDevices)
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

    /// Each output's encode keys over the whole [encoder] table (it may come after the outputs).
    private mutating func applyOutputEncodes() throws {
        for i in outputs.indices {
            guard let keys = pendingEncodes[outputs[i].name] else { continue }
            var encode = OutputEncode(encoder: encoder, asksVideo: false)
            for (key, text, line) in keys {
                do {
                    try encode.set(key, text)
                } catch {
                    throw self.error(line, "output.\(key)", error.configMessage)
                }
            }
            outputs[i].encode = encode
        }
        pendingEncodes = [:]
    }

    /// The largest config (or credential) read: a config is a page of text.
    static let maxFileBytes = 1 << 20

    struct ReadProblem: Error { var reason: String }

    /// The contents of a regular file of at most `maxFileBytes`, or why not.
    static func readFile(_ path: String) -> Result<String, ReadProblem> {
        func problem(_ error: Errno) -> ReadProblem { ReadProblem(reason: String(cString: strerror(error.rawValue))) }
        let fd: FileDescriptor
        do {
            // Non-blocking: a FIFO put where the config was blocked the open until a writer came,
            // and with it every control action (a reload opens the file). Only what fstat calls
            // a regular file is read.
            fd = try FileDescriptor.open(FilePath(path), .readOnly, options: [.closeOnExec, .nonBlocking])
        } catch {
            return .failure(problem(error as? Errno ?? .ioError))
        }
        // Closing what was only read: a failure there loses nothing.
        defer { try? fd.close() }
        var info = stat()
        guard fstat(fd.rawValue, &info) == 0 else { return .failure(problem(Errno(rawValue: errno))) }
        switch info.st_mode & S_IFMT {
        case S_IFREG: break
        case S_IFDIR: return .failure(ReadProblem(reason: "it is a directory"))
        case S_IFIFO: return .failure(ReadProblem(reason: "it is a FIFO, not a regular file"))
        default: return .failure(ReadProblem(reason: "it is not a regular file"))
        }
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

    public static func readText(_ path: String) -> String? {
        try? readFile(path).get()
    }

    func error(_ line: Int, _ key: String?, _ message: String) -> ConfigError {
        ConfigError(file: file, line: line, key: key, message: message)
    }

    private mutating func read(_ document: TOMLDocument, environment: [String: String]) throws {
        for table in document.tables {
            guard try check(table, in: document) else { continue }
            let tableName = table.name
            var output = OutputKeys(line: table.line)
            for key in table.keys {
                let entry = table.entries[key]!
                let dotted = "\(tableName).\(key)"
                lines[dotted] = entry.line
                switch tableName {
                case "video" where key == "layers":
                    try readLayers(entry, key: dotted, environment: environment)
                case "scenes":
                    try readScene(key, entry, key: dotted, environment: environment)
                case "video", "audio", "encoder", "limits":
                    try readOption(key, entry, table: tableName, environment: environment)
                case "setup":
                    setup[key] = try scalarText(entry, key: dotted, environment: environment)
                case "control":
                    try readControl(key, entry, environment: environment)
                case "daemon":
                    guard key == "autostart" else { throw unknownKey(dotted, entry.line, known: Self.daemonKeys, table: tableName) }
                    guard case .boolean(let b) = entry.value else { throw error(entry.line, dotted, "expected true or false, got \(entry.value.typeName)") }
                    autostart = b
                default:  // output
                    try readOutputKey(key, entry, into: &output, environment: environment)
                }
            }
            if tableName == "output" { try addOutput(output, table) }
        }
    }

    /// The table is one we know, in the shape we take (an array of tables only for [[output]]);
    /// false for the document's root when it holds no key.
    private func check(_ table: TOMLDocument.Table, in document: TOMLDocument) throws -> Bool {
        let tableName = table.name
        if tableName.isEmpty {
            if let key = table.keys.first {
                throw error(table.entries[key]!.line, key, "keys must be inside a table: \(Self.tables.map { "[\($0)]" }.joined(separator: ", "))")
            }
            return false
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
        return true
    }

    /// A key of [video], [audio], [encoder] or [limits]: the option spec the command line shares.
    private mutating func readOption(_ key: String, _ entry: TOMLDocument.Entry, table: String, environment: [String: String]) throws {
        let dotted = "\(table).\(key)"
        let settings = Self.optionKeys[table]!
        if table == "audio", key == "app_denoise" {
            throw error(entry.line, dotted, Options.appDenoiseRefusal.replacing("--mic-denoise", with: "audio.mic_denoise"))
        }
        guard let setting = settings[key] else {
            throw unknownKey(dotted, entry.line, known: settings.keys.sorted(), table: table)
        }
        let value: String
        if case .boolean(let on) = entry.value, table == "audio", key.hasSuffix("_mute") || key == "mic_denoise" {
            value = on ? "true" : "false"  // mic_mute = true, mic_denoise = true
        } else {
            value = try scalarText(entry, key: dotted, environment: environment)
        }
        do {
            try setting.apply(&self, value)
        } catch {
            throw self.error(entry.line, dotted, error.configMessage)
        }
    }

    /// A key of [control].
    private mutating func readControl(_ key: String, _ entry: TOMLDocument.Entry, environment: [String: String]) throws {
        let dotted = "control.\(key)"
        switch key {
        case "socket":
            socketPath = try string(entry, key: dotted, environment: environment)
            guard socketPath.hasPrefix("/") else { throw error(entry.line, dotted, "expected an absolute path, got \"\(socketPath)\"") }
        case "socket_mode":
            let text = try scalarText(entry, key: dotted, environment: environment)
            guard let mode = mode_t(text.hasPrefix("0o") ? String(text.dropFirst(2)) : text, radix: 8), mode <= 0o777 else {
                throw error(entry.line, dotted, "expected an octal mode such as \"0660\", got \(text)")
            }
            socketMode = UInt32(mode)
        case "socket_group":
            let name = try string(entry, key: dotted, environment: environment)
            guard let group = ControlGroup(name) else {
                throw error(entry.line, dotted, "no group named \"\(name)\" on this system (create it: groupadd --system \(name), or systemd-sysusers with systemd/broadcast.sysusers)")
            }
            socketGroup = group
        case "tcp":
            let text = try string(entry, key: dotted, environment: environment)
            let parts = text.split(separator: ":")
            guard parts.count == 2, let port = UInt16(parts[1]), port > 0 else {
                throw error(entry.line, dotted, "expected HOST:PORT such as \"127.0.0.1:9090\", got \"\(text)\"")
            }
            tcp = ControlTCP(host: String(parts[0]), port: port)
        case "token":
            token = try string(entry, key: dotted, environment: environment)
            if token!.count < 16 { throw error(entry.line, dotted, "a token needs at least 16 characters") }
        default:
            throw unknownKey(dotted, entry.line, known: Self.controlKeys, table: "control")
        }
    }

    /// One [[output]]'s keys as read, checked together once the table ends (`addOutput`).
    private struct OutputKeys {
        var name: String?
        var path: String?
        var url: String?
        var line: Int
        var segment: MediaTime?
        var retainFor: MediaTime?
        var retainBytes: Int64?
        var overwrite = false
        var replay = ReplayKeys()
        var tls = TLSKeys()
        var token: (value: String, line: Int)?
        /// Encode keys as written (applied over [encoder] once the whole document is read).
        var encode: [(key: String, text: String, line: Int)] = []
        var allowHTTP: (value: Bool, line: Int)?
    }

    private func readOutputKey(_ key: String, _ entry: TOMLDocument.Entry, into output: inout OutputKeys, environment: [String: String]) throws {
        let dotted = "output.\(key)"
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
                throw error(entry.line, dotted, e.description.replacing("invalid \(dotted) ", with: "", maxReplacements: 1))
            }
        case "overwrite":
            guard case .boolean(let b) = entry.value else { throw error(entry.line, dotted, "expected true or false, got \(entry.value.typeName)") }
            output.overwrite = b
        case "replay", "max_memory", "on_file_finished", "hook_timeout":
            try readReplayKey(key, entry, into: &output.replay, environment: environment)
        case "tls_ca", "tls_verify":
            try readTLSKey(key, entry, into: &output.tls, environment: environment)
        case "token":
            output.token = (try string(entry, key: dotted, environment: environment), entry.line)
        case _ where OutputEncode.keys.contains(key):
            let text: String
            if case .boolean(let on) = entry.value { text = on ? "true" : "false" } else { text = try scalarText(entry, key: dotted, environment: environment) }
            // Checked now, at its line; applied over [encoder] (wherever that table stands) once read.
            var check = OutputEncode(encoder: EncoderSettings())
            do {
                try check.set(key, text)
            } catch {
                throw self.error(entry.line, dotted, error.configMessage)
            }
            output.encode.append((key, text, entry.line))
        case "allow_http":
            guard case .boolean(let b) = entry.value else { throw error(entry.line, dotted, "expected true or false, got \(entry.value.typeName)") }
            output.allowHTTP = (b, entry.line)
        default:
            throw unknownKey(dotted, entry.line, known: Self.outputKeys, table: "[output]")
        }
    }

    /// The [[output]] whose keys were read: named uniquely, a recording or a live stream (not
    /// both), its keys fitting its kind, no file shared with another output.
    private mutating func addOutput(_ output: OutputKeys, _ table: TOMLDocument.Table) throws {
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
            // Not echoed: without its scheme nothing says which part is the key.
            guard StreamURL.looksLikeURL(url) else {
                throw error(
                    table.entries["url"]?.line ?? table.line, "output.url",
                    "not a stream URL (not shown: it may hold a key): expected rtmp://HOST/APP/KEY, rtmps://... or srt://HOST:PORT")
            }
            do {
                _ = try OutputDestination.parse(url)
            } catch {
                throw self.error(table.entries["url"]?.line ?? table.line, "output.url", error.message)
            }
            kind = .live(url: url)
        case (nil, nil):
            throw error(table.line, "output", "output \"\(name)\" needs either path (a recording) or url (a live stream)")
        default:
            throw error(table.line, "output", "output \"\(name)\" has both path and url: choose one")
        }
        if case .live = kind, output.segment != nil || output.retainFor != nil || output.retainBytes != nil || output.overwrite {
            throw error(table.line, "output", "segment, retain_* and overwrite apply to recordings (path), not to \"\(name)\"")
        }
        // One file cannot take two recordings: compared with the directories' links resolved.
        if case .recording(let template) = kind, let other = outputs.first(where: {
            if case .recording(let t) = $0.kind { return Self.sameFile(t, template) }
            return false
        }) {
            throw error(table.line, "output.path", "outputs \"\(other.name)\" (line \(other.line)) and \"\(name)\" write the same file \(template)")
        }
        var made = Output(
            name: name, kind: kind, line: table.line, segment: output.segment, retainFor: output.retainFor, retainBytes: output.retainBytes,
            overwrite: output.overwrite)
        try applyReplayKeys(output.replay, to: &made)
        try applyTLSKeys(output.tls, to: &made)
        made.encodeLines = Dictionary(output.encode.map { ($0.key, $0.line) }, uniquingKeysWith: { $1 })
        // Kept as written until [encoder] is known: `applyOutputEncodes` sets `made.encode`.
        if !output.encode.isEmpty { pendingEncodes[name] = output.encode }
        if let token = output.token {
            guard case .live(let url) = kind, (try? OutputDestination.parse(url))?.isWHIP == true else {
                throw error(token.line, "output.token", "token applies to whip+https:// (whip+http://) outputs, not to \"\(name)\"")
            }
            made.token = token.value
        }
        let plainHTTP: StreamURL? = {
            guard case .live(let url) = kind, case .live(let parsed)? = try? OutputDestination.parse(url), parsed.scheme == .whipHTTP else { return nil }
            return parsed
        }()
        if let allow = output.allowHTTP {
            guard plainHTTP != nil else {
                throw error(allow.line, "output.allow_http", "applies to whip+http:// outputs, not to \"\(name)\"")
            }
            made.allowPlainHTTP = allow.value
        }
        if let problem = plainHTTP?.plainHTTPProblem, !made.allowPlainHTTP {
            throw error(table.entries["url"]?.line ?? table.line, "output.url", problem)
        }
        outputs.append(made)
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
                // The value is not echoed: it may be a URL with its key, or a token.
                throw error(entry.line, key, "unterminated ${: write ${NAME} or ${credential:NAME}")
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
            throw error(entry.line, key, e.description.replacing("invalid \(key) ", with: "", maxReplacements: 1))
        }
    }

    /// At load: the devices the config names opened once to say early (file:line: key) that one is
    /// missing or cannot do what the config asks, and the memory plan. Not the ScreenCast portal:
    /// asking it is a Start (a prompt on a desktop with a chooser, a restore token spent), so it is
    /// asked once, when the broadcast starts; a refusal there is exit 2 too.
    /// `openingDevices: false` (a reload while a broadcast holds the devices): the values were
    /// checked as they were read and nothing is opened; `SourceReload` opens what changed.
    private func check(openingDevices: Bool) throws {
        var opened: [(type: SampleBufferType, source: any CaptureSource)] = []
        if openingDevices {
            do {
                opened = try sources.makeSources(logger: nil, openingPortal: false, blame: { option, error in self.error(option, error) })
            } catch let error as OptionError {
                // A check across the sources ("nothing to capture").
                throw self.error(error.option, error)
            }
        }
        try checkMemory(opened: opened)
    }

    /// The budget the broadcast runs within: [limits] memory, else the default.
    public var memoryBudgetBytes: Int64 { memoryBudget ?? MemoryPlan.defaultBudget }

    /// The outputs whose replay byte limit the config sets (kept as set by the memory plan).
    public var replayLimitsSet: Set<String> { Set(outputs.filter { $0.maxMemory != nil }.map(\.name)) }

    /// Refuses a config whose broadcast cannot fit its memory budget, naming [limits] memory (or
    /// the video size when the budget is the default) with what it needs.
    private func checkMemory(opened: [(type: SampleBufferType, source: any CaptureSource)]) throws {
        // The picture: the size asked, else what the opened sources give (a screen's own size).
        let picture = opened.isEmpty ? sources.videoSize : sources.outputSize(for: opened)
        let outputs = try self.outputs.map { output -> OutputConfiguration in
            var configuration: OutputConfiguration
            switch output.kind {
            case .recording(let template):
                configuration = OutputConfiguration(
                    name: output.name, destination: .file(template),
                    replay: output.replay.map { ReplaySettings(seconds: $0.seconds, maxBytes: output.maxMemory ?? ReplaySettings.defaultMaxBytes) })
            case .live(let url):
                configuration = OutputConfiguration(name: output.name, destination: (try? OutputDestination.parse(url)) ?? .file("/dev/null"))
            }
            if let encode = output.encode {
                configuration.audioBitrate = encode.audioBitrate
            }
            if let encode = output.encode, sources.hasVideo {
                do {
                    try EncoderSettings.apply(encode, to: &configuration, picture: picture, frameRate: sources.frameRate, colour: nil)
                } catch {
                    // Named at the key that decides: the one the message names, else the size
                    // when given, else the first encode key.
                    let named = (error as? OptionError).map { String($0.option.key.split(separator: ".").last ?? "") }
                    let key = named.flatMap { output.encodeLines[$0] != nil ? $0 : nil }
                        ?? (output.encodeLines["size"] != nil ? "size" : output.encodeLines.min { $0.value < $1.value }?.key ?? "size")
                    let message = (error as? OptionError)?.configMessage ?? "\(error)"
                    throw self.error(output.encodeLines[key] ?? output.line, "output.\(key)", message)
                }
            }
            return configuration
        }
        let configuration: EncodingConfiguration
        do {
            configuration = EncodingConfiguration(
                video: sources.hasVideo ? try encoder.videoSettings(size: sources.videoSize, frameRate: sources.frameRate, live: true) : nil,
                audio: encoder.audioSettings(), recordings: [], outputs: outputs)
            // vfr is for files: refused here, at its line, when an output is live.
            _ = try encoder.rateMode(live: outputs.contains { $0.destination.isLive })
        } catch {
            throw self.error(Options.encoder.name, error)
        }
        do {
            _ = try MemoryBudgeting.plan(configuration, budget: memoryBudgetBytes, sources: opened, replayLimitsSet: replayLimitsSet)
        } catch let e as ValueError {
            if memoryBudget != nil { throw error(lines["limits.memory"] ?? 0, "limits.memory", e.description) }
            let key = lines["video.size"] != nil ? "video.size" : lines["video.source"] != nil ? "video.source" : "limits.memory"
            throw error(lines[key] ?? 0, key, e.description + " (the default budget; set [limits] memory)")
        }
    }

    /// A failure of `option`'s value (its source would not open, a check across options), as a
    /// config error at the line the key was set on.
    func error(_ option: OptionName, _ failure: any Error) -> ConfigError {
        let message: String
        switch failure {
        case let e as OptionError: return error(lines[e.option.key] ?? 0, e.option.key, e.configMessage)
        case let e as ConfigError: return e
        case let e as ValueError: message = option.configMessage(e.description)
        case let e as BroadcastError: message = option.configMessage(e.message)
        default: message = option.configMessage("\(failure)")
        }
        return error(lines[option.key] ?? 0, option.key, message)
    }
}

/// How one config key sets its option's value on the configuration.
struct ConfigSetting {
    let name: OptionName
    let apply: (inout DaemonConfiguration, String) throws(OptionError) -> Void
}

extension OptionSpec {
    func setting(_ path: WritableKeyPath<DaemonConfiguration, Value>) -> ConfigSetting {
        ConfigSetting(name: name) { (config: inout DaemonConfiguration, text: String) throws(OptionError) in
            config[keyPath: path] = try parse(text)
        }
    }

    func setting(_ path: WritableKeyPath<DaemonConfiguration, Value?>) -> ConfigSetting {
        ConfigSetting(name: name) { (config: inout DaemonConfiguration, text: String) throws(OptionError) in
            config[keyPath: path] = try parse(text)
        }
    }
}

extension DaemonConfiguration {
    /// Whether two recording paths (strftime templates) name one file: equal once their
    /// directories' links are resolved (a directory that does not exist yet compares as written).
    static func sameFile(_ a: String, _ b: String) -> Bool {
        func normal(_ path: String) -> String {
            if let resolved = Recording.resolvedPath(path) { return resolved }
            return "/" + path.split(separator: "/").filter { $0 != "." }.joined(separator: "/")
        }
        return normal(a) == normal(b)
    }
}
